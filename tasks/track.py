"""The ``track`` stage: end-cap trajectories from a collect stage's recordings (DESIGN §1.2).

For every recording folder of the collect stage, :func:`run_track` writes
``<stage>/<policy_id>/tracked.parquet`` (trajectory contract, ``source =
tracked``), plots, and the manifest. With ``track.method = camera`` it runs the
RGB-D + cable tracker (:mod:`pipeline.perception.tracker`); with ``onboard`` the
cable + IMU state estimator (:mod:`pipeline.state_estimation`), which does not
observe translation. When the recording has ground truth (the twin), the summary
carries the tracking error against it. The Prefect task's cache key is the
collect ref's hash, the track and robot configs and the stage version.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from prefect import task
from prefect.context import TaskRunContext

from pipeline.config import LoadedConfigs, RobotConfig, TrackConfig, config_hash
from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo
from pipeline.metrics import pose_errors, truth_at
from pipeline.perception.tracker import CapTracker
from pipeline.plots import error_over_time, top_view_paths
from pipeline.robot_model import build_cables
from pipeline.state_estimation import estimate_trajectory
from storage.files import atomic_write_bytes
from storage.frames import frames_meta, iter_frames
from storage.layout import Ref, RunLayout, read_manifest, write_manifest
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.tracking import client_for
from storage.trajectory import CONF_COLS, caps_array, make_meta, read_trajectory, write_trajectory
from tasks.caching import stage_cache_key

STAGE = "track"
STAGE_VERSION = "1"
TRACKED_FILE = "tracked.parquet"


def recording_folders(collect_ref: Ref) -> list[Path]:
    """The recording folders (each with a hardware trajectory) of a verified collect stage."""
    read_manifest(collect_ref)
    folders = sorted(p.parent for p in Path(collect_ref.path).glob(f"*/{HARDWARE_FILE}"))
    if not folders:
        raise DataError(f"{collect_ref.path}: the collect stage holds no recording ({HARDWARE_FILE})")
    return folders


def camera_from_meta(path: Path) -> CameraInfo:
    """The camera of a frames file, from its validated metadata."""
    camera = dict(frames_meta(path)["camera"])
    camera["camera_to_world"] = np.asarray(camera["camera_to_world"], float)
    if camera["camera_to_world"].shape != (4, 4):
        raise DataError(f"{path}: camera.camera_to_world must be 4 x 4")
    return CameraInfo(**camera)


def track_recording(robot: RobotConfig, config: TrackConfig, folder: Path) -> tuple[pd.DataFrame, dict[str, object]]:
    """Track one recording folder; returns the tracked rows and the run's figures."""
    sensors, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    if config.method == "onboard":
        start = time.perf_counter()
        estimate = estimate_trajectory(sensors, robot)
        wall_s = time.perf_counter() - start
        return estimate.frame, {
            "method": "onboard",
            "samples": len(estimate.frame),
            "skipped": {"missing_or_invalid_sensor_values": estimate.n_skipped},
            "wall_s": wall_s,
            "samples_per_s": len(estimate.frame) / wall_s if wall_s > 0 else float("nan"),
        }
    frames = folder / FRAMES_FILE
    if not frames.is_file():
        raise DataError(f"{frames}: track.method 'camera' needs camera frames; use 'onboard' for a recording without")
    tracker = CapTracker(robot, camera_from_meta(frames), config, build_cables(robot, robot.attachment.phase_rad))
    tracked, stats = tracker.track(iter_frames(frames, tolerant=True), sensors)
    ground = stats.ground
    return tracked, {
        "method": "camera",
        "samples": stats.frames_tracked,
        "frames_in": stats.frames_in,
        "skipped": dict(stats.skipped),
        "sightings": stats.sightings,
        "sightings_rejected": stats.sightings_rejected,
        "wall_s": stats.wall_s,
        "samples_per_s": stats.frames_per_s,
        "ground_tilt_correction_deg": ground.tilt_correction_deg if ground else float("nan"),
        "ground_height_correction_m": ground.height_correction_m if ground else float("nan"),
        "ground_inlier_ratio": ground.inlier_ratio if ground else float("nan"),
        "ground_rms_m": ground.rms_m if ground else float("nan"),
        "ground_camera_to_world": ground.camera_to_world.tolist() if ground else None,
    }


def write_tracked(
    path: Path,
    tracked: pd.DataFrame,
    figures: dict[str, object],
    robot: RobotConfig,
    configs: LoadedConfigs,
    iteration: int,
    policy_id: str,
) -> None:
    """Write tracked rows as a ``source = tracked`` trajectory with the tracker's ``figures``."""
    meta = make_meta(
        source="tracked",
        robot_config_hash=config_hash(robot),
        campaign=configs.pipeline.campaign,
        iteration=iteration,
        policy_id=policy_id,
        sample_rate_hz=float((len(tracked) - 1) / max(np.ptp(tracked["t"].to_numpy()), 1e-9)),
        complete=True,
        tracking=figures,
    )
    write_trajectory(path, tracked, meta)


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
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    stage_dir = layout.stage_dir(iteration, STAGE)
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


def cache_key(context: TaskRunContext | None, parameters: dict) -> str:
    """The Prefect cache key of this stage for the task parameters ``parameters``."""
    inputs = {"collect": parameters["collect_ref"]}
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def track(configs: LoadedConfigs, iteration: int, mlflow_run_id: str, collect_ref: dict[str, str]) -> dict[str, str]:
    """Prefect task: run :func:`run_track`, log its figures and plots to MLflow, return the ref as JSON."""
    ref, summary = run_track(configs, iteration, Ref.from_json(collect_ref))
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    for recording in summary["recordings"]:
        for key, value in recording.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value):
                client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
        for png in sorted((Path(ref.path) / recording["policy_id"] / "plots").glob("*.png")):
            client.log_artifact(mlflow_run_id, str(png), artifact_path=f"{STAGE}/{recording['policy_id']}")
    return ref.to_json()
