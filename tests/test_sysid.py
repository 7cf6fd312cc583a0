"""System identification: gaits, key frames, the parameter space, KFL gradients and recovery."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from pipeline.config import PriorConfig, SysidConfig, robot_with_overlay
from pipeline.errors import ConfigError, DataError
from pipeline.physics import BOUNDS, Engine, Params, RobotModel, State
from pipeline.physics.params import robot_overlay, robot_values
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.policies import random_policy
from pipeline.robot_model import length_to_target, reference_prism, resting_on_face
from pipeline.sysid import losses
from pipeline.sysid.data import EXTEND, HOLD, RETRACT, Recording, split_gaits
from pipeline.sysid.evolution import PROFILE_MOVES, refine, robust_defects
from pipeline.sysid.identify import identify, identify_staged, planned_steps, robust_sum, unit_gradients
from pipeline.sysid.keyframes import key_frame_offsets, mask_filter
from pipeline.sysid.latency import best_latency, latency_robot, with_latency
from pipeline.sysid.losses import KeyFrameLoss, LossValue, Population, make_loss
from pipeline.sysid.parameters import ParameterSpace, search_bounds
from pipeline.sysid.start_fit import COORDINATES, LeadIn, StartResiduals, difference, perturbed
from pipeline.sysid.synthetic import engine_recording, exact_states
from pipeline.sysid.validate import replay, replay_recordings, split_holdout
from pipeline.sysid.windows import WindowStarts, run_windows
from pipeline.truth import twin_true_params

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
    # a recording that says its own segment timeout (a redeploy run's is shorter) is split with it
    longest = max(gaits[:-1], key=lambda g: g.duration_s)
    own = dataclasses.replace(slow_motor_data, segment_timeout_s=longest.duration_s)
    timed_out = [g for g in split_gaits(own, robot, segment_timeout_s=8.0)[:-1] if not g.reached]
    assert longest.index in {g.index for g in timed_out}
    assert all(g.duration_s >= longest.duration_s - 1e-9 for g in timed_out)


def test_policy_rollout_losses_hold_targets_as_long_as_each_recording_did(
    engine, slow_motor_data, default_configs
) -> None:
    robot = default_configs.robot
    gaits = split_gaits(slow_motor_data, robot, segment_timeout_s=8.0)
    start = Params.from_robot(robot)
    redeployed = dataclasses.replace(slow_motor_data, segment_timeout_s=3.0)
    for loss in ("last_step", "multiple_shooting"):
        config = SysidConfig().updated(
            {"parameters": ("motor_speed",), "loss.kind": loss, "dt_s": DT, "loss.shooting_windows": 2}
        )
        own = make_loss(engine, robot, {redeployed.name: redeployed}, gaits, start, config, 8.0)
        unsaid = make_loss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, start, config, 8.0)
        assert set(own.segment_timeout_s) == {3.0} and set(unsaid.segment_timeout_s) == {8.0}, loss


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
    """From 30 % slower and 20 % faster than the truth (0.5), the robust sum of the key frames'
    gradients points back to it. Further out it need not: at 0.7, three of the 17 gaits pull the
    wrong way hard enough to turn the sum (measured: -2.2); the stage's search does not rely on it."""
    robot = default_configs.robot
    config = SysidConfig().updated({"parameters": ("motor_speed",), "dt_s": DT, "loss.chunk_s": 2.0})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    loss = KeyFrameLoss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, Params.from_robot(robot), config)
    assert loss.units == len(gaits) and loss.scored[0]
    for speed, sign in ((0.35, -1.0), (0.6, 1.0)):  # slower than the truth: speed up, and vice versa
        space = ParameterSpace(("motor_speed",), Params.from_robot(robot, motor_speed=speed))
        _, units = unit_gradients(loss, space, space.initial().clone().requires_grad_(True))
        assert units.shape == (len(gaits), 1)
        assert float(robust_sum(units, 3.0)[0]) * sign > 0
        assert not units[~torch.as_tensor(loss.scored)].any()  # lead-in gaits give no gradient


class _OverflowingLoss:
    """Three units of one parameter (motor speed), minimum at 0.5: unit 1 is outside the loss and
    unit 2 counts only with ``count_last``; the derivatives of units 1 and 2 overflow (sqrt at 0)."""

    name = "overflowing"
    units = 3
    scored = np.array([True, False, True])

    def __init__(self, count_last: bool) -> None:
        self.kept = np.array([True, False, count_last])

    def __call__(self, params: Params) -> LossValue:
        s = params.motor_speed
        stuck = [torch.sqrt(s[k] - s[k].detach()) for k in (1, 2)]  # 0, with an infinite derivative
        defects = torch.stack([(s[0] - 0.5) ** 2, stuck[0], (s[2] - 0.5) ** 2 + stuck[1]]) / 1e-4
        loss = defects[torch.as_tensor(self.kept)].mean()
        return LossValue(loss, defects.detach().numpy(), np.zeros((3, 6)), self.scored, self.kept)


def test_a_unit_whose_derivatives_overflow_leaves_the_gradient_finite(default_configs, caplog) -> None:
    """A unit outside the loss gets an exactly zero gradient even where its rollout's derivatives
    overflowed (0 * inf); a counted one that overflowed counts as having none, with a warning;
    the identification goes on with the others."""
    space = ParameterSpace(("motor_speed",), Params.from_robot(default_configs.robot))
    theta = space.initial().clone().requires_grad_(True)
    _, units = unit_gradients(_OverflowingLoss(count_last=False), space, theta)
    assert units[0, 0] > 0 and units[1, 0] == 0 and units[2, 0] == 0
    assert "not finite" not in caplog.text
    _, units = unit_gradients(_OverflowingLoss(count_last=True), space, theta)
    assert units[0, 0] > 0 and units[2, 0] == 0
    assert "the gradient of 1 of 2 counted units is not finite" in caplog.text
    config = SysidConfig().updated(
        {"parameters": ("motor_speed",), "gradient.iterations": 30, "gradient.min_iterations": 30}
    )
    result = identify(_OverflowingLoss(count_last=False), space, config.gradient)
    assert result.values["motor_speed"] == pytest.approx(0.5, abs=0.03)


def test_robust_sum_bounds_an_exploding_key_frame() -> None:
    units = torch.tensor([[1.0], [1.2], [0.9], [-400.0], [0.0]], dtype=torch.float64)
    assert float(robust_sum(units, 3.0)[0]) > 0  # the outlier counts with 3 x the median norm only
    assert float(units.sum(0)[0]) < 0


def test_population_runs_candidates_as_one_batch_exactly(engine, slow_motor_data, default_configs) -> None:
    robot = default_configs.robot
    config = SysidConfig().updated({"parameters": ("motor_speed", "friction"), "dt_s": DT, "loss.chunk_s": 2.0})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    loss = KeyFrameLoss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, Params.from_robot(robot), config)
    candidates = [Params.from_robot(robot, motor_speed=0.5), Params.from_robot(robot, motor_speed=0.7, friction=0.4)]
    batched = loss.population(Params.concat(candidates))
    single = [loss(c.expand(loss.units)) for c in candidates]
    np.testing.assert_allclose(batched.defects, np.stack([v.defects for v in single]), rtol=1e-12)
    assert batched.defects.shape == (2, loss.units) and not np.allclose(batched.defects[0], batched.defects[1])
    # the search's penalty: the scored gaits' mean engine-minus-data duration, in duration_sigma_s, squared;
    # the timing: their squared differences, averaged
    late = [(v.engine_durations_s - v.data_durations_s)[v.scored] / config.search.duration_sigma_s for v in single]
    np.testing.assert_allclose(batched.penalty, [np.mean(x) ** 2 for x in late], rtol=1e-12)
    np.testing.assert_allclose(batched.timing, [np.mean(x**2) for x in late], rtol=1e-12)
    assert np.mean(late[1]) < -1 < 0.5 > abs(np.mean(late[0]))  # truth: 0.5

    # a gait that timed out in the data: the engine gives up when the data did, and its duration is no timing
    k = int(np.flatnonzero(loss.scored)[1])
    gaits[k] = dataclasses.replace(gaits[k], reached=False)
    gave_up = KeyFrameLoss(engine, robot, loss.recordings, gaits, Params.from_robot(robot), config)
    limits = gave_up.timeout[gave_up.timeout > 1.5 * gave_up.tick_s]
    assert limits[k] == pytest.approx(gaits[k].duration_s + gave_up.tick_s)
    assert limits[k - 1] == pytest.approx(config.loss.duration_cap * gaits[k - 1].duration_s + gave_up.tick_s)
    value = gave_up(candidates[1].expand(gave_up.units))
    timed = value.scored & (np.arange(gave_up.units) != k)
    late = (value.engine_durations_s - value.data_durations_s)[timed] / config.search.duration_sigma_s
    timed_out = gave_up.population(candidates[1])
    np.testing.assert_allclose(timed_out.penalty, [np.mean(late) ** 2], rtol=1e-12)
    np.testing.assert_allclose(timed_out.timing, [np.mean(late**2)], rtol=1e-12)


def test_latency_is_chosen_at_each_candidates_best_motor_speed(default_configs) -> None:
    """Engine data with a 0.06 s latency and motor speed 0.8; the start's motor speed (0.99) is too
    fast. Profiled over motor speed, the grid picks the true latency, at about the true speed, and
    scores it below the others. 24 random targets: with 12, once the rods' end caps and motors
    collided, the true latency's best speed was the grid's 0.891, not 0.792 (noise on few key frames)."""
    robot = with_latency(default_configs.robot, 0.06)
    config = SysidConfig().updated(
        {"parameters": ("motor_speed",), "dt_s": DT, "loss.chunk_s": 4.0, "loss.mask_filter": False}
    )
    engine = Engine(RobotModel.from_robot(robot), dt=DT)
    truth = Params.from_robot(robot, motor_speed=0.8)
    data = engine_recording(engine, truth, robot, random_policy(robot, 24, seed=4).targets, caps_noise_m=0.002)
    gaits = split_gaits(data, robot, 8.0)
    grid = (0.0, 0.06, 0.12)

    def choose(factors: tuple[float, ...]):  # the stage's choice (tasks.sysid.latency_robot)
        own = config.updated({"latency.grid_s": grid, "latency.speed_factors": factors})
        return latency_robot(robot, {data.name: data}, gaits, own, 8.0)[1]

    choice = choose((0.8, 0.9, 1.0))
    assert choice.latency_s == 0.06
    assert choice.motor_speeds[0.06] == pytest.approx(0.8, rel=0.04)
    assert choice.scores[0.06] < min(choice.scores[0.0], choice.scores[0.12])
    # The true speed below every factor: the profile steps on past the grid's lower edge to it.
    beyond = choose((0.9, 1.0, 1.1))
    assert beyond.latency_s == 0.06
    assert beyond.motor_speeds[0.06] == pytest.approx(0.8, rel=0.04)
    with pytest.raises(ValueError, match="motor speed factors"):
        best_latency(lambda latency_s: pytest.fail("built a loss"), Params.from_robot(robot), grid, (), config)


class _SpeedBowl:
    """A loss with KFL's population interface: one key frame, quadratic in motor speed about
    ``best``; records every motor speed it is asked for."""

    name = "bowl"
    units = 1
    scored = np.ones(1, dtype=bool)

    def __init__(self, best: float) -> None:
        self.best = best
        self.asked: list[float] = []

    def population(self, candidates: Params) -> Population:
        motor = candidates.motor_speed.numpy()
        self.asked.extend(motor.tolist())
        none = np.zeros(len(motor))
        return Population(((motor[:, None] - self.best) / 0.01) ** 2, none, none)


def test_latency_profiles_step_past_the_factors_edge_within_the_bounds(default_configs) -> None:
    """Each latency's motor-speed profile steps on past the factor grid's edge where its best lies
    (start 1.0, factors 0.9-1.1 in steps of 0.1): to the best speed inside reach (0.7 and 1.2),
    one speed a step; at most as many steps as there are factors (a best at 0.3 stops at 0.6, one
    at 2.5 at 1.4); never past the motor speed's search bounds (from 1.8 and 1.89, a best at 2.5
    stops at 1.98, below the bound of 2)."""
    robot = default_configs.robot
    start = Params.from_robot(robot, motor_speed=1.0)
    config = SysidConfig()
    bowls = {0.0: _SpeedBowl(0.7), 0.02: _SpeedBowl(1.2), 0.04: _SpeedBowl(0.3), 0.06: _SpeedBowl(2.5)}
    choice = best_latency(bowls.__getitem__, start, tuple(bowls), (1.1, 0.9, 1.0), config)
    assert choice.motor_speeds == pytest.approx({0.0: 0.7, 0.02: 1.2, 0.04: 0.6, 0.06: 1.4})
    assert sorted(bowls[0.0].asked) == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    assert sorted(bowls[0.06].asked) == pytest.approx([0.9, 1.0, 1.1, 1.2, 1.3, 1.4])
    assert choice.latency_s == 0.0
    assert choice.scores[0.0] == pytest.approx(0.0, abs=1e-9)
    narrow = _SpeedBowl(2.5)
    near_top = best_latency(
        {0.0: narrow}.__getitem__, Params.from_robot(robot, motor_speed=1.8), (0.0,), (1.0, 1.05), config
    )
    assert near_top.motor_speeds[0.0] <= search_bounds("motor_speed")[1]
    assert max(narrow.asked) == pytest.approx(1.98)


class _DivergingKeyFrames:
    """A loss with KFL's population interface over 40 key frames: quadratic in motor speed
    (truth 0.7, width 0.01) and, ten times weaker, in friction (truth 0.5, width 0.05); six key
    frames "tip over" (defect 400) whenever the motor is slower than 0.72, as a bifurcation
    does, so the plain mean of squared defects is lowest above 0.72."""

    name = "diverging"
    units = 40
    scored = np.ones(40, dtype=bool)

    def population(self, candidates: Params) -> Population:
        motor = candidates.motor_speed.numpy()[:, None]
        friction = candidates.friction.numpy()[:, None]
        weight = np.linspace(0.5, 1.5, self.units)[None]
        defects = ((motor - 0.7) / 0.01) ** 2 + 0.1 * weight * ((friction - 0.5) / 0.05) ** 2
        tipped = np.arange(self.units)[None] < 6
        none = np.zeros(len(motor))
        return Population(defects + np.where(tipped & (motor < 0.72), 400.0, 0.0), none, none)


def test_search_fits_through_diverging_key_frames_and_profiles_the_widths(default_configs) -> None:
    loss = _DivergingKeyFrames()
    start = Params.from_robot(default_configs.robot, motor_speed=0.8, friction=0.7)
    config = SysidConfig().updated(
        {"parameters": ("motor_speed", "friction"), "search.generations": 40, "search.population": 8}
    )
    robot = default_configs.robot
    mean_of_squares = {m: loss.population(Params.from_robot(robot, motor_speed=m)).defects.mean() for m in (0.7, 0.73)}
    assert mean_of_squares[0.73] < mean_of_squares[0.7]  # the plain loss would be fooled
    assert robust_defects(np.array([1e6]), 4.0)[0] < 4.0
    result = refine(loss, ParameterSpace(config.parameters, start), config)
    assert result.values["motor_speed"] == pytest.approx(0.7, rel=0.01)
    assert result.values["friction"] == pytest.approx(0.5, rel=0.03)
    assert [s.method for s in result.history] == ["search"] * 40
    assert result.history[-1].loss < result.history[0].loss
    motor_low, motor_high = result.profile["motor_speed"]
    friction_low, friction_high = result.profile["friction"]
    assert motor_low <= result.values["motor_speed"] <= motor_high and friction_low <= 0.5 <= friction_high
    assert motor_high - motor_low < friction_high - friction_low  # friction is seen ten times more weakly


def test_search_that_stops_short_moves_to_its_profiles_minimum(default_configs) -> None:
    loss = _DivergingKeyFrames()
    start = Params.from_robot(default_configs.robot, motor_speed=0.8, friction=0.7)
    config = SysidConfig().updated(
        {"parameters": ("motor_speed", "friction"), "search.generations": 1, "search.population": 4}
    )
    space = ParameterSpace(config.parameters, start)
    stopped = refine(loss, space, config.updated({"search.profile_tolerance": 1e9}))  # any point is settled
    assert [s.method for s in stopped.history] == ["search"]
    result = refine(loss, space, config)
    methods = [s.method for s in result.history]
    assert methods[0] == "search" and 1 <= methods.count("profile") <= PROFILE_MOVES
    assert methods == ["search"] + ["profile"] * methods.count("profile")
    losses = [s.loss for s in result.history]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))
    assert result.history[-1].values == pytest.approx(result.values)
    for name, (low, high) in result.profile.items():  # the answer is now inside its own profile ranges
        assert low <= result.values[name] <= high
    assert abs(result.values["motor_speed"] - 0.7) < abs(stopped.values["motor_speed"] - 0.7)


def test_staged_identification_plans_warm_up_gradient_and_search() -> None:
    once = {"start_fit.refits": 0, "gait_shooting.iterations": 0}
    moves = PROFILE_MOVES  # each search may move its answer to a profile's minimum
    searched = SysidConfig().updated(
        {"gradient.iterations": 25, "gradient.warmup_iterations": 15, "search.generations": 15, **once}
    )
    assert planned_steps(searched) == 15 + 15 + moves
    only_gradient = SysidConfig().updated(
        {"gradient.iterations": 25, "gradient.warmup_iterations": 15, "search.generations": 0, **once}
    )
    assert planned_steps(only_gradient) == 15 + 25
    mixed = SysidConfig().updated(
        {
            "gradient.iterations": 25,
            "gradient.warmup_iterations": 15,
            "search.parameters": ("friction",),
            "search.generations": 10,
            **once,
        }
    )
    assert planned_steps(mixed) == 15 + 25 + 10 + moves  # motor speed warmed up, then with restitution by gradient
    # each refit of the KFL's start states is followed by the search again (without one: every stage)
    assert planned_steps(mixed.updated({"start_fit.refits": 2})) == 15 + 25 + 3 * (10 + moves)
    assert planned_steps(only_gradient.updated({"start_fit.refits": 1})) == 2 * (15 + 25)
    no_fit = {"start_fit.refits": 1, "start_fit.iterations": 0}
    assert planned_steps(mixed.updated(no_fit)) == 15 + 25 + 10 + moves
    assert planned_steps(mixed.updated({"start_fit.refits": 1, "loss.kind": "last_step"})) == 15 + 25 + 10 + moves
    # gait shooting (KFL only) adds its steps per continuity weight and round
    shooting = {"gait_shooting.iterations": 4, "gait_shooting.weights": (0.3, 3.0), "gait_shooting.restarts": 0}
    assert planned_steps(searched.updated(shooting)) == 15 + 15 + moves + 2 * 4
    restarted = shooting | {"gait_shooting.restarts": 2}
    assert planned_steps(searched.updated(restarted)) == 15 + 15 + moves + 3 * 2 * 4
    assert planned_steps(only_gradient.updated(shooting | {"loss.kind": "last_step"})) == 15 + 25
    assert planned_steps(searched.updated(shooting | {"gait_shooting.parameters": ()})) == 15 + 15 + moves


@pytest.mark.slow
def test_motor_speed_experiment_kfl_converges_smoother_than_last_step(engine, slow_motor_data, default_configs) -> None:
    """Seed 000 Fig. 12: motor speed 0.5 from engine data, from the nominal 0.99.

    KFL as the stage runs it up to gait shooting: Adam lr 0.1 for 40 steps, then CMA-ES on the
    same (robust) KFL;
    last-step: Adam lr 0.1 for 40 steps. KFL's answer is within 2 %. Smoothness measure: the
    total variation of the Adam path over the last half of its steps (sum of |step|): KFL's is
    smaller than last-step's."""
    robot = default_configs.robot
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    recordings = {slow_motor_data.name: slow_motor_data}
    start = Params.from_robot(robot)
    kfl_config = SysidConfig().updated(
        {
            "parameters": ("motor_speed",),
            "dt_s": DT,
            "loss.chunk_s": 2.0,
            "gradient.warmup_iterations": 40,
            "search.generations": 15,
            "gait_shooting.iterations": 0,
        }
    )
    kfl = identify_staged(make_loss(engine, robot, recordings, gaits, start, kfl_config, 8.0), start, kfl_config)
    assert kfl.values["motor_speed"] == pytest.approx(0.5, rel=0.02)
    last_config = SysidConfig().updated(
        {"parameters": ("motor_speed",), "loss.kind": "last_step", "dt_s": DT, "gradient.iterations": 40}
    )
    last_loss = make_loss(engine, robot, recordings, gaits, start, last_config, 8.0)
    last_step = identify(last_loss, ParameterSpace(last_config.parameters, start), last_config.gradient)

    def variation(steps) -> float:
        path = np.array([s.values["motor_speed"] for s in steps if s.method == "gradient"])
        return float(np.abs(np.diff(path[len(path) // 2 :])).sum())

    assert variation(kfl.history) < variation(last_step.history)


def test_truth_holdout_replays_the_twins_own_values_on_the_held_out_gaits(
    slow_motor_data, default_configs, monkeypatch
) -> None:
    """Evaluation on the twin: the held-out gaits are replayed with the twin's values in the engine,
    its true attachment points and its control latency; the figures are named ``holdout.truth.*``
    and the reduction is against the start values' error passed in."""
    import pipeline.sysid.heldout as heldout
    from pipeline.sysid.heldout import SysidData
    from pipeline.truth import truth_holdout

    config = SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 2.0, "start_fit.iterations": 0})
    configs = default_configs.model_copy(update={"pipeline": default_configs.pipeline.updated({"sysid": config})})
    gaits = split_gaits(slow_motor_data, default_configs.robot, 8.0)[:7]
    fit, held = split_holdout(gaits, 0.3)
    data = SysidData(default_configs.robot, {slow_motor_data.name: slow_motor_data}, gaits, fit, held)
    calls = []

    def spied(engine, params, robot, held_out, *args):
        [(_, own, _)] = held_out.values()
        calls.append((params, robot, own))
        return replay_recordings(engine, params, robot, held_out, *args)

    monkeypatch.setattr(heldout, "replay_recordings", spied)
    figures = truth_holdout(configs, data, before_mm=50.0)
    [(params, robot, own)] = calls
    twin = default_configs.twin
    assert own == held
    assert robot.attachment.phase_rad == twin.attachment_phase_rad
    assert robot.pid.latency_s == twin.control_latency_s
    truth = twin_true_params(default_configs.robot, twin)
    assert all(torch.equal(v, getattr(truth, k)) for k, v in params.as_dict().items())
    error_mm = figures["holdout.truth.key_frame_error_mm"]
    assert error_mm > 0 and "holdout.truth.final_heading_error_deg" in figures
    assert figures["holdout.truth.key_frame_error_reduction_pct"] == pytest.approx(100 * (1 - error_mm / 50.0))


def test_split_recordings_holds_out_each_recordings_last_gaits_and_names_empty_data(
    slow_motor_data, default_configs
) -> None:
    """The stage's split: every gait of the recording in order, its last ``holdout_fraction`` held
    out; with no gait at all, a DataError that names the data's source."""
    from pipeline.errors import DataError
    from pipeline.sysid.heldout import split_recordings

    robot = default_configs.robot
    data = split_recordings(default_configs, robot, {slow_motor_data.name: slow_motor_data}, "runs/x/collect")
    every = split_gaits(slow_motor_data, robot, default_configs.pipeline.collect.segment_timeout_s)
    indices = [g.index for g in every]
    assert [g.index for g in data.gaits] == [g.index for g in data.fit + data.held] == indices
    fraction = default_configs.pipeline.sysid.data.holdout_fraction
    assert [g.index for g in data.held] == indices[len(indices) - round(fraction * len(indices)) :]
    assert list(data.held_out()) == [slow_motor_data.name]
    with pytest.raises(DataError, match="runs/x/collect: no gait to identify from"):
        split_recordings(default_configs, robot, {}, "runs/x/collect")


@pytest.mark.slow
def test_recovery_from_a_noisy_random_policy_on_engine_data(default_configs) -> None:
    """Motor speed, friction and restitution within 3 % from 60 s of a random policy in the
    engine with tracking-level noise (2 mm per cap, 1 mm per cable reading): the search, then gait
    shooting of all three (weight 0.3, 12 steps, one restart), with the compiled engine."""
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005, compiled=default_configs.pipeline.engine.compiled)
    truth = {"motor_speed": 0.7, "friction": 0.5, "restitution": 0.3}
    data = engine_recording(
        engine,
        Params.from_robot(robot, **truth),
        robot,
        random_policy(robot, 140, seed=2).targets,
        caps_noise_m=0.002,
        cable_noise_m=0.001,
    )
    config = SysidConfig().updated(
        {
            "parameters": tuple(truth),
            "dt_s": 0.005,
            "search.generations": 15,
            "start_fit.refits": 0,
            "gait_shooting.iterations": 12,
        }
    )
    gaits = split_gaits(data, robot, 8.0)
    start = Params.from_robot(robot)
    loss = make_loss(engine, robot, {data.name: data}, gaits, start, config, 8.0)
    result = identify_staged(loss, start, config)
    for name, value in truth.items():
        assert result.values[name] == pytest.approx(value, rel=0.03), name


def test_replay_scores_the_true_engine_better(engine, slow_motor_data, default_configs) -> None:
    robot = default_configs.robot
    config = SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 2.0, "start_fit.iterations": 3})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    fit, held = split_holdout(gaits, 0.4)
    assert fit and held and fit[-1].end_s == pytest.approx(held[0].start_s)
    scores = {
        speed: replay(engine, Params.from_robot(robot, motor_speed=speed), robot, slow_motor_data, held, config, 8.0)
        for speed in (0.5, 0.99)
    }
    assert scores[0.5].key_frame_error_m < 0.5 * scores[0.99].key_frame_error_m
    assert 0 < scores[0.5].key_frame_error_median_m < scores[0.99].key_frame_error_median_m
    assert scores[0.5].key_frame_error_per_rod_m.shape == (3,)
    assert scores[0.5].final_com_error_pct == pytest.approx(100 * scores[0.5].final_com_error_m / robot.rod.length_m)
    assert 0 <= scores[0.5].final_heading_error_deg <= 180
    figures = set(scores[0.5].metrics("x."))
    assert figures >= {"x.key_frame_error_mm", "x.key_frame_error_median_mm", "x.final_rod2_error_mm"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("twin_config", "collect_seed"),
    [
        ("twin.yaml", 0),
        ("twin.yaml", 1),
        pytest.param(
            "twin.yaml",
            2,
            marks=pytest.mark.xfail(
                strict=True,
                reason="measured: on this trajectory the twin's own values predict the held-out gaits worse than the "
                "robot config's (22.0 against 17.3 mm): the analytic contact's structure, not its values, limits it "
                "(docs/sysid.md)",
            ),
        ),
        ("twin-heldout.yaml", 0),
        ("twin-heldout.yaml", 1),
    ],
)
def test_sysid_on_the_twin_closes_most_of_the_gap_that_the_twins_own_values_close(
    tmp_path, default_configs, twin_config, collect_seed
) -> None:
    """The twin criterion, measured against the twin's own values rather than as a fixed share (a
    fixed 50 % on one trajectory is out of reach even for a perfect model: the mean over a dozen
    held-out key frames is decided by the few where one model tips a rod over and the other does
    not, docs/sysid.md): one tracked random-policy trajectory per collect seed through the flow
    with the main job's sysid settings, on two twins whose hidden values lie on either side of the
    robot config's priors; of the gap between the robot config's values and the
    twin's own values in the engine, the identified values close at least 80 %. Each error is the
    nudge-smoothed held-out mean (:func:`pipeline.sysid.heldout.smoothed_held_out_error`); a stage
    that identified nothing would close none of it."""
    from flows.iteration import r2s2r_iteration
    from pipeline.config import load_all
    from pipeline.sysid.heldout import smoothed_held_out_error
    from pipeline.truth import truth_engine
    from storage.catalog import identified_robot
    from storage.layout import Ref
    from tasks.sysid import sysid_data
    from tests.conftest import write_test_pipeline

    config = write_test_pipeline(tmp_path, campaign="twingap", n_targets=40, twin=twin_config)
    overrides = {f"sysid.{k}": v for k, v in default_configs.pipeline.sysid.model_dump(mode="json").items()}
    overrides["collect.random.seed"] = collect_seed
    stages = ["collect", "track", "attach", "sysid"]
    summary = r2s2r_iteration(str(config), iteration=1, overrides=overrides, stages=stages)
    collect, track, attach, identified = (Ref.from_json(summary["stages"][s]["ref"]) for s in stages)
    configs = load_all(str(config), overrides)
    data = sysid_data(configs, collect, track, attach)
    after = identified_robot(configs, attach, identified)
    engines = {
        "before": (data.robot, Params.from_robot(data.robot)),
        "truth": truth_engine(configs, data.robot),
        "after": (after, Params.from_robot(after)),
    }
    error = {label: smoothed_held_out_error(configs, data, *engine, 0.001)[0] for label, engine in engines.items()}
    assert error["truth"] < 0.7 * error["before"], f"this trajectory does not tell the two apart: {error}"
    closed = (error["before"] - error["after"]) / (error["before"] - error["truth"])
    assert closed >= 0.8, f"identification closed {100 * closed:.0f} % of the gap: {error}"


def test_a_chunk_whose_last_target_is_never_reached_does_not_hold_up_the_batch(
    engine, slow_motor_data, default_configs, monkeypatch
) -> None:
    """Chunks are padded to the longest one with holds of their last target; where that target
    is never reached, each hold must still end after a tick, not after the gait's timeout."""
    robot = default_configs.robot
    config = SysidConfig().updated({"parameters": ("motor_speed",), "dt_s": DT, "loss.chunk_s": 1.0})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    gaits[0] = dataclasses.replace(gaits[0], target=np.full(6, 3.0))  # far outside the cables' range
    loss = KeyFrameLoss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, Params.from_robot(robot), config)
    assert len(loss.chunks[0]) < max(len(c) for c in loss.chunks)
    ends = []

    def spied(*args, **kwargs):
        trace, finished = run_windows(*args, **kwargs)
        ends.append(float(trace.t_s[-1]))
        return trace, finished

    monkeypatch.setattr(losses, "run_windows", spied)
    loss.population(Params.from_robot(robot))
    tick_s = 1.0 / robot.pid.control_rate_hz
    longest = max(sum(config.loss.duration_cap * g.duration_s + tick_s for g in c) for c in loss.chunks)
    assert ends[0] <= longest + (max(len(c) for c in loss.chunks) + 1) * tick_s


def test_exact_start_states_reproduce_the_data_and_lower_the_key_frame_error(engine, default_configs) -> None:
    """``exact_states`` are the engine's own states where the chunks start (their caps are the
    noise-free data's), and a loss started from them sees smaller key-frame errors at the truth
    than one started from the settled observations (which start with zero velocity)."""
    robot = default_configs.robot
    truth = Params.from_robot(robot, motor_speed=0.7, friction=0.5, restitution=0.3)
    targets = random_policy(robot, 8, seed=2).targets
    data = engine_recording(engine, truth, robot, targets, caps_rate_hz=robot.pid.control_rate_hz)
    config = SysidConfig().updated({"parameters": ("friction",), "dt_s": DT, "loss.chunk_s": 1.0})
    observed = KeyFrameLoss(engine, robot, {data.name: data}, split_gaits(data, robot, 8.0), truth, config)
    assert len(observed.chunks) >= 2
    states = exact_states(engine, truth, robot, targets, [chunk[0].index for chunk in observed.chunks])
    exact = observed.with_start_states(states)
    starts_s = [chunk[0].start_s for chunk in observed.chunks]
    np.testing.assert_allclose(exact.starts.caps_m.numpy(), data.caps_at(np.array(starts_s)), atol=1e-9)
    with torch.no_grad():
        errors = [loss(truth.expand(loss.units)).cap_errors_m[loss.scored].mean() for loss in (observed, exact)]
    assert errors[1] < 0.5 * errors[0]
    with pytest.raises(ValueError, match="one start state per chunk"):
        observed.with_start_states(states.index(slice(0, 1)))


def test_start_residuals_are_the_noise_at_the_engines_own_states(engine, default_configs) -> None:
    """From the engine's exact chunk starts, with the true parameters, the start-fit residuals
    over whole chunks are the data's noise in its own units: their squared sum is the residual
    count to within its chi-square spread. Moving the rods' velocities by one scale or friction
    by 10 % raises it beyond that spread."""
    robot = default_configs.robot
    truth = Params.from_robot(robot, motor_speed=0.7, friction=0.5, restitution=0.3)
    targets = random_policy(robot, 8, seed=2).targets
    data = engine_recording(engine, truth, robot, targets, caps_noise_m=0.002, cable_noise_m=0.001)
    loss = KeyFrameLoss(
        engine,
        robot,
        {data.name: data},
        split_gaits(data, robot, 8.0),
        truth,
        SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 1.0}),
    )
    exact = exact_states(engine, truth, robot, targets, [chunk[0].index for chunk in loss.chunks])
    leads = [LeadIn(data, chunk[0].start_s, sum(g.duration_s for g in chunk)) for chunk in loss.chunks]
    residuals = StartResiduals(
        engine, robot, loss.with_start_states(exact).starts, leads, loss.targets, loss.timeout, 0.002, 0.001
    )
    chunks = len(loss.chunks)
    rows = torch.arange(chunks)
    z = torch.zeros(chunks, COORDINATES, dtype=torch.float64)
    spread = 4 * np.sqrt(2 * residuals.count)

    def cost(z: torch.Tensor, params: Params) -> float:
        return float((residuals(z, rows, params.expand(chunks)) ** 2).sum())

    assert chunks >= 3 and residuals.count > 1000
    assert abs(cost(z, truth) - residuals.count) < spread
    faster = z.clone()
    faster[:, 18:27] = 1.0
    assert cost(faster, truth) > residuals.count + 2 * spread
    assert cost(z, Params.from_robot(robot, motor_speed=0.7, friction=0.55, restitution=0.3)) > residuals.count + spread
    with pytest.raises(ValueError, match="one lead-in per start"):
        StartResiduals(engine, robot, loss.starts, leads[:1], loss.targets, loss.timeout, 0.002, 0.001)


def test_gait_windows_end_where_the_next_gait_starts(engine, default_configs) -> None:
    """Each gait a window from the engine's exact state where it began, run over the gait's own
    duration (its target, then the next): the window's end state is the exact state where the
    next gait began (continuity defect zero, noise-free data), the residuals vanish, and the
    coordinates of :func:`difference` invert those of :func:`perturbed`."""
    robot = default_configs.robot
    truth = Params.from_robot(robot, motor_speed=0.7, friction=0.5, restitution=0.3)
    targets = random_policy(robot, 6, seed=2).targets
    data = engine_recording(engine, truth, robot, targets)
    gaits = split_gaits(data, robot, 8.0)
    exact = exact_states(engine, truth, robot, targets, [g.index for g in gaits])
    starts = WindowStarts(exact, engine.cap_positions(exact), np.zeros((len(gaits), 6, 3)), np.zeros(len(gaits)))
    policy = torch.tensor(np.stack([targets[[g.index, min(g.index + 1, len(targets) - 1)]] for g in gaits]))
    leads = [LeadIn(data, g.start_s, g.duration_s) for g in gaits]
    residuals = StartResiduals(engine, robot, starts, leads, policy, np.full((len(gaits), 2), 8.0), 0.002, 0.001)
    rows = torch.arange(len(gaits))
    z = torch.zeros(len(gaits), COORDINATES, dtype=torch.float64)
    res, ends = residuals.run(z, rows, truth.expand(len(gaits)))
    assert len(gaits) >= 5 and float(res.abs().max()) < 1e-6
    defects = difference(ends.index(slice(0, -1)), exact.index(slice(1, None)))
    assert float(defects.abs().max()) < 1e-6
    moved = perturbed(exact, 0.1 * torch.ones_like(z))
    torch.testing.assert_close(difference(moved, exact), 0.1 * torch.ones_like(z), rtol=0, atol=1e-3)
    _, wrong = residuals.run(z, rows, Params.from_robot(robot, motor_speed=0.8).expand(len(gaits)))
    assert float(difference(wrong.index(slice(0, -1)), exact.index(slice(1, None))).abs().max()) > 1.0


def test_fitted_starts_carry_the_lead_ins_and_lower_the_key_frame_error(engine, default_configs) -> None:
    """Each lead-in chunk starts where its lead-in ends, from the settled start fitted to the
    lead-in's noisy caps (10 Hz) and cables (50 Hz) with the true parameters. Without fit
    iterations, that scores the gaits exactly as running the lead-ins does; with them, the starts
    are nearer the data there and the scored key frames at the truth are matched better. The
    chunk that starts the recording keeps its settled start."""
    robot = default_configs.robot
    truth = Params.from_robot(robot, motor_speed=0.7, friction=0.5, restitution=0.3)
    data = engine_recording(
        engine, truth, robot, random_policy(robot, 14, seed=2).targets, caps_noise_m=0.002, cable_noise_m=0.001
    )
    gaits = split_gaits(data, robot, 8.0)
    config = SysidConfig().updated(
        {"parameters": ("friction",), "dt_s": DT, "loss.chunk_s": 1.0, "start_fit.iterations": 4}
    )
    observed = KeyFrameLoss(engine, robot, {data.name: data}, gaits, truth, config)
    assert not observed.lead_in[0] and observed.lead_in.sum() >= 3
    carried = KeyFrameLoss(
        engine, robot, {data.name: data}, gaits, truth, config.updated({"start_fit.iterations": 0})
    ).with_fitted_starts(truth)
    fitted = observed.with_fitted_starts(truth)
    scored_gaits = [g for g, scored in zip(observed.gaits, observed.scored, strict=True) if scored]
    for loss in (carried, fitted):
        assert loss.gaits == scored_gaits and loss.scored.all() and not loss.lead_in.any()
        assert torch.equal(loss.starts.state.pos[0], observed.starts.state.pos[0])
        np.testing.assert_allclose(loss.starts.t_s, [chunk[0].start_s for chunk in loss.chunks])
    with torch.no_grad():
        values = [loss(truth.expand(loss.units)) for loss in (observed, carried, fitted)]
    np.testing.assert_allclose(values[1].defects, values[0].defects[observed.scored], rtol=1e-9)
    start_errors = [
        np.linalg.norm(loss.starts.caps_m.numpy() - loss.starts.data_caps_m, axis=-1)[1:].mean()
        for loss in (carried, fitted)
    ]
    assert start_errors[1] < 0.7 * start_errors[0]
    scored_errors = [v.cap_errors_m[v.scored].mean() for v in values[1:]]
    assert scored_errors[1] < 0.9 * scored_errors[0]


def test_start_states_are_fitted_in_the_estimator_and_the_lead_ins_run_in_the_loss_engine(default_configs) -> None:
    """``with_fitted_starts(params, estimator)``: every Levenberg-Marquardt rollout (one robot per
    lead-in and coordinate) runs in the estimator, only the lead-ins' carry (one robot per lead-in)
    in the loss's engine; with the same physics in both the starts are those of the default fit."""
    robot = default_configs.robot
    model = RobotModel.from_robot(robot)

    class Counted(Engine):
        def __init__(self) -> None:
            super().__init__(model, dt=DT)
            self.batches: list[int] = []

        def steps(self, params: Params, state: State, control: torch.Tensor, n: int) -> State:
            self.batches.append(state.batch_size)
            return super().steps(params, state, control, n)

    truth = Params.from_robot(robot, motor_speed=0.7)
    loss_engine, estimator = Counted(), Counted()
    data = engine_recording(loss_engine, truth, robot, random_policy(robot, 8, seed=2).targets, caps_noise_m=0.002)
    gaits = split_gaits(data, robot, 8.0)
    config = SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 1.0, "start_fit.iterations": 1})
    observed = KeyFrameLoss(loss_engine, robot, {data.name: data}, gaits, truth, config)
    leads = int(observed.lead_in.sum())
    loss_engine.batches.clear()
    fitted = observed.with_fitted_starts(truth, estimator)
    assert leads >= 2 and set(loss_engine.batches) == {leads}
    assert set(estimator.batches) == {leads, leads * COORDINATES}
    default = observed.with_fitted_starts(truth)
    torch.testing.assert_close(fitted.starts.caps_m, default.starts.caps_m, rtol=0, atol=1e-12)


def test_gaits_that_do_not_start_the_recording_begin_with_a_lead_in(engine, default_configs) -> None:
    """Held-out gaits are a recording's last ones: the robot is moving where the first of them
    starts, so that chunk starts with a lead-in like every later one. Only a chunk that starts at
    the recording's first sample (the robot at rest) has none. A gait of ``leads`` heads its
    recording's first chunk, so that the first of the gaits is scored, even where every chunk is one gait long."""
    robot = default_configs.robot
    truth = Params.from_robot(robot)
    data = engine_recording(engine, truth, robot, random_policy(robot, 8, seed=2).targets)
    gaits = split_gaits(data, robot, 8.0)
    config = SysidConfig().updated({"parameters": ("friction",), "dt_s": DT, "loss.chunk_s": 1.0})
    whole = KeyFrameLoss(engine, robot, {data.name: data}, gaits, truth, config)
    later = KeyFrameLoss(engine, robot, {data.name: data}, gaits[3:], truth, config)
    assert not whole.lead_in[0] and whole.lead_in[1:].all()
    assert later.chunks[0][0] is gaits[3] and later.lead_in.all()
    short = {"loss.chunk_s": 0.05}  # shorter than any gait: one gait per chunk
    led = KeyFrameLoss(engine, robot, {data.name: data}, gaits[3:], truth, config.updated(short), [gaits[2]])
    assert [len(c) for c in led.chunks[:2]] == [2, 1] and led.chunks[0][0] is gaits[2] and led.chunks[0][1] is gaits[3]
    assert led.lead_in.all() and not led.scored[0] and led.scored[1]


def test_replay_runs_the_gait_before_the_held_out_ones_as_their_lead_in(
    engine, slow_motor_data, default_configs, monkeypatch
) -> None:
    """The robot is moving where the held-out gaits start: the replay runs the gait before them
    first, as the first chunk's lead-in, so every held-out gait of that chunk is scored from where
    the lead-in ends, and the open loop starts there too. One held-out gait is enough."""
    import pipeline.sysid.validate as validate

    robot = default_configs.robot
    config = SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 2.0, "start_fit.iterations": 0})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    seen = []

    class Spied(KeyFrameLoss):
        def with_fitted_starts(self, params: Params, estimator: Engine | None = None) -> KeyFrameLoss:
            fitted = super().with_fitted_starts(params, estimator)
            seen.append((self, fitted))
            return fitted

    monkeypatch.setattr(validate, "KeyFrameLoss", Spied)
    truth = Params.from_robot(robot, motor_speed=0.5)
    for held in (gaits[-3:], gaits[-1:]):
        seen.clear()
        score = replay(engine, truth, robot, slow_motor_data, held, config, 8.0)
        [(observed, fitted)] = seen
        assert observed.lead_in[0] and observed.chunks[0][0].index == held[0].index - 1
        assert fitted.chunks[0][0].index == held[0].index and fitted.scored.all()
        assert fitted.starts.t_s[0] == held[0].start_s
        assert score.gaits == len(held) and np.isfinite(score.final_com_error_m)


def test_recordings_replayed_together_score_as_each_alone(engine, slow_motor_data, default_configs) -> None:
    """The held-out gaits of several recordings replay as one engine batch (key frames and the
    lead-ins' start fits); each recording's figures are those of its own replay, whatever the
    others hold (here a copy of the recording with fewer held-out gaits, so another lead-in)."""
    robot = default_configs.robot
    config = SysidConfig().updated({"dt_s": DT, "loss.chunk_s": 2.0, "start_fit.iterations": 2})
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    other = dataclasses.replace(slow_motor_data, name="other")
    held = {
        slow_motor_data.name: (slow_motor_data, gaits[-3:], 8.0),
        "other": (other, [dataclasses.replace(g, recording="other") for g in gaits[-2:]], 8.0),
    }
    truth = Params.from_robot(robot, motor_speed=0.5)
    together = replay_recordings(engine, truth, robot, held, config)
    assert list(together) == list(held)
    for name, (recording, own, timeout) in held.items():
        alone = replay(engine, truth, robot, recording, own, config, timeout)
        assert together[name].recording == name and together[name].gaits == len(own)
        for figure in ("key_frame_error_m", "key_frame_error_median_m", "final_com_error_m", "final_heading_error_deg"):
            assert getattr(together[name], figure) == pytest.approx(getattr(alone, figure), rel=1e-9), figure
        np.testing.assert_allclose(together[name].engine_caps_m, alone.engine_caps_m, rtol=0, atol=1e-12)
    assert together["other"].key_frame_error_m != together[slow_motor_data.name].key_frame_error_m


def test_staged_identification_refits_the_starts_at_its_estimate(
    engine, slow_motor_data, default_configs, monkeypatch
) -> None:
    """With ``start_refits``, the first search runs on the settled starts; then, each time, the
    starts are fitted at the estimate so far and the search runs again from it."""
    robot = default_configs.robot
    config = SysidConfig().updated(
        {
            "parameters": ("motor_speed",),
            "dt_s": DT,
            "loss.chunk_s": 1.0,
            "gradient.warmup_iterations": 0,
            "search.generations": 1,
            "search.population": 2,
            "start_fit.refits": 2,
            "start_fit.iterations": 1,
            "gait_shooting.iterations": 0,
        }
    )
    start = Params.from_robot(robot)
    gaits = split_gaits(slow_motor_data, robot, 8.0)
    loss = KeyFrameLoss(engine, robot, {slow_motor_data.name: slow_motor_data}, gaits, start, config)
    fitted_at, searches = [], []
    fit = KeyFrameLoss.with_fitted_starts

    def fit_spy(self, params):
        fitted_at.append(float(params.motor_speed[0]))
        return fit(self, params)

    def refine_spy(loss_fn, space, config, progress=None):
        result = refine(loss_fn, space, config, progress)
        searches.append((loss_fn, float(space.start.motor_speed[0]), result.values["motor_speed"]))
        return result

    monkeypatch.setattr(KeyFrameLoss, "with_fitted_starts", fit_spy)
    monkeypatch.setattr("pipeline.sysid.identify.refine", refine_spy)
    result = identify_staged(loss, start, config)
    assert len(result.history) <= planned_steps(config) == 3 * (1 + PROFILE_MOVES)
    assert [s.method for s in result.history].count("search") == 3
    assert len(searches) == 3 and searches[0][0] is loss
    assert fitted_at == [searches[0][2], searches[1][2]]
    for (_, _, answer), (after, started, _) in itertools.pairwise(searches):
        assert started == answer
        assert after.observed is loss and after.units == loss.scored.sum()  # lead-ins carried, not run
        assert after.starts.state.vel.abs().amax() > 0
    assert result.values["motor_speed"] == searches[2][2]
