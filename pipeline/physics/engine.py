"""Differentiable, batched tensegrity engine (docs/design.md).

State per environment and rod: position, unit quaternion, linear and angular
velocity (world frame), plus the six actuated cables' rest lengths and motor
speeds. :meth:`Engine.step` advances all environments by one time step:

1. motors: omega = s * omega_max * u, trapezoidal rest-length update (hybrid-GNN paper App. C);
2. tension-only cables with damping between attachment points on the end-cap
   surfaces; passive tendons linear + cubic; gravity;
3. semi-implicit Euler for velocities (Euler's equations in the body frame);
4. contact between rods (each three capsules: its bar, and at each end its end cap
   with its motor): speculative, inelastic, frictionless impulses, detached
   (:mod:`~pipeline.physics.rod_contact`);
5. ground contact on the end-cap and motor spheres, at each sphere's lowest point
   (so a rod rolls on them without slipping): impulses with restitution and
   Coulomb friction, detached per the R2S2R paper (every rod is actuated), shared
   between a rod's simultaneous contacts (Jacobi);
6. positions and orientations, then a detached position correction that puts
   penetrating points where the time of impact says they should be.

Shapes: B environments, 3 rods, 6 caps, 9 cables. Units SI.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numba
import numpy
import torch

from pipeline.control import REST_LENGTH_LIMITS_M, motor_speed_rad_s, rest_length_change_m
from pipeline.physics.adjoint import adjoint_kernel, adjoint_kernel_serial
from pipeline.physics.contact import friction_impulse, normal_impulse, time_of_impact
from pipeline.physics.kernel import PARAMETER_COLUMNS, caps_and_lengths, step_kernel, step_kernel_serial
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from pipeline.physics.rod_contact import (
    ROD_CONTACT_MARGIN_M,
    ROD_CONTACT_SWEEPS,
    approach_impulse,
    closest_points,
    rod_shapes,
    unit,
)
from pipeline.physics.rotations import quat_integrate, quat_to_matrix


@dataclass(frozen=True)
class State:
    """Engine state. ``pos`` (B, 3, 3) m, ``quat`` (B, 3, 4) (w, x, y, z), ``vel`` (B, 3, 3) m/s,
    ``omega`` (B, 3, 3) rad/s (world), ``rest_length`` (B, 6) m, ``motor_omega`` (B, 6) rad/s."""

    pos: torch.Tensor
    quat: torch.Tensor
    vel: torch.Tensor
    omega: torch.Tensor
    rest_length: torch.Tensor
    motor_omega: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.pos.shape[0])

    def replace(self, **values: torch.Tensor) -> State:
        return replace(self, **values)

    def detach(self) -> State:
        return State(**{f.name: getattr(self, f.name).detach() for f in fields(self)})

    def flat(self) -> torch.Tensor:
        """Every field side by side (B, 51), each in its own unit."""
        return torch.cat([getattr(self, f.name).flatten(1) for f in fields(self)], 1)

    def index(self, envs: torch.Tensor | slice) -> State:
        """The sub-batch ``envs``."""
        return State(**{f.name: getattr(self, f.name)[envs] for f in fields(self)})

    def repeat(self, n: int) -> State:
        """Each environment repeated ``n`` times, consecutively (batch * n environments)."""
        return State(**{f.name: getattr(self, f.name).repeat_interleave(n, dim=0) for f in fields(self)})

    @staticmethod
    def concat(states: list[State]) -> State:
        """The environments of ``states`` as one batch, in order."""
        return State(**{f.name: torch.cat([getattr(s, f.name) for s in states]) for f in fields(State)})


@dataclass(frozen=True)
class FreeMotion:
    """A step's motion before contact (:meth:`Engine.free_motion`): the new ``rest_length`` and
    ``motor_omega`` (B, 6); the rods' ``rotations`` (B, 3, 3, 3) and body-point lever ``arms``
    (B, 3, K, 3) m at the step's start; the velocities ``vel``, ``omega`` (B, 3, 3) after cable
    forces and gravity; the cables' ``tension`` (B, 9) N."""

    rest_length: torch.Tensor
    motor_omega: torch.Tensor
    rotations: torch.Tensor
    arms: torch.Tensor
    vel: torch.Tensor
    omega: torch.Tensor
    tension: torch.Tensor


def _symmetric_inverse(k: torch.Tensor) -> torch.Tensor:
    """Inverses of symmetric invertible 3x3 matrices ``k`` (..., 3, 3), from their cofactors
    (elementwise: no batched LU for matrices this small)."""
    a, b, c, d, e, f = k[..., 0, 0], k[..., 0, 1], k[..., 0, 2], k[..., 1, 1], k[..., 1, 2], k[..., 2, 2]
    ca, cb, cc = d * f - e * e, c * e - b * f, b * e - c * d
    cd, ce, cf = a * f - c * c, b * c - a * e, a * d - b * b
    det = a * ca + b * cb + c * cc
    return torch.stack([ca, cb, cc, cb, cd, ce, cc, ce, cf], -1).reshape(k.shape) / det[..., None, None]


def cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product on the last axis, broadcasting (faster than linalg.cross for many small vectors)."""
    a0, a1, a2 = a.unbind(-1)
    b0, b1, b2 = b.unbind(-1)
    return torch.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dim=-1)


class _CompiledSteps(torch.autograd.Function):
    """:meth:`Engine.steps` compiled, with gradients: the kernel forward
    (:func:`~pipeline.physics.kernel.step_kernel`), its adjoint backward
    (:func:`~pipeline.physics.adjoint.adjoint_kernel`: the eager step's gradient)."""

    @staticmethod
    def forward(ctx, engine: Engine, n: int, columns: torch.Tensor, control: torch.Tensor, *state: torch.Tensor):
        arrays = tuple(tensor.detach().contiguous().numpy() for tensor in (columns, control, *state))
        out = tuple(torch.from_numpy(a) for a in engine._run_kernel(arrays[2:], arrays[1], arrays[0], n))
        ctx.engine, ctx.n = engine, n
        ctx.save_for_backward(columns, control, *state, *out)
        return out

    @staticmethod
    def backward(ctx, *grad_out: torch.Tensor | None):
        columns, control, *saved = (tensor.detach().contiguous().numpy() for tensor in ctx.saved_tensors)
        start, end = tuple(saved[:6]), tuple(saved[6:])
        adjoints = tuple(
            numpy.zeros_like(array) if grad is None else grad.detach().to(torch.float64).contiguous().numpy()
            for grad, array in zip(grad_out, end, strict=True)
        )
        grad_columns, grad_control, grad_in = ctx.engine._run_adjoint(start, end, control, columns, ctx.n, adjoints)
        grads = (torch.from_numpy(grad_columns), torch.from_numpy(grad_control), *map(torch.from_numpy, grad_in))
        return None, None, *grads


PARALLEL_BATCH = 64
"""Batches of at least this many environments step on several threads (the compiled kernel): below,
one thread is as fast, and does not wait for a thread another process has taken the core from."""


class Engine:
    """Steps a batch of robots; ``dt`` is the physics time step (s).

    ``bounce_speed`` (m/s): approach speeds below it get no restitution, so
    resting contacts do not jitter. ``contact_iterations``: projected-Jacobi sweeps
    that refine the contact impulses of a rod touching at several points; they
    change the impulses' values only (the gradient is that of the first pass).
    ``compiled``: steps on CPU float64 tensors run the compiled kernel
    (:func:`~pipeline.physics.kernel.step_kernel`), with gradients its adjoint in the backward pass
    (:func:`~pipeline.physics.adjoint.adjoint_kernel`, the eager step's gradient); other steps run
    eagerly.
    """

    def __init__(
        self,
        model: RobotModel,
        dt: float = 0.001,
        gravity_m_s2: float = 9.81,
        bounce_speed: float = 0.05,
        contact_iterations: int = 2,
        compiled: bool = False,
    ) -> None:
        self.model = model
        self.compiled = compiled
        self.dt = dt
        self.bounce_speed = bounce_speed
        self.contact_iterations = contact_iterations
        robot = model.robot
        self.omega_max = robot.motor.omega_max_rad_s
        self.winch_radius = robot.motor.winch_radius_m
        self._gravity_force = torch.zeros(3, 3, dtype=model.dtype, device=model.device)
        self._gravity_force[:, 2] = -model.mass * gravity_m_s2
        self._contact_local = model.local_points.reshape(-1, 3)[model.contact_index]
        self._contact_rod = model.contact_index // model.local_points.shape[1]
        self._cable_ends = torch.cat([model.cable_a, model.cable_b])
        self._n_points = model.local_points.shape[0] * model.local_points.shape[1]
        self._shapes = rod_shapes(model.robot, model.dtype, model.device)
        self._kernel_model = self._kernel_constants(gravity_m_s2)
        self._cap_point = model.cap_index.to("cpu", torch.int64).numpy()
        self._columns: tuple | None = None

    def _kernel_constants(self, gravity_m_s2: float) -> tuple:
        """The model as :func:`~pipeline.physics.kernel.step_kernel` takes it (float64 NumPy arrays;
        flat point indices as int64): body points, masses, inertia, cables, ground-contact spheres,
        capsule pairs and the scalars."""
        m, shapes = self.model, self._shapes

        def array(tensor: torch.Tensor, dtype=torch.float64):
            return tensor.detach().to("cpu", dtype).contiguous().numpy()

        pair_z = torch.stack(
            [
                shapes.z0_m[shapes.first_shape],
                shapes.z1_m[shapes.first_shape],
                shapes.z0_m[shapes.second_shape],
                shapes.z1_m[shapes.second_shape],
            ],
            1,
        )
        scalars = torch.tensor(
            [
                self.dt,
                gravity_m_s2,
                self.omega_max,
                self.winch_radius,
                self.bounce_speed,
                *REST_LENGTH_LIMITS_M,
                ROD_CONTACT_MARGIN_M,
                float(shapes.z0_m.min()),
                float(shapes.z1_m.max()),
            ],
            dtype=torch.float64,
        )
        return (
            array(m.local_points),
            array(m.mass),
            array(m.inertia),
            array(m.cable_a, torch.int64),
            array(m.cable_b, torch.int64),
            array(m.contact_index, torch.int64),
            array(m.contact_radius),
            array(torch.stack([shapes.first, shapes.second], 1), torch.int64),
            array(pair_z),
            array(shapes.reach_m),
            array(scalars),
        )

    # ----------------------------------------------------------------- geometry
    def _points(self, state: State, rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All body-fixed points: world positions and lever arms, each (B, 3, K, 3)."""
        local = self.model.local_points[None, :, :, None, :]
        columns = rotations[:, :, None]
        arms = columns[..., 0] * local[..., 0] + columns[..., 1] * local[..., 1] + columns[..., 2] * local[..., 2]
        return state.pos[:, :, None] + arms, arms

    def _flat_points(self, state: State) -> torch.Tensor:
        """Every body point's world position (B, 3 * K, 3) in metres, in flat-index order."""
        points, _ = self._points(state, quat_to_matrix(state.quat))
        return points.reshape(state.batch_size, -1, 3)

    def cap_positions(self, state: State) -> torch.Tensor:
        """End-cap centres (B, 6, 3) in metres."""
        if self._kernel_applies(state):
            return self.caps_and_cable_lengths(state)[0]
        return self._flat_points(state)[:, self.model.cap_index]

    def cable_lengths(self, state: State) -> torch.Tensor:
        """Distances (B, 9) between each cable's attachment points (m)."""
        return self._lengths(self._flat_points(state))

    def caps_and_cable_lengths(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`cap_positions` and :meth:`cable_lengths` of ``state`` from one placement of its points
        (what a rollout records every control tick); compiled (:func:`~pipeline.physics.kernel.caps_and_lengths`)
        where the steps are."""
        if self._kernel_applies(state):
            batch = state.batch_size
            caps = numpy.empty((batch, len(self.model.cap_index), 3))
            lengths = numpy.empty((batch, len(self.model.cable_a)))
            local, _, _, cable_a, cable_b, *_ = self._kernel_model
            pos, quat = (tensor.detach().contiguous().numpy() for tensor in (state.pos, state.quat))
            caps_and_lengths(pos, quat, local, self._cap_point, cable_a, cable_b, caps, lengths)
            return torch.from_numpy(caps), torch.from_numpy(lengths)
        flat = self._flat_points(state)
        return flat[:, self.model.cap_index], self._lengths(flat)

    def _lengths(self, flat: torch.Tensor) -> torch.Tensor:
        """Cable lengths (B, 9) in metres of points ``flat`` (:meth:`_flat_points`)."""
        return (flat[:, self.model.cable_b] - flat[:, self.model.cable_a]).norm(dim=-1)

    def _to_world(self, rotations: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
        """R v for rotations (..., 3, 3) and vectors (..., 3), written out (small reductions are slow)."""
        b = body[..., None, :]
        return rotations[..., 0] * b[..., 0] + rotations[..., 1] * b[..., 1] + rotations[..., 2] * b[..., 2]

    def _to_body(self, rotations: torch.Tensor, world: torch.Tensor) -> torch.Tensor:
        """R^T v, written out."""
        w = world[..., None, :]
        return rotations[..., 0, :] * w[..., 0] + rotations[..., 1, :] * w[..., 1] + rotations[..., 2, :] * w[..., 2]

    def _rod_sums(
        self, arms: torch.Tensor, point_vectors: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Total force and torque (each (B, 3, 3)) of vectors (B, N, 3) applied at flat points ``index``."""
        batch = arms.shape[0]
        rods = index // arms.shape[2]
        lever = arms.reshape(batch, -1, 3)[:, index]
        zero = torch.zeros(batch, arms.shape[1], 3, dtype=arms.dtype, device=arms.device)
        return zero.index_add(1, rods, point_vectors), zero.index_add(1, rods, cross(lever, point_vectors))

    # ----------------------------------------------------------------- dynamics
    def cable_tensions(
        self, params: Params, points: torch.Tensor, velocities: torch.Tensor, rest_length: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensions (B, 9) in N and unit directions (B, 9, 3) from end a to end b."""
        m = self.model
        delta = points[:, m.cable_b] - points[:, m.cable_a]
        length = delta.norm(dim=-1)
        direction = delta / length[..., None]
        speed = ((velocities[:, m.cable_b] - velocities[:, m.cable_a]) * direction).sum(-1)
        stretch = torch.cat([length[:, :6] - rest_length, length[:, 6:] - params.passive_rest_length[:, None]], -1)
        actuated = params.actuated_stiffness[:, None] * stretch[:, :6] + params.actuated_damping[:, None] * speed[:, :6]
        passive = (
            stretch[:, 6:]
            * (params.passive_stiffness[:, None] + params.passive_cubic_stiffness[:, None] * stretch[:, 6:] ** 2)
            + params.passive_damping[:, None] * speed[:, 6:]
        )
        tension = torch.cat([actuated, passive], -1).clamp(min=0.0) * (stretch > 0)
        return tension, direction

    def step(self, params: Params, state: State, control: torch.Tensor) -> State:
        """Advance every environment by ``dt`` with motor commands ``control`` (B, 6) in [-1, 1]."""
        return self.steps(params, state, control, 1)

    def steps(self, params: Params, state: State, control: torch.Tensor, n: int) -> State:
        """Advance every environment by ``n`` steps of ``dt``, each with motor commands ``control``
        (B, 6) in [-1, 1] (a control tick's physics steps, in one call of the compiled kernel)."""
        if self._kernel_applies(state):
            return self._kernel_steps(params, state, control, n)
        if self._runs_compiled(state):
            return self._differentiable_kernel_steps(params, state, control, n)
        for _ in range(n):
            state = self.advance(params, state, control)
        return state

    def _runs_compiled(self, state: State) -> bool:
        """Whether ``state``'s steps run compiled, with or without gradients: ``compiled``, CPU float64."""
        return self.compiled and state.pos.device.type == "cpu" and state.pos.dtype == torch.float64

    def _kernel_applies(self, state: State) -> bool:
        """Whether ``state``'s steps and geometry run compiled without gradients (:meth:`_runs_compiled`,
        grad mode off)."""
        return self._runs_compiled(state) and not torch.is_grad_enabled()

    def _kernel_steps(self, params: Params, state: State, control: torch.Tensor, n: int) -> State:
        """:meth:`steps` by :func:`~pipeline.physics.kernel.step_kernel` (no gradients; CPU, float64)."""
        batch = state.batch_size
        inputs = tuple(getattr(state, f.name).detach().contiguous().numpy() for f in fields(State))
        columns = self._parameter_columns(params, batch)
        out = self._run_kernel(inputs, control.detach().expand(batch, -1).contiguous().numpy(), columns, n)
        return State(*(torch.from_numpy(array) for array in out))

    def _differentiable_kernel_steps(self, params: Params, state: State, control: torch.Tensor, n: int) -> State:
        """:meth:`steps` by the compiled kernel with gradients (CPU, float64): the kernel forward, its
        adjoint (:func:`~pipeline.physics.adjoint.adjoint_kernel`) backward."""
        batch = state.batch_size
        columns = torch.stack([getattr(params, name).expand(batch) for name in PARAMETER_COLUMNS], 1)
        tensors = (getattr(state, f.name) for f in fields(State))
        return State(*_CompiledSteps.apply(self, n, columns, control.expand(batch, -1), *tensors))

    def _threads(self, batch: int) -> int:
        """How many threads the compiled kernels take for ``batch`` environments: as many as torch uses
        (``torch.set_num_threads``) from :data:`PARALLEL_BATCH` environments up, else one (the calling
        thread)."""
        threads = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS) if batch >= PARALLEL_BATCH else 1
        numba.set_num_threads(threads)
        return threads

    def _run_kernel(
        self, inputs: tuple, control: numpy.ndarray, columns: numpy.ndarray, n: int
    ) -> tuple[numpy.ndarray, ...]:
        """``n`` steps of :func:`~pipeline.physics.kernel.step_kernel` from the state arrays ``inputs``
        under ``control`` (B, 6) and parameter columns ``columns`` (B, 10); returns the end state's arrays."""
        out = tuple(numpy.empty_like(array) for array in inputs)
        spare = tuple(numpy.empty_like(array) for array in inputs) if n > 1 else out
        kernel = step_kernel if self._threads(len(control)) > 1 else step_kernel_serial
        kernel(inputs, control, columns, self._kernel_model, self.contact_iterations, ROD_CONTACT_SWEEPS, n, spare, out)
        return out

    def _run_adjoint(
        self,
        start: tuple,
        end: tuple,
        control: numpy.ndarray,
        columns: numpy.ndarray,
        n: int,
        grad_out: tuple,
    ) -> tuple[numpy.ndarray, numpy.ndarray, tuple]:
        """The gradient of :meth:`_run_kernel` from state arrays ``start`` to ``end`` given the adjoints
        ``grad_out`` of ``end`` (:func:`~pipeline.physics.adjoint.adjoint_kernel`): the parameter
        columns' (B, 10), the control's (B, 6) and the start state's adjoints."""
        batch = len(control)
        tape = tuple(numpy.empty((n + 1, *array.shape)) for array in start)
        for lane, first, last in zip(tape, start, end, strict=True):
            lane[0], lane[n] = first, last
        grad_in = tuple(numpy.empty_like(array) for array in start)
        grad_control, grad_columns = numpy.empty((batch, control.shape[1])), numpy.empty((batch, columns.shape[1]))
        kernel = adjoint_kernel if self._threads(batch) > 1 else adjoint_kernel_serial
        kernel(
            tape, control, columns, self._kernel_model, self.contact_iterations, ROD_CONTACT_SWEEPS, n,
            grad_out, grad_in, grad_control, grad_columns,
        )  # fmt: skip
        return grad_columns, grad_control, grad_in

    def _parameter_columns(self, params: Params, batch: int) -> numpy.ndarray:
        """``params`` as the kernel's (B, 10) array (:data:`~pipeline.physics.kernel.PARAMETER_COLUMNS`),
        kept while the same parameters, unchanged, come back (a rollout passes them every step)."""
        tensors = [getattr(params, name) for name in PARAMETER_COLUMNS]
        key = (batch, *((id(t), t._version) for t in tensors))
        cached = self._columns  # read once: engines are shared between threads
        if cached is None or cached[0] != key:
            cached = (key, torch.stack([t.detach().expand(batch) for t in tensors], 1).numpy(), tensors)
            self._columns = cached
        return cached[1]

    def advance(self, params: Params, state: State, control: torch.Tensor) -> State:
        """:meth:`step` in eager mode (what :func:`~pipeline.physics.kernel.step_kernel` computes)."""
        free = self.free_motion(params, state, control)
        vel, omega, bounce_height = self._ground_contact(params, state, free.vel, free.omega, free.rotations, free.arms)
        return self.finish(state, free, vel, omega, bounce_height)

    def free_motion(self, params: Params, state: State, control: torch.Tensor) -> FreeMotion:
        """Steps 1-3 of :meth:`step`: motors, cable forces and gravity, integrated into the
        velocities the rods would have without contact."""
        m = self.model
        dt = self.dt
        batch = state.batch_size
        rest, omega_motor = self.motors(params, state.rest_length, state.motor_omega, control)

        rotations = quat_to_matrix(state.quat)
        points, arms = self._points(state, rotations)
        point_vel = state.vel[:, :, None] + cross(state.omega[:, :, None], arms)
        flat_points = points.reshape(batch, -1, 3)
        flat_vel = point_vel.reshape(batch, -1, 3)
        tension, direction = self.cable_tensions(params, flat_points, flat_vel, rest)
        pull = tension[..., None] * direction
        force, torque = self._rod_sums(arms, torch.cat([pull, -pull], dim=1), self._cable_ends)
        force = force + self._gravity_force

        vel = state.vel + force / m.mass[:, None] * dt
        w_body = self._to_body(rotations, state.omega)
        t_body = self._to_body(rotations, torque)
        w_body = w_body + dt * (t_body - cross(w_body, w_body * m.inertia)) / m.inertia
        omega = self._to_world(rotations, w_body)
        return FreeMotion(
            rest_length=rest,
            motor_omega=omega_motor,
            rotations=rotations,
            arms=arms,
            vel=vel,
            omega=omega,
            tension=tension,
        )

    def motors(
        self, params: Params, rest_length: torch.Tensor, motor_omega: torch.Tensor, control: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 1 of :meth:`step`: the actuated cables' rest lengths and the motors' speeds (each
        (B, 6), m and rad/s) one step after ``rest_length``, ``motor_omega`` under ``control``."""
        omega_cmd = motor_speed_rad_s(params.motor_speed[:, None], self.omega_max, control)
        lag = torch.exp(-self.dt / params.motor_time_constant.clamp(min=1e-6))[:, None]
        omega = omega_cmd + (motor_omega - omega_cmd) * lag
        rest = rest_length - rest_length_change_m(motor_omega, omega, self.winch_radius, self.dt)
        return rest.clamp(*REST_LENGTH_LIMITS_M), omega

    def finish(
        self,
        state: State,
        free: FreeMotion,
        vel: torch.Tensor,
        omega: torch.Tensor,
        bounce_height: torch.Tensor | None,
    ) -> State:
        """Steps 4 and 6 of :meth:`step`: contact between rods on the velocities ``vel``, ``omega``
        (B, 3, 3) that ground contact left, then positions and orientations; with ``bounce_height``
        (per ground contact, from :meth:`_ground_contact`) the ground's position correction."""
        rotations = free.rotations
        on_i, on_j = self._shape_closest_points(state.pos.detach(), rotations.detach())
        vel, omega, near = self._rod_contact(state, vel, omega, rotations, on_i, on_j)

        pos = state.pos + vel * self.dt
        quat = quat_integrate(state.quat, omega, self.dt)
        new_rotations = quat_to_matrix(quat)
        if bounce_height is not None:
            pos = pos + self._penetration_correction(pos, new_rotations, bounce_height).detach()
        pos = pos + self._rod_separation(pos.detach(), new_rotations.detach(), near)
        return State(
            pos=pos, quat=quat, vel=vel, omega=omega, rest_length=free.rest_length, motor_omega=free.motor_omega
        )

    def _rod_contact(
        self,
        state: State,
        vel: torch.Tensor,
        omega: torch.Tensor,
        rotations: torch.Tensor,
        on_i: torch.Tensor,
        on_j: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Impulses between the rods' collision capsules (:func:`~pipeline.physics.rod_contact.rod_shapes`)
        on the free-motion velocities ``vel``, ``omega`` (B, 3, 3), given every pair's closest points
        ``on_i``, ``on_j`` (B, P, 3) at the step's start (:meth:`_shape_closest_points`): for the pairs
        within :data:`~pipeline.physics.rod_contact.ROD_CONTACT_MARGIN_M` of touching, the least
        impulse along their normal that keeps the capsules from closing more than their gap within
        the step (all at once, :data:`~pipeline.physics.rod_contact.ROD_CONTACT_SWEEPS` times while
        one still closes too fast). Detached: a contact changes the velocities' values, not their
        gradient. Returns the velocities and which pairs were near (B, P).

        It works on the few near pairs (about a tenth) only: over every pair, the sweeps and
        separations took 75 % of an eager step at 1024 environments."""
        m = self.model
        shapes = self._shapes
        rot, pos = rotations.detach(), state.pos.detach()
        gap = (on_i - on_j).norm(dim=-1) - shapes.reach_m
        near = gap < ROD_CONTACT_MARGIN_M
        env, pair = near.nonzero(as_tuple=True)
        if not len(env):
            return vel, omega, near
        on_i, on_j, gap = on_i[env, pair], on_j[env, pair], gap[env, pair]
        first, second = shapes.first[pair], shapes.second[pair]
        rows_i, rows_j = 3 * env + first, 3 * env + second  # rows of the (B * 3) rods
        rows = torch.cat([rows_i, rows_j])
        flat_rot = rot.reshape(-1, 3, 3)
        normal = unit(on_i - on_j)  # (N, 3), from the pair's second rod to its first
        arm_i, arm_j = on_i - pos[env, first], on_j - pos[env, second]
        arms = torch.cat([arm_i, arm_j])
        inverse_inertia = 1.0 / m.inertia
        lever_i = self._to_body(flat_rot[rows_i], cross(arm_i, normal))
        lever_j = self._to_body(flat_rot[rows_j], cross(arm_j, normal))
        w = 1.0 / m.mass[first] + 1.0 / m.mass[second]
        w = w + (lever_i**2 * inverse_inertia).sum(-1) + (lever_j**2 * inverse_inertia).sum(-1)
        flat_vel, flat_omega = vel.detach().reshape(-1, 3), omega.detach().reshape(-1, 3)
        mass = m.mass.repeat(state.batch_size)[:, None]
        d_vel, d_omega = torch.zeros_like(flat_vel), torch.zeros_like(flat_omega)
        for _ in range(ROD_CONTACT_SWEEPS):
            v, o = flat_vel + d_vel, flat_omega + d_omega
            v_n = ((v[rows_i] + cross(o[rows_i], arm_i) - v[rows_j] - cross(o[rows_j], arm_j)) * normal).sum(-1)
            active = gap + v_n * self.dt < 0
            if not bool(active.any()):
                break
            impulse = torch.where(active, approach_impulse(gap, v_n, w, self.dt), 0.0)[:, None] * normal
            on_rods = torch.cat([impulse, -impulse])  # (2N, 3): on each pair's first rods, then second
            zero = torch.zeros_like(flat_vel)
            d_vel = d_vel + zero.index_add(0, rows, on_rods) / mass
            d_angular = zero.index_add(0, rows, cross(arms, on_rods))
            d_omega = d_omega + self._to_world(flat_rot, self._to_body(flat_rot, d_angular) * inverse_inertia)
        return vel + d_vel.view_as(vel), omega + d_omega.view_as(omega), near

    def _rod_separation(self, pos: torch.Tensor, rotations: torch.Tensor, near: torch.Tensor) -> torch.Tensor:
        """Translations (B, 3, 3) that move overlapping capsules apart along their normal, half each
        (the speculative impulses leave an overlap where a step turns the rods far); of the pairs
        ``near`` (B, P) at the step's start (no other can overlap after it), all at once, again while
        an overlap is left, at most :data:`~pipeline.physics.rod_contact.ROD_CONTACT_SWEEPS` times.
        Of the near pairs only, as :meth:`_rod_contact`."""
        shapes = self._shapes
        env, pair = near.nonzero(as_tuple=True)
        rows = torch.cat([3 * env + shapes.first[pair], 3 * env + shapes.second[pair]])
        shift = torch.zeros_like(pos).reshape(-1, 3)
        for _ in range(ROD_CONTACT_SWEEPS if len(env) else 0):
            on_i, on_j = self._pair_points(pos + shift.view_as(pos), rotations, env, pair)
            overlap = (shapes.reach_m[pair] - (on_i - on_j).norm(dim=-1)).clamp(min=0.0)
            if not bool((overlap > 0).any()):
                break
            apart = 0.5 * overlap[:, None] * unit(on_i - on_j)
            shift = shift.index_add(0, rows, torch.cat([apart, -apart]))
        return shift.view_as(pos)

    def _shape_closest_points(self, pos: torch.Tensor, rotations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The closest points (each (B, P, 3)) of each pair of collision capsules, on its first rod's
        capsule axis and on its second's."""
        every_env = torch.arange(pos.shape[0], device=pos.device)[:, None]
        every_pair = torch.arange(len(self._shapes.first), device=pos.device)[None]
        return self._pair_points(pos, rotations, every_env, every_pair)

    def _pair_points(
        self, pos: torch.Tensor, rotations: torch.Tensor, env: torch.Tensor, pair: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The closest points of the capsule pairs ``pair`` in environments ``env`` (index tensors
        of one shape, or broadcasting to one, S), on the pair's first rod's capsule axis and on its
        second's: each (*S, 3)."""
        shapes = self._shapes
        ends = []
        for rod, shape in (
            (shapes.first[pair], shapes.first_shape[pair]),
            (shapes.second[pair], shapes.second_shape[pair]),
        ):
            axis = rotations[env, rod, :, 2]
            ends += [pos[env, rod] + shapes.z0_m[shape, None] * axis, (shapes.z1_m - shapes.z0_m)[shape, None] * axis]
        return closest_points(*ends)

    def _ground_contact(
        self,
        params: Params,
        state: State,
        vel: torch.Tensor,
        omega: torch.Tensor,
        rotations: torch.Tensor,
        arms: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Contact impulses on the free-motion velocities ``vel``, ``omega`` (B, 3, 3).

        Returns the new velocities and, per contact, the height above ground that
        the time of impact puts the point at after the step (0 unless bouncing).
        """
        m = self.model
        dt = self.dt
        batch = state.batch_size
        flat_arms = arms.reshape(batch, -1, 3)
        arm = flat_arms[:, m.contact_index]
        rods = self._contact_rod
        radius = m.contact_radius[:, None]
        lever = torch.cat([arm[..., :2], arm[..., 2:] - radius], -1)  # rod centre to the touching lowest point
        v_point = vel[:, rods] + cross(omega[:, rods], lever)
        gap = state.pos[:, rods, 2] + arm[..., 2] - m.contact_radius
        v_n = v_point[..., 2]
        active = gap + v_n * dt < 0
        inv_mass = 1.0 / m.mass[rods]
        inv_inertia = 1.0 / m.inertia
        rot = rotations[:, rods].detach()
        normal_body = rot[..., 2, :]  # R^T z: the world z axis in each rod's frame
        local = self._contact_local - radius * normal_body  # the touching point in the rod's frame
        lever_n = cross(self._contact_local, normal_body)  # the radius along the normal adds no lever
        w_n = inv_mass + (lever_n * lever_n * inv_inertia).sum(-1)
        share = 1.0 / torch.matmul(active.to(arm.dtype), m.contact_incidence).clamp(min=1.0)[:, rods]
        e = params.restitution[:, None].expand_as(gap)
        j_n = normal_impulse(v_n, w_n, e, active, detach=True, bounce_speed=self.bounce_speed)
        v_t = torch.stack([v_point[..., 0], v_point[..., 1], torch.zeros_like(v_n)], dim=-1)
        t_world = v_t.detach() / (v_t.detach().norm(dim=-1, keepdim=True) + 1e-12)
        lever_t = cross(local.detach(), self._to_body(rot, t_world))
        w_t = inv_mass + (lever_t * lever_t * inv_inertia).sum(-1)
        mu = params.friction[:, None].expand_as(gap)
        friction = friction_impulse(v_t, w_t, mu, j_n, detach=True)
        impulse = friction + torch.stack([torch.zeros_like(j_n), torch.zeros_like(j_n), j_n], dim=-1)
        impulse = impulse * (share * active)[..., None]
        bouncing = active & (v_n < -self.bounce_speed)
        target_v_n = torch.where(bouncing, -params.restitution[:, None] * v_n, 0.0).detach()
        lever_fixed, rot_fixed = lever.detach(), rotations.detach()
        zero = torch.zeros(batch, 3, 3, dtype=arm.dtype, device=arm.device)

        def apply(contact_impulse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            d_momentum = zero.index_add(1, rods, contact_impulse)
            d_angular = zero.index_add(1, rods, cross(lever_fixed, contact_impulse))
            d_omega = self._to_world(rot_fixed, self._to_body(rot_fixed, d_angular) / m.inertia)
            return vel + d_momentum / m.mass[:, None], omega + d_omega

        if self.contact_iterations:
            with torch.no_grad():
                target = torch.stack([torch.zeros_like(target_v_n), torch.zeros_like(target_v_n), target_v_n], -1)
                relax = share[..., None]
                inverse_k = self._contact_inverse_mass_body(local)
                accumulated = impulse.detach().clone()
                for _ in range(self.contact_iterations):
                    v_new, w_new = apply(accumulated)
                    residual = target - (v_new[:, rods] + cross(w_new[:, rods], lever_fixed))
                    correction = self._to_world(rot, self._to_world(inverse_k, self._to_body(rot, residual)))
                    accumulated = accumulated + relax * correction
                    normal = accumulated[..., 2].clamp(min=0.0)
                    tangential = accumulated[..., :2]
                    limit = params.friction[:, None] * normal
                    scale = (limit / tangential.norm(dim=-1).clamp(min=1e-15)).clamp(max=1.0)
                    accumulated = torch.cat([tangential * scale[..., None], normal[..., None]], -1) * active[..., None]
            impulse = impulse + (accumulated - impulse.detach())
        vel, omega = apply(impulse)
        toi = time_of_impact(gap.detach(), v_n.detach(), dt)
        bounce_height = torch.where(bouncing, -params.restitution[:, None] * v_n.detach() * (1 - toi) * dt, 0.0)
        return vel, omega, bounce_height

    def _contact_inverse_mass_body(self, local: torch.Tensor) -> torch.Tensor:
        """Inverse of each contact's effective inverse-mass matrix in its rod's frame (B, P, 3, 3),
        K = I/m - [l]x diag(1/I) [l]x, for touching points ``local`` (B, P, 3) in the rods' frames.
        In the world, K_world^-1 = R K^-1 R^T."""
        m = self.model
        zero = torch.zeros_like(local[..., 0])
        x, y, z = local.unbind(-1)
        skew = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(*local.shape[:-1], 3, 3)
        eye = torch.eye(3, dtype=local.dtype, device=local.device)
        k = eye / m.mass[self._contact_rod][:, None, None] - skew @ torch.diag(1.0 / m.inertia) @ skew
        return _symmetric_inverse(k)

    def _penetration_correction(
        self, pos: torch.Tensor, rotations: torch.Tensor, target_height: torch.Tensor
    ) -> torch.Tensor:
        """Upward translation (B, 3, 3) of each rod that lifts its lowest contact point to its
        time-of-impact height (0 for resting contacts)."""
        m = self.model
        arm = self._to_world(rotations.index_select(1, self._contact_rod), self._contact_local)
        height = pos[..., 2].index_select(1, self._contact_rod) + arm[..., 2] - m.contact_radius
        deficit = (target_height - height).clamp(min=0.0)
        lift = (deficit[..., None] * m.contact_incidence).amax(dim=1)
        return torch.stack([torch.zeros_like(lift), torch.zeros_like(lift), lift], dim=-1)
