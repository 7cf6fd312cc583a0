"""The pipeline config (``configs/pipeline/*.yaml``): which robot and hardware to use, where runs
go, and a section per stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Fraction, Positive, StrictModel
from pipeline.config.follow import FollowConfig
from pipeline.config.learned import LearnConfig
from pipeline.config.network import CameraSourceConfig, NetworkConfig
from pipeline.config.recordings import BagTopicsConfig
from pipeline.config.sysid import SysidConfig


class RandomPolicyConfig(StrictModel):
    n_targets: Annotated[int, Field(ge=1, le=1000)]
    levels: tuple[Fraction, ...] | None = Field(
        default=None, description="Allowed target values; None draws uniformly from [0, 1]."
    )
    seed: int


CollectPolicyName = Literal["random", "rolling", "cw", "ccw"]
"""'random' or a published Tribar gait (:mod:`pipeline.published_gaits`)."""


class CollectConfig(StrictModel):
    policy: CollectPolicyName = Field(description="'random' or the name of a published gait.")
    gait_cycles: Annotated[int, Field(ge=1)] = 1
    random: RandomPolicyConfig
    segment_timeout_s: Positive
    record_frames: bool
    checkpoint_every_s: Positive = Field(description="Flush recorded data to disk this often (sim time).")
    later_iterations: Literal["redeploy", "redeploy_and_random"] = Field(
        default="redeploy",
        description="What iteration k > 1 collects: the previous iteration's redeploy runs, and with "
        "'redeploy_and_random' also a fresh random policy (seed + k - 1).",
    )


class TrackConfig(StrictModel):
    """Offline pose tracking (``track`` stage). Sigmas weight the fusion's residuals."""

    method: Literal["camera", "onboard"] = Field(
        default="camera", description="'camera': RGB-D + cable sensors; 'onboard': cable sensors + IMUs only."
    )
    min_blob_px: Annotated[int, Field(ge=1)] = Field(default=8, description="Smallest end-cap blob (pixels).")
    camera_sigma_m: Positive = Field(default=0.003, description="Std of an end-cap centre seen by the camera.")
    cable_sigma_m: Positive = Field(default=0.004, description="Std of a cable sensor reading (noise + bias).")
    motion_sigma_m: Positive = Field(default=0.04, description="Std of an end cap's motion between two frames.")
    roll_sigma_rad: Positive = Field(default=0.3, description="Std of a rod's roll change between two frames.")
    gate_m: Positive = Field(default=0.12, description="Farthest a camera sighting may be from its prediction.")
    ground_ransac_threshold_m: Positive = Field(default=0.006, description="RANSAC inlier distance to the ground.")
    ground_ransac_iterations: Annotated[int, Field(ge=10)] = 1000
    seed: int = 0


class AttachConfig(StrictModel):
    """Attachment-point inference (``attach`` stage)."""

    rest_window_s: Positive = Field(
        default=0.1, description="Initial stretch of the recording (s) taken as the rest state (before the motors act)."
    )
    every_iteration: bool = Field(
        default=False, description="Infer the attachment points in every iteration (default: iteration 1's are reused)."
    )


class GaitSearchConfig(StrictModel):
    """The graph search for gaits (``gaits`` stage; :mod:`pipeline.gaits.search`)."""

    depth: Annotated[int, Field(ge=2, le=5)] = Field(
        default=4, description="Edges of a gait, rest shape to rest shape (R2S2R paper: 4)."
    )
    dt_s: Positive = Field(default=0.005, description="Engine time step of the search (s).")
    transition_timeout_s: Positive = Field(
        default=2.0, description="An edge whose shape is not reached in this time is unreachable (s)."
    )
    settle_s: Annotated[float, Field(ge=0)] = Field(
        default=0.5, description="Hold on the rest shape before a gait is scored (s)."
    )
    merge_position_m: Annotated[float, Field(ge=0)] = Field(
        default=0.005, description="End states closer than this (end caps, up to a planar motion) merge (m)."
    )
    merge_velocity_m_s: Annotated[float, Field(ge=0)] = Field(
        default=0.05, description="... and whose rod velocities differ less than this (m/s)."
    )
    exact_levels: Annotated[int, Field(ge=1)] = Field(
        default=2, description="Levels searched exhaustively (every reachable shape after every node)."
    )
    beam_width: Annotated[int, Field(ge=1)] | None = Field(
        default=24, description="Deeper levels expand the best this many nodes per objective; null: exhaustive."
    )
    validate_top: Annotated[int, Field(ge=1)] = Field(
        default=6, description="Best leaves per objective re-run as whole gaits from the start."
    )
    pool: Annotated[int, Field(ge=1)] = Field(
        default=4, description="Leaves re-run per objective: this many times ``validate_top``, the best kept."
    )
    ensemble_motor_speed: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.05,
        description="Validation also runs each gait with the motor speed this fraction lower and higher, and "
        "ranks gaits by their mean score over the ensemble (0: nominal only).",
    )
    ensemble_friction: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.15, description="... and with the ground friction this fraction lower and higher."
    )
    shards: Annotated[int, Field(ge=1, le=63)] = Field(
        default=1,
        description="Split the search by its first shape into this many task runs for the task runner to "
        "spread (each with the same beam); 1: one run.",
    )


class GaitsConfig(StrictModel):
    """The ``gaits`` stage: search, expansion to long policies, smoothing."""

    search: GaitSearchConfig = GaitSearchConfig()
    straight_cycles: Annotated[int, Field(ge=1)] = Field(
        default=3, description="Forward cycles of the straight policy."
    )
    turn: Literal["ccw", "cw"] = Field(default="ccw", description="Which turning gait the turning policy repeats.")
    turn_cycles: Annotated[int, Field(ge=1)] = Field(default=3, description="Cycles of the turning policy.")
    expansion_starts: Annotated[int, Field(ge=0)] = Field(
        default=8,
        description="Each candidate long policy is also run from this many starts near the search's, and scored "
        "by its mean over them and the parameter ensemble (0: the search's start alone).",
    )
    expansion_start_sigma_m: Annotated[float, Field(ge=0)] = Field(
        default=0.002, description="... those starts: Gaussian noise of this standard deviation on every end cap (m)."
    )
    expansion_min_reached: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.75,
        description="... a policy must reach every target from at least this share of them; where none does, the "
        "one with the highest share.",
    )
    smoothing: bool = Field(default=True, description="Remove redundant reset steps between cycles (R2S2R paper).")
    smoothing_tolerance_m: Positive = Field(
        default=0.05, description="A smoothed policy must end within this of the unsmoothed one's displacement (m)."
    )
    smoothing_tolerance_deg: Positive = Field(
        default=15.0, description="... and within this of its heading change (deg)."
    )


class StartPoseConfig(StrictModel):
    """A start of a redeploy run: the rest pose turned by ``yaw_deg`` and moved by (x, y) (m)."""

    x_m: float
    y_m: float
    yaw_deg: float


class RedeployConfig(StrictModel):
    """The ``redeploy`` stage: run the expanded policies on the hardware from several starts."""

    policies: tuple[Literal["straight", "turning"], ...] = Field(default=("straight", "turning"), min_length=1)
    starts: tuple[StartPoseConfig, ...] = Field(
        default=(
            StartPoseConfig(x_m=0.0, y_m=-0.4, yaw_deg=0.0),
            StartPoseConfig(x_m=0.25, y_m=-0.7, yaw_deg=120.0),
            StartPoseConfig(x_m=0.0, y_m=-1.0, yaw_deg=-120.0),
        ),
        min_length=1,
        description="Start poses, each run for every policy (as the R2S2R paper's repeatability table).",
    )
    segment_timeout_s: Positive = Field(
        default=3.0,
        description="A policy target not reached in this time is given up (s), on the hardware and in the engine.",
    )
    concurrent_runs: bool = Field(
        default=False,
        description="Submit the runs all at once to the task runner (one hardware instance each: the twin, or "
        "several robots); false runs them one after another.",
    )


class RunnerConfig(StrictModel):
    """The Prefect task runner that spreads the parallel parts of an iteration (gait-search shards,
    redeploy runs when ``redeploy.concurrent_runs``)."""

    kind: Literal["threads", "dask", "ray"] = Field(
        default="threads",
        description="'threads': a thread pool in the flow's process; 'dask': prefect-dask on a dask.distributed "
        "cluster; 'ray': prefect-ray (install it first: pip install prefect-ray).",
    )
    workers: Annotated[int, Field(ge=1)] = Field(
        default=2, description="Threads, or the local cluster's worker processes (one thread each)."
    )
    address: str | None = Field(
        default=None,
        description="Scheduler address of a running cluster (dask: tcp://host:8786, ray: ray://host:10001); "
        "none starts a local cluster on 127.0.0.1 for the run.",
    )


class EngineConfig(StrictModel):
    """How the stages run the differentiable engine (sysid, learn, gaits, actions, evaluate)."""

    compiled: bool = Field(
        default=True,
        description="Run the engine's steps without gradients (searches, finite differences, replays) "
        "through its compiled kernel: several times faster steps, compiled once per machine (docs/physics.md). "
        "Steps with gradients always run eagerly.",
    )
    contact: Literal["analytic", "learned"] = Field(
        default="analytic",
        description="The ground contact that picks the gaits: 'analytic' (the engine's impulses) or 'learned' "
        "(the learn stage's graph network, docs/learned-contact.md). The gait search runs the analytic engine "
        "either way; with 'learned' its finalists are expanded, judged, smoothed and simulated in the learned "
        "engine, and the gaits stage picks by those scores.",
    )


class PipelineConfig(StrictModel):
    campaign: Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")] = Field(
        description="The campaign's folder under runs_dir: letters, digits, '_', '.', '-', not starting with '.'."
    )
    runs_dir: Path
    robot_config: Path
    hardware_backend: Literal["twin", "network"] = Field(
        description="'twin': the MuJoCo twin in this process; 'network': a robot (or `r2s2r serve-twin`) over the "
        "robot protocol at network.host:network.port (docs/robot-protocol.md)."
    )
    hardware_config: Path | None = Field(
        default=None,
        description="The twin's hidden config (configs/hardware/*.yaml): the world for hardware_backend 'twin' and "
        "for `r2s2r serve-twin`; a real robot has none.",
    )
    network: NetworkConfig = NetworkConfig()
    camera: CameraSourceConfig = CameraSourceConfig()
    bag_import: BagTopicsConfig = BagTopicsConfig()
    collect: CollectConfig
    track: TrackConfig = TrackConfig()
    attach: AttachConfig = AttachConfig()
    sysid: SysidConfig = SysidConfig()
    learn: LearnConfig = LearnConfig()
    gaits: GaitsConfig = GaitsConfig()
    redeploy: RedeployConfig = RedeployConfig()
    runner: RunnerConfig = RunnerConfig()
    engine: EngineConfig = EngineConfig()
    follow: FollowConfig = FollowConfig()

    @model_validator(mode="after")
    def _hardware(self) -> PipelineConfig:
        if self.hardware_backend == "twin" and self.hardware_config is None:
            raise ValueError("hardware_backend 'twin' needs hardware_config (the twin's hidden config)")
        if self.hardware_backend == "network" and self.redeploy.concurrent_runs:
            raise ValueError(
                "redeploy.concurrent_runs needs a robot per run; the network backend has one (network.host:port)"
            )
        return self

    @field_validator("runs_dir", "robot_config", "hardware_config")
    @classmethod
    def _not_empty(cls, value: Path | None) -> Path | None:
        if value is not None and str(value) in ("", "."):
            raise ValueError("must be a non-empty path")
        return value
