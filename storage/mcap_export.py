"""Recordings as MCAP files for Foxglove (``r2s2r export-mcap``).

Each recording folder of a stage (collect, redeploy, follow) becomes one MCAP file written with
the Foxglove SDK on the channels of :class:`~storage.scene.RobotScene`: the sensors' time series,
the camera's images as stored (PNG, not decoded), its pose and intrinsics, the ground, the twin's
true poses where the recording has them, the tracked end caps (the track stage's output for a
collect recording, the run's own for a redeploy or follow run) and the engines' replays the
evaluate stage stored for a redeploy run, as ghosts. ``docs/foxglove-layout.json`` is a Foxglove
layout for these channels (``docs/foxglove.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import foxglove
import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipeline.config import RobotConfig
from pipeline.errors import DataError
from pipeline.hardware.base import SensorPacket
from pipeline.progress import progress
from storage.catalog import REPLAYS_FILE
from storage.files import commit_temp, temp_sibling
from storage.frames import camera_from_meta, frame_count, iter_encoded_frames
from storage.layout import RunLayout, complete_stage_ref, existing_ref
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE, recording_folders
from storage.scene import RobotScene
from storage.tracked import TRACKED_FILE
from storage.trajectory import (
    CABLE_COLS,
    CONTROL_COLS,
    MOTOR_COLS,
    TARGET_COLS,
    caps_array,
    read_trajectory,
)


@dataclass(frozen=True)
class Export:
    """One exported recording: the MCAP file and how many messages each topic got."""

    path: Path
    messages: dict[str, int]
    start_s: float
    end_s: float


def export_recording(
    robot: RobotConfig,
    folder: Path,
    out: Path,
    tracked: Path | None = None,
    replays: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Export:
    """Write the recording in ``folder`` as the MCAP file ``out`` (atomically): its sensors, its
    camera frames and ground truth where it has them, the tracked end caps in ``tracked`` (a
    tracked-trajectory file) and each engine's replay in ``replays`` (engine: times (T,) s and end
    caps (T, 6, 3) m). Returns the file and the messages written per topic."""
    sensors, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    if sensors.empty:
        raise DataError(f"{folder / HARDWARE_FILE}: the recording holds no sample")
    robots: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if (folder / GROUNDTRUTH_FILE).is_file():
        truth, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
        robots["truth"] = (truth["t"].to_numpy(float), caps_array(truth))
    if tracked is not None and tracked.is_file():
        caps, _ = read_trajectory(tracked, expect_source="tracked")
        robots["tracked"] = (caps["t"].to_numpy(float), caps_array(caps))
    for engine, replay in (replays or {}).items():
        robots[f"replay_{engine}"] = replay
    scene = RobotScene(robot, tuple(robots))
    counts: dict[str, int] = {}
    with temp_sibling(out) as partial:
        _write(scene, folder, sensors, robots, partial, counts)
        commit_temp(partial, out)
    times = [t for t, _ in robots.values() if len(t)]
    start_s = min([float(sensors["t"].iloc[0]), *(float(t[0]) for t in times)])
    end_s = max([float(sensors["t"].iloc[-1]), *(float(t[-1]) for t in times)])
    return Export(out, counts, start_s, end_s)


def _write(
    scene: RobotScene,
    folder: Path,
    sensors: pd.DataFrame,
    robots: dict[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    counts: dict[str, int],
) -> None:
    """Log the recording in ``folder`` onto ``scene`` into the MCAP file ``path``, counting each topic's messages."""
    start_s = float(sensors["t"].iloc[0])
    writer = foxglove.open_mcap(path, allow_overwrite=True, context=scene.context)
    try:
        scene.ground(start_s)
        counts["/ground"] = 1
        frames = folder / FRAMES_FILE
        with progress(
            f"export {folder.name}", len(sensors) + (frame_count(frames) if frames.is_file() else 0), "messages"
        ) as row:
            targets, controls, cables, motors = (
                sensors[columns].to_numpy(float) for columns in (TARGET_COLS, CONTROL_COLS, CABLE_COLS, MOTOR_COLS)
            )
            for i, (t, segment) in enumerate(
                zip(sensors["t"].to_numpy(float), sensors["segment"].to_numpy(), strict=True)
            ):
                scene.sensors(SensorPacket(float(t), int(segment), targets[i], controls[i], cables[i], {}, motors[i]))
                row.advance()
            counts["/sensors"] = len(sensors)
            if frames.is_file():
                camera = camera_from_meta(frames)
                scene.camera(start_s, camera)
                counts["/tf"] = counts["/camera/calibration"] = 1
                n = 0
                for t, color, depth in iter_encoded_frames(frames):
                    scene.frame(float(t), color, depth)
                    n += 1
                    row.advance()
                counts["/camera/color"] = counts["/camera/depth"] = n
        for source, (times, caps) in robots.items():
            for t, cap in zip(times, caps, strict=True):
                scene.robot_pose(source, float(t), cap)
            counts[f"/robot/{source}"] = len(times)
    finally:
        writer.close()


def _recordings(layout: RunLayout, iteration: int, stage: str) -> list[Path]:
    """The recording folders of ``stage``'s complete output: a follow run is a folder of its own
    (``follow/<path>/``, with its manifest), the other stages list theirs in one manifest."""
    if stage != "follow":
        return recording_folders(existing_ref(layout, iteration, stage))
    root = layout.stage_dir(iteration, stage)
    runs = sorted(p for p in root.glob("*") if (p / HARDWARE_FILE).is_file() and complete_stage_ref(p) is not None)
    if not runs:
        raise DataError(f"{root}: no complete follow run in iteration {iteration}; run r2s2r follow first")
    return runs


def export_stage(
    layout: RunLayout,
    robot: RobotConfig,
    iteration: int,
    stage: str,
    out: Path | None = None,
    recording: str | None = None,
) -> list[Export]:
    """Export every recording of ``stage`` of ``iteration`` (only ``recording``, if named) as MCAP
    files: into ``out`` (a folder, or the file itself where one recording is exported; default
    :attr:`RunLayout.exports_dir` ``/iter_<k>/<stage>/``), each named after its recording; a
    redeploy run with the evaluate stage's replays of it (:data:`~storage.catalog.REPLAYS_FILE`)."""
    every = _recordings(layout, iteration, stage)
    folders = every if recording is None else [f for f in every if f.name == recording]
    if not folders:
        names = ", ".join(f.name for f in every)
        raise DataError(f"iteration {iteration} {stage}: no recording {recording!r}; it has {names}")
    if out is not None and out.suffix == ".mcap":
        if len(folders) != 1:
            raise DataError(f"{out}: {len(folders)} recordings to export; give a folder or name one (--recording)")
        paths = [out]
    else:
        folder = out if out is not None else layout.exports_dir / f"iter_{iteration}" / stage
        paths = [folder / f"{f.name}.mcap" for f in folders]
    replays = layout.stage_dir(iteration, "evaluate") / REPLAYS_FILE
    table = pq.read_table(replays).to_pandas() if stage == "redeploy" and replays.is_file() else None
    exports = []
    for folder, path in zip(folders, paths, strict=True):
        tracked = folder / TRACKED_FILE
        if not tracked.is_file():  # a collect recording: the track stage's output
            tracked = layout.stage_dir(iteration, "track") / folder.name / TRACKED_FILE
        ghosts = {}
        if table is not None:
            for engine, rows in table[table["run"] == folder.name].groupby("engine", sort=False):
                ghosts[str(engine)] = (rows["t"].to_numpy(float), caps_array(rows))
        exports.append(export_recording(robot, folder, path, tracked, ghosts))
    return exports
