"""Cable-length PID controller and motor/winch model (hybrid-GNN paper App. C, Tribar paper).

The PID works on normalised cable lengths (0 = ``min_length_m``, 1 = ``min_length_m
+ range_m``) like the Tribar firmware. Its output ``u`` in [-1, 1] is the motor
command; ``u > 0`` winds the winch in and shortens the cable. A cable whose error
is within the tolerance gets ``u = 0`` (dead band), and a target is reached when
every actuated cable is within the tolerance at once.

The functions use only arithmetic, comparisons and ``.clip``, so the same code
runs on NumPy arrays (the twin) and on batched torch tensors (the engine, with
gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from pipeline.config import PIDConfig
from pipeline.robot_model import N_ACTUATED

Array = TypeVar("Array")

REST_LENGTH_LIMITS_M = (0.02, 0.40)
"""Mechanical limits of an actuated cable's rest length (m): the winch cannot go beyond them."""


def pid_update(
    gains: PIDConfig, error: Array, integral: Array, previous_error: Array | None, dt_s: float
) -> tuple[Array, Array]:
    """One PID tick on normalised errors ``error = position - target`` (..., 6).

    Returns ``(u, integral)``: commands clipped to [-1, 1], zero inside the dead
    band (where the integral is also reset). ``previous_error`` None means no
    derivative term (first tick of a segment).
    """
    active = abs(error) >= gains.tolerance
    integral = (integral + error * dt_s) * active
    u = gains.kp * error + gains.ki * integral
    if previous_error is not None:
        u = u + gains.kd * (error - previous_error) / dt_s
    return u.clip(-1.0, 1.0) * active, integral


@dataclass
class PID:
    """Stateful NumPy PID over the six actuated cables, stepped at ``gains.control_rate_hz``."""

    gains: PIDConfig
    integral: np.ndarray = field(default_factory=lambda: np.zeros(N_ACTUATED))
    previous_error: np.ndarray | None = None

    @property
    def dt_s(self) -> float:
        return 1.0 / self.gains.control_rate_hz

    def reset(self) -> None:
        """Forget the integral and derivative history (new segment or new run)."""
        self.integral = np.zeros(N_ACTUATED)
        self.previous_error = None

    def within_tolerance(self, position: np.ndarray, target: np.ndarray) -> np.ndarray:
        """Boolean mask (6,) of cables whose normalised error is inside the tolerance."""
        return np.abs(np.asarray(position) - np.asarray(target)) < self.gains.tolerance

    def step(self, position: np.ndarray, target: np.ndarray) -> np.ndarray:
        """One control tick: normalised ``position`` and ``target`` (6,) -> commands ``u`` (6,)."""
        error = np.asarray(position, float) - np.asarray(target, float)
        u, self.integral = pid_update(self.gains, error, self.integral, self.previous_error, self.dt_s)
        self.previous_error = error
        return u


def motor_speed_rad_s(speed: float | Array, omega_max_rad_s: float | Array, u: Array) -> Array:
    """Motor angular speed (rad/s) for command ``u``: omega = s * omega_max * u.

    ``speed`` is the speed setting s; ``omega_max_rad_s`` may be given per motor.
    """
    return speed * omega_max_rad_s * u


def rest_length_change_m(omega_prev: Array, omega: Array, winch_radius_m: float, dt_s: float) -> Array:
    """Trapezoidal change of rest length over one step; positive values shorten the cable."""
    return 0.5 * (omega + omega_prev) * winch_radius_m * dt_s
