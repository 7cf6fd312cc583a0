"""Cable-length PID controller and motor/winch model (seed 001 App. C, seed 002).

The PID works on normalised cable lengths (0 = ``min_length_m``, 1 = ``min_length_m
+ range_m``) like the Tribar firmware. Its output ``u`` in [-1, 1] is the motor
command; ``u > 0`` winds the winch in and shortens the cable. A cable whose error
is within the tolerance gets ``u = 0`` (dead band), and a target is reached when
every actuated cable is within the tolerance at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.config import PIDConfig
from pipeline.robot_model import N_ACTUATED


@dataclass
class PID:
    """Discrete PID over the six actuated cables, stepped at ``gains.control_rate_hz``."""

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
        """One control tick.

        ``position`` and ``target`` are normalised cable lengths, shape (6,).
        Returns motor commands ``u`` (6,) in [-1, 1].
        """
        error = np.asarray(position, float) - np.asarray(target, float)
        done = np.abs(error) < self.gains.tolerance
        self.integral = np.where(done, 0.0, self.integral + error * self.dt_s)
        derivative = np.zeros(N_ACTUATED) if self.previous_error is None else (error - self.previous_error) / self.dt_s
        self.previous_error = error
        u = self.gains.kp * error + self.gains.ki * self.integral + self.gains.kd * derivative
        return np.where(done, 0.0, np.clip(u, -1.0, 1.0))


def motor_speed_rad_s(speed: float, omega_max_rad_s: np.ndarray | float, u: np.ndarray) -> np.ndarray:
    """Motor angular speed (rad/s) for command ``u``: omega = s * omega_max * u.

    ``speed`` is the firmware speed setting s in [0, 1]; ``omega_max_rad_s`` may be
    given per motor, shape (6,).
    """
    return speed * np.asarray(omega_max_rad_s) * np.asarray(u)


def rest_length_change_m(omega_prev: np.ndarray, omega: np.ndarray, winch_radius_m: float, dt_s: float) -> np.ndarray:
    """Trapezoidal change of rest length over one step; positive values shorten the cable."""
    return 0.5 * (omega + omega_prev) * winch_radius_m * dt_s
