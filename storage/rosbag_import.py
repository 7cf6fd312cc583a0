"""Import a Tribar-style robot's ROS 1 or ROS 2 bag (``rosbags``) as a collect recording.

Every message on the cables topic is one sample; the targets, commands, winch angles and IMU
orientations are the latest at or before it (held, never interpolated). Samples keep the bag's
time stamps as they are: a long step is listed in the trajectory's ``gaps`` and duplicated
stamps are counted (``duplicated_stamps``), both kept (:func:`storage.trajectory.stamp_gaps`). The
frames pair each colour image with the depth image nearest in time (within half a frame period).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.config.recordings import BagTopicsConfig
from pipeline.errors import DataError
from storage.frames import FRAMES_SCHEMA, FRAMES_SCHEMA_VERSION, encode_frame
from storage.recording import FRAMES_FILE, HARDWARE_FILE
from storage.tables import write_table
from storage.trajectory import (
    CABLE_COLS,
    CONTROL_COLS,
    MOTOR_COLS,
    TARGET_COLS,
    StampedImport,
    imu_cols,
    make_meta,
    stamp_gaps,
    write_trajectory,
)

log = logging.getLogger(__name__)


@dataclass
class BagReport(StampedImport):
    """What :func:`import_bag` read: also whether it held motor commands, and the rods with IMUs."""

    control_recorded: bool = False
    imu_rods: tuple[int, ...] = ()

    source_format: ClassVar[str] = "rosbag"

    def summary(self) -> dict[str, object]:
        return {
            **super().summary(),
            "control_recorded": self.control_recorded,
            "imu_rods": ",".join(map(str, self.imu_rods)),
        }


def bag_digest(bag: Path) -> str:
    """sha256 of the bag's files (a ROS 2 bag is a folder), in name order."""
    digest = hashlib.sha256()
    files = sorted(p for p in bag.rglob("*") if p.is_file()) if bag.is_dir() else [bag]
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _stamp_s(message: object, logged_ns: int) -> float:
    header = getattr(message, "header", None)
    if header is None:
        return logged_ns * 1e-9
    return header.stamp.sec + header.stamp.nanosec * 1e-9


def _read(bag: Path, topics: BagTopicsConfig) -> dict[str, list[tuple[float, object]]]:
    """Every message on the mapped topics, deserialised, by topic: (stamp s, message)."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    wanted = {t for t in (topics.cables, topics.targets, topics.controls, topics.motors) if t}
    wanted |= set(topics.imu.values())
    wanted |= {t for t in (topics.color, topics.depth, topics.camera_info) if t}
    try:
        reader = AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_HUMBLE))
        reader.open()
    except Exception as exc:  # rosbags raises its own error types for each format problem
        raise DataError(f"{bag}: not a readable ROS 1 or ROS 2 bag ({exc})") from None
    try:
        present = {c.topic for c in reader.connections}
        optional = {topics.controls, topics.motors}
        missing = sorted(t for t in wanted - present if t not in optional)
        if missing:
            raise DataError(
                f"{bag}: no topic {', '.join(missing)} (bag_import in the pipeline config maps the topics); the bag "
                f"has {', '.join(sorted(present)) or 'none'}"
            )
        out: dict[str, list[tuple[float, object]]] = {t: [] for t in wanted & present}
        connections = [c for c in reader.connections if c.topic in out]
        for connection, logged_ns, raw in reader.messages(connections=connections):
            message = reader.deserialize(raw, connection.msgtype)
            out[connection.topic].append((_stamp_s(message, logged_ns), message))
    finally:
        reader.close()
    return out


def _array(topic: str, message: object, size: int, bag: Path) -> np.ndarray:
    values = np.asarray(message.data, float)
    if values.shape != (size,) or not np.isfinite(values).all():
        raise DataError(f"{bag}: topic {topic}: expected {size} finite numbers a message, got {values.tolist()}")
    return values


def _held(times: np.ndarray, stream: list[tuple[float, np.ndarray]]) -> np.ndarray:
    """The latest value of ``stream`` at or before each time (the first one before it starts)."""
    stamps = np.array([t for t, _ in stream])
    values = np.stack([v for _, v in stream])
    index = np.clip(np.searchsorted(stamps, times, side="right") - 1, 0, len(stream) - 1)
    return values[index]


def _quaternion(message: object) -> np.ndarray:
    """A sensor_msgs/Imu orientation as (w, x, y, z)."""
    q = message.orientation
    return np.array([q.w, q.x, q.y, q.z])


def _image(topic: str, message: object, bag: Path) -> np.ndarray:
    height, width, encoding = message.height, message.width, message.encoding
    data = np.frombuffer(bytes(message.data), np.uint8)
    if encoding in ("rgb8", "bgr8"):
        image = data.reshape(height, message.step)[:, : 3 * width].reshape(height, width, 3)
        return image[..., ::-1].copy() if encoding == "bgr8" else image.copy()
    if encoding in ("16UC1", "mono16"):
        dtype = ">u2" if message.is_bigendian else "<u2"
        rows = data.reshape(height, message.step)[:, : 2 * width]
        return rows.copy().view(dtype).reshape(height, width).astype(np.uint16)
    raise DataError(f"{bag}: topic {topic}: image encoding {encoding!r}; expected rgb8, bgr8, 16UC1 or mono16")


def import_bag(
    bag: Path,
    topics: BagTopicsConfig,
    dest_folder: Path,
    campaign: str,
    iteration: int,
    policy_id: str,
    robot_config_hash: str,
) -> BagReport:
    """Write ``hardware.parquet`` (and ``frames.parquet`` with images mapped) into ``dest_folder``."""
    messages = _read(bag, topics)
    report = BagReport(source=bag)
    cables = [(t, _array(topics.cables, m, 9, bag) * topics.cable_scale_m) for t, m in messages[topics.cables]]
    if len(cables) < 2:
        raise DataError(f"{bag}: topic {topics.cables}: {len(cables)} message(s); an import needs two or more")
    stamps = np.array([t for t, _ in cables])
    if np.any(np.diff(stamps) < 0):
        order = np.argsort(stamps, kind="stable")
        cables = [cables[i] for i in order]
        stamps = stamps[order]
    t0 = stamps[0]
    t = stamps - t0
    report.start_time_s, report.duration_s, report.n_samples = float(t0), float(t[-1]), len(t)
    report.gaps, report.duplicated_stamps = stamp_gaps(t)
    targets = _held(stamps, [(s, _array(topics.targets, m, 6, bag)) for s, m in messages[topics.targets]])
    changed = np.r_[True, np.any(targets[1:] != targets[:-1], axis=1)]
    report.targets = targets[changed].tolist()
    columns: dict[str, np.ndarray] = {"t": t, "segment": (np.cumsum(changed) - 1).astype(np.int32)}
    columns.update(zip(TARGET_COLS, targets.T, strict=True))
    if topics.controls and messages.get(topics.controls):
        controls = [(s, _array(topics.controls, m, 6, bag)) for s, m in messages[topics.controls]]
        columns.update(zip(CONTROL_COLS, _held(stamps, controls).T, strict=True))
        report.control_recorded = True
    columns.update(zip(CABLE_COLS, np.stack([c for _, c in cables]).T, strict=True))
    for rod, topic in sorted(topics.imu.items()):
        imu = [
            (s, np.array([m.orientation.w, m.orientation.x, m.orientation.y, m.orientation.z]))
            for s, m in messages[topic]
        ]
        columns.update(zip(imu_cols(rod), _held(stamps, imu).T, strict=True))
    report.imu_rods = tuple(sorted(topics.imu))
    if topics.motors and messages.get(topics.motors):
        motors = [(s, _array(topics.motors, m, 6, bag)) for s, m in messages[topics.motors]]
        columns.update(zip(MOTOR_COLS, _held(stamps, motors).T, strict=True))
    dest_folder.mkdir(parents=True, exist_ok=True)
    common = dict(
        robot_config_hash=robot_config_hash,
        campaign=campaign,
        iteration=iteration,
        policy_id=policy_id,
        complete=True,
    )
    write_trajectory(
        dest_folder / HARDWARE_FILE,
        pd.DataFrame(columns),
        make_meta(
            "hardware",
            sample_rate_hz=report.sample_rate_hz or 1.0,
            control_recorded=report.control_recorded,
            gaps=report.gaps,
            duplicated_stamps=report.duplicated_stamps,
            source_format=report.source_format,
            source_dir=str(bag),
            start_time_s=report.start_time_s,
            **common,
        ),
    )
    if topics.color:
        report.n_frames = _write_frames(bag, topics, messages, dest_folder, t0, policy_id, campaign, iteration)
    for gap in report.gaps:
        log.warning(
            "%s: %.3f s without a sample at t = %.3f s (kept, marked as a gap)",
            bag,
            gap["t_end_s"] - gap["t_start_s"],
            gap["t_start_s"],
        )
    return report


def _write_frames(
    bag: Path,
    topics: BagTopicsConfig,
    messages: dict[str, list[tuple[float, object]]],
    dest_folder: Path,
    t0: float,
    policy_id: str,
    campaign: str,
    iteration: int,
) -> int:
    """Pair colour and depth images by time and write ``frames.parquet``; returns how many."""
    color = sorted(messages[topics.color], key=lambda item: item[0])
    depth = sorted(messages[topics.depth], key=lambda item: item[0])
    infos = messages[topics.camera_info]
    if not color or not depth or not infos:
        raise DataError(
            f"{bag}: frames mapped but the bag has no message on {topics.color}, {topics.depth} or {topics.camera_info}"
        )
    info = infos[0][1]
    k = np.asarray(getattr(info, "K", None) if hasattr(info, "K") else info.k, float)
    depth_t = np.array([s for s, _ in depth])
    period = float(np.median(np.diff([s for s, _ in color]))) if len(color) > 1 else np.inf
    rows = []
    for stamp, message in color:
        nearest = int(np.argmin(np.abs(depth_t - stamp)))
        if abs(depth_t[nearest] - stamp) > period / 2:
            continue
        rgb = _image(topics.color, message, bag)
        depth_image = _image(topics.depth, depth[nearest][1], bag)
        if depth_image.shape != rgb.shape[:2]:
            raise DataError(
                f"{bag}: topic {topics.depth}: depth {depth_image.shape} and colour {rgb.shape[:2]} differ in size; "
                "map the depth aligned to colour"
            )
        rows.append(encode_frame(stamp - t0, rgb, depth_image))
    if not rows:
        raise DataError(
            f"{bag}: no image on {topics.color} has one on {topics.depth} within half a frame period; "
            "are they the same camera's?"
        )
    height, width = _image(topics.color, color[0][1], bag).shape[:2]
    camera = {
        "width_px": int(width),
        "height_px": int(height),
        "fx": float(k[0]),
        "fy": float(k[4]),
        "cx": float(k[2]),
        "cy": float(k[5]),
        "camera_to_world": topics.camera_to_world,
        "depth_scale_m": topics.depth_scale_m,
    }
    write_table(
        dest_folder / FRAMES_FILE,
        pa.Table.from_pylist(rows, schema=FRAMES_SCHEMA),
        {
            "schema_version": FRAMES_SCHEMA_VERSION,
            "policy_id": policy_id,
            "campaign": campaign,
            "iteration": iteration,
            "camera": camera,
            "complete": True,
        },
    )
    return len(rows)
