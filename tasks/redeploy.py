"""The ``redeploy`` stage: the expanded gaits on the hardware, tracked, and the sim-to-real gap
(DESIGN §1.6; seed 000 Tables I-II).

:func:`run_redeploy` runs every policy of the gaits stage (``redeploy.policies``) from
every start pose (``redeploy.starts``) on the hardware, one recording folder per run
(``<policy>-start<k>/``: hardware stream, ground truth where the backend has it,
frames), tracks each with the perception stage's tracker (``tracked.parquet``), and
replays each run in the engine from its tracked start, with the robot config's
parameters ("before" sysid) and with the identified ones ("after"). Figures per run
and engine: final centre-of-mass error (m and % of rod length) and heading error
(deg), sim vs real; per policy, the real robot's repeatability across starts (final
displacement in the start's frame and heading change, mean and std). The recording
folders have the collect stage's layout plus ``tracked.parquet``, so the next
iteration's sysid can read them.

A run whose folder already holds a complete recording of the same policy and its
tracking is not run again, so a stage that died mid-way resumes where it stopped. In
the flow each run is its own task run (:func:`redeploy_run`) before the stage task
evaluates them, so a parallel task runner can spread them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from prefect import task
from prefect.context import TaskRunContext

from pipeline.config import LoadedConfigs, RobotConfig, StartPoseConfig
from pipeline.errors import DataError
from pipeline.gaits.outcome import heading_change_rad, simulate_targets
from pipeline.hardware import make_robot
from pipeline.hardware.base import Robot, StartPose
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.plots import replay_paths
from pipeline.policies import Policy
from pipeline.robot_model import heading_rad
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import HARDWARE_FILE
from storage.tables import write_table
from storage.tracking import client_for
from storage.trajectory import caps_array, read_trajectory
from tasks.caching import stage_cache_key
from tasks.collect import POLICY_FILE, open_recording, record_run, write_policy_json
from tasks.gaits import POLICIES_FILE, identified_robot
from tasks.sysid import sysid_robot
from tasks.track import TRACKED_FILE, track_recording, write_tracked

STAGE = "redeploy"
STAGE_VERSION = "1"
GAP_FILE = "gap.parquet"
REPEATABILITY_FILE = "repeatability.json"
ENGINES = ("before", "after")
"""The engines each run is replayed in: the robot config's parameters, and the identified ones."""


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
    recording = open_recording(configs, iteration, run.name, run.folder, hardware)
    start = StartPose(run.start.x_m, run.start.y_m, math.radians(run.start.yaw_deg))
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    record = configs.pipeline.collect.record_frames
    record_run(hardware, run.policy, recording, timeout_s, record, start=start, show_progress=False)
    tracked, figures = track_recording(robot_config, configs.pipeline.track, run.folder)
    write_tracked(run.folder / TRACKED_FILE, tracked, figures, robot_config, configs, iteration, run.name)


def _wrap_deg(angle_rad: np.ndarray) -> np.ndarray:
    return np.degrees((angle_rad + np.pi) % (2 * np.pi) - np.pi)


def motion_in_start_frame(caps_m: np.ndarray) -> tuple[float, float, float]:
    """Final centroid displacement (forward along the start heading, lateral; m) and heading
    change (deg, ccw positive, unwrapped) of end caps ``caps_m`` (T, 6, 3)."""
    heading = float(heading_rad(caps_m[0]))
    forward = np.array([math.cos(heading), math.sin(heading)])
    lateral = np.array([-forward[1], forward[0]])
    displacement = caps_m[-1].mean(0)[:2] - caps_m[0].mean(0)[:2]
    return float(displacement @ forward), float(displacement @ lateral), math.degrees(heading_change_rad(caps_m))


def replay_runs(
    robot: RobotConfig, runs: list[Run], starts_m: np.ndarray, timeout_s: float, dt_s: float
) -> list[np.ndarray]:
    """The engine with ``robot``'s parameters running each run's policy from its tracked start
    caps ``starts_m`` (R, 6, 3), one batch per policy; each run's end caps (T, 6, 3)."""
    engine = Engine(RobotModel.from_robot(robot), dt=dt_s)
    out: list[np.ndarray | None] = [None] * len(runs)
    for key in dict.fromkeys(r.policy_key for r in runs):
        rows = [i for i, r in enumerate(runs) if r.policy_key == key]
        params = Params.from_robot(robot, batch=len(rows))
        state = settle(
            engine, params, state_from_caps(engine, params, starts_m[rows]), robot.pid, np.ones(6), duration_s=1.0
        )
        outcome = simulate_targets(engine, params, robot, state, runs[rows[0]].policy.targets, timeout_s)
        finished = outcome.trace.finished.numpy()
        for j, i in enumerate(rows):
            end = int(finished[j].argmax()) if finished[j].any() else finished.shape[1] - 1
            out[i] = outcome.trace.caps_m[j, : end + 1].numpy()
    return out


def run_redeploy(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    sysid_ref: Ref,
    gaits_ref: Ref,
    hardware: Robot | None = None,
) -> tuple[Ref, dict[str, object]]:
    """Run, track and compare every planned run; write the stage output. Returns ref and summary."""
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    stage_dir = layout.stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    runs = planned_runs(configs, gaits_ref, stage_dir)
    engines = {"before": sysid_robot(configs, attach_ref), "after": identified_robot(configs, attach_ref, sysid_ref)}
    try:
        for run in runs:
            if not _complete(run):
                hardware = make_robot(configs) if hardware is None else hardware
                execute_run(configs, iteration, engines["before"], run, hardware)
    except BaseException as exc:
        done = [r.name for r in runs if _complete(r)]
        write_manifest(
            stage_dir, STAGE, complete=False, summary={"runs_complete": done, "error": f"{type(exc).__name__}: {exc}"}
        )
        raise
    real = [caps_array(read_trajectory(r.folder / TRACKED_FILE, expect_source="tracked")[0]) for r in runs]
    starts = np.stack([caps[0] for caps in real])
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    dt_s = configs.pipeline.gaits.search.dt_s
    sims = {label: replay_runs(robot, runs, starts, timeout_s, dt_s) for label, robot in engines.items()}
    rod_m = configs.robot.rod.length_m
    rows = []
    for i, run in enumerate(runs):
        real_motion = motion_in_start_frame(real[i])
        for label in ENGINES:
            sim = sims[label][i]
            sim_motion = motion_in_start_frame(sim)
            com_error = float(np.linalg.norm(sim[-1].mean(0)[:2] - real[i][-1].mean(0)[:2]))
            heading_error = float(abs(_wrap_deg(heading_rad(sim[-1]) - heading_rad(real[i][-1]))))
            rows.append(
                {
                    "policy": run.policy_key,
                    "start": run.start_index,
                    "engine": label,
                    "com_error_m": com_error,
                    "com_error_pct_rod": 100.0 * com_error / rod_m,
                    "heading_error_deg": heading_error,
                    "sim_forward_m": sim_motion[0],
                    "real_forward_m": real_motion[0],
                    "sim_rotation_deg": sim_motion[2],
                    "real_rotation_deg": real_motion[2],
                }
            )
    write_table(stage_dir / GAP_FILE, pa.Table.from_pylist(rows), {"stage": STAGE})
    repeatability = _repeatability(runs, real)
    atomic_write_json(stage_dir / REPEATABILITY_FILE, repeatability)
    for i, run in enumerate(runs):
        engine_caps = {f"engine {label}": sims[label][i] for label in ENGINES}
        image = replay_paths(real[i], engine_caps, f"{run.name}: sim vs real")
        atomic_write_bytes(stage_dir / "plots" / f"{run.name}.png", image)
    summary = _summary(rows, repeatability)
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def _repeatability(runs: list[Run], real: list[np.ndarray]) -> dict[str, dict[str, float]]:
    """Per policy: mean and std over starts of the real final forward and lateral displacement (m,
    start frame) and heading change (deg) (seed 000 Table I)."""
    out = {}
    for key in dict.fromkeys(r.policy_key for r in runs):
        motions = np.array([motion_in_start_frame(c) for r, c in zip(runs, real, strict=True) if r.policy_key == key])
        out[key] = {"runs": len(motions)}
        for j, name in enumerate(("forward_m", "lateral_m", "rotation_deg")):
            out[key][f"{name}_mean"] = float(motions[:, j].mean())
            out[key][f"{name}_std"] = float(motions[:, j].std(ddof=1)) if len(motions) > 1 else 0.0
    return out


def _summary(rows: list[dict], repeatability: dict[str, dict[str, float]]) -> dict[str, object]:
    summary: dict[str, object] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for label in ENGINES:
            own = [r for r in rows if r["policy"] == policy and r["engine"] == label]
            for key in ("com_error_m", "com_error_pct_rod", "heading_error_deg"):
                summary[f"gap.{label}.{policy}.{key}"] = float(np.mean([r[key] for r in own]))
        for key, value in repeatability[policy].items():
            summary[f"repeatability.{policy}.{key}"] = value
    for label in ENGINES:
        own = [r for r in rows if r["engine"] == label]
        summary[f"gap.{label}.com_error_m"] = float(np.mean([r["com_error_m"] for r in own]))
        summary[f"gap.{label}.heading_error_deg"] = float(np.mean([r["heading_error_deg"] for r in own]))
    return summary


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
    inputs = {k: parameters[f"{k}_ref"] for k in ("attach", "sysid", "gaits")}
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def redeploy(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    gaits_ref: dict[str, str],
) -> dict[str, str]:
    """Prefect task: run :func:`run_redeploy`; log the gap and repeatability figures and the
    sim-vs-real plots to MLflow."""
    ref, summary = run_redeploy(
        configs, iteration, Ref.from_json(attach_ref), Ref.from_json(sysid_ref), Ref.from_json(gaits_ref)
    )
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    for key, value in summary.items():
        client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
    for name in (GAP_FILE, REPEATABILITY_FILE):
        client.log_artifact(mlflow_run_id, str(Path(ref.path) / name), artifact_path=STAGE)
    for path in sorted((Path(ref.path) / "plots").glob("*.png")):
        client.log_artifact(mlflow_run_id, str(path), artifact_path=STAGE)
    return ref.to_json()
