"""Record a hardware packet stream into trajectory and frame files, crash-safe.

A :class:`Recording` routes :class:`~pipeline.hardware.base.SensorPacket` to the
``hardware`` trajectory, :class:`~pipeline.hardware.base.GroundTruthPacket` to the
``groundtruth`` trajectory and :class:`~pipeline.hardware.base.FramePacket` to the
frames file. Data are flushed to part files every ``checkpoint_every_s`` of robot
time; :meth:`Recording.close` merges them and marks the files complete or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.hardware.base import CameraInfo, FramePacket, GroundTruthPacket, Packet, SensorPacket
from storage.frames import FRAMES_SCHEMA, FRAMES_SCHEMA_VERSION, encode_frame
from storage.tables import PartedTableWriter, recover_parts
from storage.trajectory import (
    CABLE_COLS,
    CAP_COLS,
    CONTROL_COLS,
    MOTOR_COLS,
    ROD_POS_COLS,
    ROD_QUAT_COLS,
    TARGET_COLS,
    arrow_schema,
    imu_cols,
    make_meta,
)

HARDWARE_FILE = "hardware.parquet"
GROUNDTRUTH_FILE = "groundtruth.parquet"
FRAMES_FILE = "frames.parquet"


@dataclass
class RecordingIdentity:
    """Who made a recording; stored in every file's metadata."""

    campaign: str
    iteration: int
    policy_id: str
    robot_config_hash: str
    sample_rate_hz: float
    imu_rods: tuple[int, ...]
    segment_timeout_s: float
    """The longest each target is held before the run moves on (s)."""


@dataclass
class Recording:
    """Write one policy execution under ``folder`` (one trajectory = one folder)."""

    folder: Path
    identity: RecordingIdentity
    camera: CameraInfo | None
    checkpoint_every_s: float
    n_sensor: int = 0
    n_truth: int = 0
    n_frames: int = 0
    last_t_s: float = 0.0
    _next_checkpoint: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        ident = self.identity
        common = dict(
            robot_config_hash=ident.robot_config_hash,
            campaign=ident.campaign,
            iteration=ident.iteration,
            policy_id=ident.policy_id,
            sample_rate_hz=ident.sample_rate_hz,
            complete=False,
            segment_timeout_s=ident.segment_timeout_s,
        )
        imu = [c for r in ident.imu_rods for c in imu_cols(r)]
        self._hardware = PartedTableWriter(
            self.folder / HARDWARE_FILE,
            arrow_schema(["t", "segment", *TARGET_COLS, *CONTROL_COLS, *CABLE_COLS, *imu, *MOTOR_COLS]),
            make_meta("hardware", **common),
        )
        self._truth = PartedTableWriter(
            self.folder / GROUNDTRUTH_FILE,
            arrow_schema(["t", "segment", *TARGET_COLS, *CAP_COLS, *ROD_POS_COLS, *ROD_QUAT_COLS]),
            make_meta("groundtruth", **common),
        )
        self._frames = None
        if self.camera is not None:
            self._frames = PartedTableWriter(
                self.folder / FRAMES_FILE,
                FRAMES_SCHEMA,
                {
                    "schema_version": FRAMES_SCHEMA_VERSION,
                    "policy_id": ident.policy_id,
                    "campaign": ident.campaign,
                    "iteration": ident.iteration,
                    "camera": self.camera.as_dict(),
                    "complete": False,
                },
            )
        self._next_checkpoint = self.checkpoint_every_s
        self._current_target: list[float] | None = None

    def add(self, packet: Packet) -> None:
        """Route one packet to its file; checkpoint when enough robot time has passed."""
        if isinstance(packet, SensorPacket):
            row: dict[str, object] = {"t": packet.t_s, "segment": packet.segment}
            row.update(zip(TARGET_COLS, map(float, packet.target), strict=True))
            row.update(zip(CONTROL_COLS, map(float, packet.control), strict=True))
            row.update(zip(CABLE_COLS, map(float, packet.cable_m), strict=True))
            for rod in self.identity.imu_rods:
                row.update(zip(imu_cols(rod), map(float, packet.imu_quat[rod]), strict=True))
            row.update(zip(MOTOR_COLS, map(float, packet.motor_rad), strict=True))
            self._hardware.append(row)
            self._current_target = [float(v) for v in packet.target]
            self.n_sensor += 1
            self.last_t_s = max(self.last_t_s, packet.t_s)
        elif isinstance(packet, GroundTruthPacket):
            row = {"t": packet.t_s, "segment": packet.segment}
            if self._current_target is None:
                raise ValueError("ground-truth packet before any sensor packet")
            row.update(zip(TARGET_COLS, self._current_target, strict=True))
            row.update(zip(CAP_COLS, map(float, packet.caps_m.ravel()), strict=True))
            row.update(zip(ROD_POS_COLS, map(float, packet.rod_pos_m.ravel()), strict=True))
            row.update(zip(ROD_QUAT_COLS, map(float, packet.rod_quat.ravel()), strict=True))
            self._truth.append(row)
            self.n_truth += 1
        elif isinstance(packet, FramePacket):
            if self._frames is None:
                raise ValueError("frame packet received but the recording has no camera")
            self._frames.append(encode_frame(packet.t_s, packet.rgb, packet.depth))
            self.n_frames += 1
        if self.last_t_s >= self._next_checkpoint:
            self.checkpoint()
            self._next_checkpoint += self.checkpoint_every_s

    def checkpoint(self) -> None:
        """Flush everything buffered to part files on disk."""
        for writer in self._writers():
            writer.flush()

    def _writers(self) -> list[PartedTableWriter]:
        return [w for w in (self._hardware, self._truth, self._frames) if w is not None]

    def close(self, complete: bool, reason: str | None = None) -> list[Path]:
        """Merge parts into the final files, stamping ``complete`` (and ``reason``)."""
        extra = {} if reason is None else {"incomplete_reason": reason}
        return [writer.finalize(complete, extra) for writer in self._writers()]


def recover_recording(folder: Path) -> list[Path]:
    """Merge part files left in ``folder`` by a process that died; marked incomplete."""
    recovered = []
    for name in (HARDWARE_FILE, GROUNDTRUTH_FILE, FRAMES_FILE):
        path = recover_parts(folder / name)
        if path is not None:
            recovered.append(path)
    return recovered
