"""The hardware interface every backend (MuJoCo twin, robot bridge, recordings) implements.

A backend streams timestamped packets while it executes a policy. Downstream code
sees only these packets and :class:`CameraInfo`, never which backend made them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pipeline.policies import Policy


@dataclass(frozen=True)
class SensorPacket:
    """On-board sensors at one control tick.

    ``t_s``: time stamp (s, from the start of the policy); ``segment``: index of the
    policy target being executed; ``target`` (6,) normalised targets; ``control``
    (6,) motor commands in [-1, 1]; ``cable_m`` (9,) sensed cable lengths (m);
    ``imu_quat`` maps rod index -> measured orientation quaternion (w, x, y, z);
    ``motor_rad`` (6,) winch angles (rad).
    """

    t_s: float
    segment: int
    target: np.ndarray
    control: np.ndarray
    cable_m: np.ndarray
    imu_quat: dict[int, np.ndarray]
    motor_rad: np.ndarray


@dataclass(frozen=True)
class FramePacket:
    """One RGB-D camera sample: ``rgb`` (H, W, 3) uint8, ``depth`` (H, W) uint16 in
    units of :attr:`CameraInfo.depth_scale_m` (0 = no reading)."""

    t_s: float
    rgb: np.ndarray
    depth: np.ndarray


@dataclass(frozen=True)
class GroundTruthPacket:
    """Simulator truth (twin only): ``caps_m`` (6, 3) end-cap centres, ``rod_pos_m``
    (3, 3) rod centres, ``rod_quat`` (3, 4) rod orientations (w, x, y, z), world frame."""

    t_s: float
    segment: int
    caps_m: np.ndarray
    rod_pos_m: np.ndarray
    rod_quat: np.ndarray


@dataclass(frozen=True)
class GapPacket:
    """Telemetry lost on the way from a networked robot: ``missing`` messages between the last one
    received before the gap (robot time ``t_start_s``) and the first one after it (``t_end_s``)."""

    t_start_s: float
    t_end_s: float
    missing: int

    @property
    def duration_s(self) -> float:
        return self.t_end_s - self.t_start_s


@dataclass(frozen=True)
class ClockPacket:
    """How another device's clock was put on the robot's: robot time = that device's time +
    ``offset_s`` (s), estimated from ``samples`` of its stamps (``source``: ``camera``); the
    estimates applied to its packets as they came were at most ``spread_s`` from it."""

    source: str
    offset_s: float
    samples: int
    spread_s: float = 0.0


Packet = SensorPacket | FramePacket | GroundTruthPacket | GapPacket | ClockPacket


@dataclass(frozen=True)
class CameraInfo:
    """Pinhole intrinsics (pixels) and camera-to-world extrinsics (4, 4), OpenCV
    convention: x right, y down, z forward."""

    width_px: int
    height_px: int
    fx: float
    fy: float
    cx: float
    cy: float
    camera_to_world: np.ndarray
    depth_scale_m: float

    def as_dict(self) -> dict[str, object]:
        return {
            "width_px": self.width_px,
            "height_px": self.height_px,
            "fx": self.fx,
            "fy": self.fy,
            "cx": self.cx,
            "cy": self.cy,
            "camera_to_world": np.asarray(self.camera_to_world).tolist(),
            "depth_scale_m": self.depth_scale_m,
        }


ProgressCallback = Callable[[float], None]


@dataclass(frozen=True)
class StartPose:
    """Where the robot is placed before a run: its rest pose turned by ``yaw_rad`` about the
    vertical through its centroid, then moved by (``x_m``, ``y_m``) on the ground (world frame)."""

    x_m: float = 0.0
    y_m: float = 0.0
    yaw_rad: float = 0.0


class Robot(ABC):
    """A cable-driven robot that can be reset, run a policy, and be stopped."""

    @property
    @abstractmethod
    def camera(self) -> CameraInfo | None:
        """The calibrated RGB-D camera, or None if the backend records no frames."""

    @abstractmethod
    def reset(self, start: StartPose | None = None) -> None:
        """Bring the robot to its rest state (all actuated cables extended, on the ground),
        placed at ``start`` (default: where the backend's rest pose is)."""

    @abstractmethod
    def execute(
        self,
        policy: Policy,
        segment_timeout_s: float,
        record_frames: bool = True,
        progress: ProgressCallback | None = None,
    ) -> Iterator[Packet]:
        """Run ``policy`` from the current state, yielding packets as they are produced.

        Each target is held until the PID reports it reached or ``segment_timeout_s``
        passes. ``progress`` is called with the elapsed robot time (s).
        Raises :class:`pipeline.errors.HardwareError` if the hardware fails; packets
        already yielded stay valid.
        """

    @abstractmethod
    def stop(self) -> None:
        """Stop all motors now; the next :meth:`execute` starts a new run."""

    def close(self) -> None:  # noqa: B027 (a backend with nothing to release keeps this)
        """Release the backend's resources (renderer, connection); the robot is not used after."""
