"""Static equilibrium of an observed pose: the actuated cables' tensions that hold it.

Given the rods' poses (from tracked end caps), the passive tendons' tensions
follow from their stretch, gravity is known, and the ground pushes on the
contact spheres that touch it. :func:`equilibrium_rest_lengths` finds
non-negative actuated tensions and ground forces (normal >= 0, small tangential
parts preferred) that balance every rod's force and torque in the least-squares
sense (``scipy.optimize.lsq_linear``), and returns the rest lengths that give those
tensions. Starting the engine from them, the observed pose is (close to) at rest,
rather than relaxing into another of the many poses that ground friction can hold.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import lsq_linear

from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rotations import quat_to_matrix
from pipeline.robot_model import N_ACTUATED

TOUCH_M = 0.003
"""A contact sphere within this height of the lowest one (m) may carry a ground force (tracked
poses hover or sink by a few mm)."""
TANGENTIAL_WEIGHT = 0.1
"""Weight of the regularisation toward small tangential ground forces (per N)."""


def equilibrium_rest_lengths(engine: Engine, params: Params, state: State, gravity_m_s2: float = 9.81) -> torch.Tensor:
    """Actuated rest lengths (B, 6) in m that hold ``state``'s pose in static equilibrium."""
    model = engine.model
    with torch.no_grad():
        rotations = quat_to_matrix(state.quat)
        points, arms = engine._points(state, rotations)
        batch = state.batch_size
        flat_points = points.reshape(batch, -1, 3).numpy()
        flat_arms = arms.reshape(batch, -1, 3).numpy()
        lengths = engine.cable_lengths(state).numpy()
    a, b = model.cable_a.numpy(), model.cable_b.numpy()
    per_rod = model.local_points.shape[1]
    mass = model.mass.numpy()
    contact = model.contact_index.numpy()
    radius = model.contact_radius.numpy()
    k = params.actuated_stiffness.detach().numpy()
    rest = np.empty((batch, N_ACTUATED))
    for env in range(batch):
        passive = _passive_tensions(params, env, lengths[env, N_ACTUATED:])
        known = np.zeros(18)
        known[2:9:3] = -mass * gravity_m_s2
        columns = []
        for c in range(len(a)):
            direction = flat_points[env, b[c]] - flat_points[env, a[c]]
            direction /= np.linalg.norm(direction)
            wrench = _wrench(flat_arms[env, a[c]], a[c] // per_rod, direction)
            wrench += _wrench(flat_arms[env, b[c]], b[c] // per_rod, -direction)
            if c < N_ACTUATED:
                columns.append(wrench)
            else:
                known += wrench * passive[c - N_ACTUATED]
        n_contact = 0
        gaps = flat_points[env, contact, 2] - radius
        for i, point in enumerate(contact):
            if gaps[i] - gaps.min() > TOUCH_M:
                continue
            arm = flat_arms[env, point] - np.array([0.0, 0.0, radius[i]])
            columns += [_wrench(arm, point // per_rod, np.eye(3)[axis]) for axis in range(3)]
            n_contact += 1
        matrix = np.array(columns).T
        regulariser = np.zeros((2 * n_contact, matrix.shape[1]))
        for j in range(n_contact):
            regulariser[2 * j, N_ACTUATED + 3 * j] = TANGENTIAL_WEIGHT
            regulariser[2 * j + 1, N_ACTUATED + 3 * j + 1] = TANGENTIAL_WEIGHT
        lower = np.r_[np.zeros(N_ACTUATED), np.tile([-np.inf, -np.inf, 0.0], n_contact)]
        system = np.vstack([matrix, regulariser])
        solution = lsq_linear(system, np.r_[-known, np.zeros(2 * n_contact)], bounds=(lower, np.inf)).x
        rest[env] = lengths[env, :N_ACTUATED] - solution[:N_ACTUATED] / k[env]
    return torch.tensor(rest, dtype=state.pos.dtype)


def _wrench(arm: np.ndarray, rod: int, force: np.ndarray) -> np.ndarray:
    """The 18 equilibrium rows (forces of rods 0-2, then torques about their centres) of
    ``force`` (3,) applied at lever ``arm`` (3,) on ``rod``."""
    wrench = np.zeros(18)
    wrench[3 * rod : 3 * rod + 3] = force
    wrench[9 + 3 * rod : 9 + 3 * rod + 3] = np.cross(arm, force)
    return wrench


def _passive_tensions(params: Params, env: int, lengths: np.ndarray) -> np.ndarray:
    """Tensions (3,) in N of the passive tendons at ``lengths`` (m), at rest (no damping)."""
    stretch = np.clip(lengths - float(params.passive_rest_length[env]), 0.0, None)
    return float(params.passive_stiffness[env]) * stretch + float(params.passive_cubic_stiffness[env]) * stretch**3
