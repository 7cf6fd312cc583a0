"""The differentiable engine: statics, drops, gradients, batching, bounds, and the twin."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.gaits.symmetry import bottom_face
from pipeline.hardware.base import GroundTruthPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.physics import Engine, ParameterBoundsError, Params, RobotModel
from pipeline.physics.rollout import run_policy, settle, state_from_caps
from pipeline.policies import gait_policy, random_policy
from pipeline.robot_model import reference_prism, resting_on_face
from pipeline.truth import twin_true_model, twin_true_params

ONES = torch.ones(6, dtype=torch.float64)


@pytest.fixture(scope="module")
def engine(default_configs) -> Engine:
    return Engine(RobotModel.from_robot(default_configs.robot), dt=0.002)


@pytest.fixture(scope="module")
def rest_state(engine, default_configs):
    robot = default_configs.robot
    params = Params.from_robot(robot)
    caps = resting_on_face(robot, reference_prism(robot))
    return params, settle(engine, params, state_from_caps(engine, params, caps), robot.pid, ONES, duration_s=2.0)


def test_state_from_caps_reproduces_the_caps(engine, default_configs) -> None:
    robot = default_configs.robot
    params = Params.from_robot(robot, batch=2)
    caps = resting_on_face(robot, reference_prism(robot))
    state = state_from_caps(engine, params, caps)
    np.testing.assert_allclose(engine.cap_positions(state).numpy(), np.broadcast_to(caps, (2, 6, 3)), atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        state_from_caps(engine, params, caps[:5])


def test_robot_at_rest_stays_at_rest(engine, rest_state) -> None:
    params, state = rest_state
    caps0 = engine.cap_positions(state)
    zero = torch.zeros(1, 6, dtype=torch.float64)
    speeds = []
    with torch.no_grad():
        for _ in range(round(10.0 / engine.dt)):
            state = engine.step(params, state, zero)
            speeds.append(float(state.vel.norm(dim=-1).max()))
    drift = (engine.cap_positions(state) - caps0).norm(dim=-1).max()
    assert float(drift) < 1e-3  # < 1 mm over 10 s
    assert max(speeds) < 0.01  # only the settling of the last motor command
    assert max(speeds[len(speeds) // 2 :]) < 1e-5  # no energy gain: still at rest after 5 s
    assert torch.isfinite(state.pos).all()


def test_drop_from_half_a_metre_settles(engine, rest_state) -> None:
    params, rest = rest_state
    state = rest.replace(pos=rest.pos + torch.tensor([0.0, 0.0, 0.5], dtype=torch.float64))
    zero = torch.zeros(1, 6, dtype=torch.float64)
    lowest = []
    with torch.no_grad():
        for _ in range(round(3.0 / engine.dt)):
            state = engine.step(params, state, zero)
            caps = engine.cap_positions(state)
            lowest.append(float(caps[..., 2].min()))
    radius = engine.model.robot.end_cap.radius_m
    assert torch.isfinite(state.pos).all()
    assert min(lowest) > radius - 0.002  # penetration tolerance: 2 mm
    kinetic = 0.5 * float((engine.model.mass[:, None] * state.vel**2).sum())
    released = float(engine.model.mass.sum()) * 9.81 * 0.5
    assert kinetic < 1e-3 * released  # the impact energy is gone after 3 s
    assert abs(lowest[-1] - radius) < 1e-3


def test_gradients_match_finite_differences_in_free_flight(engine, rest_state) -> None:
    params0, rest = rest_state
    names = [
        "motor_speed",
        "actuated_stiffness",
        "actuated_damping",
        "passive_stiffness",
        "passive_cubic_stiffness",
        "passive_damping",
        "passive_rest_length",
    ]
    state0 = rest.replace(
        pos=rest.pos + torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), omega=torch.full_like(rest.omega, 0.3)
    )
    control = torch.tensor([[0.8, -0.5, 0.3, 0.0, 1.0, -1.0]], dtype=torch.float64)
    weights = torch.linspace(-1.0, 1.0, 18, dtype=torch.float64).reshape(6, 3)

    def loss(values: dict[str, torch.Tensor]) -> torch.Tensor:
        params = params0.replace(**values)
        state = state0
        for _ in range(60):
            state = engine.step(params, state, control)
        return (engine.cap_positions(state)[0] * weights).sum()

    values = {n: getattr(params0, n).clone().requires_grad_(True) for n in names}
    analytic = torch.autograd.grad(loss(values), list(values.values()))
    for name, grad in zip(names, analytic, strict=True):
        base = getattr(params0, name)
        h = 1e-6 * max(1.0, float(base.abs()))
        plus = loss({name: base + h}).item()
        minus = loss({name: base - h}).item()
        numeric = (plus - minus) / (2 * h)
        assert float(grad) == pytest.approx(numeric, rel=1e-4, abs=1e-9), name


def test_contact_parameters_get_gradients_through_rollouts(engine, rest_state, default_configs) -> None:
    _, rest = rest_state
    robot = default_configs.robot
    friction = torch.tensor([0.8], dtype=torch.float64, requires_grad=True)
    restitution = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    speed = torch.tensor([0.9], dtype=torch.float64, requires_grad=True)
    params = Params.from_robot(robot).replace(friction=friction, restitution=restitution, motor_speed=speed)
    targets = torch.tensor(gait_policy(robot, "rolling", 1).targets[:3])
    _, trace = run_policy(engine, params, rest, targets, robot.pid, segment_timeout_s=4.0, final_hold_s=0.2)
    # Cable forces are internal: with detached contacts the centroid has no gradient with respect to
    # the actuation, so weigh the caps unevenly (the shape carries the motor-speed gradient).
    weights = torch.linspace(0.5, 1.5, 18, dtype=torch.float64).reshape(6, 3)
    grads = torch.autograd.grad((trace.caps_m[0, -1] * weights).sum(), [friction, restitution, speed])
    for name, grad in zip(["friction", "restitution", "motor_speed"], grads, strict=True):
        assert grad is not None and torch.isfinite(grad).all() and float(grad.abs()) > 0, name


def test_batch_matches_single_environments(engine, rest_state, default_configs) -> None:
    params1, rest = rest_state
    robot = default_configs.robot
    speeds = [0.6, 0.9, 1.2]
    batch = Params(**{n: v.expand(3).clone() for n, v in params1.as_dict().items()}).replace(
        motor_speed=torch.tensor(speeds, dtype=torch.float64)
    )
    state = rest.index(torch.zeros(3, dtype=torch.long))
    targets = torch.tensor([[0.2, 1, 1, 0.2, 1, 1], [1.0] * 6], dtype=torch.float64)
    with torch.no_grad():
        _, trace = run_policy(
            engine, batch, state, targets, robot.pid, segment_timeout_s=3.0, final_hold_s=0.2, max_time_s=2.0
        )
        for i, s in enumerate(speeds):
            _, single = run_policy(
                engine,
                params1.replace(motor_speed=torch.tensor([s], dtype=torch.float64)),
                rest,
                targets,
                robot.pid,
                segment_timeout_s=3.0,
                final_hold_s=0.2,
                max_time_s=2.0,
            )
            n = single.caps_m.shape[1]
            torch.testing.assert_close(trace.caps_m[i, :n], single.caps_m[0], rtol=1e-9, atol=1e-12)
    slow, fast = trace.segment[0], trace.segment[2]
    assert int((fast >= 1).nonzero()[0]) < int((slow >= 1).nonzero()[0])  # faster motors reach the target sooner


def test_compiled_engine_matches_the_eager_one(engine, rest_state, default_configs, monkeypatch) -> None:
    """With ``compiled``, rollouts run the compiled kernel at every batch size, with the eager step's
    results, and so do steps with gradients (their backward pass: the next test)."""
    import pipeline.physics.engine as engine_module

    params1, rest = rest_state
    robot = default_configs.robot
    eager = Engine(engine.model, dt=0.005)  # the stages' time step
    compiled = Engine(engine.model, dt=0.005, compiled=True)
    batched = []
    for name in ("step_kernel", "step_kernel_serial"):  # on several threads, on one
        real = getattr(engine_module, name)

        def counted(*inputs, real=real):
            batched.append(inputs[0][0].shape[0])
            return real(*inputs)

        monkeypatch.setattr(engine_module, name, counted)
    targets = torch.tensor([[0.2, 1, 1, 0.2, 1, 1], [1.0] * 6], dtype=torch.float64)
    for speeds in ([0.6, 0.9, 1.2], [0.7, 0.8, 1.0, 1.1, 1.3]):
        batch = params1.expand(len(speeds)).replace(motor_speed=torch.tensor(speeds, dtype=torch.float64))
        state = rest.index(torch.zeros(len(speeds), dtype=torch.long))
        with torch.no_grad():
            runs = [
                run_policy(e, batch, state, targets, robot.pid, segment_timeout_s=3.0, final_hold_s=0.2, max_time_s=1.5)
                for e in (eager, compiled)
            ]
        torch.testing.assert_close(runs[1][1].caps_m, runs[0][1].caps_m, rtol=1e-9, atol=1e-10)
    assert set(batched) == {3, 5}
    steps = len(batched)
    speed = torch.tensor([0.9, 1.1], dtype=torch.float64, requires_grad=True)
    state = compiled.step(
        params1.expand(2).replace(motor_speed=speed), rest.index(torch.zeros(2, dtype=torch.long)), ONES.expand(2, 6)
    )
    (gradient,) = torch.autograd.grad(state.rest_length.sum(), speed)
    assert batched[steps:] == [2] and bool((gradient != 0).all())


@pytest.mark.parametrize("batch", [1, 96])
def test_compiled_gradients_equal_the_eager_ones(engine, rest_state, batch) -> None:
    """The compiled steps' backward pass (the kernel's adjoint, on one thread at batch 1, on several at
    96) gives the eager step's gradient, to rounding, of a loss on every field of the state after
    ten control ticks of four 5 ms steps under random commands, started mid-roll (rods on the
    ground, some bouncing): with respect to every parameter, every field of the start state and
    every tick's commands. Rounding: the two sum in other orders, a few units in the last place
    carried through 40 steps (1e-13 relative measured); a wrong term is off by percents."""
    from pipeline.physics.kernel import PARAMETER_COLUMNS

    params1, rest = rest_state
    engines = [Engine(engine.model, dt=0.005), Engine(engine.model, dt=0.005, compiled=True)]
    generator = torch.Generator().manual_seed(7)
    commands = torch.rand(25, batch, 6, generator=generator, dtype=torch.float64) * 2 - 1
    start = rest.index(torch.zeros(batch, dtype=torch.long))
    with torch.no_grad():
        for k in range(15):
            start = engines[1].steps(params1.expand(batch), start, commands[k], 4)
    weights = {
        name: torch.randn(value.shape, generator=generator, dtype=torch.float64) for name, value in vars(start).items()
    }
    gradients = []
    for e in engines:
        leaves = {name: getattr(params1, name).expand(batch).clone().requires_grad_(True) for name in PARAMETER_COLUMNS}
        state = type(start)(**{name: value.clone().requires_grad_(True) for name, value in vars(start).items()})
        controls = commands[15:].clone().requires_grad_(True)
        inputs = [*leaves.values(), *vars(state).values(), controls]
        for k in range(10):
            state = e.steps(params1.expand(batch).replace(**leaves), state, controls[k], 4)
        loss = sum((value * weights[name]).sum() for name, value in vars(state).items())
        gradients.append(torch.autograd.grad(loss, inputs))
    names = [*PARAMETER_COLUMNS, *vars(start), "control"]
    for name, eager, compiled in zip(names, *gradients, strict=True):
        scale = float(eager.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(compiled, eager, rtol=1e-9, atol=1e-10 * scale, msg=name)


@pytest.mark.parametrize("batch", [1, 128])
def test_compiled_step_equals_the_eager_step_over_random_commands(engine, rest_state, batch) -> None:
    """1,000 compiled steps (dt 5 ms: 5 s of rolling, with rods touching) under random motor
    commands held 0.1 s each keep the end caps where the eager steps put them, to rounding: the
    kernel computes the eager step's physics, its sums in another order. Over these steps rounding grows to a few
    nanometres (contacts amplify it); a wrong term or a contact left out moves a cap by
    millimetres within a few steps. Velocities are not compared: an impulse's sticking-or-sliding
    switch turns rounding into transient differences of 1e-6 rad/s that the positions do not keep."""
    params1, rest = rest_state
    eager = Engine(engine.model, dt=0.005)
    compiled = Engine(engine.model, dt=0.005, compiled=True)
    generator = torch.Generator().manual_seed(batch)
    start = rest.index(torch.zeros(batch, dtype=torch.long))
    states = [start, start]
    largest_m = 0.0
    with torch.no_grad():
        for step in range(1000):
            if step % 20 == 0:
                control = torch.rand(batch, 6, generator=generator, dtype=torch.float64) * 2 - 1
            states = [e.step(params1.expand(batch), s, control) for e, s in zip((eager, compiled), states, strict=True)]
            caps = [engine.cap_positions(s) for s in states]
            largest_m = max(largest_m, float((caps[0] - caps[1]).norm(dim=-1).max()))
    moved_m = (engine.cap_positions(states[0]) - engine.cap_positions(start)).norm(dim=-1).amax()
    assert float(moved_m) > 0.1  # the commands rolled the robot
    assert largest_m < 1e-7, largest_m


def test_a_ticks_steps_in_one_kernel_call_equal_single_steps(engine, rest_state) -> None:
    """``Engine.steps`` runs a control tick's steps in one kernel call, each environment through all
    of them in turn: its states are those of as many single steps, bit for bit (1, 2 and 5 steps:
    the last lands in the output whether the step count is odd or even), and the compiled end caps
    and cable lengths equal the eager geometry's to rounding (1e-15 m: the same products in
    another order)."""
    params1, rest = rest_state
    compiled = Engine(engine.model, dt=0.005, compiled=True)
    batch = 96
    generator = torch.Generator().manual_seed(11)
    start = rest.index(torch.zeros(batch, dtype=torch.long))
    params = params1.expand(batch)
    with torch.no_grad():
        for n in (1, 2, 5):
            control = torch.rand(batch, 6, generator=generator, dtype=torch.float64) * 2 - 1
            single = start
            for _ in range(n):
                single = compiled.step(params, single, control)
            together = compiled.steps(params, start, control, n)
            for field in ("pos", "quat", "vel", "omega", "rest_length", "motor_omega"):
                assert torch.equal(getattr(single, field), getattr(together, field)), (n, field)
            start = together
        caps, lengths = compiled.caps_and_cable_lengths(start)
        eager_caps, eager_lengths = engine.caps_and_cable_lengths(start)
    assert float((start.pos - rest.pos[:1]).norm(dim=-1).max()) > 1e-4  # the steps moved the rods
    torch.testing.assert_close(caps, eager_caps, rtol=0, atol=1e-15)
    torch.testing.assert_close(lengths, eager_lengths, rtol=0, atol=1e-15)
    torch.testing.assert_close(compiled.cap_positions(start), eager_caps, rtol=0, atol=1e-15)


def test_the_kernel_on_several_threads_equals_it_on_one(engine, rest_state, monkeypatch) -> None:
    """The compiled kernel's environments are independent: split over two threads (256 robots, 50
    steps of random commands) its states are those of the one-thread kernel, bit for bit (the
    test workers run torch on one thread, so the rest of the tests take the one-thread kernel)."""
    import pipeline.physics.engine as engine_module

    params1, rest = rest_state
    compiled = Engine(engine.model, dt=0.005, compiled=True)
    batch = 256
    generator = torch.Generator().manual_seed(7)
    states = {}
    for threads in (1, 2):
        called = []
        for name in ("step_kernel", "step_kernel_serial"):
            real = getattr(engine_module, name)

            def counted(*inputs, real=real, name=name, called=called):
                called.append(name)
                return real(*inputs)

            monkeypatch.setattr(engine_module, name, counted)
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        state = rest.index(torch.zeros(batch, dtype=torch.long))
        with torch.no_grad():
            for step in range(50):
                if step % 10 == 0:
                    control = torch.rand(batch, 6, generator=generator.manual_seed(step), dtype=torch.float64) * 2 - 1
                state = compiled.step(params1.expand(batch), state, control)
        assert set(called) == {"step_kernel" if threads > 1 else "step_kernel_serial"}
        states[threads] = state
        monkeypatch.undo()
    for field in ("pos", "quat", "vel", "omega", "rest_length", "motor_omega"):
        assert torch.equal(getattr(states[1], field), getattr(states[2], field)), field


def test_per_environment_end_times_return_the_state_at_each(engine, rest_state, default_configs) -> None:
    """A (B,) ``max_time_s`` ends each environment at its own time: its returned state is the one a
    run of that length alone ends in, and its trace up to then is that run's."""
    params1, rest = rest_state
    robot = default_configs.robot
    ends_s = [0.3, 0.62, 1.0]
    targets = torch.tensor([[0.2, 1, 1, 0.2, 1, 1], [1.0] * 6], dtype=torch.float64)
    with torch.no_grad():
        final, trace = run_policy(
            engine,
            params1.expand(3),
            rest.index(torch.zeros(3, dtype=torch.long)),
            targets,
            robot.pid,
            segment_timeout_s=3.0,
            max_time_s=torch.tensor(ends_s, dtype=torch.float64),
        )
        for i, end_s in enumerate(ends_s):
            alone, single = run_policy(engine, params1, rest, targets, robot.pid, 3.0, max_time_s=end_s)
            torch.testing.assert_close(final.pos[i], alone.pos[0], rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(final.motor_omega[i], alone.motor_omega[0], rtol=1e-9, atol=1e-12)
            n = single.caps_m.shape[1]
            torch.testing.assert_close(trace.caps_m[i, :n], single.caps_m[0], rtol=1e-9, atol=1e-12)
    assert trace.t_s[-1] == pytest.approx(1.0)
    assert not torch.allclose(final.pos[0], final.pos[2])


def test_parameters_out_of_bounds_are_errors(default_configs) -> None:
    robot = default_configs.robot
    with pytest.raises(ParameterBoundsError, match=r"'friction' = -0.1 in environment 0 .* \[0.0, 2.0\]"):
        Params.from_robot(robot, friction=-0.1)
    params = Params.from_robot(robot, batch=3)
    bad = params.replace(restitution=torch.tensor([0.1, 1.5, 0.2], dtype=torch.float64))
    with pytest.raises(ParameterBoundsError, match="'restitution' = 1.5 in environment 1"):
        bad.validate()
    with pytest.raises(ParameterBoundsError, match="unknown engine parameters"):
        Params.from_robot(robot, stiffness=3.0)


def test_float32_rollouts_stay_within_the_measured_drift_of_float64(default_configs) -> None:
    """A published gait (one rolling cycle and rest, 5 ms steps as the stages take) run in float32
    (eager) ends with its end caps within 1 cm of the float64 run (the compiled kernel): they ended
    4.2 mm apart, the PID reaching some targets a tick earlier or later in float32. ``benchmarks.engine
    --drift`` measured float32 against float64 under random commands: median 0.0003-0.06 mm over
    1-5 s, the worst of 64 robots 0.26 mm after 1 s and 12-29 mm after 2-5 s where one of the two
    tips over and the other does not. Over these 5.1 s a float32 run without the passive cables'
    damping ended 11 mm away, one with friction 0.7 instead of 0.8 48 mm."""
    robot = default_configs.robot
    targets = gait_policy(robot, "rolling", 1).targets
    caps = {}
    for dtype in (torch.float64, torch.float32):
        engine = Engine(RobotModel.from_robot(robot, dtype=dtype), dt=0.005, compiled=True)
        params = Params.from_robot(robot, dtype=dtype)
        start = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
        with torch.no_grad():
            end, _ = run_policy(
                engine, params, start, torch.tensor(targets, dtype=dtype), robot.pid, segment_timeout_s=3.0
            )
        assert end.pos.dtype == dtype
        caps[dtype] = engine.cap_positions(end).double()
        moved_m = float((caps[dtype] - engine.cap_positions(start).double()).norm(dim=-1).max())
    assert moved_m > 0.05  # the gait rolled the robot
    gap_m = float((caps[torch.float32] - caps[torch.float64]).norm(dim=-1).max())
    assert gap_m < 1e-2, gap_m


def test_rods_roll_on_their_spheres_without_slipping(engine, default_configs) -> None:
    """Three rods lying side by side along y, on their end-cap and motor spheres (radius r), cables
    slack. Rolling without slipping (v = omega r) keeps rolling: friction acts at the touching
    lowest point of each sphere, which does not move. A rod thrown sliding without spin ends up
    rolling at v0 / (1 + I_axial / (m r^2)) (angular momentum about the ground line is kept)."""
    robot = default_configs.robot
    model = engine.model
    radius = robot.end_cap.radius_m
    assert robot.motor.radius_m == radius  # the rod lies level on all four spheres
    half = robot.rod.length_m / 2
    caps = np.zeros((6, 3))
    for rod, (a, b) in enumerate(robot.topology.rods):
        caps[a] = [0.06 * rod, -half, radius]
        caps[b] = [0.06 * rod, half, radius]
    params = Params.from_robot(robot, batch=2, passive_rest_length=0.5)
    state = state_from_caps(engine, params, caps)
    v0 = 0.5
    vel = torch.zeros(2, 3, 3, dtype=torch.float64)
    vel[..., 0] = v0
    omega = torch.zeros(2, 3, 3, dtype=torch.float64)
    omega[0, :, 1] = v0 / radius  # environment 0 rolls; environment 1 slides without spin
    state = state.replace(vel=vel, omega=omega, rest_length=torch.full((2, 6), 0.4, dtype=torch.float64))
    zero = torch.zeros(2, 6, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(round(0.4 / engine.dt)):
            state = engine.step(params, state, zero)
    lengths = engine.cable_lengths(state)
    assert float(lengths[:, :6].max()) < 0.4 and float(lengths[:, 6:].max()) < 0.5  # every cable slack
    rolling = v0 / (1 + float(model.inertia[2]) / (float(model.mass[0]) * radius**2))
    np.testing.assert_allclose(state.vel[0, :, 0].numpy(), v0, rtol=0.02)
    np.testing.assert_allclose(state.vel[1, :, 0].numpy(), rolling, rtol=0.03)
    np.testing.assert_allclose(state.omega[1, :, 1].numpy() * radius, rolling, rtol=0.03)
    np.testing.assert_allclose(state.pos[..., 2].numpy(), radius, atol=1e-3)  # still lying level


def test_engine_with_twin_parameters_tracks_the_twin(default_configs) -> None:
    """One rolling cycle and a random policy, as one engine batch of two, against the twin run
    with three noise seeds (7-9). The models differ in contact (MuJoCo's soft contact with
    torsional/rolling friction and a little bounce vs impulses), sensing (the twin's PID sees
    biased, noisy lengths), per-motor speed spread and the settled rest pose; measured, the final
    centroid gap is 0.06-0.08 m for one full rolling cycle (0.70-0.74 m travelled) and
    0.003-0.05 m for the random policy: this is the sim-to-sim gap that sysid starts from.
    Tolerance: that measured gap and half again (0.12 m, 0.075 m) and the same final bottom face,
    against at least two of the three twin runs: the twin does not repeat itself (with seed 7
    its rolling cycle stops one roll short, 0.46 m)."""
    robot = default_configs.robot
    policies = {"rolling": gait_policy(robot, "rolling", 1), "random": random_policy(robot, 10, seed=3)}
    seeds = (7, 8, 9)
    twin_ends, travelled = {}, {}
    for seed in seeds:
        truth = default_configs.twin.model_copy(update={"seed": seed})
        for name, policy in policies.items():
            twin = MujocoTwin(robot, truth)  # its own instance: the twin's noise does not depend on test order
            start = twin.ground_truth(0.0, 0).caps_m  # every fresh twin starts at the same rest pose
            packets = twin.execute(policy, 8.0, record_frames=False)
            caps = [p.caps_m for p in packets if isinstance(p, GroundTruthPacket)]
            twin_ends[seed, name] = caps[-1]
            travelled[seed, name] = np.linalg.norm(caps[-1].mean(0)[:2] - caps[0].mean(0)[:2])
    truth = default_configs.twin
    engine = Engine(twin_true_model(robot, truth), dt=0.001)
    params = twin_true_params(robot, truth, batch=2)
    state = settle(engine, params, state_from_caps(engine, params, start), robot.pid, ONES, duration_s=2.0)
    n = max(len(p.targets) for p in policies.values())  # the shorter policy holds its last target
    padded = [np.vstack([p.targets, np.repeat(p.targets[-1:], n - len(p.targets), 0)]) for p in policies.values()]
    with torch.no_grad():
        final, trace = run_policy(
            engine, params, state, torch.tensor(np.stack(padded)), robot.pid, 8.0, latency_s=truth.control_latency_s
        )
    sim_ends = engine.cap_positions(final).numpy()
    for env, name in enumerate(policies):
        matched = []
        for seed in seeds:
            error = np.linalg.norm(sim_ends[env].mean(0)[:2] - twin_ends[seed, name].mean(0)[:2])
            tolerance = {"rolling": 0.12, "random": 0.075}[name]
            same_face = bottom_face(sim_ends[env]) == bottom_face(twin_ends[seed, name])
            matched.append(bool(error <= tolerance and same_face))
        assert sum(matched) >= 2, f"{name}: the engine's end matches the twin runs of seeds {seeds}: {matched}"
    rolled = np.linalg.norm(sim_ends[0].mean(0)[:2] - trace.caps_m[0, 0].numpy().mean(0)[:2])
    assert max(travelled[seed, "rolling"] for seed in seeds) > 0.5 and rolled > 0.5


def test_trace_caps_at_requested_times(engine, rest_state, default_configs) -> None:
    params, rest = rest_state
    robot = default_configs.robot
    targets = torch.tensor([[0.5] * 6, [1.0] * 6], dtype=torch.float64)
    with torch.no_grad():
        _, trace = run_policy(engine, params, rest, targets, robot.pid, segment_timeout_s=2.0, final_hold_s=0.1)
    tick = 1.0 / robot.pid.control_rate_hz
    assert torch.allclose(trace.t_s[1:] - trace.t_s[:-1], torch.tensor(tick, dtype=torch.float64))
    picked = trace.caps_at(torch.tensor([0.0, 5 * tick, 1e9], dtype=torch.float64))
    torch.testing.assert_close(picked[:, 0], trace.caps_m[:, 0])
    torch.testing.assert_close(picked[:, 1], trace.caps_m[:, 5])
    torch.testing.assert_close(picked[:, 2], trace.caps_m[:, -1])
    assert bool(trace.finished[0, -1]) and trace.segment[0, -1] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_matches_cpu(default_configs) -> None:
    robot = default_configs.robot
    caps = resting_on_face(robot, reference_prism(robot))
    finals = []
    for device in ("cpu", "cuda"):
        engine = Engine(RobotModel.from_robot(robot, device=device), dt=0.002)
        params = Params.from_robot(robot, batch=4, device=device)
        state = state_from_caps(engine, params, caps)
        control = torch.full((4, 6), 0.5, dtype=torch.float64, device=device)
        with torch.no_grad():
            for _ in range(100):
                state = engine.step(params, state, control)
        finals.append(engine.cap_positions(state).cpu())
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-9, atol=1e-10)
