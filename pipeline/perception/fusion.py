"""Fusion of camera sightings, cable sensors and a motion prior into rod poses.

Each rod is parameterised by its centre, its unit axis and its roll about the
axis, so its length is exact (the rod-length constraint holds by construction)
and its end caps are ``centre -/+ L/2 * axis``. The roll places the cables'
attachment points (:func:`pipeline.robot_model.rod_frames`), so cable lengths
are modelled exactly and the sensors constrain the pose even when the camera
sees little. One frame is a small nonlinear least-squares problem
(``scipy.optimize.least_squares``) warm-started from the motion prior.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from pipeline.config import RobotConfig
from pipeline.robot_model import Cable, cable_lengths_from_caps

_GROUND_SIGMA_M = 0.001
_STEP = 1e-7


@dataclass(frozen=True)
class RodPoses:
    """Three rods: ``centres`` (3, 3) m, unit ``axes`` (3, 3) from each rod's first cap
    to its second, ``rolls`` (3,) rad about the axis relative to the rod-frame
    convention of :func:`pipeline.robot_model.rod_frames`."""

    centres: np.ndarray
    axes: np.ndarray
    rolls: np.ndarray

    @classmethod
    def from_caps(cls, robot: RobotConfig, caps: np.ndarray, rolls: np.ndarray | None = None) -> RodPoses:
        """Poses whose end caps best match ``caps`` (6, 3) (exact when the rod lengths are right)."""
        rods = np.asarray(robot.topology.rods)
        first, second = caps[rods[:, 0]], caps[rods[:, 1]]
        axes = second - first
        return cls(
            centres=0.5 * (first + second),
            axes=axes / np.linalg.norm(axes, axis=1, keepdims=True),
            rolls=np.zeros(3) if rolls is None else np.asarray(rolls, float),
        )

    def caps(self, robot: RobotConfig) -> np.ndarray:
        """End-cap centres (6, 3) in metres."""
        half = 0.5 * robot.rod.length_m
        out = np.empty((6, 3))
        for r, (a, b) in enumerate(robot.topology.rods):
            out[a] = self.centres[r] - half * self.axes[r]
            out[b] = self.centres[r] + half * self.axes[r]
        return out


@dataclass(frozen=True)
class Evidence:
    """What one frame offers. ``sighted`` (6, 3): camera end-cap centres (NaN where
    not seen), ``sighting_sigma_m`` (6,); ``cables_m`` (9,): sensed lengths (NaN
    where missing); ``prior_caps`` (6, 3) and ``prior_rolls`` (3,): the motion
    prediction with its std ``motion_sigma_m``."""

    sighted: np.ndarray
    sighting_sigma_m: np.ndarray
    cables_m: np.ndarray
    prior_caps: np.ndarray
    prior_rolls: np.ndarray
    motion_sigma_m: float


@dataclass(frozen=True)
class Solution:
    """The fused poses, per-cap sighting residuals (6,) m (NaN where not seen) and the
    cable residuals (9,) m (NaN where missing)."""

    poses: RodPoses
    sighting_residual_m: np.ndarray
    cable_residual_m: np.ndarray
    cost: float


class PoseFusion:
    """Solves one frame. ``cables``: the attachment model; ``cable_sigma_m`` and
    ``roll_sigma_rad`` weight the sensor and roll-prior residuals."""

    def __init__(self, robot: RobotConfig, cables: list[Cable], cable_sigma_m: float, roll_sigma_rad: float) -> None:
        self.robot = robot
        self.cables = cables
        self.cable_sigma_m = cable_sigma_m
        self.roll_sigma_rad = roll_sigma_rad
        rods = np.asarray(robot.topology.rods)
        self._cap_rod = np.empty(6, int)
        self._cap_sign = np.empty(6)
        self._cap_rod[rods[:, 0]], self._cap_rod[rods[:, 1]] = np.arange(3), np.arange(3)
        self._cap_sign[rods[:, 0]], self._cap_sign[rods[:, 1]] = -1.0, 1.0

    def _unpack(self, x: np.ndarray, start: RodPoses, bases: np.ndarray) -> tuple[np.ndarray, ...]:
        """Centres (K, 3, 3), axes (K, 3, 3), rolls (K, 3) and caps (K, 6, 3) of parameters x (K, 18)."""
        tilt = x[:, 9:15].reshape(-1, 3, 2)
        axes = start.axes + np.einsum("nrk,rkj->nrj", tilt, bases)
        axes = axes / np.linalg.norm(axes, axis=-1, keepdims=True)
        centres = start.centres + x[:, :9].reshape(-1, 3, 3)
        half = 0.5 * self.robot.rod.length_m
        caps = centres[:, self._cap_rod] + (half * self._cap_sign)[:, None] * axes[:, self._cap_rod]
        return centres, axes, start.rolls + x[:, 15:18], caps

    def solve(self, start: RodPoses, evidence: Evidence, max_evaluations: int = 200) -> Solution:
        """The poses minimising the weighted squared residuals of ``evidence``, from ``start``
        (at most ``max_evaluations`` residual evaluations).

        The Jacobian is taken by forward differences, all 18 perturbations evaluated
        in one vectorised call."""
        bases = _tangent_bases(start.axes)
        seen = np.isfinite(evidence.sighted).all(axis=1)
        sensed = np.isfinite(evidence.cables_m)
        radius = self.robot.end_cap.radius_m

        def residuals(x: np.ndarray) -> np.ndarray:
            _, _, rolls, caps = self._unpack(x, start, bases)
            lengths = cable_lengths_from_caps(self.robot, self.cables, caps, rolls)
            batch = len(x)
            return np.concatenate(
                [
                    ((caps[:, seen] - evidence.sighted[seen]) / evidence.sighting_sigma_m[seen, None]).reshape(
                        batch, -1
                    ),
                    (lengths[:, sensed] - evidence.cables_m[sensed]) / self.cable_sigma_m,
                    ((caps - evidence.prior_caps) / evidence.motion_sigma_m).reshape(batch, -1),
                    (rolls - evidence.prior_rolls) / self.roll_sigma_rad,
                    np.minimum(caps[..., 2] - radius, 0.0) / _GROUND_SIGMA_M,
                ],
                axis=1,
            )

        def jacobian(x: np.ndarray) -> np.ndarray:
            points = np.vstack([x, x + _STEP * np.eye(18)])
            values = residuals(points)
            return ((values[1:] - values[0]) / _STEP).T

        fit = least_squares(
            lambda x: residuals(x[None])[0],
            np.zeros(18),
            jac=jacobian,
            method="lm",
            xtol=1e-8,
            max_nfev=max_evaluations,
        )
        centres, axes, rolls, caps = (v[0] for v in self._unpack(fit.x[None], start, bases))
        poses = RodPoses(centres=centres, axes=axes, rolls=rolls)
        sighting = np.full(6, np.nan)
        sighting[seen] = np.linalg.norm(caps[seen] - evidence.sighted[seen], axis=1)
        cable = np.full(9, np.nan)
        cable[sensed] = (cable_lengths_from_caps(self.robot, self.cables, caps, rolls) - evidence.cables_m)[sensed]
        return Solution(poses=poses, sighting_residual_m=sighting, cable_residual_m=cable, cost=float(fit.cost))


def _tangent_bases(axes: np.ndarray) -> np.ndarray:
    """Two unit vectors (3, 2, 3) perpendicular to each axis (3, 3) and to each other."""
    helper = np.where(np.abs(axes[:, :1]) < 0.9, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    first = np.cross(axes, helper)
    first /= np.linalg.norm(first, axis=1, keepdims=True)
    return np.stack([first, np.cross(axes, first)], axis=1)
