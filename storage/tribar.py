"""Import and export of recordings in the published Tribar layout (all file IO for it).

A Tribar recording folder holds, per camera frame ``N`` (file names are the frame
number, zero-padded to 4 digits: ``0000``, ``0001``, ...):

- ``color/N.png``: 8-bit colour image as written by OpenCV (BGR channel order on disk);
- ``depth/N.png``: 16-bit single-channel depth image (0 = no reading);
- ``data/N.json``: the robot's state when the frame was taken;

and one ``config.json`` for the whole recording.

What is established from the published code
-------------------------------------------
Sources: the tracker of the "6N-DoF Pose Tracking for Tensegrity Robot" paper
(github.com/shiyoung77/tensegrity_perception: ``tracking.py``,
``configs/data_cfg.json``) and the Tribar robot stack that writes these folders
(github.com/ChemStud24/tensegrity: ``src/perception/scripts/tracking_service.py``,
``src/perception/scripts/camera_calibration.py``,
``src/gnn_simulator/utilities/real_data_utils.py``).

``config.json``
    ``cam_intr``: 3 x 3 pinhole matrix ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` (px);
    ``im_w``, ``im_h``: image size (px); ``depth_scale``: depth units per metre as
    the tracker uses it (``metres = value / depth_scale``; RealSense cameras write
    1000, the paper's dataset 4000); ``cam_extr``: 4 x 4 extrinsics;
    ``cable_length_scale``: sensor length units per metre (1000: millimetres).
    Other keys (HSV ranges, rod length, ...) belong to the tracker and are ignored.
``data/N.json``
    ``header.secs``: time stamp (s, float, ROS time) and ``header.seq`` (message
    number); ``sensors["0".."8"].length``: cable sensor lengths in
    ``1 / cable_length_scale`` m (mm), sensor ``k`` on cable ``k`` of docs/design.md, *Conventions*
    (same end-cap pairs as the tracker's ``sensor_to_tendon``);
    ``motors["0".."5"].target``: normalised motor targets in [0, 1] (the robot's
    gait states); ``motors["0".."5"].speed`` and ``info.max_speed``: the signed
    motor command is ``speed / max_speed`` in [-1, 1]. Other keys (capacitance,
    position, PID errors, encoders, trajectory, ...) are ignored.

What is assumed (not established)
---------------------------------
- ``cam_extr`` is **camera-to-world** in OpenCV camera axes (x right, y down, z
  forward), world z up: the robot stack's AprilTag calibration writes it so and
  its dataset tools apply it to camera-frame points. The paper's tracker uses the
  inverse convention (a ground plane pose in the camera frame), so
  :func:`import_tribar` takes ``extrinsics=Extrinsics.WORLD_TO_CAMERA`` for such
  folders.
- ``depth_scale`` >= 1 is read as units per metre (above); a value below 1 is read
  as metres per unit (the RealSense SDK convention). No real camera has either a
  unit larger than 1 m or fewer than one unit per metre, so the two cannot clash.
- ``cam_intr`` has zero skew; ``cable_length_scale`` defaults to 1000 when absent.
- IMU orientation: the published recorder stores only accelerometer and gyroscope
  readings. We read (and write) ``imu["r"].orientation = {w, x, y, z}``: the unit
  quaternion of rod ``r`` (0-2) in the world frame; IMUs without it are ignored.
- When ``info.max_speed`` is missing or 0, or a kept frame lacks a finite
  ``speed``, the recording has no motor command: the ``hardware`` trajectory is
  written without ``control_*`` columns and with ``control_recorded = false``
  (:mod:`storage.trajectory`).
- ``segment`` is not in the format: a new segment starts at each change of the
  target vector, and the policy is the list of these distinct consecutive targets.

Import rules: frames are taken in order of their number; a frame is kept only if its
JSON, colour and depth files are all present and valid (see :data:`SKIP_REASONS`),
otherwise it is skipped, counted by reason and logged. Each kept frame gives one
``hardware`` row and one frames row with the same time ``t = secs - secs_0``
(``secs_0`` of the first kept frame); a stamp below an earlier one is raised to it
(counted in :attr:`ImportReport.n_time_fixed`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo
from storage.files import atomic_write_bytes, atomic_write_json
from storage.frames import FRAMES_SCHEMA, FRAMES_SCHEMA_VERSION, encode_frame, frames_meta, iter_frames
from storage.recording import FRAMES_FILE, HARDWARE_FILE
from storage.tables import PartedTableWriter, parts_dir
from storage.trajectory import (
    CABLE_COLS,
    CONTROL_COLS,
    TARGET_COLS,
    imu_cols,
    make_meta,
    read_trajectory,
    write_trajectory,
)

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
COLOR_DIR = "color"
DEPTH_DIR = "depth"
DATA_DIR = "data"
N_SENSORS = len(CABLE_COLS)
N_MOTORS = len(TARGET_COLS)
DEFAULT_CABLE_LENGTH_SCALE = 1000.0
EXPORT_LENGTH_DECIMALS = 3
"""Exported sensor lengths are rounded to 10^-3 mm (1 µm)."""
EXPORT_MAX_SPEED = 80.0
"""``info.max_speed`` written by :func:`export_tribar`: ``speed = control * max_speed``."""
FLUSH_EVERY_FRAMES = 32

SKIP_REASONS = (
    "duplicate_number",
    "missing_data",
    "missing_color",
    "missing_depth",
    "unreadable_json",
    "bad_stamp",
    "bad_length",
    "bad_target",
    "unreadable_color",
    "color_wrong_size",
    "unreadable_depth",
    "depth_wrong_size",
    "depth_wrong_dtype",
)
"""Why a frame can be skipped: a duplicated frame number (``7.json`` and ``0007.json``),
a missing file of the three, a JSON that cannot be parsed, a missing or non-finite
``header.secs``, a missing, non-finite or non-positive sensor length, a missing,
non-finite or out-of-[0, 1] target, a colour image that cannot be decoded or is not
``im_h x im_w x 3`` uint8, a depth image that cannot be decoded, is not
``im_h x im_w`` or is not uint16."""

_NUMBER = re.compile(r"^[0-9]+$")


DEFAULT_MIN_IMPORTED_SHARE = 0.9
"""An import is refused when fewer than this share of its frames are usable."""


class Extrinsics(StrEnum):
    """What the 4 x 4 ``cam_extr`` of ``config.json`` maps (see the module docstring)."""

    CAMERA_TO_WORLD = "camera_to_world"
    WORLD_TO_CAMERA = "world_to_camera"


@dataclass(frozen=True)
class TribarConfig:
    """What we use from ``config.json``: the camera and the cable length unit (units per metre)."""

    camera: CameraInfo
    cable_length_scale: float


@dataclass
class ImportReport:
    """Outcome of :func:`import_tribar`.

    ``n_candidates``: distinct frame numbers found in ``data/``, ``color/`` and
    ``depth/``; ``n_imported``: frames kept (= rows of both files); ``skipped``:
    count per reason of :data:`SKIP_REASONS`; ``n_time_fixed``: stamps raised to
    keep time non-decreasing; ``duration_s``: last minus first kept stamp (s);
    ``start_time_s``: ``header.secs`` of the first kept frame (s);
    ``control_recorded``: whether ``control_*`` columns were written;
    ``imu_rods``: rods whose IMU orientation was imported; ``targets``: the
    distinct consecutive target vectors, (n_segments, 6) in [0, 1]; ``notes``:
    file-level remarks (dropped control or IMU).
    """

    src_dir: Path
    n_candidates: int = 0
    n_imported: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    n_time_fixed: int = 0
    duration_s: float = 0.0
    start_time_s: float = 0.0
    control_recorded: bool = False
    imu_rods: tuple[int, ...] = ()
    targets: list[list[float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def sample_rate_hz(self) -> float:
        """Mean frame rate of the kept frames (Hz)."""
        return (self.n_imported - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, object]:
        """Flat summary (str, bool, int, float values) for a stage manifest or a printout."""
        out: dict[str, object] = {
            "source_format": "tribar",
            "source_dir": str(self.src_dir),
            "n_candidates": self.n_candidates,
            "n_frames": self.n_imported,
            "n_sensor_samples": self.n_imported,
            "n_skipped": self.n_skipped,
            "n_time_fixed": self.n_time_fixed,
            "n_targets": len(self.targets),
            "duration_s": self.duration_s,
            "start_time_s": self.start_time_s,
            "sample_rate_hz": self.sample_rate_hz,
            "control_recorded": self.control_recorded,
            "imu_rods": ",".join(map(str, self.imu_rods)),
            "notes": "; ".join(self.notes),
        }
        out.update({f"skipped_{reason}": count for reason, count in sorted(self.skipped.items())})
        return out


@dataclass(frozen=True)
class _Sample:
    """One parsed ``data/N.json``: stamp (s), targets (6,), lengths (m, 9,), control (6,) or None, IMU quats."""

    secs: float
    target: np.ndarray
    cable_m: np.ndarray
    control: np.ndarray | None
    imu: dict[int, np.ndarray]


class _Skip(Exception):
    """A frame is unusable; ``args[0]`` is one of :data:`SKIP_REASONS`."""


# ----------------------------------------------------------------------------- config


def _number(value: object) -> float | None:
    """``value`` as a float if it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _matrix(path: Path, raw: dict, key: str, shape: tuple[int, int], expected: str) -> np.ndarray:
    value = raw.get(key)
    try:
        matrix = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        matrix = None
    if value is None or matrix is None or matrix.shape != shape or not np.isfinite(matrix).all():
        raise DataError(f"{path}: field '{key}' must be {expected}, got {value!r}")
    return matrix


def read_tribar_config(src_dir: str | Path, extrinsics: Extrinsics = Extrinsics.CAMERA_TO_WORLD) -> TribarConfig:
    """Read and check ``src_dir/config.json``.

    Returns the camera (intrinsics in px, ``camera_to_world`` 4 x 4 in OpenCV axes,
    ``depth_scale_m`` in m per unit) and the cable length scale (units per metre).
    Raises :class:`DataError` naming the file, the field and what was expected.
    """
    src_dir = Path(src_dir)
    path = src_dir / CONFIG_FILE
    if not src_dir.is_dir():
        raise DataError(f"{src_dir}: not a folder; expected a Tribar recording (color/, depth/, data/, {CONFIG_FILE})")
    if not path.is_file():
        raise DataError(f"{path}: not found; a Tribar recording needs it (cam_intr, cam_extr, im_w, im_h, depth_scale)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected a JSON object at the top level, got {type(raw).__name__}")

    size = {}
    for key in ("im_w", "im_h"):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise DataError(f"{path}: field '{key}' must be a positive integer (pixels), got {value!r}")
        size[key] = value
    intr_text = "a 3 x 3 matrix [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0 (pixels)"
    k = _matrix(path, raw, "cam_intr", (3, 3), intr_text)
    if k[0, 0] <= 0 or k[1, 1] <= 0 or not np.allclose(k[[0, 1, 2, 2], [1, 0, 0, 1]], 0) or k[2, 2] != 1:
        raise DataError(f"{path}: field 'cam_intr' must be {intr_text}, got {raw['cam_intr']!r}")
    extr = _matrix(path, raw, "cam_extr", (4, 4), "a 4 x 4 rigid transform (rotation, translation in m)")
    rotation = extr[:3, :3]
    if (
        not np.allclose(extr[3], [0, 0, 0, 1])
        or not np.allclose(rotation.T @ rotation, np.eye(3), atol=1e-2)
        or np.linalg.det(rotation) <= 0
    ):
        raise DataError(
            f"{path}: field 'cam_extr' must be a 4 x 4 rigid transform (orthonormal rotation with det +1, "
            f"last row [0, 0, 0, 1]), got {raw['cam_extr']!r}"
        )
    depth_scale = _number(raw.get("depth_scale"))
    if depth_scale is None or not math.isfinite(depth_scale) or depth_scale <= 0:
        raise DataError(f"{path}: field 'depth_scale' must be a positive number, got {raw.get('depth_scale')!r}")
    cable_scale = _number(raw.get("cable_length_scale", DEFAULT_CABLE_LENGTH_SCALE))
    if cable_scale is None or not math.isfinite(cable_scale) or cable_scale <= 0:
        raise DataError(
            f"{path}: field 'cable_length_scale' must be a positive number (units per metre), "
            f"got {raw.get('cable_length_scale')!r}"
        )
    camera_to_world = extr if extrinsics == Extrinsics.CAMERA_TO_WORLD else np.linalg.inv(extr)
    camera = CameraInfo(
        width_px=size["im_w"],
        height_px=size["im_h"],
        fx=float(k[0, 0]),
        fy=float(k[1, 1]),
        cx=float(k[0, 2]),
        cy=float(k[1, 2]),
        camera_to_world=camera_to_world,
        depth_scale_m=1.0 / depth_scale if depth_scale >= 1 else depth_scale,
    )
    return TribarConfig(camera=camera, cable_length_scale=cable_scale)


def source_digest(src_dir: str | Path) -> str:
    """sha256 (hex) of ``config.json`` and every ``data/*.json`` (names and bytes, sorted).

    Images are left out for speed: the JSON files already identify a recording
    (time stamps, sensor readings and targets of every frame).
    """
    src_dir = Path(src_dir)
    digest = hashlib.sha256()
    files = [src_dir / CONFIG_FILE, *sorted((src_dir / DATA_DIR).glob("*.json"))]
    for path in files:
        if path.is_file():
            digest.update(path.relative_to(src_dir).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- import


def _numbered(folder: Path, suffix: str) -> tuple[dict[int, Path], set[int]]:
    """Files ``<digits><suffix>`` in ``folder`` by frame number, and numbers seen more than once."""
    found: dict[int, Path] = {}
    duplicates: set[int] = set()
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.suffix == suffix and _NUMBER.match(path.stem) and path.is_file():
                number = int(path.stem)
                if number in found:
                    duplicates.add(number)
                found[number] = path
    return found, duplicates


def _finite(block: object, key: str, name: str) -> float | None:
    """``block[key][name]`` as a float if present and finite, else None."""
    item = block.get(key) if isinstance(block, dict) else None
    value = _number(item.get(name)) if isinstance(item, dict) else None
    return value if value is not None and math.isfinite(value) else None


def _required(block: object, key: str, name: str, reason: str) -> float:
    """``block[key][name]`` as a finite float, else :class:`_Skip` with ``reason``."""
    value = _finite(block, key, name)
    if value is None:
        raise _Skip(reason)
    return value


def _parse_data(path: Path, cable_length_scale: float) -> _Sample:
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Skip("unreadable_json") from exc
    if not isinstance(payload, dict):
        raise _Skip("unreadable_json")
    secs = _required(payload, "header", "secs", "bad_stamp")
    lengths = np.array([_required(payload.get("sensors"), str(k), "length", "bad_length") for k in range(N_SENSORS)])
    if (lengths <= 0).any():
        raise _Skip("bad_length")
    motors = payload.get("motors")
    target = np.array([_required(motors, str(k), "target", "bad_target") for k in range(N_MOTORS)])
    if ((target < 0) | (target > 1)).any():
        raise _Skip("bad_target")
    return _Sample(
        secs=secs,
        target=target,
        cable_m=lengths / cable_length_scale,
        control=_parse_control(payload),
        imu=_parse_imu(payload.get("imu")),
    )


def _parse_control(payload: dict) -> np.ndarray | None:
    """``motors[k].speed / info.max_speed`` clipped to [-1, 1], or None if not recorded."""
    max_speed = _finite(payload, "info", "max_speed")
    speeds = [_finite(payload.get("motors"), str(k), "speed") for k in range(N_MOTORS)]
    if max_speed is None or max_speed <= 0 or any(v is None for v in speeds):
        return None
    return np.clip(np.array(speeds) / max_speed, -1.0, 1.0)


def _parse_imu(block: object) -> dict[int, np.ndarray]:
    """Rod -> (w, x, y, z) for every IMU with a finite, non-zero ``orientation``."""
    out: dict[int, np.ndarray] = {}
    if not isinstance(block, dict):
        return out
    for key, entry in block.items():
        if key not in ("0", "1", "2"):
            continue
        values = [_finite(entry, "orientation", axis) for axis in "wxyz"]
        if all(v is not None for v in values) and np.linalg.norm(values) > 0:
            out[int(key)] = np.array(values)
    return out


def _read_images(color_path: Path, depth_path: Path, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """RGB (H, W, 3) uint8 and depth (H, W) uint16 of one frame, or :class:`_Skip`."""
    bgr = cv2.imread(str(color_path), cv2.IMREAD_UNCHANGED)
    if bgr is None:
        raise _Skip("unreadable_color")
    if bgr.dtype != np.uint8 or bgr.shape != (height, width, 3):
        raise _Skip("color_wrong_size")
    depth = cv2.imread(str(depth_path), cv2.IMREAD_UNCHANGED)
    if depth is None:
        raise _Skip("unreadable_depth")
    if depth.shape != (height, width):
        raise _Skip("depth_wrong_size")
    if depth.dtype != np.uint16:
        raise _Skip("depth_wrong_dtype")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), depth


def import_tribar(
    src_dir: str | Path,
    dest_folder: str | Path,
    *,
    campaign: str,
    iteration: int,
    policy_id: str,
    robot_config_hash: str,
    extrinsics: Extrinsics = Extrinsics.CAMERA_TO_WORLD,
    min_imported_share: float = DEFAULT_MIN_IMPORTED_SHARE,
) -> ImportReport:
    """Convert a Tribar recording folder into ``dest_folder/{hardware,frames}.parquet``.

    ``hardware.parquet`` follows the trajectory contract (source ``hardware``, one
    row per kept frame: ``t`` (s), ``segment``, ``target_0..5``, ``control_0..5``
    when recorded, ``cable_0..8`` (m), ``imu{r}_qw..qz``); ``frames.parquet`` holds
    the kept frames with the camera of ``config.json``. Bad ``config.json`` or a
    recording with fewer than two usable frames, or fewer than ``min_imported_share`` of its
    frames usable, raise :class:`DataError` (nothing is written); unusable frames are
    skipped, counted and logged (module docstring).
    Existing output files are never overwritten (:class:`DataError`).
    """
    src_dir = Path(src_dir)
    dest_folder = Path(dest_folder)
    config = read_tribar_config(src_dir, extrinsics)
    camera = config.camera
    for name in (HARDWARE_FILE, FRAMES_FILE):
        if (dest_folder / name).exists():
            raise DataError(f"{dest_folder / name}: already exists; an import never overwrites data")

    data, dup_data = _numbered(src_dir / DATA_DIR, ".json")
    color, dup_color = _numbered(src_dir / COLOR_DIR, ".png")
    depth, dup_depth = _numbered(src_dir / DEPTH_DIR, ".png")
    numbers = sorted(set(data) | set(color) | set(depth))
    duplicates = dup_data | dup_color | dup_depth
    report = ImportReport(src_dir=src_dir, n_candidates=len(numbers))
    skipped: Counter[str] = Counter()

    dest_folder.mkdir(parents=True, exist_ok=True)
    frames_path = dest_folder / FRAMES_FILE
    writer = PartedTableWriter(
        frames_path,
        FRAMES_SCHEMA,
        {
            "schema_version": FRAMES_SCHEMA_VERSION,
            "policy_id": policy_id,
            "campaign": campaign,
            "iteration": iteration,
            "camera": camera.as_dict(),
            "complete": False,
            "source_format": "tribar",
            "source_dir": str(src_dir),
        },
    )
    samples: list[_Sample] = []
    times: list[float] = []
    latest = -math.inf
    try:
        for number in numbers:
            try:
                if number in duplicates:
                    raise _Skip("duplicate_number")
                for files, reason in ((data, "missing_data"), (color, "missing_color"), (depth, "missing_depth")):
                    if number not in files:
                        raise _Skip(reason)
                sample = _parse_data(data[number], config.cable_length_scale)
                rgb, depth_image = _read_images(color[number], depth[number], camera.height_px, camera.width_px)
            except _Skip as skip:
                skipped[skip.args[0]] += 1
                log.warning("tribar import: skipped frame %d of %s (%s)", number, src_dir, skip.args[0])
                continue
            if sample.secs < latest:
                report.n_time_fixed += 1
                log.warning(
                    "tribar import: frame %d of %s is stamped %.6f s before an earlier frame; time held",
                    number,
                    src_dir,
                    latest - sample.secs,
                )
            latest = max(latest, sample.secs)
            t = latest - (samples[0].secs if samples else sample.secs)
            writer.append(encode_frame(t, rgb, depth_image))
            samples.append(sample)
            times.append(t)
            if len(samples) % FLUSH_EVERY_FRAMES == 0:
                writer.flush()
    except BaseException as exc:
        writer.finalize(complete=False, extra_meta={"incomplete_reason": f"{type(exc).__name__}: {exc}"})
        raise

    report.skipped = {reason: skipped[reason] for reason in SKIP_REASONS if skipped[reason]}
    if len(samples) < 2 or times[-1] <= 0:
        shutil.rmtree(parts_dir(frames_path), ignore_errors=True)
        raise DataError(
            f"{src_dir}: {len(samples)} usable frame(s) spanning {times[-1] if times else 0:.3f} s; an import needs "
            f"at least two at different times (frames found: {len(numbers)}, skipped: {report.skipped or 'none'})"
        )
    if len(samples) < min_imported_share * len(numbers):
        shutil.rmtree(parts_dir(frames_path), ignore_errors=True)
        raise DataError(
            f"{src_dir}: {len(samples)} of {len(numbers)} frames usable ({100 * len(samples) / len(numbers):.0f} %), "
            f"fewer than the {100 * min_imported_share:.0f} % an import requires (--min-share); skipped: "
            f"{', '.join(f'{count} {reason}' for reason, count in report.skipped.items())}"
        )
    report.n_imported = len(samples)
    report.start_time_s = samples[0].secs
    report.duration_s = times[-1]
    hardware = _hardware_frame(samples, np.array(times), report)
    write_trajectory(
        dest_folder / HARDWARE_FILE,
        hardware,
        make_meta(
            "hardware",
            robot_config_hash=robot_config_hash,
            campaign=campaign,
            iteration=iteration,
            policy_id=policy_id,
            sample_rate_hz=report.sample_rate_hz,
            complete=True,
            control_recorded=report.control_recorded,
            source_format="tribar",
            source_dir=str(src_dir),
            start_time_s=report.start_time_s,
        ),
    )
    writer.finalize(complete=True)
    for note in report.notes:
        log.warning("tribar import of %s: %s", src_dir, note)
    log.info(
        "tribar import: %d of %d frames from %s (skipped %s)",
        report.n_imported,
        report.n_candidates,
        src_dir,
        report.skipped or "none",
    )
    return report


def _hardware_frame(samples: list[_Sample], t: np.ndarray, report: ImportReport) -> pd.DataFrame:
    """The ``hardware`` trajectory rows of the kept samples; fills the report's file-level fields."""
    targets = np.stack([s.target for s in samples])
    changed = np.r_[True, np.any(targets[1:] != targets[:-1], axis=1)]
    report.targets = targets[changed].tolist()
    columns: dict[str, np.ndarray] = {"t": t, "segment": (np.cumsum(changed) - 1).astype(np.int32)}
    columns.update(zip(TARGET_COLS, targets.T, strict=True))
    controls = [s.control for s in samples]
    report.control_recorded = all(c is not None for c in controls)
    if report.control_recorded:
        columns.update(zip(CONTROL_COLS, np.stack(controls).T, strict=True))
    else:
        report.notes.append(
            f"no motor command in {sum(c is None for c in controls)} of {len(samples)} frames "
            "(motors[k].speed / info.max_speed): control_* not written"
        )
    columns.update(zip(CABLE_COLS, np.stack([s.cable_m for s in samples]).T, strict=True))
    seen = set().union(*(s.imu for s in samples))
    report.imu_rods = tuple(sorted(r for r in seen if all(r in s.imu for s in samples)))
    for rod in sorted(seen - set(report.imu_rods)):
        report.notes.append(f"IMU of rod {rod} missing in some frames: not imported")
    for rod in report.imu_rods:
        columns.update(zip(imu_cols(rod), np.stack([s.imu[rod] for s in samples]).T, strict=True))
    return pd.DataFrame(columns)


# ----------------------------------------------------------------------------- export


def export_tribar(
    recording_folder: str | Path,
    out_dir: str | Path,
    start_time_s: float = 0.0,
    max_speed: float = EXPORT_MAX_SPEED,
) -> int:
    """Write one of our recordings (``hardware.parquet`` + ``frames.parquet``) in the Tribar layout.

    One ``data/N.json`` per camera frame, from the sensor sample nearest in time to
    the frame: ``header.secs = start_time_s + t`` of that sample (s), ``header.seq``
    its row index; sensor lengths in mm rounded to :data:`EXPORT_LENGTH_DECIMALS`
    decimals; ``motors[k].target``; ``motors[k].speed = control * max_speed`` with
    ``info.max_speed`` (when control was recorded); ``imu[r].orientation``.
    ``config.json`` gets ``cam_intr``, ``cam_extr`` (camera-to-world), ``im_w``,
    ``im_h``, ``depth_scale`` (units per metre) and ``cable_length_scale`` (1000).
    Every file is written atomically. ``out_dir`` must be absent or empty.
    Returns the number of frames written.
    """
    recording_folder = Path(recording_folder)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir}: not empty; export_tribar writes into a new folder")
    hardware, meta = read_trajectory(recording_folder / HARDWARE_FILE, expect_source="hardware")
    frames_path = recording_folder / FRAMES_FILE
    if not frames_path.is_file():
        raise DataError(f"{frames_path}: not found; a Tribar recording needs camera frames")
    camera = frames_meta(frames_path)["camera"]
    intrinsics = [[camera["fx"], 0.0, camera["cx"]], [0.0, camera["fy"], camera["cy"]], [0.0, 0.0, 1.0]]
    atomic_write_json(
        out_dir / CONFIG_FILE,
        {
            "cam_intr": intrinsics,
            "cam_extr": camera["camera_to_world"],
            "im_w": camera["width_px"],
            "im_h": camera["height_px"],
            "depth_scale": 1.0 / camera["depth_scale_m"],
            "cable_length_scale": DEFAULT_CABLE_LENGTH_SCALE,
        },
    )
    t_hw = hardware["t"].to_numpy()
    imu_rods = [r for r in range(3) if imu_cols(r)[0] in hardware.columns]
    count = 0
    for count, frame in enumerate(iter_frames(frames_path), start=1):
        right = min(int(np.searchsorted(t_hw, frame.t_s)), len(t_hw) - 1)
        left = max(right - 1, 0)
        row = hardware.iloc[left if abs(t_hw[left] - frame.t_s) <= abs(t_hw[right] - frame.t_s) else right]
        name = f"{count - 1:04d}"
        ok_color, color_png = cv2.imencode(".png", cv2.cvtColor(frame.rgb, cv2.COLOR_RGB2BGR))
        ok_depth, depth_png = cv2.imencode(".png", frame.depth)
        if not (ok_color and ok_depth):
            raise DataError(f"{frames_path}: PNG encoding failed for the frame at t = {frame.t_s:.3f} s")
        atomic_write_bytes(out_dir / COLOR_DIR / f"{name}.png", color_png.tobytes())
        atomic_write_bytes(out_dir / DEPTH_DIR / f"{name}.png", depth_png.tobytes())
        payload = _data_json(row, meta.control_recorded, imu_rods, start_time_s, max_speed)
        atomic_write_json(out_dir / DATA_DIR / f"{name}.json", payload)
    return count


def _data_json(
    row: pd.Series, control_recorded: bool, imu_rods: list[int], start_time_s: float, max_speed: float
) -> dict[str, object]:
    """The ``data/N.json`` payload of one ``hardware`` row (see :func:`export_tribar`)."""
    motors: dict[str, dict[str, float]] = {}
    for k in range(N_MOTORS):
        motors[str(k)] = {"target": float(row[TARGET_COLS[k]])}
        if control_recorded:
            motors[str(k)]["speed"] = float(row[CONTROL_COLS[k]]) * max_speed
    payload: dict[str, object] = {
        "header": {"seq": int(row.name), "secs": start_time_s + float(row["t"])},
        "sensors": {
            str(k): {"length": round(float(row[CABLE_COLS[k]]) * 1000.0, EXPORT_LENGTH_DECIMALS)}
            for k in range(N_SENSORS)
        },
        "motors": motors,
        "imu": {
            str(r): {"orientation": {axis: float(row[col]) for axis, col in zip("wxyz", imu_cols(r), strict=True)}}
            for r in imu_rods
        },
    }
    if control_recorded:
        payload["info"] = {"max_speed": max_speed}
    return payload
