"""Import the processed trajectories published with the R2S2R paper's code as a collect recording.

The file is a JSON list of frames, each with ``time`` (s, Unix time or from the start), the two
end caps of each rod (``rod_01_end_pt1``, ``rod_01_end_pt2``, ``rod_23_…``, ``rod_45_…``, in that
code's scaled units: :data:`LENGTH_SCALE` per metre), the six targets (``target_gaits``) and the
six motor commands (``controls``); the first frame also holds the firmware PID's settings
(``min_length``, ``RANGE``, ``tol``, ``motor_speed``) and the initial actuated lengths
(``init_act_lens``). Other keys (``pos``, ``end_pts``) are ignored. There are no camera frames and
no cable readings: the end caps are written as given (:data:`GIVEN_CAPS_FILE`, taken by the track
stage as they are) and the hardware trajectory says ``cables_recorded: false``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from pipeline.config import RobotConfig
from pipeline.errors import DataError
from storage.files import atomic_write_bytes
from storage.recording import GIVEN_CAPS_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.trajectory import (
    CABLE_COLS,
    CAP_COLS,
    CONTROL_COLS,
    TARGET_COLS,
    StampedImport,
    caps_array,
    make_meta,
    read_trajectory,
    stamp_gaps,
    write_trajectory,
)

LENGTH_SCALE = 10.0
"""The published code's length unit: 10 units a metre."""
CAP_KEYS = tuple(f"rod_{rod}_end_pt{end}" for rod in ("01", "23", "45") for end in (1, 2))
"""The end caps 0..5 in order: rod 0 joins caps 0 and 1, rod 1 caps 2 and 3, rod 2 caps 4 and 5."""
PID_KEYS = ("min_length", "RANGE", "tol", "motor_speed")


@dataclass
class PublishedReport(StampedImport):
    """What :func:`import_published` read, and the firmware settings it found."""

    pid: dict[str, float] = field(default_factory=dict)
    init_act_lens_m: list[float] = field(default_factory=list)

    source_format: ClassVar[str] = "r2s2r-processed-json"

    def summary(self) -> dict[str, object]:
        return {**super().summary(), **{f"pid.{k}": v for k, v in self.pid.items()}}


def _numbers(path: Path, index: int, frame: dict, key: str, size: int | None) -> np.ndarray:
    if key not in frame:
        raise DataError(f"{path}: frame {index}: no '{key}'")
    values = np.asarray(frame[key] if size is not None else [frame[key]], dtype=object)
    try:
        values = values.astype(float)
    except (TypeError, ValueError):
        raise DataError(f"{path}: frame {index}: '{key}' is {frame[key]!r}; expected numbers") from None
    expected = (size,) if size is not None else (1,)
    if values.shape != expected:
        raise DataError(f"{path}: frame {index}: '{key}' has {values.size} values; expected {size}")
    if not np.isfinite(values).all():
        raise DataError(f"{path}: frame {index}: '{key}' is {frame[key]!r}; expected finite numbers")
    return values


def read_published(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """The file's stamps (N,) s, end caps (N, 6, 3) m, targets (N, 6), commands (N, 6) and first frame."""
    try:
        frames = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(frames, list) or len(frames) < 2 or not all(isinstance(f, dict) for f in frames):
        raise DataError(f"{path}: expected a JSON list of two or more frames (objects)")
    t = np.array([_numbers(path, i, f, "time", None)[0] for i, f in enumerate(frames)])
    backwards = np.flatnonzero(np.diff(t) < 0)
    if backwards.size:
        i = int(backwards[0]) + 1
        raise DataError(
            f"{path}: frame {i}: 'time' {t[i]} is before frame {i - 1}'s {t[i - 1]}; expected stamps in order"
        )
    caps = np.stack([[_numbers(path, i, f, key, 3) for key in CAP_KEYS] for i, f in enumerate(frames)])
    targets = np.stack([_numbers(path, i, f, "target_gaits", 6) for i, f in enumerate(frames)])
    controls = np.stack([_numbers(path, i, f, "controls", 6) for i, f in enumerate(frames)])
    return t, caps / LENGTH_SCALE, targets, controls, frames[0]


def import_published(
    path: Path, dest_folder: Path, campaign: str, iteration: int, policy_id: str, robot_config_hash: str
) -> PublishedReport:
    """Write ``hardware.parquet`` (no cable columns) and the given end caps into ``dest_folder``."""
    t_raw, caps, targets, controls, first = read_published(path)
    report = PublishedReport(source=path)
    for key in PID_KEYS:
        report.pid[key] = float(_numbers(path, 0, first, key, None)[0])
    report.init_act_lens_m = (_numbers(path, 0, first, "init_act_lens", 6) / LENGTH_SCALE).tolist()
    t = t_raw - t_raw[0]
    report.start_time_s, report.duration_s, report.n_samples = float(t_raw[0]), float(t[-1]), len(t)
    if report.duration_s <= 0:
        raise DataError(f"{path}: every frame has the same 'time'; expected a recording that lasts")
    report.gaps, report.duplicated_stamps = stamp_gaps(t)
    changed = np.r_[True, np.any(targets[1:] != targets[:-1], axis=1)]
    report.targets = targets[changed].tolist()
    segment = (np.cumsum(changed) - 1).astype(np.int32)
    hardware = {"t": t, "segment": segment}
    hardware.update(zip(TARGET_COLS, targets.T, strict=True))
    hardware.update(zip(CONTROL_COLS, controls.T, strict=True))
    meta = {
        "robot_config_hash": robot_config_hash,
        "campaign": campaign,
        "iteration": iteration,
        "policy_id": policy_id,
        "sample_rate_hz": report.sample_rate_hz,
        "complete": True,
        "gaps": report.gaps,
        "duplicated_stamps": report.duplicated_stamps,
        "source_format": report.source_format,
        "source_dir": str(path),
        "start_time_s": report.start_time_s,
    }
    dest_folder.mkdir(parents=True, exist_ok=True)
    write_trajectory(
        dest_folder / HARDWARE_FILE,
        pd.DataFrame(hardware),
        make_meta("hardware", cables_recorded=False, pid=report.pid, init_act_lens_m=report.init_act_lens_m, **meta),
    )
    given = {"t": t, "segment": segment}
    given.update(zip(TARGET_COLS, targets.T, strict=True))
    given.update(zip(CAP_COLS, caps.reshape(len(t), 18).T, strict=True))
    write_trajectory(dest_folder / GIVEN_CAPS_FILE, pd.DataFrame(given), make_meta("tracked", method="given", **meta))
    return report


def export_published(folder: Path, robot: RobotConfig, path: Path, every: int = 1, start_time_s: float = 0.0) -> int:
    """Write the twin recording in ``folder`` (its hardware and ground-truth trajectories) in the
    published format: every ``every``-th tick, stamps from ``start_time_s`` (s, Unix time), the
    true end caps as the tracked ones, the PID's settings from ``robot`` and the sensed actuated
    lengths of the first tick as ``init_act_lens``. Returns how many frames were written."""
    hardware, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    truth, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
    caps = caps_array(truth) * LENGTH_SCALE
    frames = []
    for i in range(0, min(len(hardware), len(truth)), every):
        frame: dict[str, object] = {"time": round(start_time_s + float(truth["t"].iloc[i]), 3)}
        frame.update({key: caps[i, c].tolist() for c, key in enumerate(CAP_KEYS)})
        frame["target_gaits"] = hardware[TARGET_COLS].iloc[i].tolist()
        frame["controls"] = hardware[CONTROL_COLS].iloc[i].tolist()
        frames.append(frame)
    frames[0].update(
        min_length=robot.actuated_cable.min_length_m * LENGTH_SCALE,
        RANGE=robot.actuated_cable.range_m * LENGTH_SCALE,
        tol=robot.pid.tolerance,
        motor_speed=robot.motor.speed,
        init_act_lens=(hardware[CABLE_COLS[:6]].iloc[0].to_numpy() * LENGTH_SCALE).tolist(),
    )
    atomic_write_bytes(path, json.dumps(frames).encode())
    return len(frames)
