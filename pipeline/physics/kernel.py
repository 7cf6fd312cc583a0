"""The engine's step as one compiled loop over environments (numba).

:meth:`Engine.step <pipeline.physics.engine.Engine.step>` with ``compiled`` runs :func:`step_kernel`
on CPU float64 tensors (with gradients, its adjoint in the backward pass:
:mod:`~pipeline.physics.adjoint`): the same physics as :meth:`Engine.advance` (motors,
cables, gravity, ground contact with its projected-Jacobi refinement, contact between the rods'
capsules, integration, the ground's and the rods' position corrections), written per environment
in scalars and a few work arrays per thread (:func:`_work`), the environments split over the CPU's
threads. A pair of capsules whose gap is beyond the rod-contact margin at the step's start adds
nothing (the eager step's selection of near pairs, as masks); a lower bound of the gap from the
rods' distance and the capsules' bounding spheres (:func:`_gap_bound`) spares most such pairs their
closest points. Its results equal the eager step's to rounding (``tests/test_engine.py``); it runs
several times faster than a ``torch.compile`` of the eager step, whose graphs write every
intermediate of every environment to memory (``docs/performance.md``). Compiled once per machine
(numba's cache beside this module), for every batch size.

Every function but the two kernels and :func:`_work` compiles without numba's runtime
(``_nrt=False``): they allocate nothing, and without the runtime a view of an array (``rot[r]``)
carries no reference count, whose atomic increments and decrements took half of a step's time.
They may fuse a multiply and an add (``fastmath={"contract"}``, 4 % faster; one rounding instead of
two): no other fast-math licence, so sums keep their order and NaN and infinity their meaning.
The parts of a step that its gradient computes again (:func:`_free_motion`, :func:`_ground_impulses`,
:func:`_cable`; :mod:`~pipeline.physics.adjoint`) are inlined where they are called
(``inline="always"``): called as functions they cost a tenth of a step.

Shapes as in :mod:`~pipeline.physics.engine`: B environments, 3 rods, 10 body points per rod, 12
ground contacts (4 per rod), 9 cables (6 actuated), P capsule pairs. Units SI.
"""

from __future__ import annotations

import math

import numba
import numpy as np

PARAMETER_COLUMNS = (
    "motor_speed",
    "motor_time_constant",
    "friction",
    "restitution",
    "actuated_stiffness",
    "actuated_damping",
    "passive_stiffness",
    "passive_cubic_stiffness",
    "passive_damping",
    "passive_rest_length",
)
"""The columns of the kernel's parameter array, in order (:class:`~pipeline.physics.params.Params`)."""

_EPS = 1e-12

# OpenMP is safe where the stages step engines from several threads at once; "threadsafe" would try
# TBB first, and warn on the older TBB that Open3D loads into the process
numba.config.THREADING_LAYER = "omp"


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _cross(ax: float, ay: float, az: float, bx: float, by: float, bz: float) -> tuple[float, float, float]:
    return ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _to_world(r: np.ndarray, x: float, y: float, z: float) -> tuple[float, float, float]:
    """R v for a rotation ``r`` (3, 3)."""
    return (
        r[0, 0] * x + r[0, 1] * y + r[0, 2] * z,
        r[1, 0] * x + r[1, 1] * y + r[1, 2] * z,
        r[2, 0] * x + r[2, 1] * y + r[2, 2] * z,
    )


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _to_body(r: np.ndarray, x: float, y: float, z: float) -> tuple[float, float, float]:
    """R^T v."""
    return (
        r[0, 0] * x + r[1, 0] * y + r[2, 0] * z,
        r[0, 1] * x + r[1, 1] * y + r[2, 1] * z,
        r[0, 2] * x + r[1, 2] * y + r[2, 2] * z,
    )


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _rotation(q: np.ndarray, r: np.ndarray) -> None:
    """The rotation matrix of unit quaternion ``q`` (w, x, y, z) into ``r`` (3, 3)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    r[0, 0] = 1 - 2 * (y * y + z * z)
    r[0, 1] = 2 * (x * y - w * z)
    r[0, 2] = 2 * (x * z + w * y)
    r[1, 0] = 2 * (x * y + w * z)
    r[1, 1] = 1 - 2 * (x * x + z * z)
    r[1, 2] = 2 * (y * z - w * x)
    r[2, 0] = 2 * (x * z - w * y)
    r[2, 1] = 2 * (y * z + w * x)
    r[2, 2] = 1 - 2 * (x * x + y * y)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _closest(
    pos: np.ndarray, rot: np.ndarray, rod_i: int, rod_j: int, z0_i: float, z1_i: float, z0_j: float, z1_j: float
) -> tuple[float, float, float, float, float, float]:
    """The closest points of two capsule axes (rod ``rod_i`` from ``z0_i`` to ``z1_i`` along its
    body z, and ``rod_j``'s), :func:`~pipeline.physics.rod_contact.closest_points`."""
    ai = rot[rod_i, 0, 2], rot[rod_i, 1, 2], rot[rod_i, 2, 2]
    aj = rot[rod_j, 0, 2], rot[rod_j, 1, 2], rot[rod_j, 2, 2]
    a0, a1, a2 = pos[rod_i, 0] + z0_i * ai[0], pos[rod_i, 1] + z0_i * ai[1], pos[rod_i, 2] + z0_i * ai[2]
    b0, b1, b2 = pos[rod_j, 0] + z0_j * aj[0], pos[rod_j, 1] + z0_j * aj[1], pos[rod_j, 2] + z0_j * aj[2]
    li, lj = z1_i - z0_i, z1_j - z0_j
    u0, u1, u2 = li * ai[0], li * ai[1], li * ai[2]
    v0, v1, v2 = lj * aj[0], lj * aj[1], lj * aj[2]
    r0, r1, r2 = a0 - b0, a1 - b1, a2 - b2
    uu = u0 * u0 + u1 * u1 + u2 * u2
    vv = v0 * v0 + v1 * v1 + v2 * v2
    uv = u0 * v0 + u1 * v1 + u2 * v2
    ur = u0 * r0 + u1 * r1 + u2 * r2
    vr = v0 * r0 + v1 * r1 + v2 * r2
    denominator = uu * vv - uv * uv
    s = -ur / uu if denominator <= 1e-12 * uu * vv else (uv * vr - ur * vv) / denominator
    s = min(max(s, 0.0), 1.0)
    t = (uv * s + vr) / vv
    if t < 0:
        s = min(max(-ur / uu, 0.0), 1.0)
    elif t > 1:
        s = min(max((uv - ur) / uu, 0.0), 1.0)
    t = min(max(t, 0.0), 1.0)
    return a0 + s * u0, a1 + s * u1, a2 + s * u2, b0 + t * v0, b1 + t * v1, b2 + t * v2


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _rod_distances(pos: np.ndarray, rot: np.ndarray, z0: float, z1: float, distance: np.ndarray) -> None:
    """Per pair of rods, the distance (m) of the segments from ``z0`` to ``z1`` along their body z
    that hold all their capsules' axes, into ``distance`` (3, 3): no pair of their capsules is
    nearer than it, less the capsules' radii."""
    for ri in range(3):
        for rj in range(ri + 1, 3):
            o = _closest(pos, rot, ri, rj, z0, z1, z0, z1)
            dx, dy, dz = o[0] - o[3], o[1] - o[4], o[2] - o[5]
            distance[ri, rj] = distance[rj, ri] = math.sqrt(dx * dx + dy * dy + dz * dz)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _gap_bound(
    pos: np.ndarray, rot: np.ndarray, ri: int, rj: int, z: np.ndarray, reach: float, rod_distance: float
) -> float:
    """A lower bound (m) of the gap of a pair of capsules (of rods ``ri`` and ``rj``, axes' ends
    ``z`` (4,) along their body z, radii's sum ``reach``): the larger of their rods' distance
    (:func:`_rod_distances`) and their bounding spheres' distance, less ``reach``. A pair whose
    bound is beyond the contact margin skips its closest points, the most costly part of a step
    where rods are apart; its gap is beyond the margin all the same."""
    mid_i, mid_j = 0.5 * (z[0] + z[1]), 0.5 * (z[2] + z[3])
    dx = pos[ri, 0] + mid_i * rot[ri, 0, 2] - pos[rj, 0] - mid_j * rot[rj, 0, 2]
    dy = pos[ri, 1] + mid_i * rot[ri, 1, 2] - pos[rj, 1] - mid_j * rot[rj, 1, 2]
    dz = pos[ri, 2] + mid_i * rot[ri, 2, 2] - pos[rj, 2] - mid_j * rot[rj, 2, 2]
    spheres = math.sqrt(dx * dx + dy * dy + dz * dz) - 0.5 * (z[1] - z[0]) - 0.5 * (z[3] - z[2])
    return max(spheres, rod_distance) - reach


_CHUNKS = 64
"""The parallel kernel's environments in this many runs of consecutive ones, each with its work
arrays, shared out among the threads."""

_FORCE, _TORQUE, _V1, _W1, _V2, _W2, _MOMENTUM, _ANGULAR, _D_VEL, _D_ANG, _SHIFT, _MOVED, _STEP = range(13)
"""Slots of the work tuple's per-rod vectors (13, 3, 3) (:func:`_work`)."""


@numba.njit(cache=True)
def _work(model: tuple) -> tuple:
    """One thread's work arrays, reused by each environment it steps (an allocation per array per
    environment would cost as much as the physics): rotations at the step's start and end (2, 3, 3,
    3); per-rod vectors (13, 3, 3) in the ``_FORCE``... slots; each rod's lift and active ground
    contacts (2, 3); the body points' lever arms and velocities (2, 3, K, 3); per ground contact its
    lever, body point, impulse and slip direction (4, 12, 3), its inverse contact mass (12, 6), its
    target speed, share, bounce height, normal speed, gap, first normal impulse and inverse mass
    along the normal (7, 12) and whether it is active (12,) (:func:`_ground_impulses`); per capsule
    pair its closest points and their lever arms (2, P, 6), normal (P, 3), gap and inverse mass
    (2, P); per pair of rods their distance (3, 3). ``model`` as :func:`step_kernel` takes it."""
    n_points, n_contacts, n_pairs = model[0].shape[1], model[5].shape[0], model[7].shape[0]
    return (
        np.empty((2, 3, 3, 3)),
        np.empty((13, 3, 3)),
        np.empty((2, 3)),
        np.empty((2, 3, n_points, 3)),
        np.empty((4, n_contacts, 3)),
        np.empty((n_contacts, 6)),
        np.empty((7, n_contacts)),
        np.empty(n_contacts, dtype=np.bool_),
        np.empty((2, n_pairs, 6)),
        np.empty((n_pairs, 3)),
        np.empty((2, n_pairs)),
        np.empty((3, 3)),
    )


@numba.njit(parallel=True, cache=True)
def step_kernel(
    state: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    spare: tuple,
    out: tuple,
) -> None:
    """``steps`` steps of every environment under the same ``control``, the last written into
    ``out``.

    ``state``: ``pos`` (B, 3, 3) m, ``quat`` (B, 3, 4), ``vel``, ``omega`` (B, 3, 3),
    ``rest_length``, ``motor_omega`` (B, 6); ``spare`` and ``out`` the same arrays (``spare`` holds
    the steps between the first and the last; unused for one step). ``control`` (B, 6);
    ``params`` (B, 10) in :data:`PARAMETER_COLUMNS` order. ``model``: ``local`` (3, 10, 3) body
    points; ``mass`` (3,), ``inertia`` (3,); ``cable_a``/``cable_b`` (9,) flat point indices;
    ``contact_point`` (12,) flat point index of each ground-contact sphere and ``contact_radius``
    (12,); per capsule pair ``pair_rods`` (P, 2), ``pair_z`` (P, 4) both capsules' axis ends (body
    z) and ``pair_reach`` (P,) their radii's sum; ``scalars``: dt, gravity, omega_max, winch
    radius, bounce speed, the rest-length limits (low, high), the rod-contact margin, and the
    body-z span (low, high) of the rods' capsules. Each environment takes its steps one after the
    other, in the caches of the thread that runs it.
    """
    batch = state[0].shape[0]
    chunks = min(batch, _CHUNKS)
    for chunk in numba.prange(chunks):
        work = _work(model)
        for b in range(chunk * batch // chunks, (chunk + 1) * batch // chunks):
            _steps_env(b, state, control, params, model, contact_iterations, sweeps, steps, work, spare, out)


@numba.njit(cache=True)
def step_kernel_serial(
    state: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    spare: tuple,
    out: tuple,
) -> None:
    """:func:`step_kernel` on the calling thread alone: for one thread, where the parallel loop's
    team would still wait at its barrier for threads other processes hold the cores of."""
    work = _work(model)
    for b in range(state[0].shape[0]):
        _steps_env(b, state, control, params, model, contact_iterations, sweeps, steps, work, spare, out)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _steps_env(
    b: int,
    state: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    work: tuple,
    spare: tuple,
    out: tuple,
) -> None:
    """``steps`` steps of environment ``b`` (:func:`step_kernel`), between ``spare`` and ``out`` so
    that the last lands in ``out``."""
    for k in range(steps):
        last_to_out = (steps - k) % 2 == 1
        if k == 0:
            target = out if last_to_out else spare
            _step_env(b, state, control, params, model, contact_iterations, sweeps, work, target)
        elif last_to_out:
            _step_env(b, spare, control, params, model, contact_iterations, sweeps, work, out)
        else:
            _step_env(b, out, control, params, model, contact_iterations, sweeps, work, spare)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _step_env(
    b: int,
    state: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    work: tuple,
    out: tuple,
) -> None:
    """One step of environment ``b`` (:func:`step_kernel`) in the thread's ``work`` arrays
    (:func:`_work`)."""
    pos, quat, _, _, _, _ = state
    out_pos, out_quat, out_vel, out_omega, _, _ = out
    local, mass, inertia, _, _, contact_point, contact_radius, pair_rods, pair_z, pair_reach, scalars = model
    dt, bounce, margin = scalars[0], scalars[4], scalars[7]
    n_points = local.shape[1]
    n_contacts = contact_point.shape[0]
    n_pairs = pair_rods.shape[0]
    inv_i0, inv_i1, inv_i2 = 1.0 / inertia[0], 1.0 / inertia[1], 1.0 / inertia[2]
    frames, vectors, per_rod, points, _, _, _, _, pair_points, _, pair_scalars, rod_distance = work
    rot, new_rot, arms = frames[0], frames[1], points[0]
    p = params[b]
    _free_motion(b, state, control, params, model, work, out)
    _ground(
        b, pos, rot, arms, p, local, mass, inertia, contact_point, contact_radius, dt, bounce, contact_iterations,
        work,
    )  # fmt: skip
    v2, w2, bounce_height = vectors[_V2], vectors[_W2], work[6][2]
    # contact between rods, on the velocities ground contact left
    on, gap = pair_points[0], pair_scalars[0]
    _rod_distances(pos[b], rot, scalars[8], scalars[9], rod_distance)
    for q in range(n_pairs):
        ri, rj = pair_rods[q, 0], pair_rods[q, 1]
        bound = _gap_bound(pos[b], rot, ri, rj, pair_z[q], pair_reach[q], rod_distance[ri, rj])
        if bound >= margin:
            gap[q] = bound
            continue
        o = _closest(pos[b], rot, ri, rj, pair_z[q, 0], pair_z[q, 1], pair_z[q, 2], pair_z[q, 3])
        for j in range(6):
            on[q, j] = o[j]
        dx, dy, dz = on[q, 0] - on[q, 3], on[q, 1] - on[q, 4], on[q, 2] - on[q, 5]
        gap[q] = math.sqrt(dx * dx + dy * dy + dz * dz) - pair_reach[q]
    _rod_contact(b, pos, rot, v2, w2, pair_rods, mass, inv_i0, inv_i1, inv_i2, dt, margin, sweeps, work)
    # positions, orientations, position corrections
    for r in range(3):
        for j in range(3):
            out_pos[b, r, j] = pos[b, r, j] + v2[r, j] * dt
            out_vel[b, r, j] = v2[r, j]
            out_omega[b, r, j] = w2[r, j]
        nw, nx, ny, nz, norm = _quat_step(quat[b, r], w2[r, 0], w2[r, 1], w2[r, 2], 0.5 * dt)
        out_quat[b, r, 0], out_quat[b, r, 1] = nw / norm, nx / norm
        out_quat[b, r, 2], out_quat[b, r, 3] = ny / norm, nz / norm
        _rotation(out_quat[b, r], new_rot[r])
    lift = per_rod[0]
    lift[:] = 0.0
    for c in range(n_contacts):
        r, k = contact_point[c] // n_points, contact_point[c] % n_points
        _, _, az = _to_world(new_rot[r], local[r, k, 0], local[r, k, 1], local[r, k, 2])
        height = out_pos[b, r, 2] + az - contact_radius[c]
        lift[r] = max(lift[r], bounce_height[c] - height)
    for r in range(3):
        out_pos[b, r, 2] += lift[r]
    _rod_separation(b, out_pos, new_rot, gap, pair_rods, pair_z, pair_reach, margin, sweeps, vectors)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"}, inline="always")
def _quat_step(q: np.ndarray, ox: float, oy: float, oz: float, half: float) -> tuple[float, float, float, float, float]:
    """The quaternion ``q`` (w, x, y, z) moved by angular velocity (``ox``, ``oy``, ``oz``) over a
    step of ``2 half`` s before its normalisation, ``n = q + half (0, w) q``, and the norm of ``n``
    (the step's orientation is ``n / |n|``)."""
    qw, qx, qy, qz = q[0], q[1], q[2], q[3]
    nw = qw + half * (-ox * qx - oy * qy - oz * qz)
    nx = qx + half * (ox * qw + oy * qz - oz * qy)
    ny = qy + half * (oy * qw + oz * qx - ox * qz)
    nz = qz + half * (oz * qw + ox * qy - oy * qx)
    return nw, nx, ny, nz, math.sqrt(nw * nw + nx * nx + ny * ny + nz * nz)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"}, inline="always")
def _free_motion(
    b: int, state: tuple, control: np.ndarray, params: np.ndarray, model: tuple, work: tuple, out: tuple
) -> None:
    """Motors, cables, gravity and Euler's equations of environment ``b``'s step (:func:`step_kernel`):
    the new rest lengths and motor speeds into ``out``; into ``work`` (:func:`_work`) the rods'
    rotations at the step's start, the body points' lever arms and velocities, the cables' and
    gravity's force and torque per rod, and the free-motion velocities (``_V1``, ``_W1`` slots)."""
    pos, quat, vel, omega, rest_length, motor_omega = state
    out_rest, out_motor = out[4], out[5]
    local, mass, inertia, cable_a, cable_b = model[0], model[1], model[2], model[3], model[4]
    scalars = model[10]
    dt, gravity, omega_max, winch = scalars[0], scalars[1], scalars[2], scalars[3]
    rest_low, rest_high = scalars[5], scalars[6]
    n_points = local.shape[1]
    frames, vectors, points = work[0], work[1], work[3]
    rot, arms, pvel = frames[0], points[0], points[1]
    force, torque, v1, w1 = vectors[_FORCE], vectors[_TORQUE], vectors[_V1], vectors[_W1]
    force[:] = 0.0
    torque[:] = 0.0
    p = params[b]
    # motors: rest lengths and motor speeds
    lag = math.exp(-dt / max(p[1], 1e-6))
    for c in range(6):
        cmd = p[0] * omega_max * control[b, c]
        w = cmd + (motor_omega[b, c] - cmd) * lag
        rest = rest_length[b, c] - 0.5 * (w + motor_omega[b, c]) * winch * dt
        out_rest[b, c] = min(max(rest, rest_low), rest_high)
        out_motor[b, c] = w
    # body points
    for r in range(3):
        _rotation(quat[b, r], rot[r])
        for k in range(n_points):
            x, y, z = _to_world(rot[r], local[r, k, 0], local[r, k, 1], local[r, k, 2])
            arms[r, k, 0], arms[r, k, 1], arms[r, k, 2] = x, y, z
            cx, cy, cz = _cross(omega[b, r, 0], omega[b, r, 1], omega[b, r, 2], x, y, z)
            pvel[r, k, 0], pvel[r, k, 1], pvel[r, k, 2] = vel[b, r, 0] + cx, vel[b, r, 1] + cy, vel[b, r, 2] + cz
    # cables
    for c in range(cable_a.shape[0]):
        d0, d1, d2, _, _, stretch, tension = _cable(b, c, pos, arms, pvel, out_rest, p, cable_a, cable_b, n_points)
        if stretch <= 0 or tension < 0:
            continue
        ra, ka = cable_a[c] // n_points, cable_a[c] % n_points
        rb, kb = cable_b[c] // n_points, cable_b[c] % n_points
        f0, f1, f2 = tension * d0, tension * d1, tension * d2
        force[ra, 0] += f0
        force[ra, 1] += f1
        force[ra, 2] += f2
        t0, t1, t2 = _cross(arms[ra, ka, 0], arms[ra, ka, 1], arms[ra, ka, 2], f0, f1, f2)
        torque[ra, 0] += t0
        torque[ra, 1] += t1
        torque[ra, 2] += t2
        force[rb, 0] -= f0
        force[rb, 1] -= f1
        force[rb, 2] -= f2
        t0, t1, t2 = _cross(arms[rb, kb, 0], arms[rb, kb, 1], arms[rb, kb, 2], -f0, -f1, -f2)
        torque[rb, 0] += t0
        torque[rb, 1] += t1
        torque[rb, 2] += t2
    # free motion: gravity, Euler's equations
    for r in range(3):
        force[r, 2] += -mass[r] * gravity
        for j in range(3):
            v1[r, j] = vel[b, r, j] + force[r, j] / mass[r] * dt
        wx, wy, wz = _to_body(rot[r], omega[b, r, 0], omega[b, r, 1], omega[b, r, 2])
        tx, ty, tz = _to_body(rot[r], torque[r, 0], torque[r, 1], torque[r, 2])
        gx, gy, gz = _cross(wx, wy, wz, wx * inertia[0], wy * inertia[1], wz * inertia[2])
        wx = wx + dt * (tx - gx) / inertia[0]
        wy = wy + dt * (ty - gy) / inertia[1]
        wz = wz + dt * (tz - gz) / inertia[2]
        w1[r, 0], w1[r, 1], w1[r, 2] = _to_world(rot[r], wx, wy, wz)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"}, inline="always")
def _cable(
    b: int,
    c: int,
    pos: np.ndarray,
    arms: np.ndarray,
    pvel: np.ndarray,
    rest: np.ndarray,
    p: np.ndarray,
    cable_a: np.ndarray,
    cable_b: np.ndarray,
    n_points: int,
) -> tuple[float, float, float, float, float, float, float]:
    """Cable ``c`` of environment ``b``: its unit direction from end a to end b, length (m),
    lengthening speed (m/s), stretch beyond its rest length (m; the actuated cables' rest lengths
    ``rest`` (B, 6)) and the tension (N) its stretch and speed ask for (the cable pulls only where
    both the stretch and that tension are positive). ``arms``, ``pvel`` (3, K, 3): the body
    points' lever arms and velocities; ``p`` (10,) the environment's parameters."""
    ra, ka = cable_a[c] // n_points, cable_a[c] % n_points
    rb, kb = cable_b[c] // n_points, cable_b[c] % n_points
    d0 = pos[b, rb, 0] + arms[rb, kb, 0] - pos[b, ra, 0] - arms[ra, ka, 0]
    d1 = pos[b, rb, 1] + arms[rb, kb, 1] - pos[b, ra, 1] - arms[ra, ka, 1]
    d2 = pos[b, rb, 2] + arms[rb, kb, 2] - pos[b, ra, 2] - arms[ra, ka, 2]
    length = math.sqrt(d0 * d0 + d1 * d1 + d2 * d2)
    d0, d1, d2 = d0 / length, d1 / length, d2 / length
    speed = (
        (pvel[rb, kb, 0] - pvel[ra, ka, 0]) * d0
        + (pvel[rb, kb, 1] - pvel[ra, ka, 1]) * d1
        + (pvel[rb, kb, 2] - pvel[ra, ka, 2]) * d2
    )
    if c < 6:
        stretch = length - rest[b, c]
        tension = p[4] * stretch + p[5] * speed
    else:
        stretch = length - p[9]
        tension = stretch * (p[6] + p[7] * stretch * stretch) + p[8] * speed
    return d0, d1, d2, length, speed, stretch, tension


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _ground(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    arms: np.ndarray,
    p: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    dt: float,
    bounce: float,
    iterations: int,
    work: tuple,
) -> None:
    """Ground contact of environment ``b`` on the free-motion velocities in the ``_V1``, ``_W1``
    slots of ``work`` (:func:`_work`): :meth:`Engine._ground_contact
    <pipeline.physics.engine.Engine._ground_contact>`, the first impulses
    (:func:`_ground_impulses`) refined by ``iterations`` projected-Jacobi sweeps. Writes the new
    velocities into the ``_V2``, ``_W2`` slots and each contact's time-of-impact height into the
    contact scalars' row 2."""
    _ground_impulses(b, pos, rot, arms, p, local, mass, inertia, contact_point, contact_radius, dt, bounce, work)
    n_points = local.shape[1]
    n_contacts = contact_point.shape[0]
    friction = p[2]
    _, vectors, _, _, contact_vectors, k_inv, contact_scalars, active, _, _, _, _ = work
    v1, w1, v2, w2 = vectors[_V1], vectors[_W1], vectors[_V2], vectors[_W2]
    lever, impulse = contact_vectors[0], contact_vectors[2]
    target, share = contact_scalars[0], contact_scalars[1]
    momentum, angular = vectors[_MOMENTUM], vectors[_ANGULAR]
    for it in range(iterations + 1):
        _apply_ground(rot, v1, w1, impulse, lever, contact_point, n_points, mass, inertia, momentum, angular, v2, w2)
        if it == iterations:
            break
        for c in range(n_contacts):
            if not active[c]:
                continue
            r = contact_point[c] // n_points
            cx, cy, cz = _cross(w2[r, 0], w2[r, 1], w2[r, 2], lever[c, 0], lever[c, 1], lever[c, 2])
            x, y, z = _to_body(rot[r], -(v2[r, 0] + cx), -(v2[r, 1] + cy), target[c] - (v2[r, 2] + cz))
            m = k_inv[c]
            x, y, z = m[0] * x + m[1] * y + m[2] * z, m[1] * x + m[3] * y + m[4] * z, m[2] * x + m[4] * y + m[5] * z
            x, y, z = _to_world(rot[r], x, y, z)
            tx, ty = impulse[c, 0] + share[c] * x, impulse[c, 1] + share[c] * y
            normal = max(impulse[c, 2] + share[c] * z, 0.0)
            scale = min(friction * normal / max(math.sqrt(tx * tx + ty * ty), 1e-15), 1.0)
            impulse[c, 0], impulse[c, 1], impulse[c, 2] = tx * scale, ty * scale, normal


@numba.njit(cache=True, _nrt=False, fastmath={"contract"}, inline="always")
def _ground_impulses(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    arms: np.ndarray,
    p: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    dt: float,
    bounce: float,
    work: tuple,
) -> None:
    """The ground's first impulses of environment ``b`` on the free-motion velocities in ``work``
    (:func:`_work`), into its contact arrays: per contact its lever from the rod's centre to the
    touching point (world), touching point (rod frame) and impulse (N s); its target normal speed,
    share of its rod's contacts, bounce height, normal speed, gap, normal impulse and inverse mass
    along the normal (the contact scalars' rows); its slip direction (x, y, and 1 where it slips,
    the contact vectors' slot 3); whether it is active; its inverse contact mass. What the gradient
    of the step's impulses is taken from (:mod:`~pipeline.physics.adjoint`)."""
    n_points = local.shape[1]
    n_contacts = contact_point.shape[0]
    friction, restitution = p[2], p[3]
    _, vectors, per_rod, _, contact_vectors, k_inv, contact_scalars, active, _, _, _, _ = work
    v1, w1 = vectors[_V1], vectors[_W1]
    lever, body, impulse, slip = contact_vectors[0], contact_vectors[1], contact_vectors[2], contact_vectors[3]
    target, share, height, v_n, gap, normal_impulse, normal_weight = contact_scalars
    count = per_rod[1]
    impulse[:] = 0.0
    slip[:] = 0.0
    target[:] = 0.0
    height[:] = 0.0
    normal_impulse[:] = 0.0
    count[:] = 0.0
    for c in range(n_contacts):
        r, k = contact_point[c] // n_points, contact_point[c] % n_points
        radius = contact_radius[c]
        lever[c, 0], lever[c, 1], lever[c, 2] = arms[r, k, 0], arms[r, k, 1], arms[r, k, 2] - radius
        cx, cy, cz = _cross(w1[r, 0], w1[r, 1], w1[r, 2], lever[c, 0], lever[c, 1], lever[c, 2])
        gap[c] = pos[b, r, 2] + arms[r, k, 2] - radius
        v_n[c] = v1[r, 2] + cz
        active[c] = gap[c] + v_n[c] * dt < 0
        if active[c]:
            count[r] += 1.0
    for c in range(n_contacts):
        r, k = contact_point[c] // n_points, contact_point[c] % n_points
        share[c] = 1.0 / max(count[r], 1.0)
        if not active[c]:
            continue
        radius = contact_radius[c]
        nx, ny, nz = rot[r, 2, 0], rot[r, 2, 1], rot[r, 2, 2]  # world z in the rod's frame
        lx, ly, lz = local[r, k, 0], local[r, k, 1], local[r, k, 2]
        body[c, 0], body[c, 1], body[c, 2] = lx - radius * nx, ly - radius * ny, lz - radius * nz
        inv_mass = 1.0 / mass[r]
        a0, a1, a2 = _cross(lx, ly, lz, nx, ny, nz)
        w_n = inv_mass + (a0 * a0 / inertia[0] + a1 * a1 / inertia[1] + a2 * a2 / inertia[2])
        normal_weight[c] = w_n
        vn = v_n[c]
        j_n = 0.0
        if vn < 0:
            e = restitution if vn < -bounce else 0.0
            j_n = -(1 + e) * vn / w_n
        normal_impulse[c] = j_n
        cx, cy, _ = _cross(w1[r, 0], w1[r, 1], w1[r, 2], lever[c, 0], lever[c, 1], lever[c, 2])
        tx, ty = v1[r, 0] + cx, v1[r, 1] + cy
        t_norm = math.sqrt(tx * tx + ty * ty) + 1e-12
        bx, by, bz = _to_body(rot[r], tx / t_norm, ty / t_norm, 0.0)
        a0, a1, a2 = _cross(body[c, 0], body[c, 1], body[c, 2], bx, by, bz)
        w_t = inv_mass + (a0 * a0 / inertia[0] + a1 * a1 / inertia[1] + a2 * a2 / inertia[2])
        speed = math.sqrt(tx * tx + ty * ty + 1e-12)
        stick, slide = speed / w_t, friction * j_n
        magnitude = stick if stick < slide else slide
        if speed > 1e-9:
            slip[c, 0], slip[c, 1], slip[c, 2] = tx / speed, ty / speed, 1.0
            impulse[c, 0] = -magnitude * (tx / speed) * share[c]
            impulse[c, 1] = -magnitude * (ty / speed) * share[c]
        impulse[c, 2] = j_n * share[c]
        if vn < -bounce:
            target[c] = -restitution * vn
            reach = max(gap[c], 0.0) / max(-vn, 1e-12)
            toi = min(max(reach / dt, 0.0), 1.0)
            height[c] = -restitution * vn * (1 - toi) * dt
        # the inverse of K = I/m - [l]x diag(1/I) [l]x in the rod's frame (symmetric: 6 entries)
        x, y, z = body[c, 0], body[c, 1], body[c, 2]
        ka = inv_mass + (z * z / inertia[1] + y * y / inertia[2])
        kb = -(x * y / inertia[2])
        kc = -(x * z / inertia[1])
        kd = inv_mass + (z * z / inertia[0] + x * x / inertia[2])
        ke = -(y * z / inertia[0])
        kf = inv_mass + (y * y / inertia[0] + x * x / inertia[1])
        ca, cb, cc = kd * kf - ke * ke, kc * ke - kb * kf, kb * ke - kc * kd
        cd, ce, cf = ka * kf - kc * kc, kb * kc - ka * ke, ka * kd - kb * kb
        det = ka * ca + kb * cb + kc * cc
        k_inv[c, 0], k_inv[c, 1], k_inv[c, 2] = ca / det, cb / det, cc / det
        k_inv[c, 3], k_inv[c, 4], k_inv[c, 5] = cd / det, ce / det, cf / det


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _apply_ground(
    rot: np.ndarray,
    v1: np.ndarray,
    w1: np.ndarray,
    impulse: np.ndarray,
    lever: np.ndarray,
    contact_point: np.ndarray,
    n_points: int,
    mass: np.ndarray,
    inertia: np.ndarray,
    momentum: np.ndarray,
    angular: np.ndarray,
    v2: np.ndarray,
    w2: np.ndarray,
) -> None:
    """The velocities ``v2``, ``w2`` (3, 3): ``v1``, ``w1`` after ground impulses ``impulse`` (12, 3)
    at ``lever``, their sums per rod in ``momentum`` and ``angular`` (3, 3)."""
    momentum[:] = 0.0
    angular[:] = 0.0
    for c in range(contact_point.shape[0]):
        r = contact_point[c] // n_points
        jx, jy, jz = impulse[c, 0], impulse[c, 1], impulse[c, 2]
        momentum[r, 0] += jx
        momentum[r, 1] += jy
        momentum[r, 2] += jz
        ax, ay, az = _cross(lever[c, 0], lever[c, 1], lever[c, 2], jx, jy, jz)
        angular[r, 0] += ax
        angular[r, 1] += ay
        angular[r, 2] += az
    for r in range(3):
        x, y, z = _to_body(rot[r], angular[r, 0], angular[r, 1], angular[r, 2])
        x, y, z = _to_world(rot[r], x / inertia[0], y / inertia[1], z / inertia[2])
        v2[r, 0] = v1[r, 0] + momentum[r, 0] / mass[r]
        v2[r, 1] = v1[r, 1] + momentum[r, 1] / mass[r]
        v2[r, 2] = v1[r, 2] + momentum[r, 2] / mass[r]
        w2[r, 0], w2[r, 1], w2[r, 2] = w1[r, 0] + x, w1[r, 1] + y, w1[r, 2] + z


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _rod_contact(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    vel: np.ndarray,
    omega: np.ndarray,
    pair_rods: np.ndarray,
    mass: np.ndarray,
    inv_i0: float,
    inv_i1: float,
    inv_i2: float,
    dt: float,
    margin: float,
    sweeps: int,
    work: tuple,
) -> None:
    """Rod-contact impulses on ``vel``, ``omega`` (3, 3) in place, from the pairs' closest points
    and gaps at the step's start (``work``'s pair arrays, :func:`_work`): :meth:`Engine._rod_contact
    <pipeline.physics.engine.Engine._rod_contact>`, every pair within ``margin``, Jacobi sweeps."""
    n_pairs = pair_rods.shape[0]
    _, vectors, _, _, _, _, _, _, pair_points, normal, pair_scalars, _ = work
    on, arm, gap, weight = pair_points[0], pair_points[1], pair_scalars[0], pair_scalars[1]
    near = 0
    for q in range(n_pairs):
        if gap[q] >= margin:
            continue
        near += 1
        ri, rj = pair_rods[q, 0], pair_rods[q, 1]
        dx, dy, dz = on[q, 0] - on[q, 3], on[q, 1] - on[q, 4], on[q, 2] - on[q, 5]
        length = max(math.sqrt(dx * dx + dy * dy + dz * dz), _EPS)
        normal[q, 0], normal[q, 1], normal[q, 2] = dx / length, dy / length, dz / length
        for j in range(3):
            arm[q, j] = on[q, j] - pos[b, ri, j]
            arm[q, 3 + j] = on[q, 3 + j] - pos[b, rj, j]
        cx, cy, cz = _cross(arm[q, 0], arm[q, 1], arm[q, 2], normal[q, 0], normal[q, 1], normal[q, 2])
        li = _to_body(rot[ri], cx, cy, cz)
        cx, cy, cz = _cross(arm[q, 3], arm[q, 4], arm[q, 5], normal[q, 0], normal[q, 1], normal[q, 2])
        lj = _to_body(rot[rj], cx, cy, cz)
        weight[q] = (
            1.0 / mass[ri]
            + 1.0 / mass[rj]
            + (li[0] ** 2 * inv_i0 + li[1] ** 2 * inv_i1 + li[2] ** 2 * inv_i2)
            + (lj[0] ** 2 * inv_i0 + lj[1] ** 2 * inv_i1 + lj[2] ** 2 * inv_i2)
        )
    if near == 0:
        return
    d_vel, d_ang = vectors[_D_VEL], vectors[_D_ANG]
    for _ in range(sweeps):
        d_vel[:] = 0.0
        d_ang[:] = 0.0
        closing = False
        for q in range(n_pairs):
            if gap[q] >= margin:
                continue
            ri, rj = pair_rods[q, 0], pair_rods[q, 1]
            ci = _cross(omega[ri, 0], omega[ri, 1], omega[ri, 2], arm[q, 0], arm[q, 1], arm[q, 2])
            cj = _cross(omega[rj, 0], omega[rj, 1], omega[rj, 2], arm[q, 3], arm[q, 4], arm[q, 5])
            v_n = (
                (vel[ri, 0] + ci[0] - vel[rj, 0] - cj[0]) * normal[q, 0]
                + (vel[ri, 1] + ci[1] - vel[rj, 1] - cj[1]) * normal[q, 1]
                + (vel[ri, 2] + ci[2] - vel[rj, 2] - cj[2]) * normal[q, 2]
            )
            if not gap[q] + v_n * dt < 0:
                continue
            closing = True
            j = max((-max(gap[q], 0.0) / dt - v_n) / weight[q], 0.0)
            jx, jy, jz = j * normal[q, 0], j * normal[q, 1], j * normal[q, 2]
            d_vel[ri, 0] += jx
            d_vel[ri, 1] += jy
            d_vel[ri, 2] += jz
            d_vel[rj, 0] -= jx
            d_vel[rj, 1] -= jy
            d_vel[rj, 2] -= jz
            ax, ay, az = _cross(arm[q, 0], arm[q, 1], arm[q, 2], jx, jy, jz)
            d_ang[ri, 0] += ax
            d_ang[ri, 1] += ay
            d_ang[ri, 2] += az
            ax, ay, az = _cross(arm[q, 3], arm[q, 4], arm[q, 5], -jx, -jy, -jz)
            d_ang[rj, 0] += ax
            d_ang[rj, 1] += ay
            d_ang[rj, 2] += az
        if not closing:
            break
        for r in range(3):
            x, y, z = _to_body(rot[r], d_ang[r, 0], d_ang[r, 1], d_ang[r, 2])
            x, y, z = _to_world(rot[r], x * inv_i0, y * inv_i1, z * inv_i2)
            for k in range(3):
                vel[r, k] += d_vel[r, k] / mass[r]
            omega[r, 0] += x
            omega[r, 1] += y
            omega[r, 2] += z


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _rod_separation(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    gap: np.ndarray,
    pair_rods: np.ndarray,
    pair_z: np.ndarray,
    pair_reach: np.ndarray,
    margin: float,
    sweeps: int,
    vectors: np.ndarray,
) -> None:
    """Moves overlapping capsules of the pairs near at the step's start (``gap`` below ``margin``)
    apart along their normal, half each, in ``pos`` (B, 3, 3) in place, the rods turned by ``rot``
    (3, 3, 3): :meth:`Engine._rod_separation <pipeline.physics.engine.Engine._rod_separation>`;
    its sums in ``vectors``' slots (:func:`_work`)."""
    n_pairs = pair_rods.shape[0]
    shift, moved, step = vectors[_SHIFT], vectors[_MOVED], vectors[_STEP]
    shift[:] = 0.0
    for _ in range(sweeps):
        for r in range(3):
            for k in range(3):
                moved[r, k] = pos[b, r, k] + shift[r, k]
        step[:] = 0.0
        overlapping = False
        for q in range(n_pairs):
            if gap[q] >= margin:
                continue
            ri, rj = pair_rods[q, 0], pair_rods[q, 1]
            o = _closest(moved, rot, ri, rj, pair_z[q, 0], pair_z[q, 1], pair_z[q, 2], pair_z[q, 3])
            dx, dy, dz = o[0] - o[3], o[1] - o[4], o[2] - o[5]
            distance = math.sqrt(dx * dx + dy * dy + dz * dz)
            overlap = max(pair_reach[q] - distance, 0.0)
            if overlap <= 0:
                continue
            overlapping = True
            half = 0.5 * overlap / max(distance, _EPS)
            step[ri, 0] += half * dx
            step[ri, 1] += half * dy
            step[ri, 2] += half * dz
            step[rj, 0] -= half * dx
            step[rj, 1] -= half * dy
            step[rj, 2] -= half * dz
        if not overlapping:
            break
        for r in range(3):
            for k in range(3):
                shift[r, k] += step[r, k]
    for r in range(3):
        for k in range(3):
            pos[b, r, k] += shift[r, k]


@numba.njit(cache=True)
def caps_and_lengths(
    pos: np.ndarray,
    quat: np.ndarray,
    local: np.ndarray,
    cap_point: np.ndarray,
    cable_a: np.ndarray,
    cable_b: np.ndarray,
    caps: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """The end caps' centres into ``caps`` (B, 6, 3) in metres and the cables' lengths into
    ``lengths`` (B, 9) in metres, of rods at ``pos`` (B, 3, 3) turned by ``quat`` (B, 3, 4):
    :meth:`Engine.caps_and_cable_lengths <pipeline.physics.engine.Engine.caps_and_cable_lengths>`.
    ``local`` (3, K, 3) body points; ``cap_point`` (6,), ``cable_a``/``cable_b`` (9,) flat point
    indices."""
    n_points = local.shape[1]
    rot = np.empty((3, 3, 3))
    for b in range(pos.shape[0]):
        for r in range(3):
            _rotation(quat[b, r], rot[r])
        for c in range(cap_point.shape[0]):
            x, y, z = _point(pos, b, rot, local, cap_point[c], n_points)
            caps[b, c, 0], caps[b, c, 1], caps[b, c, 2] = x, y, z
        for c in range(cable_a.shape[0]):
            ax, ay, az = _point(pos, b, rot, local, cable_a[c], n_points)
            bx, by, bz = _point(pos, b, rot, local, cable_b[c], n_points)
            lengths[b, c] = math.sqrt((bx - ax) ** 2 + (by - ay) ** 2 + (bz - az) ** 2)


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _point(
    pos: np.ndarray, b: int, rot: np.ndarray, local: np.ndarray, flat: int, n_points: int
) -> tuple[float, float, float]:
    """The world position (m) of body point ``flat`` (flat index) of environment ``b``."""
    r, k = flat // n_points, flat % n_points
    x, y, z = _to_world(rot[r], local[r, k, 0], local[r, k, 1], local[r, k, 2])
    return pos[b, r, 0] + x, pos[b, r, 1] + y, pos[b, r, 2] + z
