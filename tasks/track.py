"""The ``track`` stage: end-cap trajectories from a collect stage's recordings.

For every recording folder of the collect stage, :func:`run_track` writes
``<stage>/<policy_id>/tracked.parquet`` (trajectory contract, ``source = tracked``), plots,
and the manifest. With ``track.method = camera`` it runs the RGB-D + cable tracker
(:mod:`pipeline.perception.tracker`); with ``onboard`` the cable + IMU state estimator
(:mod:`pipeline.state_estimation`), which does not observe translation. When the recording
has ground truth (the twin), the summary carries the tracking error against it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.metrics import pose_errors, truth_at
from pipeline.plots import error_over_time, top_view_paths
from storage.files import atomic_write_bytes
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import GROUNDTRUTH_FILE, recording_folders
from storage.tracked import TRACKED_FILE, track_recording, write_tracked
from storage.tracking import StageContext
from storage.trajectory import CONF_COLS, caps_array, read_trajectory

STAGE = "track"


def _evaluate(robot: RobotConfig, folder: Path, tracked: pd.DataFrame, centred: bool, out: Path) -> dict[str, float]:
    """Errors against the recording's ground truth (empty without one); writes the error plot."""
    if not (folder / GROUNDTRUTH_FILE).is_file():
        return {}
    truth_df, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
    caps = caps_array(tracked)
    t = tracked["t"].to_numpy()
    truth = truth_at(t, truth_df["t"].to_numpy(), caps_array(truth_df))
    errors = pose_errors(robot, caps, truth, centred=centred)
    if centred:
        caps, truth = caps - caps.mean(axis=1, keepdims=True), truth - truth.mean(axis=1, keepdims=True)
    per_cap_mm = np.linalg.norm(caps - truth, axis=-1) * 1e3
    conf = tracked[CONF_COLS].to_numpy() if set(CONF_COLS) <= set(tracked.columns) else np.ones_like(per_cap_mm)
    atomic_write_bytes(out / "plots" / "error.png", error_over_time(t, per_cap_mm, conf, "tracking error vs truth"))
    return errors


def run_track(configs: LoadedConfigs, iteration: int, collect_ref: Ref) -> tuple[Ref, dict[str, object]]:
    """Track every recording of ``collect_ref`` and write the stage output (replacing an
    earlier one only once the new one is complete). Returns the stage ref and summary."""
    robot, config = configs.robot, configs.pipeline.track
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{STAGE}-", dir=stage_dir.parent))
    try:
        summary: dict[str, object] = {"method": config.method, "recordings": []}
        for folder in recording_folders(collect_ref):
            tracked, figures = track_recording(robot, config, folder)
            out = work / folder.name
            write_tracked(out / TRACKED_FILE, tracked, figures, robot, configs, iteration, folder.name)
            atomic_write_bytes(
                out / "plots" / "top_view.png", top_view_paths(caps_array(tracked), f"tracked: {folder.name}")
            )
            errors = _evaluate(robot, folder, tracked, centred=config.method == "onboard", out=out)
            errors = {f"error_{k}": v for k, v in errors.items()}
            summary["recordings"].append({"policy_id": folder.name, **figures, **errors})
        ref = write_manifest(work, STAGE, complete=True, summary=summary)
        if stage_dir.exists():
            shutil.rmtree(stage_dir)
        work.rename(stage_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Ref(path=str(stage_dir), sha256=ref.sha256), summary


@task(name=STAGE)
def track(configs: LoadedConfigs, iteration: int, mlflow_run_id: str, collect_ref: dict[str, str]) -> dict[str, str]:
    """Prefect task: run :func:`run_track`, log its figures and plots to MLflow, return the ref as JSON."""
    ref, summary = run_track(configs, iteration, Ref.from_json(collect_ref))
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        for recording in summary["recordings"]:
            plots = sorted((Path(ref.path) / recording["policy_id"] / "plots").glob("*.png"))
            context.log(recording, plots, folder=recording["policy_id"])
    return ref.to_json()
