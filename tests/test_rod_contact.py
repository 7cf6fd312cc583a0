"""Contact between the engine's rods: their bars, end caps and motors never pass through each other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rod_contact import closest_points
from pipeline.physics.rollout import run_policy, settle, state_from_caps
from pipeline.robot_model import reference_prism, resting_on_face

PAIRS = ((0, 1), (0, 2), (1, 2))


def bar_distances(caps: np.ndarray) -> np.ndarray:
    """(T, 3) least distance between the bars (cap centre to cap centre) of each rod pair in
    ``caps`` (T, 6, 3), by dense sampling (independent of the engine's closest points)."""
    s = np.linspace(0.0, 1.0, 401)[None, :, None]
    out = []
    for i, j in PAIRS:
        a = caps[:, 2 * i, None] + s * (caps[:, 2 * i + 1] - caps[:, 2 * i])[:, None]
        b = caps[:, 2 * j, None] + s * (caps[:, 2 * j + 1] - caps[:, 2 * j])[:, None]
        out.append(np.linalg.norm(a[:, :, None] - b[:, None, :], axis=-1).min((1, 2)))
    return np.stack(out, 1)


def test_closest_points_of_segments_match_dense_sampling() -> None:
    rng = np.random.default_rng(0)
    a, u, b, v = (torch.tensor(rng.normal(size=(200, 3))) for _ in range(4))
    v[:20] = 0.7 * u[:20]  # parallel pairs
    p, q = closest_points(a, u, b, v)
    caps = torch.stack([a, a + u, b, b + v, b, b + v], 1).numpy()
    sampled = bar_distances(caps)[:, 0]
    np.testing.assert_allclose((p - q).norm(dim=-1).numpy(), sampled, atol=2e-3 * np.abs(caps).max())
    assert bool(((p - q).norm(dim=-1).numpy() <= sampled + 1e-12).all())
    s = ((p - a) * u).sum(-1) / (u * u).sum(-1)
    np.testing.assert_allclose(torch.linalg.cross(p - a, u).norm(dim=-1).numpy(), 0.0, atol=1e-9)
    assert bool(((s >= -1e-12) & (s <= 1 + 1e-12)).all())


def test_the_kernels_gap_bound_never_exceeds_a_capsule_pairs_gap(default_configs) -> None:
    """The compiled kernel skips the closest points of capsule pairs whose gap's lower bound is
    beyond the contact margin: over 2,000 random poses of three rods (within a 0.4 m cube, so that
    pairs from touching to well apart occur) the bound is never above the pair's gap (closest points
    of :func:`closest_points`, less the radii; 1e-12 m for rounding), and it skips most pairs that are
    beyond the margin (a bound that skipped none would leave the kernel at its cost without it)."""
    from pipeline.physics import kernel

    engine = Engine(RobotModel.from_robot(default_configs.robot), dt=0.005)
    shapes = engine._shapes
    *_, pair_rods, pair_z, pair_reach, scalars = engine._kernel_model
    rng = np.random.default_rng(3)
    pos = rng.uniform(0.0, 0.4, size=(2000, 3, 3))
    quat = rng.normal(size=(2000, 3, 4))
    quat /= np.linalg.norm(quat, axis=-1, keepdims=True)
    rot = np.empty((2000, 3, 3, 3))
    for b in range(2000):
        for r in range(3):
            kernel._rotation(quat[b, r], rot[b, r])
    axis = torch.from_numpy(rot[..., 2])  # (N, 3, 3): each rod's body z in the world
    z0, z1 = shapes.z0_m, shapes.z1_m
    start_i = torch.from_numpy(pos)[:, shapes.first] + z0[shapes.first_shape, None] * axis[:, shapes.first]
    start_j = torch.from_numpy(pos)[:, shapes.second] + z0[shapes.second_shape, None] * axis[:, shapes.second]
    on_i, on_j = closest_points(
        start_i,
        (z1 - z0)[shapes.first_shape, None] * axis[:, shapes.first],
        start_j,
        (z1 - z0)[shapes.second_shape, None] * axis[:, shapes.second],
    )
    gap = ((on_i - on_j).norm(dim=-1) - shapes.reach_m).numpy()  # (N, P)
    distance = np.empty((3, 3))
    bound = np.empty_like(gap)
    for b in range(2000):
        kernel._rod_distances(pos[b], rot[b], scalars[8], scalars[9], distance)
        for q, (ri, rj) in enumerate(pair_rods):
            bound[b, q] = kernel._gap_bound(pos[b], rot[b], ri, rj, pair_z[q], pair_reach[q], distance[ri, rj])
    assert bool((bound <= gap + 1e-12).all()), float((bound - gap).max())
    margin = scalars[7]
    assert ((bound >= margin) & (gap >= margin)).sum() > 0.5 * (gap >= margin).sum()


@pytest.fixture(scope="module")
def weightless(default_configs):
    """An engine without gravity and its robot at rest in the prism's shape, 1 m above the ground."""
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005, gravity_m_s2=0.0)
    params = Params.from_robot(robot)
    caps = resting_on_face(robot, reference_prism(robot)) + np.array([0.0, 0.0, 1.0])
    return engine, params, state_from_caps(engine, params, caps)


def test_a_rod_thrown_at_another_bounces_off_its_bar_and_momentum_is_kept(weightless, default_configs) -> None:
    """Rod 0 thrown at 3 m/s at rod 1's bar (2.5 cm a step at most, eight bar widths) stops at
    their radii and does not come out on the other side; contact, like the cables, is internal."""
    engine, params, state = weightless
    radius = default_configs.robot.rod.radius_m
    caps = engine.cap_positions(state)[0].numpy()
    on_0, on_1 = closest_points(*(torch.tensor(x) for x in (caps[0], caps[1] - caps[0], caps[2], caps[3] - caps[2])))
    towards = (on_1 - on_0) / (on_1 - on_0).norm()
    state = state.replace(vel=state.vel.clone())
    state.vel[0, 0] = 3.0 * towards
    mass = engine.model.mass[None, :, None]
    momentum = (mass * state.vel).sum(1)
    path = [engine.cap_positions(state)[0].numpy()]
    zero = torch.zeros(1, 6, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(40):
            state = engine.step(params, state, zero)
            path.append(engine.cap_positions(state)[0].numpy())
    distances = bar_distances(np.stack(path))[:, 0]
    assert distances.min() > 2 * radius - 2e-4
    side = [float(np.dot(np.cross(c[1] - c[0], c[3] - c[2]), c[0] - c[2])) for c in path]
    assert np.sign(side[-1]) == np.sign(side[0])
    torch.testing.assert_close((mass * state.vel).sum(1), momentum, atol=1e-9, rtol=0)


def test_a_gait_that_folded_the_prism_through_itself_is_stopped_by_the_bars(default_configs) -> None:
    """The first two targets of a turning gait that a search finds in an engine whose rods do not
    collide: from rest, the three bars pass through each other there (0.1 to 0.3 mm apart at the
    closest) and the twin, whose rods collide, jams flat. With rod contact they stay their radii apart."""
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    params = Params.from_robot(robot, motor_speed=0.876, friction=0.537, restitution=0.017)
    state = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
    state = settle(engine, params, state, robot.pid, torch.ones(6, dtype=torch.float64))
    targets = torch.tensor([[0.9, 0.0, 0.0, 0.9, 0.0, 0.0], [0.0, 0.0, 0.9, 1.0, 1.0, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        _, trace = run_policy(engine, params, state, targets, robot.pid, 3.0, final_hold_s=0.0, latency_s=0.06)
    assert bar_distances(trace.caps_m[0].numpy()).min() > 2 * robot.rod.radius_m - 2e-4


def sphere_gaps(caps: np.ndarray, robot) -> np.ndarray:
    """(T,) least gap (m) between the end-cap spheres and motor centres (as spheres of the end-cap
    radius) of two different rods in ``caps`` (T, 6, 3), from the caps alone."""
    offset, radius = robot.motor.offset_m, robot.end_cap.radius_m
    rods = []
    for a, b in robot.topology.rods:
        centre, axis = (caps[:, a] + caps[:, b]) / 2, caps[:, b] - caps[:, a]
        axis = axis / np.linalg.norm(axis, axis=-1, keepdims=True)
        rods.append(np.stack([caps[:, a], centre - offset * axis, centre + offset * axis, caps[:, b]], 1))
    gaps = [
        np.linalg.norm(rods[i][:, :, None] - rods[j][:, None, :], axis=-1).min((1, 2)) - 2 * radius for i, j in PAIRS
    ]
    return np.min(gaps, axis=0)


def test_end_caps_and_motors_of_two_rods_do_not_pass_through_each_other(default_configs) -> None:
    """The first cycle of a straight gait that a search finds in an engine whose rods collide as bars
    only, with identified values: from rest, the end caps and motors of two rods go 23 mm into each
    other there, and on the twin, where they collide, every later target times out. Each rod's ends
    collide as capsules of the end-cap radius."""
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    params = Params.from_robot(robot, motor_speed=0.875, friction=0.537, restitution=0.046)
    state = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
    state = settle(engine, params, state, robot.pid, torch.ones(6, dtype=torch.float64))
    targets = torch.tensor(
        [[0.0, 0.9, 0.0, 0.0, 0.9, 0.0], [0.9, 0.0, 0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]],
        dtype=torch.float64,
    )
    with torch.no_grad():
        _, trace = run_policy(engine, params, state, targets, robot.pid, 3.0, final_hold_s=0.0, latency_s=0.06)
    assert sphere_gaps(trace.caps_m[0].numpy(), robot).min() > -2e-3
