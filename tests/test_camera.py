"""Cameras: a RealSense recording played back through pyrealsense2, a camera beside a robot on the
robot's clock, and the clock offset between the two.

No RealSense device is attached here: the bag is written with ``rosbags`` in the layout the
RealSense SDK records (``/device_0/sensor_<i>/<stream>/...``, static information at the first
nanosecond), and pyrealsense2 plays it back as it would a recording of a device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.config import LoadedConfigs
from pipeline.errors import ConfigError, HardwareError
from pipeline.hardware.base import ClockPacket, FramePacket, SensorPacket
from pipeline.hardware.camera import CameraRobot, ClockSync, RealSenseCamera
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import random_policy
from storage.frames import frames_meta, iter_frames
from storage.recording import FRAMES_FILE, Recording, RecordingIdentity

from .conftest import small_twin

pytest.importorskip("pyrealsense2")

W, H = 64, 48
K = (52.0, 51.0, 31.5, 23.0)  # fx, fy, cx, cy (px)
DEPTH_UNIT_M = 0.001
STAMPS_S = (0.1, 0.2, 0.3, 0.4, 0.5)


def _rgb(i: int) -> np.ndarray:
    return (np.arange(H * W * 3, dtype=np.uint32).reshape(H, W, 3) * (i + 1) % 251).astype(np.uint8)


def _depth(i: int) -> np.ndarray:
    return (800 + 10 * i + np.arange(H * W).reshape(H, W) % 97).astype(np.uint16)


def write_realsense_bag(path: Path, stamps_s: tuple[float, ...] = STAMPS_S) -> None:
    """A RealSense-layout ROS 1 bag: a depth and a colour stream of ``W`` x ``H`` at the given
    device times, intrinsics ``K``, depth unit ``DEPTH_UNIT_M``."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    store.register(
        get_types_from_msg("uint32 fps\nstring encoding\nbool is_recommended\n", "realsense_msgs/msg/StreamInfo")
    )
    T = store.types
    connections: dict[str, object] = {}

    def header(t: float, seq: int) -> object:
        return T["std_msgs/msg/Header"](
            seq=seq, stamp=T["builtin_interfaces/msg/Time"](sec=int(t), nanosec=round(t % 1 * 1e9)), frame_id="0"
        )

    with Writer(path) as writer:

        def put(topic: str, kind: str, message: object, t: float | None = None) -> None:
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, kind, typestore=store)
            # static information at the first nanosecond (the SDK reads it "at time 0"), frames later
            writer.write(
                connections[topic], 1 if t is None else round((t + 1.0) * 1e9), store.serialize_ros1(message, kind)
            )

        key_value = T["diagnostic_msgs/msg/KeyValue"]
        put("/file_version", "std_msgs/msg/UInt32", T["std_msgs/msg/UInt32"](data=3))
        for key, value in {"Name": "Intel RealSense D435", "Serial Number": "000000000001"}.items():
            put("/device_0/info", "diagnostic_msgs/msg/KeyValue", key_value(key=key, value=value))
        streams = (("Stereo Module", "Depth_0", "mono16"), ("RGB Camera", "Color_0", "rgb8"))
        for index, (sensor, stream, encoding) in enumerate(streams):
            base = f"/device_0/sensor_{index}"
            put(f"{base}/info", "diagnostic_msgs/msg/KeyValue", key_value(key="Name", value=sensor))
            info = T["realsense_msgs/msg/StreamInfo"](fps=10, encoding=encoding, is_recommended=True)
            put(f"{base}/{stream}/info", "realsense_msgs/msg/StreamInfo", info)
            fx, fy, cx, cy = K
            camera_info = T["sensor_msgs/msg/CameraInfo"](
                header=header(0.0, 0), height=H, width=W, distortion_model="Brown Conrady", D=np.zeros(5),
                K=np.array([fx, 0, cx, 0, fy, cy, 0, 0, 1.0]), R=np.eye(3).ravel(), P=np.zeros(12), binning_x=0,
                binning_y=0, roi=T["sensor_msgs/msg/RegionOfInterest"](
                    x_offset=0, y_offset=0, height=0, width=0, do_rectify=False
                ),
            )  # fmt: skip
            put(f"{base}/{stream}/info/camera_info", "sensor_msgs/msg/CameraInfo", camera_info)
            transform = T["geometry_msgs/msg/Transform"](
                translation=T["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0),
                rotation=T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
            )
            put(f"{base}/{stream}/tf/0", "geometry_msgs/msg/Transform", transform)
        units = "/device_0/sensor_0/option/Depth Units"
        put(f"{units}/value", "std_msgs/msg/Float32", T["std_msgs/msg/Float32"](data=DEPTH_UNIT_M))
        put(f"{units}/description", "std_msgs/msg/String", T["std_msgs/msg/String"](data="metres per depth unit"))
        image = T["sensor_msgs/msg/Image"]
        for i, t in enumerate(stamps_s):
            depth = image(header=header(t, i), height=H, width=W, encoding="mono16", is_bigendian=0, step=2 * W,
                          data=_depth(i).view(np.uint8).ravel())  # fmt: skip
            put("/device_0/sensor_0/Depth_0/image/data", "sensor_msgs/msg/Image", depth, t)
            rgb = image(header=header(t, i), height=H, width=W, encoding="rgb8", is_bigendian=0, step=3 * W,
                        data=_rgb(i).ravel())  # fmt: skip
            put("/device_0/sensor_1/Color_0/image/data", "sensor_msgs/msg/Image", rgb, t)


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("realsense") / "recording.bag"
    write_realsense_bag(path)
    return path


def test_a_realsense_recording_plays_back_with_its_intrinsics_and_stamps(bag: Path) -> None:
    pose = np.eye(4)
    pose[:3, 3] = (1.0, -0.5, 1.2)
    camera = RealSenseCamera(pose, bag=bag)
    try:
        info = camera.info
        assert (info.width_px, info.height_px) == (W, H)
        assert (info.fx, info.fy, info.cx, info.cy) == pytest.approx(K)
        assert info.depth_scale_m == pytest.approx(DEPTH_UNIT_M)
        assert np.array_equal(info.camera_to_world, pose)
        frames = camera.frames()
    finally:
        camera.close()
    # the SDK's syncer has nothing to match the first depth and colour frames to yet and may hand them
    # over apart (librealsense's own syncer tests expect it), more often on a loaded machine; such a
    # frame is not a frame of both, and the camera skips it
    skipped = len(STAMPS_S) - len(frames)
    assert skipped in (0, 1)
    assert [f.t_s for f in frames] == pytest.approx(STAMPS_S[skipped:])
    for i, frame in enumerate(frames, start=skipped):
        assert np.array_equal(frame.rgb, _rgb(i))
        # depth aligned to colour: with the same intrinsics and no offset between the two a depth reading
        # lands on its own pixel, but the SDK's splatting leaves the odd pixel empty or on its neighbour
        assert (frame.depth == _depth(i)).mean() > 0.85


def test_a_missing_or_foreign_bag_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nosuch.bag is not a file"):
        RealSenseCamera(np.eye(4), bag=tmp_path / "nosuch.bag")
    foreign = tmp_path / "foreign.bag"
    foreign.write_bytes(b"#ROSBAG V2.0\n" + bytes(64))
    with pytest.raises(HardwareError, match="foreign.bag"):
        RealSenseCamera(np.eye(4), bag=foreign)


def test_clock_sync_finds_the_offset_within_the_least_delay() -> None:
    rng = np.random.default_rng(0)
    robot_minus_local, camera_minus_local = 12.5, -3.25  # true clocks against this machine's
    sync = ClockSync()
    for local in np.arange(0.0, 5.0, 0.02):
        delay = rng.exponential(0.004) + 0.001  # transport delays: at least 1 ms, a few on average
        sync.robot_stamp(local + robot_minus_local - delay, local)
        if round(local / 0.02) % 3 == 0:
            sync.camera_stamp(local + camera_minus_local - rng.exponential(0.004) - 0.001, local)
    # each bound is off by its stream's least delay (1 ms and a little): the offset by their difference
    assert sync.offset_s == pytest.approx(robot_minus_local - camera_minus_local, abs=1e-3)


def test_a_camera_beside_a_robot_records_its_frames_on_the_robot_clock(
    default_configs: LoadedConfigs, bag: Path, tmp_path: Path
) -> None:
    twin = MujocoTwin(default_configs.robot, small_twin(default_configs.twin))
    robot = CameraRobot(twin, RealSenseCamera(np.eye(4), bag=bag))
    try:
        packets = list(robot.execute(random_policy(default_configs.robot, 1, seed=0), 3.0, record_frames=True))
        identity = RecordingIdentity("c", 1, "p", "hash", 50.0, (0, 1, 2), 3.0)
        recording = Recording(tmp_path, identity, robot.camera, checkpoint_every_s=1.0)
        for packet in packets:
            recording.add(packet)
        recording.close(complete=True)
    finally:
        robot.close()
    frames = [p for p in packets if isinstance(p, FramePacket)]
    (clock,) = [p for p in packets if isinstance(p, ClockPacket)]
    assert len(frames) == len(STAMPS_S) and clock.samples == len(STAMPS_S) and clock.source == "camera"
    # the frames keep the camera's spacing (they came in one poll: one estimate) ...
    assert np.diff([f.t_s for f in frames]) == pytest.approx(np.diff(STAMPS_S))
    # ... and went out with the estimate of that time: within the reported spread of the final one
    assert np.allclose([f.t_s - clock.offset_s for f in frames], STAMPS_S, atol=clock.spread_s + 1e-9)
    assert all(f.rgb.shape == (H, W, 3) for f in frames)  # the bag's frames, none of the twin's own
    assert any(isinstance(p, SensorPacket) for p in packets)
    assert [f.t_s for f in iter_frames(tmp_path / FRAMES_FILE)] == pytest.approx([f.t_s for f in frames])
    meta = frames_meta(tmp_path / FRAMES_FILE)
    assert meta["camera_clock_offset_s"] == clock.offset_s and meta["camera_clock_samples"] == len(STAMPS_S)
    assert meta["camera_clock_spread_s"] == clock.spread_s
