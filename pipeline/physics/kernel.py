"""The engine's step without gradients as one compiled loop over environments (numba).

:meth:`Engine.step <pipeline.physics.engine.Engine.step>` with ``compiled`` and gradients off runs
:func:`step_kernel` on CPU float64 tensors: the same physics as :meth:`Engine.advance` (motors,
cables, gravity, ground contact with its projected-Jacobi refinement, contact between the rods'
capsules, integration, the ground's and the rods' position corrections), written per environment
in scalars and a few per-environment work arrays, the environments split over the CPU's threads.
Every pair of capsules goes through the rod-contact sweeps; a pair beyond the margin at the step's
start, or one not closing, adds nothing (the eager step's selection of near pairs, as masks). Its
results equal the eager step's to rounding (``tests/test_engine.py``); it runs several times
faster than a ``torch.compile`` of the eager step, whose graphs write every intermediate of every
environment to memory (``docs/performance.md``). Compiled once per machine (numba's cache beside
this module), for every batch size.

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

numba.config.THREADING_LAYER = "threadsafe"  # the stages may step engines from several threads at once
numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


@numba.njit(cache=True)
def _cross(ax: float, ay: float, az: float, bx: float, by: float, bz: float) -> tuple[float, float, float]:
    return ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx


@numba.njit(cache=True)
def _to_world(r: np.ndarray, x: float, y: float, z: float) -> tuple[float, float, float]:
    """R v for a rotation ``r`` (3, 3)."""
    return (
        r[0, 0] * x + r[0, 1] * y + r[0, 2] * z,
        r[1, 0] * x + r[1, 1] * y + r[1, 2] * z,
        r[2, 0] * x + r[2, 1] * y + r[2, 2] * z,
    )


@numba.njit(cache=True)
def _to_body(r: np.ndarray, x: float, y: float, z: float) -> tuple[float, float, float]:
    """R^T v."""
    return (
        r[0, 0] * x + r[1, 0] * y + r[2, 0] * z,
        r[0, 1] * x + r[1, 1] * y + r[2, 1] * z,
        r[0, 2] * x + r[1, 2] * y + r[2, 2] * z,
    )


@numba.njit(cache=True)
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


@numba.njit(cache=True)
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


@numba.njit(parallel=True, cache=True)
def step_kernel(
    pos: np.ndarray,
    quat: np.ndarray,
    vel: np.ndarray,
    omega: np.ndarray,
    rest_length: np.ndarray,
    motor_omega: np.ndarray,
    control: np.ndarray,
    params: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    cable_a: np.ndarray,
    cable_b: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    pair_rods: np.ndarray,
    pair_z: np.ndarray,
    pair_reach: np.ndarray,
    scalars: np.ndarray,
    contact_iterations: int,
    sweeps: int,
    out_pos: np.ndarray,
    out_quat: np.ndarray,
    out_vel: np.ndarray,
    out_omega: np.ndarray,
    out_rest: np.ndarray,
    out_motor: np.ndarray,
) -> None:
    """One step of every environment, written into the ``out_*`` arrays.

    State: ``pos`` (B, 3, 3) m, ``quat`` (B, 3, 4), ``vel``, ``omega`` (B, 3, 3), ``rest_length``,
    ``motor_omega`` (B, 6); ``control`` (B, 6); ``params`` (B, 10) in :data:`PARAMETER_COLUMNS`
    order. Model: ``local`` (3, 10, 3) body points; ``mass`` (3,), ``inertia`` (3,);
    ``cable_a``/``cable_b`` (9,) flat point indices; ``contact_point`` (12,) flat point index of
    each ground-contact sphere and ``contact_radius`` (12,); per capsule pair ``pair_rods`` (P, 2),
    ``pair_z`` (P, 4) both capsules' axis ends (body z) and ``pair_reach`` (P,) their radii's sum.
    ``scalars``: dt, gravity, omega_max, winch radius, bounce speed, the rest-length limits (low,
    high) and the rod-contact margin.
    """
    for b in numba.prange(pos.shape[0]):
        _step_env(
            b, pos, quat, vel, omega, rest_length, motor_omega, control, params, local, mass, inertia,
            cable_a, cable_b, contact_point, contact_radius, pair_rods, pair_z, pair_reach, scalars,
            contact_iterations, sweeps, out_pos, out_quat, out_vel, out_omega, out_rest, out_motor,
        )  # fmt: skip


@numba.njit(cache=True)
def step_kernel_serial(
    pos: np.ndarray,
    quat: np.ndarray,
    vel: np.ndarray,
    omega: np.ndarray,
    rest_length: np.ndarray,
    motor_omega: np.ndarray,
    control: np.ndarray,
    params: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    cable_a: np.ndarray,
    cable_b: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    pair_rods: np.ndarray,
    pair_z: np.ndarray,
    pair_reach: np.ndarray,
    scalars: np.ndarray,
    contact_iterations: int,
    sweeps: int,
    out_pos: np.ndarray,
    out_quat: np.ndarray,
    out_vel: np.ndarray,
    out_omega: np.ndarray,
    out_rest: np.ndarray,
    out_motor: np.ndarray,
) -> None:
    """:func:`step_kernel` on the calling thread alone: for one thread, where the parallel loop's
    team would still wait at its barrier for threads other processes hold the cores of."""
    for b in range(pos.shape[0]):
        _step_env(
            b, pos, quat, vel, omega, rest_length, motor_omega, control, params, local, mass, inertia,
            cable_a, cable_b, contact_point, contact_radius, pair_rods, pair_z, pair_reach, scalars,
            contact_iterations, sweeps, out_pos, out_quat, out_vel, out_omega, out_rest, out_motor,
        )  # fmt: skip


@numba.njit(cache=True)
def _step_env(
    b: int,
    pos: np.ndarray,
    quat: np.ndarray,
    vel: np.ndarray,
    omega: np.ndarray,
    rest_length: np.ndarray,
    motor_omega: np.ndarray,
    control: np.ndarray,
    params: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    cable_a: np.ndarray,
    cable_b: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    pair_rods: np.ndarray,
    pair_z: np.ndarray,
    pair_reach: np.ndarray,
    scalars: np.ndarray,
    contact_iterations: int,
    sweeps: int,
    out_pos: np.ndarray,
    out_quat: np.ndarray,
    out_vel: np.ndarray,
    out_omega: np.ndarray,
    out_rest: np.ndarray,
    out_motor: np.ndarray,
) -> None:
    """One step of environment ``b`` (:func:`step_kernel`)."""
    dt, gravity, omega_max, winch = scalars[0], scalars[1], scalars[2], scalars[3]
    bounce, rest_low, rest_high, margin = scalars[4], scalars[5], scalars[6], scalars[7]
    n_points = local.shape[1]
    n_contacts = contact_point.shape[0]
    n_pairs = pair_rods.shape[0]
    inv_i0, inv_i1, inv_i2 = 1.0 / inertia[0], 1.0 / inertia[1], 1.0 / inertia[2]
    rot = np.empty((3, 3, 3))
    arms = np.empty((3, n_points, 3))
    pvel = np.empty((3, n_points, 3))
    force = np.zeros((3, 3))
    torque = np.zeros((3, 3))
    v1 = np.empty((3, 3))
    w1 = np.empty((3, 3))
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
            stretch = length - out_rest[b, c]
            tension = p[4] * stretch + p[5] * speed
        else:
            stretch = length - p[9]
            tension = stretch * (p[6] + p[7] * stretch * stretch) + p[8] * speed
        if stretch <= 0 or tension < 0:
            continue
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
    v2, w2, bounce_height = _ground(
        b, pos, rot, arms, v1, w1, p, local, mass, inertia, contact_point, contact_radius, dt, bounce,
        contact_iterations,
    )  # fmt: skip
    # contact between rods, on the velocities ground contact left
    on = np.empty((n_pairs, 6))
    gap = np.empty(n_pairs)
    for q in range(n_pairs):
        ri, rj = pair_rods[q, 0], pair_rods[q, 1]
        o = _closest(pos[b], rot, ri, rj, pair_z[q, 0], pair_z[q, 1], pair_z[q, 2], pair_z[q, 3])
        for j in range(6):
            on[q, j] = o[j]
        dx, dy, dz = on[q, 0] - on[q, 3], on[q, 1] - on[q, 4], on[q, 2] - on[q, 5]
        gap[q] = math.sqrt(dx * dx + dy * dy + dz * dz) - pair_reach[q]
    _rod_contact(b, pos, rot, v2, w2, on, gap, pair_rods, mass, inv_i0, inv_i1, inv_i2, dt, margin, sweeps)
    new_rot = np.empty((3, 3, 3))
    # positions, orientations, position corrections
    for r in range(3):
        for j in range(3):
            out_pos[b, r, j] = pos[b, r, j] + v2[r, j] * dt
            out_vel[b, r, j] = v2[r, j]
            out_omega[b, r, j] = w2[r, j]
        ox, oy, oz = w2[r, 0], w2[r, 1], w2[r, 2]
        qw, qx, qy, qz = quat[b, r, 0], quat[b, r, 1], quat[b, r, 2], quat[b, r, 3]
        nw = qw + 0.5 * dt * (-ox * qx - oy * qy - oz * qz)
        nx = qx + 0.5 * dt * (ox * qw + oy * qz - oz * qy)
        ny = qy + 0.5 * dt * (oy * qw + oz * qx - ox * qz)
        nz = qz + 0.5 * dt * (oz * qw + ox * qy - oy * qx)
        norm = math.sqrt(nw * nw + nx * nx + ny * ny + nz * nz)
        out_quat[b, r, 0], out_quat[b, r, 1] = nw / norm, nx / norm
        out_quat[b, r, 2], out_quat[b, r, 3] = ny / norm, nz / norm
        _rotation(out_quat[b, r], new_rot[r])
    lift = np.zeros(3)
    for c in range(n_contacts):
        r, k = contact_point[c] // n_points, contact_point[c] % n_points
        _, _, az = _to_world(new_rot[r], local[r, k, 0], local[r, k, 1], local[r, k, 2])
        height = out_pos[b, r, 2] + az - contact_radius[c]
        lift[r] = max(lift[r], bounce_height[c] - height)
    for r in range(3):
        out_pos[b, r, 2] += lift[r]
    _rod_separation(b, out_pos, new_rot, gap, pair_rods, pair_z, pair_reach, margin, sweeps)


@numba.njit(cache=True)
def _ground(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    arms: np.ndarray,
    v1: np.ndarray,
    w1: np.ndarray,
    p: np.ndarray,
    local: np.ndarray,
    mass: np.ndarray,
    inertia: np.ndarray,
    contact_point: np.ndarray,
    contact_radius: np.ndarray,
    dt: float,
    bounce: float,
    iterations: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ground contact of environment ``b`` on the free-motion velocities ``v1``, ``w1`` (3, 3):
    :meth:`Engine._ground_contact <pipeline.physics.engine.Engine._ground_contact>`. Returns the
    new velocities (3, 3) and each contact's time-of-impact height (12,)."""
    n_points = local.shape[1]
    n_contacts = contact_point.shape[0]
    friction, restitution = p[2], p[3]
    lever = np.empty((n_contacts, 3))
    body = np.empty((n_contacts, 3))
    impulse = np.zeros((n_contacts, 3))
    k_inv = np.empty((n_contacts, 6))
    active = np.zeros(n_contacts, dtype=np.bool_)
    target = np.zeros(n_contacts)
    share = np.zeros(n_contacts)
    height = np.zeros(n_contacts)
    count = np.zeros(3)
    v_n = np.empty(n_contacts)
    gap = np.empty(n_contacts)
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
        vn = v_n[c]
        j_n = 0.0
        if vn < 0:
            e = restitution if vn < -bounce else 0.0
            j_n = -(1 + e) * vn / w_n
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
    v2 = np.empty((3, 3))
    w2 = np.empty((3, 3))
    for it in range(iterations + 1):
        _apply_ground(rot, v1, w1, impulse, lever, contact_point, n_points, mass, inertia, v2, w2)
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
    return v2, w2, height


@numba.njit(cache=True)
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
    v2: np.ndarray,
    w2: np.ndarray,
) -> None:
    """The velocities ``v2``, ``w2`` (3, 3): ``v1``, ``w1`` after ground impulses ``impulse`` (12, 3)
    at ``lever``."""
    momentum = np.zeros((3, 3))
    angular = np.zeros((3, 3))
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


@numba.njit(cache=True)
def _rod_contact(
    b: int,
    pos: np.ndarray,
    rot: np.ndarray,
    vel: np.ndarray,
    omega: np.ndarray,
    on: np.ndarray,
    gap: np.ndarray,
    pair_rods: np.ndarray,
    mass: np.ndarray,
    inv_i0: float,
    inv_i1: float,
    inv_i2: float,
    dt: float,
    margin: float,
    sweeps: int,
) -> None:
    """Rod-contact impulses on ``vel``, ``omega`` (3, 3) in place, from the pairs' closest points
    ``on`` (P, 6) and gaps ``gap`` (P,) at the step's start: :meth:`Engine._rod_contact
    <pipeline.physics.engine.Engine._rod_contact>`, every pair within ``margin``, Jacobi sweeps."""
    n_pairs = pair_rods.shape[0]
    normal = np.empty((n_pairs, 3))
    arm = np.empty((n_pairs, 6))
    weight = np.empty(n_pairs)
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
    d_vel = np.empty((3, 3))
    d_ang = np.empty((3, 3))
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


@numba.njit(cache=True)
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
) -> None:
    """Moves overlapping capsules of the pairs near at the step's start (``gap`` below ``margin``)
    apart along their normal, half each, in ``pos`` (B, 3, 3) in place, the rods turned by ``rot``
    (3, 3, 3): :meth:`Engine._rod_separation <pipeline.physics.engine.Engine._rod_separation>`."""
    n_pairs = pair_rods.shape[0]
    shift = np.zeros((3, 3))
    moved = np.empty((3, 3))
    step = np.empty((3, 3))
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
