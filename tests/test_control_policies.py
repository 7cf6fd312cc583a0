"""PID controller, motor model, policy generation, feasibility and gait symmetry."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.control import PID, motor_speed_rad_s, rest_length_change_m
from pipeline.errors import PolicyError
from pipeline.gaits.symmetry import FACES, bottom_face, count_rolls
from pipeline.policies import Policy, check_policy, gait_policy, random_policy
from pipeline.published_gaits import ROLLING_UNIT, published_gait
from pipeline.robot_model import shift_left, shift_right


def test_pid_signs_saturation_and_dead_band(default_configs) -> None:
    pid = PID(default_configs.robot.pid)
    target = np.full(6, 0.5)
    position = np.array([0.9, 0.1, 0.55, 0.45, 0.5, 0.71])
    u = pid.step(position, target)
    assert u[0] == 1.0  # too long, saturated: wind in
    assert u[1] == -1.0  # too short: let out
    assert np.all(u[2:5] == 0.0)  # within the 0.2 tolerance: dead band
    assert 0 < u[5] <= 1.0
    assert pid.within_tolerance(position, target).tolist() == [False, False, True, True, True, False]


def test_pid_integral_and_derivative(default_configs) -> None:
    gains = default_configs.robot.pid.model_copy(update={"kp": 0.0, "ki": 1.0, "kd": 0.0})
    pid = PID(gains)
    for _ in range(10):
        u = pid.step(np.full(6, 0.8), np.full(6, 0.5))
    assert u[0] == pytest.approx(10 * 0.3 * pid.dt_s)
    pid.reset()
    gains = default_configs.robot.pid.model_copy(update={"kp": 0.0, "ki": 0.0, "kd": 1.0})
    pid = PID(gains)
    pid.step(np.full(6, 0.8), np.full(6, 0.5))
    u = pid.step(np.full(6, 0.805), np.full(6, 0.5))
    assert u[0] == pytest.approx(0.005 / pid.dt_s)


def test_pid_closes_the_loop_on_the_motor_model(default_configs) -> None:
    """Ideal cable (length = rest length): the PID drives it into the tolerance band."""
    robot = default_configs.robot
    pid = PID(robot.pid)
    length = np.full(6, robot.actuated_cable.min_length_m + robot.actuated_cable.range_m)
    target = np.array([0.0, 0.3, 0.6, 1.0, 0.1, 0.5])
    omega_prev = np.zeros(6)
    for tick in range(500):  # noqa: B007 (tick is read after the loop)
        position = (length - robot.actuated_cable.min_length_m) / robot.actuated_cable.range_m
        if pid.within_tolerance(position, target).all():
            break
        u = pid.step(position, target)
        omega = motor_speed_rad_s(robot.motor.speed, robot.motor.omega_max_rad_s, u)
        length = length - rest_length_change_m(omega_prev, omega, robot.motor.winch_radius_m, pid.dt_s)
        omega_prev = omega
    assert pid.within_tolerance(position, target).all()
    max_speed = robot.motor.speed * robot.motor.omega_max_rad_s * robot.motor.winch_radius_m
    assert tick * pid.dt_s == pytest.approx(0.8 * robot.actuated_cable.range_m / max_speed, rel=0.15)


def test_motor_model_trapezoid() -> None:
    omega = motor_speed_rad_s(0.5, np.array([10.0, 20.0]), np.array([1.0, -0.5]))
    np.testing.assert_allclose(omega, [5.0, -5.0])
    np.testing.assert_allclose(rest_length_change_m(np.zeros(2), omega, 0.01, 0.1), [0.0025, -0.0025])


def test_feasibility_repairs_triangle_violation(default_configs, caplog) -> None:
    robot = default_configs.robot
    policy = Policy("cwfix", np.array([[0, 0, 1, 0, 1, 1.0]]))
    with caplog.at_level(logging.WARNING):
        fixed = check_policy(robot, policy)
    assert fixed.targets[0, 2] == pytest.approx(0.9)  # 0.10 + 0.10 - 0.01 m slack
    assert "cable 2 repaired" in caplog.text
    published_fix = Policy("cw", np.array([[0, 0, 0.8, 0, 1, 1.0]]))
    np.testing.assert_array_equal(check_policy(robot, published_fix).targets, published_fix.targets)
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # a gait repeated for cycles: one line for all its repairs
        check_policy(robot, Policy("cycles", np.array([[0, 0, 1, 0, 1, 1.0]] * 3)))
    (record,) = caplog.records
    assert record.getMessage().count("cable 2 repaired 1.000 -> 0.900") == 3


def test_feasibility_reject_mode_and_bad_values(default_configs) -> None:
    robot = default_configs.robot.model_copy(
        update={"feasibility": default_configs.robot.feasibility.model_copy(update={"mode": "reject"})}
    )
    with pytest.raises(PolicyError, match=r"target 1 .* cable 5 by 10.0 mm"):
        check_policy(robot, Policy("p", np.array([[1.0] * 6, [1, 1, 1, 0, 0, 1.0]])))
    with pytest.raises(PolicyError, match=r"target 0 cable 3 = nan"):
        check_policy(robot, Policy("p", np.array([[1, 1, 1, np.nan, 1, 1.0]])))
    with pytest.raises(PolicyError, match=r"cable 0 = 1.2"):
        check_policy(robot, Policy("p", np.array([[1.2, 1, 1, 1, 1, 1.0]])))
    with pytest.raises(PolicyError, match="shape"):
        check_policy(robot, Policy("p", np.ones((2, 5))))


def test_random_policy_is_seeded_and_ends_at_rest(default_configs) -> None:
    robot = default_configs.robot
    a = random_policy(robot, 10, seed=3)
    b = random_policy(robot, 10, seed=3)
    c = random_policy(robot, 10, seed=4)
    np.testing.assert_array_equal(a.targets, b.targets)
    assert a.policy_id == b.policy_id != c.policy_id
    assert a.targets.shape == (11, 6)
    np.testing.assert_array_equal(a.targets[-1], np.ones(6))
    assert np.all((a.targets >= 0) & (a.targets <= 1))
    np.testing.assert_array_equal(check_policy(robot, a).targets, a.targets)
    levels = random_policy(robot, 50, seed=1, levels=(0.0, 1.0))
    assert set(np.unique(levels.targets.round(9))) <= {0.0, 0.9, 1.0}


def test_symmetry_vectors() -> None:
    v = np.arange(6)
    assert shift_left(v).tolist() == [1, 2, 0, 4, 5, 3]
    assert shift_left(shift_left(v)).tolist() == [2, 0, 1, 5, 3, 4]
    np.testing.assert_array_equal(shift_left(shift_left(shift_left(v))), v)
    np.testing.assert_array_equal(shift_right(shift_left(v)), v)
    np.testing.assert_array_equal(shift_left(ROLLING_UNIT), [[1, 0.1, 1, 1, 0.1, 1], [1, 1, 0, 1, 0.1, 0]])


def test_published_gaits(default_configs) -> None:
    robot = default_configs.robot
    assert published_gait("rolling").shape == (6, 2 * 3)
    assert published_gait("cw").shape == (12, 6)
    np.testing.assert_array_equal(published_gait("ccw")[2], np.zeros(6))
    rolling = gait_policy(robot, "rolling", cycles=2)
    assert rolling.targets.shape == (13, 6)
    np.testing.assert_array_equal(rolling.targets[:6], published_gait("rolling"))
    with pytest.raises(PolicyError, match="unknown gait 'hop'"):
        gait_policy(robot, "hop", 1)


def test_bottom_face_and_roll_counting() -> None:
    caps = np.zeros((6, 3))
    caps[:, 2] = [0.02, 0.2, 0.02, 0.08, 0.2, 0.02]  # rest pose: caps 0, 2, 5 down, 3 close
    assert FACES[bottom_face(caps)] == (0, 2, 3, 5)
    caps[:, 2] = [0.2, 0.02, 0.02, 0.2, 0.06, 0.02]
    assert FACES[bottom_face(caps)] == (1, 2, 4, 5)
    assert count_rolls([0, 0, 1, 1, 2, 2, 0, 0], min_dwell=2) == (3, 0)
    assert count_rolls([0, 0, 2, 2, 1, 1], min_dwell=2) == (0, 2)
    assert count_rolls([0, 0, 1, 0, 0, 1, 0, 0], min_dwell=2) == (0, 0)  # rocking is not rolling
