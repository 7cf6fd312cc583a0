"""System identification: gaits, key frames, the parameter space, KFL gradients and recovery."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import PriorConfig, SysidConfig, robot_with_overlay
from pipeline.errors import ConfigError, DataError
from pipeline.physics import BOUNDS, Engine, Params, RobotModel
from pipeline.physics.params import robot_overlay, robot_values
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.policies import random_policy
from pipeline.robot_model import length_to_target, reference_prism, resting_on_face
from pipeline.sysid.data import EXTEND, HOLD, RETRACT, Recording, split_gaits
from pipeline.sysid.identify import identify, identify_staged, robust_sum, unit_gradients
from pipeline.sysid.keyframes import key_frame_offsets, mask_filter
from pipeline.sysid.losses import KeyFrameLoss, make_loss
from pipeline.sysid.parameters import ParameterSpace
from pipeline.sysid.synthetic import engine_recording
from pipeline.sysid.validate import replay, split_holdout

DT = 0.005  # engine data and identification share the step, so the model is exact


@pytest.fixture(scope="module")
def engine(default_configs) -> Engine:
    return Engine(RobotModel.from_robot(default_configs.robot), dt=DT)


@pytest.fixture(scope="module")
def slow_motor_data(engine, default_configs) -> Recording:
    """Seed 000's experiment: engine data with motor speed 0.5, tracking-level noise."""
    robot = default_configs.robot
    truth = Params.from_robot(robot, motor_speed=0.5)
    policy = random_policy(robot, 16, seed=1)
    return engine_recording(engine, truth, robot, policy.targets, caps_noise_m=0.002, cable_noise_m=0.001)


def test_gaits_follow_the_policy_segments(slow_motor_data, default_configs) -> None:
    robot = default_configs.robot
    gaits = split_gaits(slow_motor_data, robot, segment_timeout_s=8.0)
    assert [g.index for g in gaits] == list(range(int(slow_motor_data.segment.max()) + 1))
    for before, after in itertools.pairwise(gaits):
        assert after.start_s == pytest.approx(before.end_s)  # a gait ends where the next starts
    assert all(g.reached for g in gaits)
    for gait in gaits:
        start = length_to_target(robot, slow_motor_data.cables_at(gait.start_s)[:6])
        error = gait.target - start
        far = np.abs(error) > robot.pid.tolerance + 0.05
        expected = np.where(error > 0, EXTEND, RETRACT)
        np.testing.assert_array_equal(gait.direction[far], expected[far])
    assert {HOLD, RETRACT, EXTEND} >= set(np.concatenate([g.direction for g in gaits]))


def test_a_command_reversal_makes_a_gait_non_monotonic(slow_motor_data, default_configs) -> None:
    control = slow_motor_data.control.copy()
    rows = np.flatnonzero(slow_motor_data.segment == 1)
    cable = int(np.argmax(np.abs(control[rows]).sum(0)))
    control[rows[-1], cable] = -np.sign(control[rows].sum(0)[cable])  # one tick of the other sign
    assert split_gaits(slow_motor_data, default_configs.robot, 8.0)[1].monotonic
    gaits = split_gaits(dataclasses.replace(slow_motor_data, control=control), default_configs.robot, 8.0)
    assert not gaits[1].monotonic


def test_bad_recordings_are_rejected_with_the_field_named(slow_motor_data) -> None:
    with pytest.raises(DataError, match="cables_m has shape"):
        dataclasses.replace(slow_motor_data, cables_m=slow_motor_data.cables_m[:, :6])
    with pytest.raises(DataError, match="segment index must never decrease"):
        dataclasses.replace(slow_motor_data, segment=slow_motor_data.segment[::-1].copy())
    caps = slow_motor_data.caps_m.copy()
    caps[3, 2, 1] = np.nan
    with pytest.raises(DataError, match="tracked end caps must be finite"):
        dataclasses.replace(slow_motor_data, caps_m=caps)


def test_key_frames_and_mask_filter() -> None:
    engine, data = np.array([1.0, 2.0, 0.5]), np.array([1.5, 1.0, 0.5])
    np.testing.assert_allclose(key_frame_offsets(engine, data), [1.0, 1.0, 0.5])
    # engine total 3.5 s > data 3.0 s: only gaits where it was also slower (or equal) are kept
    np.testing.assert_array_equal(mask_filter(engine, data, tolerance_s=0.02), [False, True, True])
    np.testing.assert_array_equal(mask_filter(data, data, tolerance_s=0.02), [True, True, True])
    with pytest.raises(ValueError, match="two"):
        mask_filter(engine, data[:2], 0.02)


def test_parameter_space_stays_inside_the_bounds(default_configs) -> None:
    robot = default_configs.robot
    start = Params.from_robot(robot)
    names = ("motor_speed", "friction", "restitution", "passive_stiffness")
    space = ParameterSpace(names, start)
    theta = space.initial()
    for n, v in space.values(theta).items():
        assert float(v) == pytest.approx(float(getattr(start, n)[0]), abs=1.1e-3)  # restitution 0: just inside
    theta = space.project(theta + torch.tensor([-50.0, 50.0, 50.0, 50.0], dtype=torch.float64))
    for n, v in space.values(theta).items():
        lo, hi = BOUNDS[n]
        assert lo < float(v) < hi
    space.params(theta).validate()
    with pytest.raises(ConfigError, match="sysid.parameters"):
        ParameterSpace(("motor_speed", "stiffness"), start)
    prior = ParameterSpace(("friction",), start, priors={"friction": PriorConfig(value=0.5, scale=0.1)})
    assert float(prior.prior_penalty(prior.initial())) == pytest.approx(((0.8 - 0.5) / 0.1) ** 2)


def test_identified_values_round_trip_through_the_robot_config(default_configs) -> None:
    robot = default_configs.robot
    values = {"motor_speed": 0.61, "friction": 0.42, "restitution": 0.2, "actuated_damping": 2.5}
    updated = robot_with_overlay(robot, robot_overlay(values), "identified.yaml")
    assert {k: robot_values(updated)[k] for k in values} == pytest.approx(values)
    assert Params.from_robot(updated).friction.item() == pytest.approx(0.42)


def test_observed_pose_is_held_in_equilibrium(engine, default_configs) -> None:
    """A pose the engine came to rest in, observed through its end caps only, is restored with
    equilibrium rest lengths and stays put (the old prestress heuristic let it sag by cm)."""
    robot = default_configs.robot
    params = Params.from_robot(robot)
    prism = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
    rest_pose = engine.cap_positions(settle(engine, params, prism, robot.pid, torch.ones(6, dtype=torch.float64)))
    state = state_from_caps(engine, params, rest_pose)
    rest = equilibrium_rest_lengths(engine, params, state)
    assert torch.all(rest < engine.cable_lengths(state)[:, :6])  # every actuated cable in tension
    here = (engine.cable_lengths(state)[0, :6] - robot.actuated_cable.min_length_m) / robot.actuated_cable.range_m
    held = settle(engine, params, state, robot.pid, here, duration_s=1.0)
    moved = (engine.cap_positions(held) - rest_pose).norm(dim=-1).max()
    assert float(moved) < 0.003


def test_kfl_gradient_points_to_the_true_motor_speed(engine, slow_motor_data, default_configs) -> None:
    robot = default_configs.robot
    config = SysidConfig(parameters=("motor_speed",), dt_s=DT, chunk_s=2.0)
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    loss = KeyFrameLoss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, Params.from_robot(robot), config)
    assert loss.units == len(gaits) and loss.scored[0]
    for speed, sign in ((0.35, -1.0), (0.7, 1.0)):  # slower than the truth: speed up, and vice versa
        space = ParameterSpace(("motor_speed",), Params.from_robot(robot, motor_speed=speed))
        _, units = unit_gradients(loss, space, space.initial().clone().requires_grad_(True))
        assert units.shape == (len(gaits), 1)
        assert float(robust_sum(units, 3.0)[0]) * sign > 0
        assert not units[~torch.as_tensor(loss.scored)].any()  # lead-in gaits give no gradient


def test_robust_sum_bounds_an_exploding_key_frame() -> None:
    units = torch.tensor([[1.0], [1.2], [0.9], [-400.0], [0.0]], dtype=torch.float64)
    assert float(robust_sum(units, 3.0)[0]) > 0  # the outlier counts with 3 x the median norm only
    assert float(units.sum(0)[0]) < 0


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="open (issue 5): measured KFL 0.4895 (2.1 %, the bound is 2 %) after 40 steps; 19 min on 2 cores",
)
def test_motor_speed_experiment_kfl_converges_smoother_than_last_step(engine, slow_motor_data, default_configs) -> None:
    """Seed 000 Fig. 12: motor speed 0.5 from engine data, Adam lr 0.1 from the nominal 0.99.
    Smoothness measure: the total variation of the motor-speed path over the last half of the
    steps (sum of |step|): KFL's is smaller than last-step's."""
    robot = default_configs.robot
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    results = {}
    for kind in ("kfl", "last_step"):
        config = SysidConfig(parameters=("motor_speed",), loss=kind, dt_s=DT, chunk_s=2.0, iterations=40)
        loss = make_loss(
            engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, Params.from_robot(robot), config, 8.0
        )
        results[kind] = identify(loss, ParameterSpace(config.parameters, Params.from_robot(robot)), config)
    kfl = results["kfl"]
    assert kfl.values["motor_speed"] == pytest.approx(0.5, rel=0.02)

    def variation(result) -> float:
        path = np.array([s.values["motor_speed"] for s in result.history])
        return float(np.abs(np.diff(path[len(path) // 2 :])).sum())

    assert variation(kfl) < variation(results["last_step"])


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="open (issue 5): jointly, KFL recovers motor speed but friction's straight-through gradient "
    "drifts low and restitution is pushed to 0 (measured: 0.708 / 0.519 / 0.001 for 0.7 / 0.5 / 0.3)",
)
def test_recovery_from_a_noisy_random_policy_on_engine_data(default_configs) -> None:
    """Motor speed, friction and restitution within 3 % from ~30 s of a random policy in the
    engine with tracking-level noise (2 mm per cap, 1 mm per cable reading)."""
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    truth = {"motor_speed": 0.7, "friction": 0.5, "restitution": 0.3}
    data = engine_recording(
        engine,
        Params.from_robot(robot, **truth),
        robot,
        random_policy(robot, 50, seed=2).targets,
        caps_noise_m=0.002,
        cable_noise_m=0.001,
    )
    config = SysidConfig(parameters=tuple(truth), dt_s=0.005, iterations=60)
    gaits = split_gaits(data, robot, 8.0)
    start = Params.from_robot(robot)
    loss = make_loss(engine, robot, {data.name: data}, gaits, start, config, 8.0)
    result = identify_staged(loss, start, config)
    for name, value in truth.items():
        assert result.values[name] == pytest.approx(value, rel=0.03), name


def test_replay_scores_the_true_engine_better(engine, slow_motor_data, default_configs) -> None:
    robot = default_configs.robot
    config = SysidConfig(dt_s=DT, chunk_s=2.0)
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    fit, held = split_holdout(gaits, 0.4)
    assert fit and held and fit[-1].end_s == pytest.approx(held[0].start_s)
    scores = {
        speed: replay(engine, Params.from_robot(robot, motor_speed=speed), robot, slow_motor_data, held, config, 8.0)
        for speed in (0.5, 0.99)
    }
    assert scores[0.5].key_frame_error_m < 0.5 * scores[0.99].key_frame_error_m
    assert scores[0.5].key_frame_error_per_rod_m.shape == (3,)
    assert scores[0.5].final_com_error_pct == pytest.approx(100 * scores[0.5].final_com_error_m / robot.rod.length_m)
    assert 0 <= scores[0.5].final_heading_error_deg <= 180
    assert set(scores[0.5].metrics("x.")) >= {"x.key_frame_error_mm", "x.final_rod2_error_mm"}


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="open (issue 5): on the twin the held-out key-frame error is dominated by gaits where the "
    "twin and the engine roll differently; even the twin's true values score no better than the defaults",
)
def test_sysid_on_the_twin_halves_the_held_out_key_frame_error(tmp_path) -> None:
    """One tracked random-policy trajectory on the twin through the flow (collect, track, attach,
    sysid with its defaults): the held-out key-frame error falls by at least 50 %."""
    from flows.iteration import r2s2r_iteration
    from tests.conftest import write_test_pipeline

    config = write_test_pipeline(tmp_path, campaign="twinsysid", n_targets=40)
    overrides = {f"sysid.{k}": v for k, v in SysidConfig().model_dump(mode="json").items()}
    stages = ["collect", "track", "attach", "sysid"]
    summary = r2s2r_iteration(str(config), iteration=1, overrides=overrides, stages=stages)
    manifest = json.loads((Path(summary["stages"]["sysid"]["ref"]["path"]) / "manifest.json").read_text())
    assert manifest["summary"]["holdout.key_frame_error_reduction_pct"] >= 50.0
