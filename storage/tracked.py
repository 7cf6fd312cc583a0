"""Tracked trajectories: a recording folder tracked into end-cap positions, and its file.

:func:`track_recording` runs the tracker the track config names on one recording folder
(``hardware.parquet`` and, for the camera tracker, ``frames.parquet``); :func:`write_tracked`
writes the result as ``tracked.parquet`` (trajectory contract, ``source = tracked``). The
track stage and the redeploy stage (which tracks each run it records) share both.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import LoadedConfigs, RobotConfig, TrackConfig, config_hash
from pipeline.errors import DataError
from pipeline.perception.tracker import CapTracker
from pipeline.progress import progress
from pipeline.robot_model import build_cables
from pipeline.state_estimation import estimate_trajectory
from storage.frames import camera_from_meta, frame_count, iter_frames
from storage.recording import FRAMES_FILE, GIVEN_CAPS_FILE, HARDWARE_FILE
from storage.tables import read_meta
from storage.trajectory import make_meta, read_trajectory, write_trajectory

TRACKED_FILE = "tracked.parquet"


def tracking_key(robot: RobotConfig, config: TrackConfig) -> str:
    """What a tracked trajectory depends on besides its recording: the robot config (with its
    attachment overlay) and the track config, hashed; stored in its metadata (``tracking_key``)."""
    return f"{config_hash(robot)}-{config_hash(config)}"


def tracked_under(path: Path) -> str | None:
    """The ``tracking_key`` a tracked trajectory file was written under; None if there is no file."""
    return read_meta(path).get("tracking_key") if path.is_file() else None


def track_recording(robot: RobotConfig, config: TrackConfig, folder: Path) -> tuple[pd.DataFrame, dict[str, object]]:
    """Track one recording folder; returns the tracked rows and the run's figures. End caps that
    came with the recording (an import, :data:`~storage.recording.GIVEN_CAPS_FILE`) are taken as
    they are, whatever the method."""
    if (folder / GIVEN_CAPS_FILE).is_file():
        given, meta = read_trajectory(folder / GIVEN_CAPS_FILE, expect_source="tracked")
        return given, {"method": "given", "samples": len(given), "source": str(meta.model_extra.get("source_dir"))}
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
    with progress(f"track {folder.name}", frame_count(frames), "frames") as row:
        tracked, stats = tracker.track(row.over(iter_frames(frames, tolerant=True)), sensors)
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
    """Write tracked rows as a ``source = tracked`` trajectory with the tracker's ``figures`` and
    the :func:`tracking_key` of ``robot`` and the track config."""
    meta = make_meta(
        source="tracked",
        robot_config_hash=config_hash(robot),
        campaign=configs.pipeline.campaign,
        iteration=iteration,
        policy_id=policy_id,
        sample_rate_hz=float((len(tracked) - 1) / max(np.ptp(tracked["t"].to_numpy()), 1e-9)),
        complete=True,
        tracking=figures,
        tracking_key=tracking_key(robot, configs.pipeline.track),
    )
    write_trajectory(path, tracked, meta)
