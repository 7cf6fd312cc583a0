"""The MuJoCo twin: rest state, geometry, sensors, rendering, determinism, faults."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.control import REST_LENGTH_LIMITS_M
from pipeline.errors import HardwareError
from pipeline.gaits.outcome import folded_flat
from pipeline.gaits.symmetry import bottom_face, count_rolls
from pipeline.hardware.base import FramePacket, GroundTruthPacket, SensorPacket, StartPose
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import Policy, gait_policy, random_policy
from pipeline.robot_model import cable_lengths_from_poses, heading_rad, quat_to_rotation

from .conftest import FOLD, small_twin


def _run(twin: MujocoTwin, policy: Policy, frames: bool = False):
    twin.reset(seed=1)  # the same noise whatever ran before
    packets = list(twin.execute(policy, segment_timeout_s=8.0, record_frames=frames))
    sensors = [p for p in packets if isinstance(p, SensorPacket)]
    truth = [p for p in packets if isinstance(p, GroundTruthPacket)]
    images = [p for p in packets if isinstance(p, FramePacket)]
    return sensors, truth, images


@pytest.fixture(scope="module")
def ten_second_run(twin, default_configs):
    """A random policy of about 10 s on the twin, with frames."""
    policy = random_policy(default_configs.robot, n_targets=18, seed=11)
    sensors, truth, images = _run(twin, policy, frames=True)
    return policy, sensors, truth, images


def test_rest_state_lies_on_face_025(twin) -> None:
    twin.reset()
    caps = twin.ground_truth(0.0, 0).caps_m
    radius = twin.robot.end_cap.radius_m
    assert sorted(np.argsort(caps[:, 2])[:3].tolist()) == [0, 2, 5]
    assert np.all(caps[[0, 2, 5], 2] == pytest.approx(radius, abs=2e-3))
    assert caps[[1, 4], 2].min() > 0.1
    rods = [np.linalg.norm(caps[a] - caps[b]) for a, b in twin.robot.topology.rods]
    assert rods == pytest.approx([twin.robot.rod.length_m] * 3, abs=1e-6)


def test_robot_at_rest_stays_at_rest(twin) -> None:
    policy = Policy("hold", np.ones((1, 6)))
    _, truth, _ = _run(twin, policy)
    drift = np.linalg.norm(truth[-1].caps_m - truth[0].caps_m, axis=1).max()
    assert drift < 0.005


def test_attachment_sites_on_end_cap_surfaces(twin) -> None:
    robot = twin.robot
    half = robot.rod.length_m / 2
    for cable in twin.cables:
        for end in (cable.a, cable.b):
            local = np.asarray(end.local_m)
            cap_centre = np.array([0.0, 0.0, half if local[2] > 0 else -half])
            assert np.linalg.norm(local - cap_centre) == pytest.approx(robot.end_cap.radius_m)
            assert np.hypot(local[0], local[1]) == pytest.approx(robot.end_cap.radius_m)  # not on the rod axis
    used = {(end.cap, end.local_m) for c in twin.cables for end in (c.a, c.b)}
    assert len(used) == 18  # three distinct points on each of the six caps


def test_random_policy_moves_the_robot(ten_second_run) -> None:
    policy, sensors, truth, _ = ten_second_run
    duration = sensors[-1].t_s
    assert 8.0 < duration < 40.0  # about 10 s of robot time
    assert max(p.segment for p in sensors) == len(policy) - 1
    caps = np.array([p.caps_m for p in truth])
    travel = np.linalg.norm(np.diff(caps, axis=0), axis=2).sum(axis=0)
    assert travel.min() > 0.05  # every end cap moved at least 5 cm
    assert np.all(caps[:, :, 2] > 0.0)  # nothing sinks below the ground


def test_sensed_cables_match_attachment_distances(twin, ten_second_run) -> None:
    _, sensors, truth, _ = ten_second_run
    sensed = np.array([p.cable_m for p in sensors])
    rod_pos = np.array([p.rod_pos_m for p in truth])
    rod_quat = np.array([p.rod_quat for p in truth])
    true = cable_lengths_from_poses(twin.cables, rod_pos, rod_quat)
    residual = sensed - true - np.asarray(twin.twin.sensors.cable_bias_m)
    noise = twin.twin.sensors.cable_noise_std_m
    assert np.abs(residual.mean(axis=0)).max() < 4 * noise / np.sqrt(len(residual)) + 1e-4
    np.testing.assert_allclose(residual.std(axis=0), noise, rtol=0.2)
    assert np.abs(residual).max() < 6 * noise


def test_imu_orientation_and_time_stamps(twin, ten_second_run) -> None:
    _, sensors, truth, _ = ten_second_run
    t = np.array([p.t_s for p in sensors])
    assert np.all(np.diff(t) > 0)
    np.testing.assert_allclose(np.diff(t).mean(), 1 / twin.robot.pid.control_rate_hz, rtol=0.01)
    angles = []
    for s, g in zip(sensors, truth, strict=True):
        assert set(s.imu_quat) == set(twin.robot.sensors.imu_rods)
        for rod, q in s.imu_quat.items():
            relative = quat_to_rotation(q) @ quat_to_rotation(g.rod_quat[rod]).T
            angles.append(np.arccos(np.clip((np.trace(relative) - 1) / 2, -1, 1)))
    sigma = twin.twin.sensors.imu_noise_std_rad
    assert np.sqrt(np.mean(np.square(angles))) == pytest.approx(np.sqrt(3) * sigma, rel=0.2)


def test_frames_show_all_three_rod_colours_at_rest(twin, ten_second_run) -> None:
    _, _, _, images = ten_second_run
    first = images[0]
    camera = twin.camera
    assert first.t_s == 0.0
    assert first.rgb.shape == (camera.height_px, camera.width_px, 3) and first.rgb.dtype == np.uint8
    assert first.depth.dtype == np.uint16
    rgb = first.rgb.astype(int)
    for channel in range(3):
        others = [c for c in range(3) if c != channel]
        mask = (rgb[..., channel] > 120) & (rgb[..., others].max(axis=-1) < 90)
        assert mask.sum() >= 10, f"colour channel {channel} not visible"
    distance = np.linalg.norm(np.asarray(twin.twin.camera.position_m) - np.asarray(twin.twin.camera.look_at_m))
    centre_depth = first.depth[camera.height_px // 2, camera.width_px // 2] * camera.depth_scale_m
    assert centre_depth == pytest.approx(distance, rel=0.15)
    assert abs(len(images) - images[-1].t_s * twin.twin.camera.rate_hz) <= 2


def test_same_seed_same_data(default_configs) -> None:
    policy = random_policy(default_configs.robot, n_targets=2, seed=5)
    runs = []
    for _ in range(2):
        twin = MujocoTwin(default_configs.robot, small_twin(default_configs.twin))
        sensors, truth, _ = _run(twin, policy)
        runs.append((np.array([p.cable_m for p in sensors]), np.array([p.caps_m for p in truth])))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_injected_disconnect_raises_after_streaming(default_configs) -> None:
    twin = MujocoTwin(default_configs.robot, small_twin(default_configs.twin), fail_after_s=0.5)
    twin.reset()
    received = []
    with pytest.raises(HardwareError, match="connection lost at t = 0.50 s"):
        for packet in twin.execute(random_policy(default_configs.robot, 3, seed=0), 8.0, record_frames=False):
            received.append(packet)
    assert sum(isinstance(p, SensorPacket) for p in received) == 25


def _gait_outcome(twin: MujocoTwin, name: str):
    policy = gait_policy(twin.robot, name, cycles=1)
    _, truth, _ = _run(twin, policy)
    caps = np.array([p.caps_m for p in truth])
    faces = np.array([bottom_face(c) for c in caps])
    yaw = np.unwrap(heading_rad(caps))
    return caps, faces, np.degrees(yaw[-1] - yaw[0])


def test_published_rolling_gait_rolls_forward_three_faces(twin) -> None:
    caps, faces, _ = _gait_outcome(twin, "rolling")
    assert count_rolls(faces, min_dwell=25) == (3, 0)
    assert faces[0] == faces[-1] == 0
    centroid = caps.mean(axis=1)
    assert np.linalg.norm(centroid[-1, :2] - centroid[0, :2]) > 0.3


def test_published_turning_gaits_turn_in_their_published_sense(twin) -> None:
    _, _, ccw = _gait_outcome(twin, "ccw")
    _, _, cw = _gait_outcome(twin, "cw")
    assert ccw > 5.0  # counter-clockwise: heading increases
    assert cw < -5.0


def test_the_twin_folds_the_prism_flat_where_the_engine_does(twin) -> None:
    """From the rest pose, four actuated cables retracted (the gaits tests' ``FOLD``) lay the prism
    flat on the twin too: the rods slide over one another until every end cap is on the ground
    (:func:`~pipeline.gaits.outcome.folded_flat`); the published rolling gait does not."""
    fold = Policy("fold", FOLD)
    _, truth, _ = _run(twin, fold)
    caps = np.array([p.caps_m for p in truth])
    assert folded_flat(caps, twin.robot.rod.length_m)
    assert caps[0, :, 2].max() > 0.1 and caps[:, :, 2].max(-1).min() < 2.5 * twin.robot.end_cap.radius_m
    rolling, _, _ = _gait_outcome(twin, "rolling")
    assert not folded_flat(rolling, twin.robot.rod.length_m)


def test_reset_places_the_robot_at_a_start_pose(twin) -> None:
    """The rest pose moved and turned rigidly: same shape and heights, centroid moved by (x, y),
    heading turned by the yaw; and it stays at rest there."""
    twin.reset()
    rest = twin.ground_truth(0.0, 0).caps_m
    twin.reset(StartPose(0.3, -0.2, np.pi / 2))
    placed = twin.ground_truth(0.0, 0).caps_m
    np.testing.assert_allclose(placed[:, 2], rest[:, 2], atol=1e-9)
    np.testing.assert_allclose(placed.mean(0)[:2] - rest.mean(0)[:2], [0.3, -0.2], atol=1e-9)
    turn = np.angle(np.exp(1j * (heading_rad(placed) - heading_rad(rest))))
    assert turn == pytest.approx(np.pi / 2, abs=1e-9)
    pairwise = np.linalg.norm(placed[:, None] - placed[None], axis=-1)
    np.testing.assert_allclose(pairwise, np.linalg.norm(rest[:, None] - rest[None], axis=-1), atol=1e-9)
    packets = twin.execute(Policy("hold", np.ones((1, 6))), segment_timeout_s=2.0, record_frames=False)
    truth = [p for p in packets if isinstance(p, GroundTruthPacket)]
    drift = np.linalg.norm(truth[-1].caps_m - placed, axis=-1).max()
    assert drift < 0.005


def test_winch_angles_follow_the_cable_wound_and_stop_at_its_limits(twin) -> None:
    """Motor angles times the winch radius equal the rest length wound in, also once a cable is
    paid out to its mechanical limit and the motor is still commanded."""
    twin.reset()
    rest, angle = twin._rest_length[:6].copy(), twin._motor_rad.copy()
    for _ in range(4000):  # 4 s of full pay-out: every actuated cable reaches its upper limit
        twin._physics_step(-np.ones(6))
    assert twin._rest_length[:6] == pytest.approx(np.full(6, REST_LENGTH_LIMITS_M[1]))
    wound = (twin._motor_rad - angle) * twin.robot.motor.winch_radius_m
    np.testing.assert_allclose(wound, rest - twin._rest_length[:6], atol=1e-12)
    twin.reset()
