"""Face maps, reversal and symmetry expansion of gaits (Tribar paper SM S6, R2S2R paper)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.gaits.expansion import (
    ROTATION_CAPS,
    Gait,
    end_face,
    expand,
    prism_symmetries,
    published_rolling,
    reversed_gait,
    support_symmetry,
)
from pipeline.gaits.outcome import simulate_targets
from pipeline.gaits.symmetry import (
    FACES,
    cable_permutation,
    relabel,
    reversal_caps,
    reversal_permutation,
    reverse,
    shift_left,
    support_triangle,
    to_face,
)
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.published_gaits import CCW_TURN, CW_TURN_UNIT, ROLLING_UNIT, published_gait
from pipeline.robot_model import reference_prism, resting_on_face

LABELS = np.arange(6)
ODD_SIDE, EVEN_SIDE = {0, 1, 2}, {3, 4, 5}


def test_face_map_matches_seed_002() -> None:
    np.testing.assert_array_equal(to_face(LABELS, 0, 1), [1, 2, 0, 4, 5, 3])
    np.testing.assert_array_equal(to_face(LABELS, 0, 2), [2, 0, 1, 5, 3, 4])
    np.testing.assert_array_equal(to_face(LABELS, 2, 0), to_face(LABELS, 0, 1))
    np.testing.assert_array_equal(to_face(LABELS, 1, 0), to_face(LABELS, 0, 2))


def test_rolling_unit_continues_on_the_next_face() -> None:
    np.testing.assert_array_equal(to_face(ROLLING_UNIT, 0, 1), [[1, 0.1, 1, 1, 0.1, 1], [1, 1, 0, 1, 0.1, 0]])


@pytest.mark.parametrize("face", [0, 1, 2])
def test_three_shifts_return_to_the_start(face: int) -> None:
    gait = np.random.default_rng(face).uniform(size=(4, 6))
    np.testing.assert_array_equal(shift_left(shift_left(shift_left(gait))), gait)
    np.testing.assert_array_equal(to_face(to_face(gait, 0, face), face, 0), gait)
    np.testing.assert_array_equal(to_face(gait, face, face + 3), gait)


def test_support_triangle_of_face_0_is_the_published_start(default_configs) -> None:
    robot = default_configs.robot
    assert support_triangle(robot, 0) == (0, 2, 5)
    for face in range(3):
        assert set(support_triangle(robot, face)) < set(FACES[face])


def test_reversal_on_face_0_is_the_two_fold_symmetry_through_rod_1(default_configs) -> None:
    """The only odd/even-swapping symmetry of the topology that keeps face 0 (0, 2, 3, 5) on the
    ground turns about an axis through the centre of rod (2, 3): caps 0<->5, 1<->4, 2<->3."""
    robot = default_configs.robot
    assert reversal_caps(robot, 0) == (5, 4, 3, 2, 1, 0)
    np.testing.assert_array_equal(reversal_permutation(robot, 0), [3, 5, 4, 0, 2, 1])
    np.testing.assert_array_equal(reverse(ROLLING_UNIT, robot, 0), [[1, 0.1, 1, 1, 0.1, 1], [0, 0.1, 1, 0, 1, 1]])


@pytest.mark.parametrize("face", [0, 1, 2])
def test_reversal_is_an_involution_that_swaps_the_sides(default_configs, face: int) -> None:
    robot = default_configs.robot
    caps = reversal_caps(robot, face)
    perm = reversal_permutation(robot, face)
    assert sorted(perm) == list(range(6))
    assert {int(perm[j]) for j in ODD_SIDE} == EVEN_SIDE
    assert {int(perm[j]) for j in EVEN_SIDE} == ODD_SIDE
    assert all(caps[i] % 2 != i % 2 for i in range(6))
    gait = np.random.default_rng(face).uniform(size=(3, 6))
    np.testing.assert_array_equal(reverse(reverse(gait, robot, face), robot, face), gait)
    assert not np.array_equal(reverse(gait, robot, face), gait)


@pytest.mark.parametrize("face", [0, 1, 2])
def test_reversal_keeps_the_face_and_swaps_the_neighbours(default_configs, face: int) -> None:
    """Rotating by pi about the ground normal keeps the bottom face and turns the face ahead
    into the face behind, so rolling forward becomes rolling backward."""
    caps = reversal_caps(default_configs.robot, face)
    image = [{caps[i] for i in f} for f in FACES]
    assert image[face] == set(FACES[face])
    assert image[(face + 1) % 3] == set(FACES[(face + 2) % 3])


@pytest.mark.parametrize("face", [1, 2])
def test_reversal_commutes_with_the_face_map(default_configs, face: int) -> None:
    """The face map is the prism's 3-fold symmetry, so reversing on face k a gait mapped to
    face k is mapping the gait reversed on face 0."""
    robot = default_configs.robot
    gait = np.random.default_rng(face).uniform(size=(3, 6))
    np.testing.assert_array_equal(
        reverse(to_face(gait, 0, face), robot, face), to_face(reverse(gait, robot, 0), 0, face)
    )


def test_reversal_rejects_a_cable_without_an_image(default_configs) -> None:
    robot = default_configs.robot
    actuated = ((3, 4), *robot.topology.actuated[1:])
    broken = robot.model_copy(update={"topology": robot.topology.model_copy(update={"actuated": actuated})})
    with pytest.raises(ValueError, match="actuated cable 0"):
        reversal_permutation(broken, 0)


def test_gait_must_end_at_rest() -> None:
    with pytest.raises(ValueError, match="rest shape"):
        Gait("unit", ROLLING_UNIT, face_steps=1)
    assert Gait("back", np.ones((1, 6)), face_steps=-1).face_steps == 2


def test_expand_maps_each_cycle_to_its_face() -> None:
    rolling = published_rolling()
    rest = np.ones((1, 6))
    expected = np.vstack([ROLLING_UNIT, rest, to_face(ROLLING_UNIT, 0, 1), rest, to_face(ROLLING_UNIT, 0, 2), rest])
    np.testing.assert_array_equal(expand(rolling, 3), expected)
    np.testing.assert_array_equal(expand(rolling, 1, start_face=2), np.vstack([to_face(ROLLING_UNIT, 0, 2), rest]))
    assert end_face(rolling, 4, start_face=1) == 2
    assert expand(rolling, 0).shape == (0, 6)


def test_face_step_expansion_gives_the_published_turning_gaits() -> None:
    """The published clockwise turn rolls backward (right shifts); the counter-clockwise keeps its face."""
    np.testing.assert_array_equal(expand(Gait("cw", CW_TURN_UNIT, face_steps=-1), 3), published_gait("cw"))
    ccw = expand(Gait("ccw", CCW_TURN, face_steps=0), 2, start_face=1)
    np.testing.assert_array_equal(ccw, np.tile(to_face(CCW_TURN, 0, 1), (2, 1)))


def test_prism_symmetry_group(default_configs) -> None:
    """Six distinct cap maps, closed under composition; the face step relabels the cables as a
    left shift, and the group's images of support triangle (0, 2, 5) are the six triangles the
    prism rests on (two per face)."""
    robot = default_configs.robot
    group = prism_symmetries(robot)
    assert len(set(group)) == 6
    assert {tuple(a[i] for i in b) for a in group for b in group} == set(group)
    rotation = cable_permutation(robot, ROTATION_CAPS, "rotation")
    np.testing.assert_array_equal(relabel(LABELS, rotation), shift_left(LABELS))
    triangles = {frozenset(g[c] for c in (0, 2, 5)) for g in group}
    assert len(triangles) == 6
    for face, caps in enumerate(FACES):
        assert sum(t <= set(caps) for t in triangles) == 2, face


def test_support_symmetry_finds_the_resting_triangle(default_configs) -> None:
    robot = default_configs.robot
    prism = reference_prism(robot)
    for g in prism_symmetries(robot):
        triangle = (g[0], g[2], g[5])
        caps = resting_on_face(robot, prism, triangle)
        found = support_symmetry(robot, caps)
        assert {found[0], found[2], found[5]} == set(triangle)


def test_reversed_rolling_rolls_the_other_way_in_the_engine(default_configs) -> None:
    """Default parameters, dt 0.005. The reversal is the engine's exact symmetry between the two
    support triangles of face 0, (0, 2, 5) and its image (0, 3, 5): each gait from one triangle
    mirrors the other gait from the other (displacements flip sign, rotations agree), and the
    reversed unit from (0, 2, 5) rolls backward onto face 2 while the unit from (0, 3, 5) rolls
    forward onto face 1."""
    torch.set_num_threads(1)
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    params = Params.from_robot(robot, batch=4)
    prism = reference_prism(robot)
    caps = np.stack([resting_on_face(robot, prism, t) for t in [(0, 2, 5), (0, 3, 5)] * 2])
    start = settle(engine, params, state_from_caps(engine, params, caps), robot.pid, torch.ones(6), 1.0)
    unit, back = published_rolling().targets, reversed_gait(published_rolling(), robot).targets
    outcome = simulate_targets(engine, params, robot, start, np.stack([unit, unit, back, back]), 8.0)
    assert outcome.reached.all()
    assert (outcome.start_face == 0).all()
    mirror = [3, 2, 1, 0]
    np.testing.assert_allclose(outcome.forward_m, -outcome.forward_m[mirror], atol=2e-3)
    np.testing.assert_allclose(outcome.lateral_m, -outcome.lateral_m[mirror], atol=2e-3)
    np.testing.assert_allclose(outcome.rotation_rad, outcome.rotation_rad[mirror], atol=1e-2)
    assert outcome.forward_m[2] < -0.1 and outcome.end_face[2] == 2
    assert outcome.forward_m[1] > 0.1 and outcome.end_face[1] == 1
