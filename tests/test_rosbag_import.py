"""``r2s2r import-bag``: a Tribar-style robot's ROS 1 and ROS 2 bags as collect recordings.

The bags are written with ``rosbags`` from a run of the twin, in the topic layout of the default
``bag_import`` map, so that what the import reads back can be compared with what the twin sent.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo, FramePacket, GroundTruthPacket, SensorPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import random_policy
from storage.catalog import tracked_file
from storage.frames import frames_meta, iter_frames
from storage.recording import FRAMES_FILE, HARDWARE_FILE
from storage.trajectory import CABLE_COLS, CONTROL_COLS, TARGET_COLS, caps_array, imu_cols, read_trajectory
from tasks.import_recording import run_import_bag
from tasks.track import run_track

from .conftest import small_twin, write_test_pipeline

START_S = 1_700_000_000.0
"""The robot's clock at the first sample (Unix time, as a robot's computer stamps)."""


@pytest.fixture(scope="module")
def twin_packets(default_configs: LoadedConfigs) -> tuple[list, CameraInfo]:
    """A short run of the twin (all its packets) and its camera."""
    twin = MujocoTwin(default_configs.robot, small_twin(default_configs.twin))
    packets = list(twin.execute(random_policy(default_configs.robot, 2, seed=4), 3.0, record_frames=True))
    twin.close()
    return packets, twin.camera


@pytest.fixture(scope="module")
def twin_run(twin_packets: tuple[list, CameraInfo]) -> tuple[list[SensorPacket], list[FramePacket], np.ndarray]:
    """The run's samples, its frames and the camera's intrinsics (3x3)."""
    packets, info = twin_packets
    k = np.array([[info.fx, 0, info.cx], [0, info.fy, info.cy], [0, 0, 1]])
    return [p for p in packets if isinstance(p, SensorPacket)], [p for p in packets if isinstance(p, FramePacket)], k


def write_bag(path: Path, samples: list[SensorPacket], frames: list[FramePacket], k: np.ndarray, ros2: bool) -> None:
    """The run in the default topic map (cables, targets, controls, three IMUs, colour, depth, camera info)."""
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE if ros2 else Stores.ROS1_NOETIC)
    T = store.types
    if ros2:
        from rosbags.rosbag2 import Writer

        writer, serialize = Writer(path, version=8), store.serialize_cdr
    else:
        from rosbags.rosbag1 import Writer

        writer, serialize = Writer(path), store.serialize_ros1
    connections: dict[str, object] = {}

    def header(t: float) -> object:
        stamp = T["builtin_interfaces/msg/Time"](sec=int(START_S + t), nanosec=round((START_S + t) % 1 * 1e9))
        return T["std_msgs/msg/Header"](stamp=stamp, frame_id="tribar", **({} if ros2 else {"seq": 0}))

    def array(values: np.ndarray) -> object:
        layout = T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        return T["std_msgs/msg/Float64MultiArray"](layout=layout, data=np.asarray(values, np.float64))

    with writer:

        def put(topic: str, kind: str, message: object, t: float) -> None:
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, kind, typestore=store)
            writer.write(connections[topic], round((START_S + t) * 1e9), serialize(message, kind))

        for p in samples:
            put("/tribar/cable_lengths", "std_msgs/msg/Float64MultiArray", array(p.cable_m), p.t_s)
            put("/tribar/targets", "std_msgs/msg/Float64MultiArray", array(p.target), p.t_s)
            put("/tribar/controls", "std_msgs/msg/Float64MultiArray", array(p.control), p.t_s)
            for rod, q in p.imu_quat.items():
                orientation = T["geometry_msgs/msg/Quaternion"](x=q[1], y=q[2], z=q[3], w=q[0])
                zero = T["geometry_msgs/msg/Vector3"](x=0.0, y=0.0, z=0.0)
                imu = T["sensor_msgs/msg/Imu"](
                    header=header(p.t_s), orientation=orientation, orientation_covariance=np.zeros(9),
                    angular_velocity=zero, angular_velocity_covariance=np.zeros(9), linear_acceleration=zero,
                    linear_acceleration_covariance=np.zeros(9),
                )  # fmt: skip
                put(f"/tribar/imu{rod}", "sensor_msgs/msg/Imu", imu, p.t_s)
        k_name, d_name, r_name, p_name = ("k", "d", "r", "p") if ros2 else ("K", "D", "R", "P")
        for f in frames:
            height, width = f.depth.shape
            image = T["sensor_msgs/msg/Image"]
            rgb = image(header=header(f.t_s), height=height, width=width, encoding="rgb8", is_bigendian=0,
                        step=3 * width, data=f.rgb.ravel())  # fmt: skip
            put("/camera/color/image_raw", "sensor_msgs/msg/Image", rgb, f.t_s)
            depth = image(header=header(f.t_s), height=height, width=width, encoding="16UC1", is_bigendian=0,
                          step=2 * width, data=f.depth.astype("<u2").view(np.uint8).ravel())  # fmt: skip
            put("/camera/aligned_depth_to_color/image_raw", "sensor_msgs/msg/Image", depth, f.t_s)
        roi = T["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False)
        height, width = frames[0].depth.shape
        info = T["sensor_msgs/msg/CameraInfo"](
            header=header(0.0), height=height, width=width, distortion_model="plumb_bob", binning_x=0, binning_y=0,
            roi=roi, **{d_name: np.zeros(5), k_name: k.ravel(), r_name: np.eye(3).ravel(), p_name: np.zeros(12)},
        )  # fmt: skip
        put("/camera/color/camera_info", "sensor_msgs/msg/CameraInfo", info, 0.0)


def _pipeline(folder: Path, **bag_import: object) -> LoadedConfigs:
    pipeline = write_test_pipeline(folder, n_targets=2)
    pose = np.eye(4).tolist()
    return load_all(
        pipeline, {"bag_import.camera_to_world": pose, **{f"bag_import.{k}": v for k, v in bag_import.items()}}
    )


FRAMES = {
    "color": "/camera/color/image_raw",
    "depth": "/camera/aligned_depth_to_color/image_raw",
    "camera_info": "/camera/color/camera_info",
}


@pytest.mark.parametrize("ros2", [False, True], ids=["ros1", "ros2"])
def test_a_bag_imports_as_the_run_it_recorded(twin_run, tmp_path: Path, ros2: bool) -> None:
    samples, frames, k = twin_run
    bag = tmp_path / ("run" if ros2 else "run.bag")
    write_bag(bag, samples, frames, k, ros2)
    ref, summary = run_import_bag(_pipeline(tmp_path, **FRAMES), 1, bag)
    folder = Path(ref.path) / summary["policy_id"]
    hardware, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    t = np.array([p.t_s for p in samples])
    assert np.allclose(hardware["t"], t - t[0], atol=1e-6)  # the bag's stamps are ns
    assert np.array_equal(hardware[CABLE_COLS].to_numpy(), np.stack([p.cable_m for p in samples]))
    assert np.array_equal(hardware[TARGET_COLS].to_numpy(), np.stack([p.target for p in samples]))
    assert np.array_equal(hardware[CONTROL_COLS].to_numpy(), np.stack([p.control for p in samples]))
    assert np.array_equal(hardware[imu_cols(2)].to_numpy(), np.stack([p.imu_quat[2] for p in samples]))
    assert hardware["segment"].max() + 1 == summary["n_targets"] and meta.gaps == []
    stored = list(iter_frames(folder / FRAMES_FILE))
    assert len(stored) == len(frames)
    for got, sent in zip(stored, frames, strict=True):
        assert np.array_equal(got.rgb, sent.rgb) and np.array_equal(got.depth, sent.depth)
    camera = frames_meta(folder / FRAMES_FILE)["camera"]
    assert (camera["fx"], camera["cx"], camera["cy"]) == (k[0, 0], k[0, 2], k[1, 2])


def test_gaps_and_duplicated_stamps_are_kept_and_marked(twin_run, tmp_path: Path) -> None:
    samples, frames, k = twin_run
    kept = samples[:40] + samples[60:]  # 20 samples (0.4 s) never logged
    kept = [*kept[:10], kept[9], *kept[10:]]  # one logged twice
    bag = tmp_path / "gappy.bag"
    write_bag(bag, kept, frames, k, ros2=False)
    ref, summary = run_import_bag(_pipeline(tmp_path), 1, bag)
    hardware, meta = read_trajectory(Path(ref.path) / summary["policy_id"] / HARDWARE_FILE, expect_source="hardware")
    assert len(hardware) == len(kept) and summary["duplicated_stamps"] == 1
    (gap,) = meta.gaps
    assert gap.t_start_s == pytest.approx(samples[39].t_s - samples[0].t_s, abs=1e-6)
    assert gap.t_end_s == pytest.approx(samples[60].t_s - samples[0].t_s, abs=1e-6)
    assert 18 <= gap.missing <= 22  # 20 samples at a jittered 50 Hz
    assert not (Path(ref.path) / summary["policy_id"] / FRAMES_FILE).exists()  # no image topics mapped


def test_a_bag_without_the_mapped_topics_is_refused_by_name(twin_run, tmp_path: Path) -> None:
    samples, frames, k = twin_run
    bag = tmp_path / "run.bag"
    write_bag(bag, samples, frames, k, ros2=False)
    configs = _pipeline(tmp_path, cables="/robot/cables")
    with pytest.raises(DataError, match=r"run.bag: no topic /robot/cables \(bag_import"):
        run_import_bag(configs, 1, bag)
    stage = Path(configs.pipeline.runs_dir) / "test" / "iter_1" / "collect"
    assert not stage.exists()  # nothing half-written
    (tmp_path / "junk.bag").write_bytes(b"not a bag")
    with pytest.raises(DataError, match="junk.bag: not a readable ROS 1 or ROS 2 bag"):
        run_import_bag(configs, 1, tmp_path / "junk.bag")


def test_frames_need_a_calibrated_camera(tmp_path: Path) -> None:
    pipeline = write_test_pipeline(tmp_path, n_targets=2)
    data = yaml.safe_load(pipeline.read_text())
    data["bag_import"] = FRAMES
    pipeline.write_text(yaml.safe_dump(data))
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="frames need camera_to_world"):
        load_all(pipeline)


def test_the_track_stage_runs_on_an_imported_bag(twin_packets, twin_run, tmp_path: Path) -> None:
    packets, info = twin_packets
    samples, frames, k = twin_run
    bag = tmp_path / "run.bag"
    write_bag(bag, samples, frames, k, ros2=False)
    configs = _pipeline(tmp_path, **FRAMES, camera_to_world=np.asarray(info.camera_to_world).tolist())
    collect_ref, summary = run_import_bag(configs, 1, bag)
    track_ref, _ = run_track(configs, 1, collect_ref)
    tracked, _ = read_trajectory(tracked_file(track_ref, summary["policy_id"]), expect_source="tracked")
    truth = [p for p in packets if isinstance(p, GroundTruthPacket)]
    truth_t = np.array([p.t_s for p in truth]) - samples[0].t_s
    at = np.searchsorted(truth_t, tracked["t"].to_numpy() - 1e-9).clip(0, len(truth) - 1)
    error_mm = 1e3 * np.linalg.norm(caps_array(tracked) - np.stack([truth[i].caps_m for i in at]), axis=-1)
    # the tracker's error on the twin is a few millimetres (benchmarks.tracking): the same here
    assert np.median(error_mm) < 10.0
