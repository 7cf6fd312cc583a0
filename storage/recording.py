"""Record a hardware packet stream into trajectory and frame files, crash-safe.

A :class:`Recording` routes :class:`~pipeline.hardware.base.SensorPacket` to the
``hardware`` trajectory, :class:`~pipeline.hardware.base.GroundTruthPacket` to the
``groundtruth`` trajectory and :class:`~pipeline.hardware.base.FramePacket` to the
frames file; a :class:`~pipeline.hardware.base.GapPacket` (telemetry lost on the way from a
networked robot) is listed in both trajectories' metadata (``gaps``), a
:class:`~pipeline.hardware.base.ClockPacket` (a separate camera's clock offset) in the frames'. Data are flushed to part
files every ``checkpoint_every_s`` of robot time; :meth:`Recording.close` merges them and marks the
files complete or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.config import LoadedConfigs, config_hash
from pipeline.errors import DataError
from pipeline.hardware.base import (
    CameraInfo,
    ClockPacket,
    FramePacket,
    GapPacket,
    GroundTruthPacket,
    Packet,
    Robot,
    SensorPacket,
    StartPose,
)
from pipeline.policies import Policy
from pipeline.progress import progress
from storage.files import atomic_write_bytes, atomic_write_json
from storage.frames import FRAMES_SCHEMA, FRAMES_SCHEMA_VERSION, encode_frame, first_frame_png
from storage.layout import Ref, read_manifest
from storage.live import LiveScene, live_scene
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
POLICY_FILE = "policy.json"
GIVEN_CAPS_FILE = "given_caps.parquet"
"""End caps that came with an imported recording (``source = tracked``, ``method: given``): the
track stage takes them as they are."""


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
    gaps: list[dict[str, float]] = field(default_factory=list)
    live: LiveScene | None = None
    """Where the packets also go as they come (``--live``, :mod:`storage.live`)."""
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
        self._common = common
        self._truth: PartedTableWriter | None = None  # opened by the first ground-truth packet
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
        self._early_truth: list[GroundTruthPacket] = []

    def add(self, packet: Packet) -> None:
        """Route one packet to its file (and to the live view); checkpoint when enough robot time has passed."""
        if self.live is not None and not isinstance(packet, FramePacket):
            self.live.add(packet)
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
            for early in self._early_truth:
                self._add_truth(early)
            self._early_truth.clear()
            self.n_sensor += 1
            self.last_t_s = max(self.last_t_s, packet.t_s)
        elif isinstance(packet, GroundTruthPacket):
            if self._current_target is None:  # its sample was lost on the way: it takes the next one's target
                self._early_truth.append(packet)
            else:
                self._add_truth(packet)
        elif isinstance(packet, GapPacket):
            self.gaps.append({"t_start_s": packet.t_start_s, "t_end_s": packet.t_end_s, "missing": packet.missing})
            for writer in (self._hardware, self._truth):
                if writer is not None:
                    writer.meta["gaps"] = list(self.gaps)
        elif isinstance(packet, ClockPacket):
            if self._frames is not None:
                self._frames.meta[f"{packet.source}_clock_offset_s"] = packet.offset_s
                self._frames.meta[f"{packet.source}_clock_samples"] = packet.samples
                self._frames.meta[f"{packet.source}_clock_spread_s"] = packet.spread_s
        elif isinstance(packet, FramePacket):
            if self._frames is None:
                raise ValueError("frame packet received but the recording has no camera")
            row = encode_frame(packet.t_s, packet.rgb, packet.depth)
            self._frames.append(row)
            self.n_frames += 1
            if self.live is not None:
                self.live.add(packet, (row["rgb_png"], row["depth_png"]), self.camera)
        if self.last_t_s >= self._next_checkpoint:
            self.checkpoint()
            self._next_checkpoint += self.checkpoint_every_s

    def _add_truth(self, packet: GroundTruthPacket) -> None:
        """One ground-truth row, with the target of the last sensor packet."""
        assert self._current_target is not None
        row: dict[str, object] = {"t": packet.t_s, "segment": packet.segment}
        row.update(zip(TARGET_COLS, self._current_target, strict=True))
        row.update(zip(CAP_COLS, map(float, packet.caps_m.ravel()), strict=True))
        row.update(zip(ROD_POS_COLS, map(float, packet.rod_pos_m.ravel()), strict=True))
        row.update(zip(ROD_QUAT_COLS, map(float, packet.rod_quat.ravel()), strict=True))
        if self._truth is None:
            self._truth = PartedTableWriter(
                self.folder / GROUNDTRUTH_FILE,
                arrow_schema(["t", "segment", *TARGET_COLS, *CAP_COLS, *ROD_POS_COLS, *ROD_QUAT_COLS]),
                make_meta("groundtruth", **self._common, gaps=list(self.gaps)),
            )
        self._truth.append(row)
        self.n_truth += 1

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


def recording_folders(ref: Ref) -> list[Path]:
    """The recording folders of a verified stage output (collect, redeploy), in order: those whose
    hardware trajectory its manifest lists, and nothing else that may lie in the folder."""
    manifest = read_manifest(ref)
    names = sorted(
        rel.split("/")[0] for rel in manifest["files"] if rel.count("/") == 1 and rel.endswith(f"/{HARDWARE_FILE}")
    )
    if not names:
        raise DataError(f"{Path(ref.path) / 'manifest.json'}: the stage lists no recording (*/{HARDWARE_FILE})")
    return [Path(ref.path) / name for name in names]


def write_policy_json(
    folder: Path, name: str, policy_id: str, targets: np.ndarray, recorded_as: str | None = None
) -> None:
    """Write ``folder/policy.json``: the policy's name, id and targets (n, 6), and what else
    identifies the run (``recorded_as``, a hash, where the stage keeps one), atomically."""
    payload: dict[str, object] = {"name": name, "policy_id": policy_id, "targets": targets.tolist()}
    if recorded_as is not None:
        payload["recorded_as"] = recorded_as
    atomic_write_json(folder / POLICY_FILE, payload)


def write_first_frame_plot(stage_dir: Path, folder: Path) -> None:
    """Save the first camera frame of ``folder``'s frames file (if any) as ``stage_dir/plots/first_frame.png``."""
    png = first_frame_png(folder / FRAMES_FILE) if (folder / FRAMES_FILE).is_file() else None
    if png is not None:
        atomic_write_bytes(stage_dir / "plots" / "first_frame.png", png)


def open_recording(
    configs: LoadedConfigs, iteration: int, name: str, folder: Path, robot: Robot, segment_timeout_s: float
) -> Recording:
    """A recording of run ``name`` of ``iteration`` into ``folder``, with ``robot``'s camera if
    ``collect.record_frames``, checkpointed every ``collect.checkpoint_every_s``; the run will
    hold each target at most ``segment_timeout_s`` (s)."""
    c = configs.pipeline.collect
    identity = RecordingIdentity(
        campaign=configs.pipeline.campaign,
        iteration=iteration,
        policy_id=name,
        robot_config_hash=config_hash(configs.robot),
        sample_rate_hz=configs.robot.pid.control_rate_hz,
        imu_rods=configs.robot.sensors.imu_rods,
        segment_timeout_s=segment_timeout_s,
    )
    camera = robot.camera if c.record_frames else None
    return Recording(folder, identity, camera, c.checkpoint_every_s, live=live_scene(configs.robot))


def record_run(
    robot: Robot,
    policy: Policy,
    recording: Recording,
    record_frames: bool,
    start: StartPose | None = None,
) -> None:
    """Place ``robot`` at ``start``, run ``policy`` and write it into ``recording`` (opened with a
    camera if ``record_frames``), each target held at most the recording's ``segment_timeout_s``. If the
    hardware fails or the run is interrupted, the robot is stopped, what was recorded is kept,
    marked incomplete, and the exception propagates."""
    segments = 0
    try:
        robot.reset(start)
        with progress(f"run {recording.folder.name}", len(policy), "targets") as row:
            timeout_s = recording.identity.segment_timeout_s
            for packet in robot.execute(policy, timeout_s, record_frames=record_frames):
                recording.add(packet)
                if isinstance(packet, SensorPacket) and packet.segment != segments:
                    segments = packet.segment
                    row.update(completed=segments)
            row.update(completed=len(policy))
    except BaseException as exc:
        robot.stop()
        recording.close(complete=False, reason=f"{type(exc).__name__}: {exc}")
        raise
    recording.close(complete=True)
