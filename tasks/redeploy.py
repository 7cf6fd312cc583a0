"""The ``redeploy`` stage: the expanded gaits on the hardware, tracked (DESIGN §1.6; seed 000
Table I).

:func:`run_redeploy` runs every policy of the gaits stage (``redeploy.policies``) from
every start pose (``redeploy.starts``) on the hardware, one recording folder per run
(``<policy>-start<k>/``: hardware stream, ground truth where the backend has it,
frames, ``policy.json``), and tracks each with the perception stage's tracker
(``tracked.parquet``). It writes the run list (``runs.json``) and the real robot's
repeatability across starts per policy (final displacement in the start's frame and
heading change, mean and std). The recording folders have the collect stage's layout
plus ``tracked.parquet``, so the next iteration's sysid can read them; the ``evaluate``
stage replays them in the engine for the sim-to-real gap.

A run whose folder already holds a complete recording of the same policy and its
tracking is not run again, so a stage that died mid-way resumes where it stopped. In
the flow each run is its own task run (:func:`redeploy_run`) before the stage task
gathers them, so a parallel task runner can spread them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import task
from prefect.context import TaskRunContext

from pipeline.config import LoadedConfigs, RobotConfig, StartPoseConfig
from pipeline.errors import DataError
from pipeline.gaits.outcome import folded_flat, heading_change_rad
from pipeline.hardware import make_robot
from pipeline.hardware.base import Robot, StartPose
from pipeline.policies import Policy
from pipeline.robot_model import heading_rad
from storage.files import atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import HARDWARE_FILE
from storage.tracking import client_for
from storage.trajectory import caps_array, read_trajectory
from tasks.caching import stage_cache_key
from tasks.collect import POLICY_FILE, open_recording, record_run, set_aside, write_policy_json
from tasks.gaits import POLICIES_FILE
from tasks.sysid import sysid_robot
from tasks.track import TRACKED_FILE, track_recording, write_tracked

STAGE = "redeploy"
STAGE_VERSION = "3"
RUNS_FILE = "runs.json"
REPEATABILITY_FILE = "repeatability.json"


@dataclass(frozen=True)
class Run:
    """One redeploy run: the ``policy`` from start ``start_index``, recorded under ``folder``."""

    policy_key: str
    policy: Policy
    start_index: int
    start: StartPoseConfig
    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    def to_json(self) -> dict[str, object]:
        """The run's entry in ``runs.json`` (its policy is in its folder's ``policy.json``)."""
        return {
            "name": self.name,
            "policy_key": self.policy_key,
            "start_index": self.start_index,
            "start": self.start.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, payload: dict, stage_dir: Path) -> Run:
        """The run of entry ``payload`` of ``stage_dir``'s ``runs.json``, with its recorded policy."""
        folder = stage_dir / payload["name"]
        recorded = json.loads((folder / POLICY_FILE).read_text())
        policy = Policy(name=recorded["name"], targets=np.asarray(recorded["targets"], float))
        start = StartPoseConfig.model_validate(payload["start"])
        return cls(payload["policy_key"], policy, int(payload["start_index"]), start, folder)


def recorded_runs(redeploy_ref: Ref) -> list[Run]:
    """The runs of a complete redeploy stage output, in order."""
    stage_dir = Path(redeploy_ref.path)
    path = stage_dir / RUNS_FILE
    if not path.is_file():
        raise DataError(f"{path}: missing; the redeploy stage output is incomplete or from an older version")
    return [Run.from_json(entry, stage_dir) for entry in json.loads(path.read_text())]


def planned_runs(configs: LoadedConfigs, gaits_ref: Ref, stage_dir: Path) -> list[Run]:
    """Every (policy, start) run of ``redeploy``'s config, with the policies of the gaits stage."""
    path = Path(gaits_ref.path) / POLICIES_FILE
    policies = json.loads(path.read_text())
    runs = []
    for key in configs.pipeline.redeploy.policies:
        if key not in policies:
            raise DataError(f"{path}: no policy '{key}'; the gaits stage wrote {sorted(policies)}")
        policy = Policy(name=policies[key]["name"], targets=np.asarray(policies[key]["targets"], float))
        for k, start in enumerate(configs.pipeline.redeploy.starts):
            runs.append(Run(key, policy, k, start, stage_dir / f"{key}-start{k}"))
    return runs


def set_aside_other_runs(configs: LoadedConfigs, iteration: int, gaits_ref: Ref, fresh: bool = False) -> None:
    """Keep the stage folder aside (``redeploy.replaced-<time>``) if it holds runs of other
    policies than the gaits stage's (the gaits changed since), or any run when ``fresh`` (every
    run is to be recorded again): recorded runs are never overwritten."""
    stage_dir = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign).stage_dir(iteration, STAGE)
    if fresh and stage_dir.exists():
        set_aside(stage_dir, "replaced")
        return
    for run in planned_runs(configs, gaits_ref, stage_dir):
        recorded = run.folder / POLICY_FILE
        if recorded.is_file() and json.loads(recorded.read_text()).get("policy_id") != run.policy.policy_id:
            set_aside(stage_dir, "replaced")
            return


def _complete(run: Run) -> bool:
    """Whether ``run``'s folder holds a complete recording of its policy and its tracking."""
    folder = run.folder
    if not all((folder / name).is_file() for name in (TRACKED_FILE, HARDWARE_FILE, POLICY_FILE)):
        return False
    if json.loads((folder / POLICY_FILE).read_text()).get("policy_id") != run.policy.policy_id:
        return False
    _, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    return bool(meta.complete)


def execute_run(
    configs: LoadedConfigs, iteration: int, robot_config: RobotConfig, run: Run, hardware: Robot | None = None
) -> None:
    """Record ``run`` on ``hardware`` (the configured backend if None) and track it into its folder;
    skipped if the folder already holds it."""
    if _complete(run):
        return
    hardware = make_robot(configs) if hardware is None else hardware
    run.folder.mkdir(parents=True, exist_ok=True)
    write_policy_json(run.folder, run.policy.name, run.policy.policy_id, run.policy.targets)
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    recording = open_recording(configs, iteration, run.name, run.folder, hardware, timeout_s)
    start = StartPose(run.start.x_m, run.start.y_m, math.radians(run.start.yaw_deg))
    record = configs.pipeline.collect.record_frames
    record_run(hardware, run.policy, recording, record, start=start, show_progress=False)
    tracked, figures = track_recording(robot_config, configs.pipeline.track, run.folder)
    write_tracked(run.folder / TRACKED_FILE, tracked, figures, robot_config, configs, iteration, run.name)


def motion_in_start_frame(caps_m: np.ndarray) -> tuple[float, float, float]:
    """Final centroid displacement (forward along the start heading, lateral; m) and heading
    change (deg, ccw positive, unwrapped) of end caps ``caps_m`` (T, 6, 3)."""
    heading = float(heading_rad(caps_m[0]))
    forward = np.array([math.cos(heading), math.sin(heading)])
    lateral = np.array([-forward[1], forward[0]])
    displacement = caps_m[-1].mean(0)[:2] - caps_m[0].mean(0)[:2]
    return float(displacement @ forward), float(displacement @ lateral), math.degrees(heading_change_rad(caps_m))


def run_redeploy(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    gaits_ref: Ref,
    hardware: Robot | None = None,
) -> tuple[Ref, dict[str, object]]:
    """Run and track every planned run; write the run list and the repeatability figures. Returns
    the ref and the summary (repeatability per policy)."""
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    stage_dir = layout.stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    runs = planned_runs(configs, gaits_ref, stage_dir)
    robot = sysid_robot(configs, attach_ref)
    try:
        for run in runs:
            if not _complete(run):
                hardware = make_robot(configs) if hardware is None else hardware
                execute_run(configs, iteration, robot, run, hardware)
    except BaseException as exc:
        done = [r.name for r in runs if _complete(r)]
        write_manifest(
            stage_dir, STAGE, complete=False, summary={"runs_complete": done, "error": f"{type(exc).__name__}: {exc}"}
        )
        raise
    real = [caps_array(read_trajectory(r.folder / TRACKED_FILE, expect_source="tracked")[0]) for r in runs]
    atomic_write_json(stage_dir / RUNS_FILE, [run.to_json() for run in runs])
    repeatability = _repeatability(runs, real, robot.rod.length_m)
    atomic_write_json(stage_dir / REPEATABILITY_FILE, repeatability)
    summary: dict[str, object] = {"runs": len(runs)}
    for key, row in repeatability.items():
        summary.update({f"repeatability.{key}.{name}": value for name, value in row.items()})
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def _repeatability(runs: list[Run], real: list[np.ndarray], rod_length_m: float) -> dict[str, dict[str, float]]:
    """Per policy: mean and std over starts of the real final forward and lateral displacement (m,
    start frame) and heading change (deg) (seed 000 Table I), and how many of its runs folded the
    prism flat (:func:`~pipeline.gaits.outcome.folded_flat`, rods ``rod_length_m`` long)."""
    out = {}
    for key in dict.fromkeys(r.policy_key for r in runs):
        caps = [c for r, c in zip(runs, real, strict=True) if r.policy_key == key]
        motions = np.array([motion_in_start_frame(c) for c in caps])
        out[key] = {"runs": len(motions), "collapsed_runs": sum(bool(folded_flat(c, rod_length_m)) for c in caps)}
        for j, name in enumerate(("forward_m", "lateral_m", "rotation_deg")):
            out[key][f"{name}_mean"] = float(motions[:, j].mean())
            out[key][f"{name}_std"] = float(motions[:, j].std(ddof=1)) if len(motions) > 1 else 0.0
    return out


@task(name="redeploy-run")
def redeploy_run(
    configs: LoadedConfigs, iteration: int, attach_ref: dict[str, str], gaits_ref: dict[str, str], index: int
) -> str:
    """Prefect task: execute and track planned run ``index`` (skipped if its folder holds it).
    One task run per (policy, start), so the flow's task runner can spread them over hardware
    instances (``redeploy.concurrent_runs``); returns the run's folder name."""
    stage_dir = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign).stage_dir(iteration, STAGE)
    run = planned_runs(configs, Ref.from_json(gaits_ref), stage_dir)[index]
    execute_run(configs, iteration, sysid_robot(configs, Ref.from_json(attach_ref)), run)
    return run.name


def cache_key(context: TaskRunContext | None, parameters: dict) -> str:
    """The Prefect cache key of this stage for the task parameters ``parameters``."""
    inputs = {k: parameters[f"{k}_ref"] for k in ("attach", "gaits")}
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def redeploy(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    gaits_ref: dict[str, str],
) -> dict[str, str]:
    """Prefect task: run :func:`run_redeploy`; log the repeatability figures to MLflow."""
    ref, summary = run_redeploy(configs, iteration, Ref.from_json(attach_ref), Ref.from_json(gaits_ref))
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    for key, value in summary.items():
        client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
    for name in (RUNS_FILE, REPEATABILITY_FILE):
        client.log_artifact(mlflow_run_id, str(Path(ref.path) / name), artifact_path=STAGE)
    return ref.to_json()
