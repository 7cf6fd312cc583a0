"""The ``attach`` stage: cable attachment points from the tracked rest state (DESIGN §1.3).

:func:`run_attach` averages the tracked end caps and the sensed cable lengths
over the first ``attach.rest_window_s`` seconds of the first recording (the
robot starts at rest), infers the attachment points
(:func:`pipeline.attachment.infer_attachment`) and writes
``<stage>/attachment.yaml``: a robot-config overlay the engine reads through
:func:`pipeline.config.robot_with_overlay`, plus ``attachment.json`` (points and
residuals), a plot and the manifest. Cache key: the track and collect refs'
hashes, the attach and robot configs and the stage version.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml
from prefect import task
from prefect.context import TaskRunContext

from pipeline.attachment import AttachmentEstimate, infer_attachment
from pipeline.config import LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.errors import DataError
from pipeline.plots import attachment_views
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import HARDWARE_FILE
from storage.tracking import client_for
from storage.trajectory import CABLE_COLS, caps_array, read_trajectory
from tasks.caching import stage_cache_key
from tasks.track import TRACKED_FILE, recording_folders

STAGE = "attach"
STAGE_VERSION = "1"
OVERLAY_FILE = "attachment.yaml"


def rest_state(track_ref: Ref, collect_ref: Ref, window_s: float) -> tuple[str, np.ndarray, np.ndarray]:
    """Policy id, mean tracked end caps (6, 3) m and mean sensed cable lengths (9,) m over
    the first ``window_s`` seconds of the first recording."""
    folder = recording_folders(collect_ref)[0]
    tracked, _ = read_trajectory(Path(track_ref.path) / folder.name / TRACKED_FILE, expect_source="tracked")
    sensors, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    caps = caps_array(tracked)[tracked["t"].to_numpy() <= tracked["t"].iloc[0] + window_s]
    cables = sensors[CABLE_COLS].to_numpy()[sensors["t"].to_numpy() <= sensors["t"].iloc[0] + window_s]
    cables = cables[np.isfinite(cables).all(axis=1)]
    if len(caps) == 0 or len(cables) == 0:
        raise DataError(f"{folder}: no tracked frame or cable reading in the first {window_s} s (the rest state)")
    return folder.name, caps.mean(axis=0), cables.mean(axis=0)


def write_attachment(stage_dir: Path, robot: RobotConfig, estimate: AttachmentEstimate, caps: np.ndarray) -> None:
    """Write the overlay (validated against ``robot``), the details and the plot."""
    overlay_path = stage_dir / OVERLAY_FILE
    robot_with_overlay(robot, estimate.overlay(), overlay_path)
    atomic_write_bytes(overlay_path, yaml.safe_dump(estimate.overlay(), sort_keys=False).encode())
    atomic_write_json(
        stage_dir / "attachment.json",
        {
            "phase_rad": list(estimate.phase_rad),
            "centre_rod": estimate.centre_rod,
            "arrangement": estimate.arrangement,
            "points_m": estimate.points_m.tolist(),
            "rest_caps_m": caps.tolist(),
            "cable_residual_m": estimate.cable_residual_m.tolist(),
        },
    )
    atomic_write_bytes(stage_dir / "plots" / "attachment.png", attachment_views(caps, estimate.points_m))


def run_attach(
    configs: LoadedConfigs, iteration: int, track_ref: Ref, collect_ref: Ref
) -> tuple[Ref, dict[str, object]]:
    """Infer the attachment points and write the stage output. Returns the ref and summary."""
    robot = configs.robot
    policy_id, caps, cables = rest_state(track_ref, collect_ref, configs.pipeline.attach.rest_window_s)
    estimate = infer_attachment(robot, caps, cables)
    stage_dir = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    write_attachment(stage_dir, robot, estimate, caps)
    summary: dict[str, object] = {
        "policy_id": policy_id,
        **{f"phase_rad_{r}": p for r, p in enumerate(estimate.phase_rad)},
        "centre_rod": estimate.centre_rod,
        "arrangement": estimate.arrangement,
        "rest_cable_residual_rms_m": float(np.sqrt(np.mean(estimate.cable_residual_m**2))),
    }
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def cache_key(context: TaskRunContext | None, parameters: dict) -> str:
    """The Prefect cache key of this stage for the task parameters ``parameters``."""
    inputs = {"track": parameters["track_ref"], "collect": parameters["collect_ref"]}
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def attach(
    configs: LoadedConfigs, iteration: int, mlflow_run_id: str, track_ref: dict[str, str], collect_ref: dict[str, str]
) -> dict[str, str]:
    """Prefect task: run :func:`run_attach`, log the phases and plot to MLflow, return the ref as JSON."""
    ref, summary = run_attach(configs, iteration, Ref.from_json(track_ref), Ref.from_json(collect_ref))
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    for key, value in summary.items():
        if isinstance(value, int | float):
            client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
    client.set_tag(mlflow_run_id, f"{STAGE}.arrangement", str(summary["arrangement"]))
    client.log_artifact(mlflow_run_id, str(Path(ref.path) / "plots" / "attachment.png"), artifact_path=STAGE)
    client.log_artifact(mlflow_run_id, str(Path(ref.path) / OVERLAY_FILE), artifact_path=STAGE)
    return ref.to_json()
