"""RGB-D cameras behind one interface: the twin's renderer and Intel RealSense (live or a ``.bag``).

A :class:`Camera` hands over the frames it captured since it was last asked, stamped on its own
clock. :class:`CameraRobot` puts a camera beside a robot that has none of its own (a robot on the
network): it merges the camera's frames into the robot's packet stream on the robot's clock,
with the offset between the two clocks estimated as the run goes (:class:`ClockSync`) and
recorded (:class:`~pipeline.hardware.base.ClockPacket`).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.config.twin import CameraConfig as TwinCameraConfig
from pipeline.errors import ConfigError, HardwareError
from pipeline.hardware.base import (
    CameraInfo,
    ClockPacket,
    FramePacket,
    Packet,
    ProgressCallback,
    Robot,
    SensorPacket,
    StartPose,
)
from pipeline.policies import Policy

log = logging.getLogger(__name__)


class Camera(ABC):
    """A calibrated RGB-D camera."""

    @property
    @abstractmethod
    def info(self) -> CameraInfo:
        """Intrinsics, depth unit and where the camera stands (camera-to-world)."""

    @abstractmethod
    def frames(self) -> list[FramePacket]:
        """The frames captured since the last call, oldest first, ``t_s`` on the camera's clock (s)."""

    def close(self) -> None:  # noqa: B027 (a camera with nothing to release keeps this)
        """Stop streaming and release the device."""


class TwinCamera(Camera):
    """The twin's calibrated camera: MuJoCo renders it (``MUJOCO_GL=egl``) when the twin's control
    loop calls :meth:`capture`, with depth noise from the twin's generator."""

    def __init__(self, model: object, data: object, config: TwinCameraConfig, camera_to_world: np.ndarray) -> None:
        self.model, self.data, self.config = model, data, config
        self.camera_to_world = camera_to_world
        self._renderer = None
        self._captured: list[FramePacket] = []

    @property
    def info(self) -> CameraInfo:
        cam = self.config
        f = 0.5 * cam.height_px / np.tan(np.deg2rad(cam.fovy_deg) / 2)
        return CameraInfo(
            width_px=cam.width_px,
            height_px=cam.height_px,
            fx=f,
            fy=f,
            cx=(cam.width_px - 1) / 2,
            cy=(cam.height_px - 1) / 2,
            camera_to_world=self.camera_to_world,
            depth_scale_m=cam.depth_scale_m,
        )

    def capture(self, t_s: float, rng: np.random.Generator) -> FramePacket:
        """Render now, stamped ``t_s``: RGB uint8 and depth uint16 (0 = no return)."""
        import mujoco

        cam = self.config
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, cam.height_px, cam.width_px)
        renderer = self._renderer
        renderer.disable_depth_rendering()
        renderer.update_scene(self.data, camera="rgbd")
        rgb = renderer.render().copy()
        renderer.enable_depth_rendering()
        renderer.update_scene(self.data, camera="rgbd")
        depth_m = renderer.render().astype(np.float64)
        renderer.disable_depth_rendering()
        depth_m = depth_m + rng.normal(0.0, cam.depth_noise_std_m, depth_m.shape)
        valid = (depth_m > 0) & (depth_m < cam.max_depth_m)
        depth = np.where(valid, np.round(depth_m / cam.depth_scale_m), 0).astype(np.uint16)
        frame = FramePacket(t_s=t_s, rgb=rgb, depth=depth)
        self._captured.append(frame)
        return frame

    def frames(self) -> list[FramePacket]:
        out, self._captured = self._captured, []
        return out

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class RealSenseCamera(Camera):
    """An Intel RealSense RGB-D camera through ``pyrealsense2``: the device with serial number
    ``serial`` (None: the first one found), or the recording ``bag`` played back as fast as it is
    read. Depth is aligned to the colour image; intrinsics and the depth unit come from the device
    (or the bag), where it stands in the world (``camera_to_world``, 4x4) from the calibration."""

    def __init__(
        self,
        camera_to_world: np.ndarray,
        serial: str | None = None,
        bag: Path | None = None,
        width_px: int = 640,
        height_px: int = 480,
        fps: int = 30,
    ) -> None:
        try:
            import pyrealsense2 as rs
        except ImportError:
            raise ConfigError(
                "camera.source 'realsense' needs the pyrealsense2 package (pip install pyrealsense2)"
            ) from None
        self.source = str(bag) if bag is not None else f"RealSense {serial or '(first found)'}"
        config = rs.config()
        if bag is not None:
            if not Path(bag).is_file():
                raise ConfigError(f"camera.bag: {bag} is not a file")
            config.enable_device_from_file(str(bag), repeat_playback=False)
        else:
            if serial is not None:
                config.enable_device(serial)
            config.enable_stream(rs.stream.depth, width_px, height_px, rs.format.z16, fps)
            config.enable_stream(rs.stream.color, width_px, height_px, rs.format.rgb8, fps)
        self._pipeline = rs.pipeline()
        self._playback = None
        try:
            if bag is not None:
                # before start(): a bag played in real time drops the frames nobody reads yet
                self._playback = config.resolve(self._pipeline).get_device().as_playback()
                self._playback.set_real_time(False)
                self._stopped = rs.playback_status.stopped
            profile = self._pipeline.start(config)
        except RuntimeError as exc:
            raise HardwareError(f"{self.source}: {exc}") from None
        device = profile.get_device()
        self._align = rs.align(rs.stream.color)
        color = profile.get_stream(rs.stream.color).as_video_stream_profile().get_intrinsics()
        self._info = CameraInfo(
            width_px=color.width,
            height_px=color.height,
            fx=color.fx,
            fy=color.fy,
            cx=color.ppx,
            cy=color.ppy,
            camera_to_world=np.asarray(camera_to_world, float),
            depth_scale_m=device.first_depth_sensor().get_depth_scale(),
        )
        self._played = False

    @property
    def info(self) -> CameraInfo:
        return self._info

    def frames(self) -> list[FramePacket]:
        out = []
        while not self._played:
            if self._playback is not None:
                stopped = self._playback.current_status() == self._stopped
                ok, frameset = self._pipeline.try_wait_for_frames(1000 if stopped else 200)
                if not ok:
                    # a slow machine may take longer than a wait to read a frame, and a stopped playback's
                    # last frames may still be on their way: played out is a wait begun after the stop
                    # that brings nothing
                    self._played = stopped
                    continue
            else:
                frameset = self._pipeline.poll_for_frames()
                if not frameset:
                    break
            aligned = self._align.process(frameset)
            color, depth = aligned.get_color_frame(), aligned.get_depth_frame()
            if not color or not depth:  # the syncer may hand the first frames over apart, with nothing to match yet
                continue
            out.append(
                FramePacket(
                    t_s=color.get_timestamp() / 1000.0,
                    rgb=np.asanyarray(color.get_data()).copy(),
                    depth=np.asanyarray(depth.get_data()).astype(np.uint16),
                )
            )
        return out

    def close(self) -> None:
        self._pipeline.stop()


class ClockSync:
    """The offset from a camera's clock to a robot's, from when their stamps arrive here.

    A stamp ``t`` received at local time ``h`` bounds ``clock - local`` from below by ``t - h``
    (transport only delays); the largest bound seen is the least delayed one. The robot's clock
    is then the camera's plus the difference of the two bounds. The offset is as good as the
    least delayed message of each: a few milliseconds on a local network or USB.
    """

    def __init__(self) -> None:
        self.robot: float | None = None
        self.camera: float | None = None
        self.samples = 0

    def robot_stamp(self, t_s: float, local_s: float) -> None:
        self.robot = t_s - local_s if self.robot is None else max(self.robot, t_s - local_s)

    def camera_stamp(self, t_s: float, local_s: float) -> None:
        self.camera = t_s - local_s if self.camera is None else max(self.camera, t_s - local_s)
        self.samples += 1

    @property
    def offset_s(self) -> float | None:
        """Robot time minus camera time (s); None until both clocks were seen."""
        return None if self.robot is None or self.camera is None else self.robot - self.camera


class CameraRobot(Robot):
    """``robot`` with ``camera`` beside it: frames on the robot's clock in its packet stream."""

    def __init__(self, robot: Robot, camera: Camera) -> None:
        self.robot, self.rgbd = robot, camera

    @property
    def camera(self) -> CameraInfo:
        return self.rgbd.info

    def reset(self, start: StartPose | None = None) -> None:
        self.robot.reset(start)

    def stop(self) -> None:
        self.robot.stop()

    def close(self) -> None:
        self.rgbd.close()
        self.robot.close()

    def execute(
        self,
        policy: Policy,
        segment_timeout_s: float,
        record_frames: bool = True,
        progress: ProgressCallback | None = None,
    ) -> Iterator[Packet]:
        """The robot's packets (without frames of its own), and with ``record_frames`` the camera's
        frames that came while it ran, each on the robot's clock as estimated when it came, then a
        :class:`ClockPacket` with the final estimate and how far the ones applied were from it."""
        clock = ClockSync()
        waiting: list[FramePacket] = []
        applied: list[float] = []

        def stamped() -> Iterator[FramePacket]:
            offset = clock.offset_s
            if offset is None:
                return
            for frame in waiting:
                applied.append(offset)
                yield FramePacket(t_s=frame.t_s + offset, rgb=frame.rgb, depth=frame.depth)
            waiting.clear()

        def arrived(now: float) -> None:
            for frame in self.rgbd.frames():
                clock.camera_stamp(frame.t_s, now)
                waiting.append(frame)

        for packet in self.robot.execute(policy, segment_timeout_s, False, progress):
            now = time.monotonic()
            if isinstance(packet, SensorPacket):
                clock.robot_stamp(packet.t_s, now)
            if not isinstance(packet, FramePacket):
                yield packet
            if record_frames:
                arrived(now)
                yield from stamped()
        if not record_frames:
            return
        arrived(time.monotonic())
        if clock.offset_s is None:
            log.warning("%d frames dropped: the robot sent no sample to set the camera's clock by", len(waiting))
            return
        yield from stamped()
        spread = max((abs(a - clock.offset_s) for a in applied), default=0.0)
        yield ClockPacket(source="camera", offset_s=clock.offset_s, samples=clock.samples, spread_s=spread)
