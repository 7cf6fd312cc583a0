"""The ``redeploy`` stage: the expanded gaits on the hardware, tracked.

:func:`run_redeploy` runs every policy of the gaits stage (``redeploy.policies``) from every
start pose (``redeploy.starts``) on the hardware, one recording folder per run
(``<policy>-start<k>/``: hardware stream, ground truth where the backend has it, frames,
``policy.json``; :mod:`storage.redeploy_runs`), and tracks each with the perception stage's
tracker (``tracked.parquet``). It writes the run list (``runs.json``) and the real robot's
repeatability across starts per policy (final displacement in the start's frame and heading
change, mean and std, as in the R2S2R paper's repeatability table). The recording folders have
the collect stage's layout plus ``tracked.parquet``, so the next iteration's sysid can read
them; the ``evaluate`` stage replays them in the engine for the sim-to-real gap.

A run whose folder already holds a complete recording of the same policy and its tracking is
not run again, so a stage that died mid-way resumes where it stopped: its finished runs are
kept, and the run it was recording when it died (the part files a killed process left are
merged first, :func:`storage.recording.recover_recording`) is kept aside under
``set-aside/`` and recorded again from its start pose. In the flow each run is
its own task run (:func:`redeploy_run`) before the stage task gathers them, so a parallel task
runner can spread them.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
from prefect import task

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.gaits.outcome import folded_flat
from pipeline.hardware import robot_for
from pipeline.hardware.base import Robot, StartPose
from pipeline.metrics import motion_in_start_frame
from storage.catalog import REPEATABILITY_FILE, RUNS_FILE, attached_robot
from storage.files import atomic_write_json
from storage.layout import Ref, RunLayout, set_aside, write_manifest
from storage.recording import open_recording, record_run, recover_recording, write_policy_json
from storage.redeploy_runs import RUN_FIELDS, Run, planned_runs
from storage.tracked import TRACKED_FILE, track_recording, tracking_key, write_tracked
from storage.tracking import StageContext

STAGE = "redeploy"
KEY_FIELDS = ("redeploy", "track", *RUN_FIELDS)
"""The config fields the stage's output depends on: its runs' (:data:`storage.redeploy_runs.RUN_FIELDS`),
the runs and starts (``redeploy``) and the tracking of each run (``track``)."""


def set_aside_other_runs(configs: LoadedConfigs, iteration: int, gaits_ref: Ref, fresh: bool = False) -> None:
    """Keep the stage folder aside (``set-aside/iter_<k>/redeploy.replaced-<time>``) if it holds
    other runs than those planned now (the gaits, the start poses or the hardware changed since),
    or any run when ``fresh`` (every run is to be recorded again): recorded runs are never
    overwritten."""
    layout = RunLayout.of(configs)
    stage_dir = layout.stage_dir(iteration, STAGE)
    if fresh and stage_dir.exists():
        set_aside(layout, stage_dir, "replaced")
        return
    if any(run.recorded_by_another() for run in planned_runs(configs, gaits_ref, stage_dir)):
        set_aside(layout, stage_dir, "replaced")


def execute_run(
    configs: LoadedConfigs, iteration: int, robot_config: RobotConfig, run: Run, hardware: Robot | None = None
) -> None:
    """Record ``run`` on ``hardware`` (the configured backend if None) and track it into its folder;
    skipped if the folder already holds it, only tracked if it holds the recording. What an
    interrupted recording left in the folder is recovered and kept aside first (module docstring)."""
    key = tracking_key(robot_config, configs.pipeline.track)
    if run.complete(key):
        return
    if run.folder.exists():
        recover_recording(run.folder)
        if not run.recorded():
            set_aside(RunLayout.of(configs), run.folder, "incomplete")
    if not run.recorded():
        run.folder.mkdir(parents=True)
        write_policy_json(run.folder, run.policy.name, run.policy.policy_id, run.policy.targets, run.recorded_as)
        timeout_s = configs.pipeline.redeploy.segment_timeout_s
        start = StartPose(run.start.x_m, run.start.y_m, math.radians(run.start.yaw_deg))
        record = configs.pipeline.collect.record_frames
        with robot_for(configs, hardware) as robot:
            recording = open_recording(configs, iteration, run.name, run.folder, robot, timeout_s)
            record_run(robot, run.policy, recording, record, start=start)
    tracked, figures = track_recording(robot_config, configs.pipeline.track, run.folder)
    write_tracked(run.folder / TRACKED_FILE, tracked, figures, robot_config, configs, iteration, run.name)


def run_redeploy(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    gaits_ref: Ref,
    hardware: Robot | None = None,
) -> tuple[Ref, dict[str, object]]:
    """Run and track every planned run; write the run list and the repeatability figures. Returns
    the ref and the summary (repeatability per policy)."""
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    runs = planned_runs(configs, gaits_ref, stage_dir)
    robot = attached_robot(configs, attach_ref)
    try:
        with contextlib.ExitStack() as opened:
            for run in runs:
                if not run.recorded() and hardware is None:
                    hardware = opened.enter_context(robot_for(configs))
                execute_run(configs, iteration, robot, run, hardware)
    except BaseException as exc:
        done = [r.name for r in runs if r.complete(tracking_key(robot, configs.pipeline.track))]
        write_manifest(
            stage_dir, STAGE, complete=False, summary={"runs_complete": done, "error": f"{type(exc).__name__}: {exc}"}
        )
        raise
    real = [run.tracked_caps() for run in runs]
    atomic_write_json(stage_dir / RUNS_FILE, [run.to_json() for run in runs])
    repeatability = _repeatability(runs, real, robot.rod.length_m)
    atomic_write_json(stage_dir / REPEATABILITY_FILE, repeatability)
    summary: dict[str, object] = {"runs": len(runs)}
    for key, row in repeatability.items():
        summary.update({f"repeatability.{key}.{name}": value for name, value in row.items()})
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def _repeatability(runs: list[Run], real: list[np.ndarray], rod_length_m: float) -> dict[str, dict[str, float]]:
    """Per policy: mean and std over starts of the real final forward and lateral displacement (m,
    start frame) and heading change (deg), and how many of its runs folded the prism flat
    (:func:`~pipeline.gaits.outcome.folded_flat`, rods ``rod_length_m`` long)."""
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
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    run = planned_runs(configs, Ref.from_json(gaits_ref), stage_dir)[index]
    execute_run(configs, iteration, attached_robot(configs, Ref.from_json(attach_ref)), run)
    return run.name


@task(name=STAGE)
def redeploy(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    gaits_ref: dict[str, str],
) -> dict[str, str]:
    """Prefect task: run :func:`run_redeploy`; log the repeatability figures to MLflow."""
    ref, summary = run_redeploy(configs, iteration, Ref.from_json(attach_ref), Ref.from_json(gaits_ref))
    files = [Path(ref.path) / name for name in (RUNS_FILE, REPEATABILITY_FILE)]
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, files)
    return ref.to_json()
