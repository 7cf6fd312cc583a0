"""Transition smoothing (R2S2R paper, Fig. 22): pure shortcuts and their engine validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.gaits.expansion import expand, published_rolling, reversed_gait
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.gaits.smoothing import (
    Shortcut,
    Tolerance,
    agrees,
    apply,
    candidates,
    smooth,
    smooth_validated,
)
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.published_gaits import published_gait
from pipeline.robot_model import reference_prism, resting_on_face

REST = np.ones(6)


def test_expanded_rolling_smooths_to_the_published_gait() -> None:
    """Dropping the resets between rolling units gives the published six-step gait; the lift
    step of the next unit (cable 1 or 2 down and up again) is never skipped."""
    targets = expand(published_rolling(), 3)
    smoothed, taken = smooth(targets)
    assert [s.removed for s in taken] == [(2,), (5,)]
    assert [len(options) for options in candidates(targets)] == [1, 1]
    np.testing.assert_array_equal(smoothed, np.vstack([published_gait("rolling"), REST]))


def test_shortcut_with_fewest_cables_wins() -> None:
    """A -> rest -> B0 -> B1 -> B2: B0 and B1 only move cable 0 on its way from A, B2 also moves
    cables 1 and 2. Jumping to B1 changes one cable, as few as jumping to B0, and skips more."""
    a = [0, 0, 1, 1, 1, 1]
    b0, b1, b2 = [0.5, 0, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1]
    targets = np.array([a, REST, b0, b1, b2, REST])
    [options] = candidates(targets)
    assert [(s.to, s.cables) for s in options] == [(3, 1), (2, 1), (4, 3)]
    smoothed, taken = smooth(targets)
    assert taken == [Shortcut(after=0, to=3, cables=1)]
    assert taken[0].removed == (1, 2)
    np.testing.assert_array_equal(smoothed, [a, b1, b2, REST])


def test_shortcut_never_skips_a_reversal() -> None:
    """B0 contracts cable 3 that B1 extends again: skipping B0 would lose that motion."""
    a = [0, 1, 1, 1, 1, 1]
    targets = np.array([a, REST, [1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 0.5], REST])
    [options] = candidates(targets)
    assert [s.to for s in options] == [2]


def test_only_interior_reset_runs_are_transitions() -> None:
    """A leading rest, the final rest and no reset leave the targets alone; a run of rests is one
    transition, removed whole."""
    a, b = [0, 1, 1, 1, 1, 1], [1, 0, 1, 1, 1, 1]
    assert candidates(np.array([REST, a, b, REST])) == []
    targets = np.array([REST, a, REST, REST, b, REST])
    smoothed, taken = smooth(targets)
    assert [s.removed for s in taken] == [(2, 3)]
    np.testing.assert_array_equal(smoothed, [REST, a, b, REST])
    np.testing.assert_array_equal(apply(targets, []), targets)


def _outcome(
    forward: list[float],
    rotation: list[float],
    end_face: list[int],
    reached: list[bool],
    collapsed: list[bool] | None = None,
) -> Outcome:
    n = len(forward)
    return Outcome(
        forward_m=np.array(forward),
        lateral_m=np.zeros(n),
        rotation_rad=np.array(rotation),
        start_face=np.zeros(n, int),
        end_face=np.array(end_face),
        reached=np.array(reached),
        collapsed=np.zeros(n, bool) if collapsed is None else np.array(collapsed),
        final=None,
        trace=None,
    )


def test_agreement_needs_reach_face_distance_and_turn() -> None:
    reference = _outcome([0.2], [0.1], [2], [True])
    candidate = _outcome(
        [0.24, 0.2, 0.2, 0.3, 0.2, 0.2],
        [0.1, 0.1, 0.1, 0.1, 0.5, 0.1],
        [2, 2, 1, 2, 2, 2],
        [True, False] + [True] * 4,
        collapsed=[False] * 5 + [True],
    )
    tolerance = Tolerance(forward_m=0.05, rotation_rad=0.2)
    np.testing.assert_array_equal(agrees(candidate, reference, tolerance), [True] + [False] * 5)


@pytest.fixture(scope="module")
def engine_setup(default_configs):
    """Default parameters, dt 0.005, settled on the published start (0, 2, 5)."""
    torch.set_num_threads(1)
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    params = Params.from_robot(robot)
    state = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
    return engine, params, robot, settle(engine, params, state, robot.pid, torch.ones(6), 1.0)


def test_validated_smoothing_never_fails(engine_setup) -> None:
    """Three reversed rolling cycles with resets, the gait that rolls from this start in the
    engine (measured: the unsmoothed policy ends 0.242 m back on face 2, turned -0.21 rad). Each
    shortcut alone agrees with it (0.228 m back, 0.08 and -0.09 rad), both together do not
    (0.13 rad, 0.34 rad off): only the first is kept, and a fresh run of the smoothed policy
    agrees with the unsmoothed one."""
    engine, params, robot, state = engine_setup
    targets = expand(reversed_gait(published_rolling(), robot), 3)
    tolerance = Tolerance(forward_m=0.05, rotation_rad=0.3)
    smoothed, kept = smooth_validated(engine, params, robot, state, targets, 8.0, tolerance)
    assert [s.removed for s in kept] == [(2,)]
    np.testing.assert_array_equal(smoothed, apply(targets, kept))
    batch = 2
    start = state.index(torch.zeros(batch, dtype=torch.long))
    both = params.expand(batch)
    padded = np.stack([targets, np.vstack([smoothed, np.repeat(smoothed[-1:], len(targets) - len(smoothed), 0)])])
    outcome = simulate_targets(engine, both, robot, start, padded, 8.0)
    assert outcome.reached.all()
    assert outcome.end_face[0] == outcome.end_face[1] == 2
    assert agrees(outcome, outcome, tolerance).all()


def test_validated_smoothing_falls_back_when_the_outcome_changes(engine_setup) -> None:
    """With a millimetre tolerance no shortcut reproduces the unsmoothed run: the resets stay."""
    engine, params, robot, state = engine_setup
    targets = expand(reversed_gait(published_rolling(), robot), 2)
    tolerance = Tolerance(forward_m=1e-3, rotation_rad=1e-3)
    smoothed, kept = smooth_validated(engine, params, robot, state, targets, 8.0, tolerance)
    assert kept == []
    np.testing.assert_array_equal(smoothed, targets)
