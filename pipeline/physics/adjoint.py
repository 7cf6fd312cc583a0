"""The gradient of the compiled steps (numba): the adjoint of :func:`~pipeline.physics.kernel.step_kernel`.

:meth:`Engine.steps <pipeline.physics.engine.Engine.steps>` with ``compiled`` and gradients on runs
the kernel forward and, in the backward pass, :func:`adjoint_kernel`: per environment, the states
between the steps again (the kernel forward from the first), then each step's adjoint from the last
to the first. The gradient is the eager step's, under its detach rules (``pipeline/physics/contact.py``):

- motors, cables, gravity and Euler's equations, the integration of positions and orientations
  (the quaternion normalised) carry full gradients;
- a ground-contact impulse carries the gradient of its first pass only, and only with respect to
  friction and restitution: the normal impulse ``-(1 + e) v_n / w_n`` with ``v_n``, ``w_n`` fixed,
  the friction impulse's magnitude that of sliding, ``mu j_n``, its direction fixed, applied at
  fixed levers by fixed rotations; the refining sweeps change the values, not the gradient;
- contact between rods and both position corrections (the ground's, the rods' separation) add
  values without gradient.

So a step's adjoint needs the state at its start and the angular velocity at its end (the
quaternion update's), the free motion and the ground's first impulses, which
:func:`~pipeline.physics.kernel._free_motion` and :func:`~pipeline.physics.kernel._ground_impulses`
compute again in the work arrays (:func:`~pipeline.physics.kernel._work`); no contact between rods.

Shapes as in :mod:`~pipeline.physics.kernel`: B environments, 3 rods, K body points per rod, 6
actuated cables. Units SI.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from pipeline.physics.kernel import (
    _CHUNKS,
    _TORQUE,
    _cable,
    _cross,
    _free_motion,
    _ground_impulses,
    _quat_step,
    _step_env,
    _to_body,
    _to_world,
    _work,
)

_GV, _GW, _GF, _GT = range(4)
"""Slots of the adjoint work's per-rod vectors (4, 3, 3): the adjoints of the velocities after the
ground's impulses, of the angular velocities after them, of the force and of the torque per rod."""


@numba.njit(cache=True)
def _adjoint_work() -> tuple:
    """One thread's adjoint arrays: the per-rod vectors (4, 3, 3) in the ``_GV``... slots, the
    rotations' adjoints (3, 3, 3) and the running adjoint of the state: ``pos`` (3, 3), ``quat``
    (3, 4), ``vel``, ``omega`` (3, 3), ``rest_length``, ``motor_omega`` (6,)."""
    return (
        np.empty((4, 3, 3)),
        np.empty((3, 3, 3)),
        (np.empty((3, 3)), np.empty((3, 4)), np.empty((3, 3)), np.empty((3, 3)), np.empty(6), np.empty(6)),
    )


@numba.njit(parallel=True, cache=True)
def adjoint_kernel(
    tape: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    grad_out: tuple,
    grad_in: tuple,
    grad_control: np.ndarray,
    grad_params: np.ndarray,
) -> None:
    """The gradient of ``steps`` kernel steps (:func:`~pipeline.physics.kernel.step_kernel`, same
    ``control``, ``params``, ``model``, ``contact_iterations`` and ``sweeps``) for every environment.

    ``tape``: the six state arrays, each (steps + 1, B, ...): index 0 the steps' start, index
    ``steps`` their end, both filled; the states between are written here. ``grad_out``: the
    adjoints of the end state (six arrays as the state's, (B, ...)). Writes the adjoints of the
    start state into ``grad_in`` (the same arrays), of ``control`` into ``grad_control`` (B, 6) and
    of ``params`` into ``grad_params`` (B, 10)."""
    batch = control.shape[0]
    chunks = min(batch, _CHUNKS)
    for chunk in numba.prange(chunks):
        work = _work(model)
        adjoint = _adjoint_work()
        for b in range(chunk * batch // chunks, (chunk + 1) * batch // chunks):
            _adjoint_env(
                b, tape, control, params, model, contact_iterations, sweeps, steps, work, adjoint,
                grad_out, grad_in, grad_control, grad_params,
            )  # fmt: skip


@numba.njit(cache=True)
def adjoint_kernel_serial(
    tape: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    grad_out: tuple,
    grad_in: tuple,
    grad_control: np.ndarray,
    grad_params: np.ndarray,
) -> None:
    """:func:`adjoint_kernel` on the calling thread alone (as
    :func:`~pipeline.physics.kernel.step_kernel_serial`)."""
    work = _work(model)
    adjoint = _adjoint_work()
    for b in range(control.shape[0]):
        _adjoint_env(
            b, tape, control, params, model, contact_iterations, sweeps, steps, work, adjoint,
            grad_out, grad_in, grad_control, grad_params,
        )  # fmt: skip


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _adjoint_env(
    b: int,
    tape: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    contact_iterations: int,
    sweeps: int,
    steps: int,
    work: tuple,
    adjoint: tuple,
    grad_out: tuple,
    grad_in: tuple,
    grad_control: np.ndarray,
    grad_params: np.ndarray,
) -> None:
    """:func:`adjoint_kernel` for environment ``b``."""
    pos, quat, vel, omega, rest, motor = tape
    for k in range(1, steps):
        before = (pos[k - 1], quat[k - 1], vel[k - 1], omega[k - 1], rest[k - 1], motor[k - 1])
        after = (pos[k], quat[k], vel[k], omega[k], rest[k], motor[k])
        _step_env(b, before, control, params, model, contact_iterations, sweeps, work, after)
    g_pos, g_quat, g_vel, g_omega, g_rest, g_motor = adjoint[2]
    out_pos, out_quat, out_vel, out_omega, out_rest, out_motor = grad_out
    for r in range(3):
        for j in range(3):
            g_pos[r, j], g_vel[r, j], g_omega[r, j] = out_pos[b, r, j], out_vel[b, r, j], out_omega[b, r, j]
        for j in range(4):
            g_quat[r, j] = out_quat[b, r, j]
    for c in range(6):
        g_rest[c], g_motor[c] = out_rest[b, c], out_motor[b, c]
    grad_control[b, :] = 0.0
    grad_params[b, :] = 0.0
    for k in range(steps - 1, -1, -1):
        before = (pos[k], quat[k], vel[k], omega[k], rest[k], motor[k])
        after = (pos[k + 1], quat[k + 1], vel[k + 1], omega[k + 1], rest[k + 1], motor[k + 1])
        _step_adjoint(b, before, after, control, params, model, work, adjoint, grad_control, grad_params)
    in_pos, in_quat, in_vel, in_omega, in_rest, in_motor = grad_in
    for r in range(3):
        for j in range(3):
            in_pos[b, r, j], in_vel[b, r, j], in_omega[b, r, j] = g_pos[r, j], g_vel[r, j], g_omega[r, j]
        for j in range(4):
            in_quat[b, r, j] = g_quat[r, j]
    for c in range(6):
        in_rest[b, c], in_motor[b, c] = g_rest[c], g_motor[c]


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _step_adjoint(
    b: int,
    state: tuple,
    out: tuple,
    control: np.ndarray,
    params: np.ndarray,
    model: tuple,
    work: tuple,
    adjoint: tuple,
    grad_control: np.ndarray,
    grad_params: np.ndarray,
) -> None:
    """One step's adjoint for environment ``b``, from ``state`` to ``out`` (its result): turns the
    running adjoint of ``out`` (``adjoint``'s state arrays, :func:`_adjoint_work`) into that of
    ``state`` and adds the step's share to ``grad_control[b]`` and ``grad_params[b]``."""
    pos, quat, _, omega, rest_length, motor_omega = state
    out_omega, out_rest, out_motor = out[3], out[4], out[5]
    local, mass, inertia, cable_a, cable_b, contact_point, contact_radius = model[:7]
    scalars = model[10]
    dt, omega_max, winch, bounce, rest_low, rest_high = (
        scalars[0], scalars[2], scalars[3], scalars[4], scalars[5], scalars[6],
    )  # fmt: skip
    n_points = local.shape[1]
    p = params[b]
    _free_motion(b, state, control, params, model, work, out)
    frames, vectors, _, points, contact_vectors, _, contact_scalars, active = work[:8]
    rot, arms, pvel = frames[0], points[0], points[1]
    _ground_impulses(
        b, pos, rot, arms, p, local, mass, inertia, contact_point, contact_radius, dt, bounce, work
    )  # fmt: skip
    torque = vectors[_TORQUE]
    lever, slip = contact_vectors[0], contact_vectors[3]
    share, v_n, normal_impulse, normal_weight = (
        contact_scalars[1], contact_scalars[3], contact_scalars[5], contact_scalars[6],
    )  # fmt: skip
    slots, g_rot, state_adjoint = adjoint
    g_pos, g_quat, g_vel, g_omega, g_rest, g_motor = state_adjoint
    g_v, g_w, g_force, g_torque = slots[_GV], slots[_GW], slots[_GF], slots[_GT]
    g_rot[:] = 0.0
    half = 0.5 * dt
    # positions and orientations: x' = x + v' dt, q' = n / |n| with n = q + dt/2 (0, w') q
    for r in range(3):
        ox, oy, oz = out_omega[b, r, 0], out_omega[b, r, 1], out_omega[b, r, 2]
        qw, qx, qy, qz = quat[b, r, 0], quat[b, r, 1], quat[b, r, 2], quat[b, r, 3]
        nw, nx, ny, nz, norm = _quat_step(quat[b, r], ox, oy, oz, half)
        nw, nx, ny, nz = nw / norm, nx / norm, ny / norm, nz / norm
        along = nw * g_quat[r, 0] + nx * g_quat[r, 1] + ny * g_quat[r, 2] + nz * g_quat[r, 3]
        hw, hx = (g_quat[r, 0] - nw * along) / norm, (g_quat[r, 1] - nx * along) / norm
        hy, hz = (g_quat[r, 2] - ny * along) / norm, (g_quat[r, 3] - nz * along) / norm
        g_quat[r, 0] = hw + half * (hx * ox + hy * oy + hz * oz)
        g_quat[r, 1] = hx + half * (-hw * ox + hy * oz - hz * oy)
        g_quat[r, 2] = hy + half * (-hw * oy - hx * oz + hz * ox)
        g_quat[r, 3] = hz + half * (-hw * oz + hx * oy - hy * ox)
        g_w[r, 0] = g_omega[r, 0] + half * (-hw * qx + hx * qw - hy * qz + hz * qy)
        g_w[r, 1] = g_omega[r, 1] + half * (-hw * qy + hx * qz + hy * qw - hz * qx)
        g_w[r, 2] = g_omega[r, 2] + half * (-hw * qz - hx * qy + hy * qx + hz * qw)
        for j in range(3):
            g_v[r, j] = g_vel[r, j] + g_pos[r, j] * dt
    # the ground's first impulses, through friction and restitution only
    for c in range(contact_point.shape[0]):
        if not active[c]:
            continue
        r = contact_point[c] // n_points
        x, y, z = _to_body(rot[r], g_w[r, 0], g_w[r, 1], g_w[r, 2])
        x, y, z = _to_world(rot[r], x / inertia[0], y / inertia[1], z / inertia[2])
        cx, cy, cz = _cross(x, y, z, lever[c, 0], lever[c, 1], lever[c, 2])
        jx, jy, jz = g_v[r, 0] / mass[r] + cx, g_v[r, 1] / mass[r] + cy, g_v[r, 2] / mass[r] + cz
        g_magnitude = -share[c] * slip[c, 2] * (slip[c, 0] * jx + slip[c, 1] * jy)
        grad_params[b, 2] += g_magnitude * normal_impulse[c]
        if v_n[c] < -bounce:
            g_normal = share[c] * jz + p[2] * g_magnitude
            grad_params[b, 3] -= g_normal * v_n[c] / normal_weight[c]
    # Euler's equations: w1 = R (wb + dt (tb - wb x (I wb)) / I), wb = R^T w, tb = R^T torque
    for r in range(3):
        wx, wy, wz = _to_body(rot[r], omega[b, r, 0], omega[b, r, 1], omega[b, r, 2])
        tx, ty, tz = _to_body(rot[r], torque[r, 0], torque[r, 1], torque[r, 2])
        ix, iy, iz = wx * inertia[0], wy * inertia[1], wz * inertia[2]
        cx, cy, cz = _cross(wx, wy, wz, ix, iy, iz)
        ux = wx + dt * (tx - cx) / inertia[0]
        uy = wy + dt * (ty - cy) / inertia[1]
        uz = wz + dt * (tz - cz) / inertia[2]
        ax, ay, az = _to_body(rot[r], g_w[r, 0], g_w[r, 1], g_w[r, 2])
        hx, hy, hz = dt * ax / inertia[0], dt * ay / inertia[1], dt * az / inertia[2]
        c1 = _cross(ix, iy, iz, hx, hy, hz)
        c2 = _cross(hx, hy, hz, wx, wy, wz)
        bx = ax - c1[0] - inertia[0] * c2[0]
        by = ay - c1[1] - inertia[1] * c2[1]
        bz = az - c1[2] - inertia[2] * c2[2]
        for i in range(3):
            g_rot[r, i, 0] += g_w[r, i] * ux + omega[b, r, i] * bx + torque[r, i] * hx
            g_rot[r, i, 1] += g_w[r, i] * uy + omega[b, r, i] * by + torque[r, i] * hy
            g_rot[r, i, 2] += g_w[r, i] * uz + omega[b, r, i] * bz + torque[r, i] * hz
        g_omega[r, 0], g_omega[r, 1], g_omega[r, 2] = _to_world(rot[r], bx, by, bz)
        g_torque[r, 0], g_torque[r, 1], g_torque[r, 2] = _to_world(rot[r], hx, hy, hz)
        for j in range(3):
            g_vel[r, j] = g_v[r, j]
            g_force[r, j] = g_v[r, j] * dt / mass[r]
    # cables
    for c in range(cable_a.shape[0]):
        d0, d1, d2, length, speed, stretch, tension = _cable(
            b, c, pos, arms, pvel, out_rest, p, cable_a, cable_b, n_points
        )  # fmt: skip
        if stretch <= 0 or tension < 0:
            continue
        ra, ka = cable_a[c] // n_points, cable_a[c] % n_points
        rb, kb = cable_b[c] // n_points, cable_b[c] % n_points
        f0, f1, f2 = tension * d0, tension * d1, tension * d2
        ta, tb = g_torque[ra], g_torque[rb]
        ca = _cross(ta[0], ta[1], ta[2], arms[ra, ka, 0], arms[ra, ka, 1], arms[ra, ka, 2])
        cb = _cross(tb[0], tb[1], tb[2], arms[rb, kb, 0], arms[rb, kb, 1], arms[rb, kb, 2])
        gf0 = g_force[ra, 0] - g_force[rb, 0] + ca[0] - cb[0]
        gf1 = g_force[ra, 1] - g_force[rb, 1] + ca[1] - cb[1]
        gf2 = g_force[ra, 2] - g_force[rb, 2] + ca[2] - cb[2]
        g_tension = gf0 * d0 + gf1 * d1 + gf2 * d2
        if c < 6:
            grad_params[b, 4] += g_tension * stretch
            grad_params[b, 5] += g_tension * speed
            g_stretch, g_speed = g_tension * p[4], g_tension * p[5]
            g_rest[c] -= g_stretch
        else:
            grad_params[b, 6] += g_tension * stretch
            grad_params[b, 7] += g_tension * stretch * stretch * stretch
            grad_params[b, 8] += g_tension * speed
            g_stretch, g_speed = g_tension * (p[6] + 3.0 * p[7] * stretch * stretch), g_tension * p[8]
            grad_params[b, 9] -= g_stretch
        gd0 = tension * gf0 + g_speed * (pvel[rb, kb, 0] - pvel[ra, ka, 0])
        gd1 = tension * gf1 + g_speed * (pvel[rb, kb, 1] - pvel[ra, ka, 1])
        gd2 = tension * gf2 + g_speed * (pvel[rb, kb, 2] - pvel[ra, ka, 2])
        along = d0 * gd0 + d1 * gd1 + d2 * gd2
        e0 = (gd0 - d0 * along) / length + g_stretch * d0
        e1 = (gd1 - d1 * along) / length + g_stretch * d1
        e2 = (gd2 - d2 * along) / length + g_stretch * d2
        g_pos[rb, 0], g_pos[rb, 1], g_pos[rb, 2] = g_pos[rb, 0] + e0, g_pos[rb, 1] + e1, g_pos[rb, 2] + e2
        g_pos[ra, 0], g_pos[ra, 1], g_pos[ra, 2] = g_pos[ra, 0] - e0, g_pos[ra, 1] - e1, g_pos[ra, 2] - e2
        aa = _cross(f0, f1, f2, ta[0], ta[1], ta[2])
        ab = _cross(-f0, -f1, -f2, tb[0], tb[1], tb[2])
        _point_adjoint(
            b, ra, ka, aa[0] - e0, aa[1] - e1, aa[2] - e2, -g_speed * d0, -g_speed * d1, -g_speed * d2,
            omega, arms, local, g_vel, g_omega, g_rot,
        )  # fmt: skip
        _point_adjoint(
            b, rb, kb, ab[0] + e0, ab[1] + e1, ab[2] + e2, g_speed * d0, g_speed * d1, g_speed * d2,
            omega, arms, local, g_vel, g_omega, g_rot,
        )  # fmt: skip
    for r in range(3):
        _rotation_adjoint(quat[b, r], g_rot[r], g_quat[r])
    # motors: w = cmd + (w0 - cmd) lag, rest' = clamp(rest - (w + w0) winch dt / 2)
    lag = math.exp(-dt / max(p[1], 1e-6))
    for c in range(6):
        cmd = p[0] * omega_max * control[b, c]
        raw = rest_length[b, c] - 0.5 * (out_motor[b, c] + motor_omega[b, c]) * winch * dt
        g_raw = g_rest[c] if rest_low <= raw <= rest_high else 0.0
        g_speed = g_motor[c] - 0.5 * winch * dt * g_raw
        g_cmd = g_speed * (1.0 - lag)
        grad_params[b, 0] += g_cmd * omega_max * control[b, c]
        grad_control[b, c] += g_cmd * p[0] * omega_max
        if p[1] >= 1e-6:
            grad_params[b, 1] += g_speed * (motor_omega[b, c] - cmd) * lag * dt / (p[1] * p[1])
        g_rest[c] = g_raw
        g_motor[c] = g_speed * lag - 0.5 * winch * dt * g_raw


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _point_adjoint(
    b: int,
    r: int,
    k: int,
    ax: float,
    ay: float,
    az: float,
    vx: float,
    vy: float,
    vz: float,
    omega: np.ndarray,
    arms: np.ndarray,
    local: np.ndarray,
    g_vel: np.ndarray,
    g_omega: np.ndarray,
    g_rot: np.ndarray,
) -> None:
    """Adds the adjoints of body point ``k`` of rod ``r``: of its lever arm ``a = R l`` (``ax``...)
    and of its velocity ``v + w x a`` (``vx``...), into those of the rod's velocity, angular
    velocity and rotation (``g_vel``, ``g_omega`` (3, 3), ``g_rot`` (3, 3, 3))."""
    wx, wy, wz = omega[b, r, 0], omega[b, r, 1], omega[b, r, 2]
    lx, ly, lz = arms[r, k, 0], arms[r, k, 1], arms[r, k, 2]
    g_vel[r, 0] += vx
    g_vel[r, 1] += vy
    g_vel[r, 2] += vz
    cx, cy, cz = _cross(lx, ly, lz, vx, vy, vz)
    g_omega[r, 0] += cx
    g_omega[r, 1] += cy
    g_omega[r, 2] += cz
    cx, cy, cz = _cross(vx, vy, vz, wx, wy, wz)
    ax, ay, az = ax + cx, ay + cy, az + cz
    for j in range(3):
        g_rot[r, 0, j] += ax * local[r, k, j]
        g_rot[r, 1, j] += ay * local[r, k, j]
        g_rot[r, 2, j] += az * local[r, k, j]


@numba.njit(cache=True, _nrt=False, fastmath={"contract"})
def _rotation_adjoint(q: np.ndarray, g: np.ndarray, g_q: np.ndarray) -> None:
    """Adds to ``g_q`` (4,) the adjoint of quaternion ``q`` (w, x, y, z) whose rotation matrix
    (:func:`~pipeline.physics.kernel._rotation`) has the adjoint ``g`` (3, 3)."""
    w, x, y, z = q[0], q[1], q[2], q[3]
    g_q[0] += 2.0 * (-z * g[0, 1] + y * g[0, 2] + z * g[1, 0] - x * g[1, 2] - y * g[2, 0] + x * g[2, 1])
    g_q[1] += 2.0 * (
        y * g[0, 1] + z * g[0, 2] + y * g[1, 0] - 2.0 * x * g[1, 1] - w * g[1, 2] + z * g[2, 0] + w * g[2, 1]
        - 2.0 * x * g[2, 2]
    )  # fmt: skip
    g_q[2] += 2.0 * (
        -2.0 * y * g[0, 0] + x * g[0, 1] + w * g[0, 2] + x * g[1, 0] + z * g[1, 2] - w * g[2, 0] + z * g[2, 1]
        - 2.0 * y * g[2, 2]
    )  # fmt: skip
    g_q[3] += 2.0 * (
        -2.0 * z * g[0, 0] - w * g[0, 1] + x * g[0, 2] + w * g[1, 0] - 2.0 * z * g[1, 1] + y * g[1, 2] + x * g[2, 0]
        + y * g[2, 1]
    )  # fmt: skip
