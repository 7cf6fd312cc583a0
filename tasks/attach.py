"""The ``attach`` stage: cable attachment points from the tracked rest state.

:func:`run_attach` averages the tracked end caps and the sensed cable lengths over the first
``attach.rest_window_s`` seconds of the first recording (the robot starts at rest), infers the
attachment points (:func:`pipeline.attachment.infer_attachment`) and writes
``attachment.yaml``: a robot-config overlay the engine reads through
:func:`storage.catalog.attached_robot`, plus ``attachment.json`` (points and residuals), a plot
and the manifest.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import yaml
from prefect import task

from pipeline.attachment import AttachmentEstimate, config_attachment, infer_attachment
from pipeline.config import LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.errors import DataError
from pipeline.plots import attachment_views
from storage.catalog import ATTACH_OVERLAY_FILE, ATTACHMENT_FILE, tracked_file
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import HARDWARE_FILE, recording_folders
from storage.tracking import StageContext
from storage.trajectory import CABLE_COLS, caps_array, read_trajectory

STAGE = "attach"
log = logging.getLogger(__name__)


def rest_state(track_ref: Ref, collect_ref: Ref, window_s: float) -> tuple[str, np.ndarray, np.ndarray | None]:
    """Policy id, mean tracked end caps (6, 3) m and mean sensed cable lengths (9,) m over
    the first ``window_s`` seconds of the first recording (None: it has no cable readings)."""
    folder = recording_folders(collect_ref)[0]
    tracked, _ = read_trajectory(tracked_file(track_ref, folder.name), expect_source="tracked")
    sensors, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    caps = caps_array(tracked)[tracked["t"].to_numpy() <= tracked["t"].iloc[0] + window_s]
    if not meta.cables_recorded:
        if len(caps) == 0:
            raise DataError(f"{folder}: no tracked frame in the first {window_s} s (the rest state)")
        return folder.name, caps.mean(axis=0), None
    cables = sensors[CABLE_COLS].to_numpy()[sensors["t"].to_numpy() <= sensors["t"].iloc[0] + window_s]
    cables = cables[np.isfinite(cables).all(axis=1)]
    if len(caps) == 0 or len(cables) == 0:
        raise DataError(f"{folder}: no tracked frame or cable reading in the first {window_s} s (the rest state)")
    return folder.name, caps.mean(axis=0), cables.mean(axis=0)


def write_attachment(stage_dir: Path, robot: RobotConfig, estimate: AttachmentEstimate, caps: np.ndarray) -> None:
    """Write the overlay (validated against ``robot``), the details and the plot."""
    overlay_path = stage_dir / ATTACH_OVERLAY_FILE
    robot_with_overlay(robot, estimate.overlay(), overlay_path)
    atomic_write_bytes(overlay_path, yaml.safe_dump(estimate.overlay(), sort_keys=False).encode())
    atomic_write_json(
        stage_dir / ATTACHMENT_FILE,
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
    if cables is None:  # end caps only: the cable readings that would place the points are missing
        log.warning("attach: %s has no cable readings; keeping the robot config's attachment points", policy_id)
        estimate = config_attachment(robot, caps)
    else:
        estimate = infer_attachment(robot, caps, cables)
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    write_attachment(stage_dir, robot, estimate, caps)
    summary: dict[str, object] = {
        "policy_id": policy_id,
        **{f"phase_rad_{r}": p for r, p in enumerate(estimate.phase_rad)},
        "centre_rod": estimate.centre_rod,
        "arrangement": estimate.arrangement,
        "rest_cable_residual_rms_m": float(np.sqrt(np.mean(estimate.cable_residual_m**2))),
        "inferred": cables is not None,
    }
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


@task(name=STAGE)
def attach(
    configs: LoadedConfigs, iteration: int, mlflow_run_id: str, track_ref: dict[str, str], collect_ref: dict[str, str]
) -> dict[str, str]:
    """Prefect task: run :func:`run_attach`, log the phases and plot to MLflow, return the ref as JSON."""
    ref, summary = run_attach(configs, iteration, Ref.from_json(track_ref), Ref.from_json(collect_ref))
    artifacts = [Path(ref.path) / "plots" / "attachment.png", Path(ref.path) / ATTACH_OVERLAY_FILE]
    tags = {"arrangement": str(summary["arrangement"])}
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, artifacts, tags=tags)
    return ref.to_json()
