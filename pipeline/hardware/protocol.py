"""The robot protocol (``docs/robot-protocol.md``): its messages, their schemas, and their encoding.

Every message is one MessagePack map with the protocol version ``v`` and its ``type``; the
fields of each type are the pydantic models below, which validate what arrives. Commands go from
the pipeline to the robot over a ZeroMQ DEALER -> ROUTER pair and are answered one to one;
telemetry goes from the robot over PUB -> SUB. Units are SI; times are seconds on the robot's
clock; arrays are flat lists of floats in the orders of :mod:`pipeline.hardware.base`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgpack
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pipeline.config import RobotConfig
from pipeline.errors import HardwareError
from pipeline.hardware.base import FramePacket, GroundTruthPacket, Packet, SensorPacket, StartPose

PROTOCOL_VERSION = 1
"""Raised when a message's fields change meaning or a required one is added (the docs' *Versioning*)."""

Six = Annotated[list[float], Field(min_length=6, max_length=6)]
Nine = Annotated[list[float], Field(min_length=9, max_length=9)]
Quaternion = Annotated[list[float], Field(min_length=4, max_length=4)]
Id = Annotated[int, Field(ge=0)]


class ProtocolError(HardwareError):
    """A message that is not the protocol's: undecodable, of an unknown type, or with bad fields."""


class VersionMismatch(ProtocolError):
    """The peer speaks another version of the protocol."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: int = PROTOCOL_VERSION


# ----------------------------------------------------------------------------- commands
class Hello(_Message):
    """Opens a session. A simulated robot starts it as if powered on (same seed, same noise)."""

    type: Literal["hello"] = "hello"
    id: Id
    session: str = Field(min_length=1)
    client: str


class StartMsg(BaseModel):
    """Where a robot that can be placed (a simulator) starts: :class:`StartPose`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    x_m: float = 0.0
    y_m: float = 0.0
    yaw_rad: float = 0.0


class Reset(_Message):
    """Back to rest: every actuated cable at target 1; ``start`` places a robot that can be placed."""

    type: Literal["reset"] = "reset"
    id: Id
    start: StartMsg | None = None


class PidSettings(BaseModel):
    """The firmware PID of the Tribar paper: target t in [0, 1] commands the length
    ``min_length_m + t * range_m``; a cable has reached it when ``|error| < tolerance`` (normalised);
    motor speed ``max_speed`` (the speed scale, 1 = the motor's rated speed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_length_m: float = Field(gt=0)
    range_m: float = Field(gt=0)
    tolerance: float = Field(gt=0, lt=1)
    max_speed: float = Field(gt=0, le=2)
    kp: float = Field(ge=0)
    ki: float = Field(ge=0)
    kd: float = Field(ge=0)
    control_rate_hz: float = Field(gt=0)


class RunTargets(_Message):
    """Run a policy: hold each target until the PID reaches it or ``segment_timeout_s`` passes,
    then the next; after the last, hold ``final_hold_s``. The command's ``id`` names the run in its
    telemetry."""

    type: Literal["run_targets"] = "run_targets"
    id: Id
    targets: list[Six] = Field(min_length=1)
    pid: PidSettings
    segment_timeout_s: float = Field(gt=0)
    final_hold_s: float = Field(default=1.0, ge=0)
    frames: bool = True


class RunControls(_Message):
    """Raw motor commands in [-1, 1], held ``duration_s`` (at most 5 s), then the motors stop."""

    type: Literal["run_controls"] = "run_controls"
    id: Id
    controls: Six
    duration_s: float = Field(gt=0, le=5)
    frames: bool = False


class Stop(_Message):
    """Stop every motor now; the run ends with reason ``stopped``."""

    type: Literal["stop"] = "stop"
    id: Id


class Ping(_Message):
    """The client's heartbeat; a robot running a run stops when it hears none for its watchdog time."""

    type: Literal["ping"] = "ping"
    id: Id


Command = Annotated[Hello | Reset | RunTargets | RunControls | Stop | Ping, Field(discriminator="type")]


# ----------------------------------------------------------------------------- replies
class CameraMsg(BaseModel):
    """Pinhole intrinsics (px), camera-to-world (4x4, row-major) and depth unit (m) of the robot's
    camera: :class:`~pipeline.hardware.base.CameraInfo`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    width_px: int = Field(gt=0)
    height_px: int = Field(gt=0)
    fx: float = Field(gt=0)
    fy: float = Field(gt=0)
    cx: float
    cy: float
    camera_to_world: Annotated[list[list[float]], Field(min_length=4, max_length=4)]
    depth_scale_m: float = Field(gt=0)


class Welcome(_Message):
    """The robot's answer to :class:`Hello`: who it is and what it streams."""

    type: Literal["welcome"] = "welcome"
    id: Id
    robot: str
    cables: Annotated[list[tuple[int, int]], Field(min_length=9, max_length=9)]
    """End caps each cable joins: the six actuated ones first, then the passive ones."""
    control_rate_hz: float = Field(gt=0)
    imu_rods: list[int]
    telemetry_port: int = Field(ge=1, le=65535)
    camera: CameraMsg | None = None
    truth: bool = False
    """Whether it streams ground truth (simulators only)."""
    placement: bool = False
    """Whether :class:`Reset` places it at ``start`` (a real robot is placed by hand)."""


class Ack(_Message):
    type: Literal["ack"] = "ack"
    id: Id


class Refusal(_Message):
    """A command the robot will not carry out: ``code`` is ``version``, ``busy`` or ``invalid``."""

    type: Literal["error"] = "error"
    id: int
    code: Literal["version", "busy", "invalid"]
    message: str
    protocol_version: int = PROTOCOL_VERSION


Reply = Annotated[Welcome | Ack | Refusal, Field(discriminator="type")]


# ----------------------------------------------------------------------------- telemetry
class Sample(_Message):
    """The on-board sensors at one control tick (:class:`~pipeline.hardware.base.SensorPacket`)
    and the PID's state: which target (``segment``) and whether every cable has reached it."""

    type: Literal["sample"] = "sample"
    run: Id
    seq: Id
    t_s: float
    segment: int = Field(ge=0)
    reached: bool
    target: Six
    control: Six
    cable_m: Nine
    imu: dict[int, Quaternion]
    motor_rad: Six


class Truth(_Message):
    """Simulator truth (:class:`~pipeline.hardware.base.GroundTruthPacket`), flattened row-major."""

    type: Literal["truth"] = "truth"
    run: Id
    seq: Id
    t_s: float
    segment: int = Field(ge=0)
    caps_m: Annotated[list[float], Field(min_length=18, max_length=18)]
    rod_pos_m: Nine
    rod_quat: Annotated[list[float], Field(min_length=12, max_length=12)]


class Frame(_Message):
    """An RGB-D frame: ``rgb`` height x width x 3 bytes, ``depth`` height x width little-endian
    uint16 in the camera's depth unit (0 = no reading)."""

    type: Literal["frame"] = "frame"
    run: Id
    seq: Id
    t_s: float
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    rgb: bytes
    depth: bytes


class RunEnd(_Message):
    """The last message of a run: ``seq`` is one past its last sample, truth or frame; ``t_s`` the
    robot time it ended at."""

    type: Literal["run_end"] = "run_end"
    run: Id
    seq: Id
    t_s: float
    reason: Literal["done", "stopped", "fault"]
    message: str = ""


class Heartbeat(_Message):
    """Sent every 0.2 s: the robot's clock (s since it started serving), whether a run is on, the
    latest run's id (-1: none yet), how many messages of it were sent, and its end once it ended
    (the :class:`RunEnd` again, for a client that lost it)."""

    type: Literal["heartbeat"] = "heartbeat"
    t_s: float
    state: Literal["idle", "running"]
    run: int
    sent: int = Field(ge=0)
    end: RunEnd | None = None


Telemetry = Annotated[Sample | Truth | Frame | RunEnd | Heartbeat, Field(discriminator="type")]

_COMMAND = TypeAdapter(Command)
_REPLY = TypeAdapter(Reply)
_TELEMETRY = TypeAdapter(Telemetry)


def encode(message: BaseModel, version: int = PROTOCOL_VERSION) -> bytes:
    """One message as MessagePack bytes (``version``: another only to test a peer against it)."""
    return msgpack.packb({**message.model_dump(), "v": version}, use_bin_type=True)


def _decode(data: bytes, adapter: TypeAdapter, source: str, version: int = PROTOCOL_VERSION) -> BaseModel:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"{source}: a message that is not MessagePack ({exc})") from None
    if not isinstance(raw, dict) or "v" not in raw or "type" not in raw:
        raise ProtocolError(f"{source}: a message without the protocol's 'v' and 'type' fields")
    if raw["v"] != version:
        raise VersionMismatch(f"{source} speaks protocol version {raw['v']!r}, not version {version}")
    try:
        return adapter.validate_python({**raw, "v": PROTOCOL_VERSION})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(f"{source}: message '{raw['type']}': field '{where}': {first['msg']}") from None


def decode_command(
    data: bytes, source: str, version: int = PROTOCOL_VERSION
) -> Hello | Reset | RunTargets | RunControls | Stop | Ping:
    """A command from ``source`` (named in errors), validated; ``version``: the one this end speaks."""
    return _decode(data, _COMMAND, source, version)


def decode_reply(data: bytes, source: str) -> Welcome | Ack | Refusal:
    """A reply from ``source``, validated."""
    return _decode(data, _REPLY, source)


def decode_telemetry(data: bytes, source: str) -> Sample | Truth | Frame | RunEnd | Heartbeat:
    """A telemetry message from ``source``, validated."""
    return _decode(data, _TELEMETRY, source)


# ----------------------------------------------------------------------------- packets
def telemetry_message(packet: Packet, run: int, seq: int, reached: bool) -> Sample | Truth | Frame:
    """The telemetry message of ``packet`` in run ``run`` (``reached``: the PID's state, samples only)."""
    if isinstance(packet, SensorPacket):
        return Sample(
            run=run,
            seq=seq,
            t_s=packet.t_s,
            segment=packet.segment,
            reached=reached,
            target=packet.target.tolist(),
            control=np.asarray(packet.control, float).tolist(),
            cable_m=packet.cable_m.tolist(),
            imu={int(rod): q.tolist() for rod, q in packet.imu_quat.items()},
            motor_rad=packet.motor_rad.tolist(),
        )
    if isinstance(packet, GroundTruthPacket):
        return Truth(
            run=run,
            seq=seq,
            t_s=packet.t_s,
            segment=packet.segment,
            caps_m=packet.caps_m.ravel().tolist(),
            rod_pos_m=packet.rod_pos_m.ravel().tolist(),
            rod_quat=packet.rod_quat.ravel().tolist(),
        )
    height, width = packet.depth.shape
    return Frame(
        run=run,
        seq=seq,
        t_s=packet.t_s,
        width=width,
        height=height,
        rgb=np.ascontiguousarray(packet.rgb, np.uint8).tobytes(),
        depth=np.ascontiguousarray(packet.depth, "<u2").tobytes(),
    )


def message_packet(message: Sample | Truth | Frame, source: str) -> Packet:
    """The packet a telemetry message carries; a frame whose bytes do not fit its size is refused."""
    if isinstance(message, Sample):
        return SensorPacket(
            t_s=message.t_s,
            segment=message.segment,
            target=np.array(message.target),
            control=np.array(message.control),
            cable_m=np.array(message.cable_m),
            imu_quat={rod: np.array(q) for rod, q in message.imu.items()},
            motor_rad=np.array(message.motor_rad),
        )
    if isinstance(message, Truth):
        return GroundTruthPacket(
            t_s=message.t_s,
            segment=message.segment,
            caps_m=np.array(message.caps_m).reshape(6, 3),
            rod_pos_m=np.array(message.rod_pos_m).reshape(3, 3),
            rod_quat=np.array(message.rod_quat).reshape(3, 4),
        )
    pixels = message.width * message.height
    if len(message.rgb) != 3 * pixels or len(message.depth) != 2 * pixels:
        raise ProtocolError(
            f"{source}: frame at t = {message.t_s:.3f} s: {len(message.rgb)} rgb and {len(message.depth)} depth bytes "
            f"for {message.width} x {message.height} px (expected {3 * pixels} and {2 * pixels})"
        )
    return FramePacket(
        t_s=message.t_s,
        rgb=np.frombuffer(message.rgb, np.uint8).reshape(message.height, message.width, 3),
        depth=np.frombuffer(message.depth, "<u2").reshape(message.height, message.width).astype(np.uint16),
    )


def pid_settings(robot: RobotConfig) -> PidSettings:
    """The robot config's firmware PID, as a run sends it."""
    return PidSettings(
        min_length_m=robot.actuated_cable.min_length_m,
        range_m=robot.actuated_cable.range_m,
        tolerance=robot.pid.tolerance,
        max_speed=robot.motor.speed,
        kp=robot.pid.kp,
        ki=robot.pid.ki,
        kd=robot.pid.kd,
        control_rate_hz=robot.pid.control_rate_hz,
    )


def start_message(start: StartPose | None) -> StartMsg | None:
    return None if start is None else StartMsg(x_m=start.x_m, y_m=start.y_m, yaw_rad=start.yaw_rad)
