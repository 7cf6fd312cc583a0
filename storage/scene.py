"""A robot's run as Foxglove channels: the 3D scene, the camera and the sensors' time series.

:class:`RobotScene` logs onto its own :class:`foxglove.Context`, so that one scene goes to an MCAP
file (:mod:`storage.mcap_export`) and another to Foxglove's WebSocket server (:mod:`storage.live`)
without mixing. Channels (topic: message schema):

* ``/robot/<source>`` (``foxglove.SceneUpdate``): the rods as cylinders from end cap to end cap and
  the end caps as spheres, one entity per source: ``truth`` (the twin's own poses), ``tracked``
  (the track stage's), ``replay_<engine>`` (an engine's replay of the run, as a ghost);
* ``/ground`` (``foxglove.SceneUpdate``): the ground plane, at the run's first time;
* ``/tf`` (``foxglove.FrameTransform``): the camera's pose in the ``world`` frame;
* ``/camera/calibration`` (``foxglove.CameraCalibration``), ``/camera/color`` and
  ``/camera/depth`` (``foxglove.CompressedImage``, the recording's PNG bytes as they are stored;
  depth in units of the camera's depth scale);
* ``/sensors`` (JSON): per sample its segment, the six targets and controls, the nine cable lengths
  (m) and the six motor angles (rad), for Foxglove's plots.

Times are the run's own clock (``t`` in seconds from its start) as nanoseconds from the Unix
epoch: Foxglove shows them as dates in January 1970.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import foxglove
import numpy as np
from foxglove.channels import (
    CameraCalibrationChannel,
    CompressedImageChannel,
    FrameTransformChannel,
    SceneUpdateChannel,
)
from foxglove.messages import (
    CameraCalibration,
    Color,
    CompressedImage,
    CubePrimitive,
    CylinderPrimitive,
    FrameTransform,
    Pose,
    Quaternion,
    SceneEntity,
    SceneUpdate,
    SpherePrimitive,
    Timestamp,
    Vector3,
)

from pipeline.config import RobotConfig
from pipeline.hardware.base import CameraInfo, SensorPacket
from pipeline.robot_model import rotation_to_quat

WORLD_FRAME = "world"
CAMERA_FRAME = "camera"
SENSORS_TOPIC = "/sensors"
SOURCE_COLORS: Mapping[str, tuple[float, float, float, float]] = {
    "truth": (0.20, 0.45, 0.85, 1.0),
    "tracked": (0.95, 0.55, 0.10, 1.0),
    "replay_before": (0.55, 0.55, 0.55, 0.45),
    "replay_after": (0.25, 0.75, 0.35, 0.45),
    "replay_learned": (0.70, 0.35, 0.80, 0.45),
}
"""Each robot source's colour (r, g, b, alpha): replays are translucent ghosts."""
SENSORS_SCHEMA = "r2s2r.Sensors"
_SENSORS_SCHEMA = {
    "type": "object",
    "properties": {
        "t_s": {"type": "number"},
        "segment": {"type": "integer"},
        "target": {"type": "array", "items": {"type": "number"}},
        "control": {"type": "array", "items": {"type": "number"}},
        "cable_m": {"type": "array", "items": {"type": "number"}},
        "motor_rad": {"type": "array", "items": {"type": "number"}},
    },
}


def nanoseconds(t_s: float) -> int:
    """A run time (s) as the log time of its messages (ns)."""
    return round(t_s * 1e9)


def _stamp(t_s: float) -> Timestamp:
    whole = math.floor(t_s)
    return Timestamp(int(whole), min(round((t_s - whole) * 1e9), 999_999_999))


def _z_to(direction: np.ndarray) -> Quaternion:
    """The rotation turning the z axis onto unit vector ``direction`` (3,)."""
    x, y, z = (float(v) for v in direction)
    if z < -1 + 1e-9:  # opposite: half a turn about x
        return Quaternion(x=1.0, y=0.0, z=0.0, w=0.0)
    w = 1.0 + z
    norm = math.sqrt(w * w + x * x + y * y)
    return Quaternion(x=-y / norm, y=x / norm, z=0.0, w=w / norm)


def _values(values: np.ndarray) -> list[float | None]:
    """``values`` as JSON numbers, those not finite as null (JSON has no NaN)."""
    return [float(v) if math.isfinite(v) else None for v in values]


def _vector(p: np.ndarray) -> Vector3:
    return Vector3(x=float(p[0]), y=float(p[1]), z=float(p[2]))


class RobotScene:
    """Channels for one run of ``robot`` on a fresh :class:`foxglove.Context` (see the module
    docstring); ``sources`` are the ``/robot/<source>`` channels to create."""

    def __init__(self, robot: RobotConfig, sources: tuple[str, ...]) -> None:
        self.context = foxglove.Context()
        self.robot = robot
        self._robots = {s: SceneUpdateChannel(f"/robot/{s}", context=self.context) for s in sources}
        self._ground = SceneUpdateChannel("/ground", context=self.context)
        self._tf = FrameTransformChannel("/tf", context=self.context)
        self._calibration = CameraCalibrationChannel("/camera/calibration", context=self.context)
        self._color = CompressedImageChannel("/camera/color", context=self.context)
        self._depth = CompressedImageChannel("/camera/depth", context=self.context)
        schema = foxglove.Schema(name=SENSORS_SCHEMA, encoding="jsonschema", data=json.dumps(_SENSORS_SCHEMA).encode())
        self._sensors = foxglove.Channel(SENSORS_TOPIC, schema=schema, message_encoding="json", context=self.context)

    def robot_pose(self, source: str, t_s: float, caps_m: np.ndarray) -> None:
        """The robot with end caps ``caps_m`` (6, 3), m, on ``/robot/<source>`` at ``t_s``."""
        r, g, b, a = SOURCE_COLORS.get(source, (0.5, 0.5, 0.5, 1.0))
        color = Color(r=r, g=g, b=b, a=a)
        cap_d = 2 * self.robot.end_cap.radius_m
        rod_d = max(2 * self.robot.rod.radius_m, 0.01)  # thin rods drawn 1 cm thick to stay visible
        cylinders = []
        for rod in range(3):
            a_m, b_m = caps_m[2 * rod], caps_m[2 * rod + 1]
            length = float(np.linalg.norm(b_m - a_m))
            if not length > 0:
                continue
            pose = Pose(position=_vector((a_m + b_m) / 2), orientation=_z_to((b_m - a_m) / length))
            size = Vector3(x=rod_d, y=rod_d, z=length)
            cylinders.append(CylinderPrimitive(pose=pose, size=size, bottom_scale=1.0, top_scale=1.0, color=color))
        spheres = [
            SpherePrimitive(
                pose=Pose(position=_vector(cap), orientation=Quaternion(w=1.0)),
                size=Vector3(x=cap_d, y=cap_d, z=cap_d),
                color=color,
            )
            for cap in caps_m
            if np.isfinite(cap).all()
        ]
        entity = SceneEntity(
            timestamp=_stamp(t_s), frame_id=WORLD_FRAME, id=source, cylinders=cylinders, spheres=spheres
        )
        self._robots[source].log(SceneUpdate(entities=[entity]), log_time=nanoseconds(t_s))

    def ground(self, t_s: float, size_m: float = 4.0) -> None:
        """The ground plane (``size_m`` square, 1 cm thick, its top at z = 0) at ``t_s``."""
        pose = Pose(position=Vector3(z=-0.005), orientation=Quaternion(w=1.0))
        cube = CubePrimitive(
            pose=pose, size=Vector3(x=size_m, y=size_m, z=0.01), color=Color(r=0.8, g=0.8, b=0.78, a=1)
        )
        entity = SceneEntity(timestamp=_stamp(t_s), frame_id=WORLD_FRAME, id="ground", cubes=[cube])
        self._ground.log(SceneUpdate(entities=[entity]), log_time=nanoseconds(t_s))

    def camera(self, t_s: float, camera: CameraInfo) -> None:
        """The camera's pose (``/tf``) and intrinsics (``/camera/calibration``) at ``t_s``."""
        pose = np.asarray(camera.camera_to_world, float)
        w, x, y, z = (float(v) for v in rotation_to_quat(pose[:3, :3]))
        transform = FrameTransform(
            timestamp=_stamp(t_s),
            parent_frame_id=WORLD_FRAME,
            child_frame_id=CAMERA_FRAME,
            translation=_vector(pose[:3, 3]),
            rotation=Quaternion(x=x, y=y, z=z, w=w),
        )
        self._tf.log(transform, log_time=nanoseconds(t_s))
        k = [camera.fx, 0.0, camera.cx, 0.0, camera.fy, camera.cy, 0.0, 0.0, 1.0]
        calibration = CameraCalibration(
            timestamp=_stamp(t_s),
            frame_id=CAMERA_FRAME,
            width=camera.width_px,
            height=camera.height_px,
            distortion_model="plumb_bob",
            D=[0.0] * 5,
            K=k,
            R=[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
            P=[camera.fx, 0.0, camera.cx, 0.0, 0.0, camera.fy, camera.cy, 0.0, 0.0, 0.0, 1.0, 0.0],
        )
        self._calibration.log(calibration, log_time=nanoseconds(t_s))

    def frame(self, t_s: float, color_png: bytes, depth_png: bytes) -> None:
        """One camera frame (PNG-encoded colour and 16-bit depth) at ``t_s``."""
        for channel, data in ((self._color, color_png), (self._depth, depth_png)):
            image = CompressedImage(timestamp=_stamp(t_s), frame_id=CAMERA_FRAME, data=data, format="png")
            channel.log(image, log_time=nanoseconds(t_s))

    def sensors(self, packet: SensorPacket) -> None:
        """One sensor sample on ``/sensors`` (a value not read, NaN in the recording, as null)."""
        message = {
            "t_s": packet.t_s,
            "segment": int(packet.segment),
            "target": _values(packet.target),
            "control": _values(packet.control),
            "cable_m": _values(packet.cable_m),
            "motor_rad": _values(packet.motor_rad),
        }
        self._sensors.log(message, log_time=nanoseconds(packet.t_s))
