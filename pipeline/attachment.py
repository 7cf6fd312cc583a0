"""Cable attachment points inferred from the robot's rest state (R2S2R paper, Fig. 5).

Every rod carries three attachment points on each end cap, on the cap sphere's
great circle perpendicular to the rod, 2*pi/3 apart; the rings at the two ends
are parallel (A-D, B-E, C-F are parallel to the rod). The engine describes them
by one phase per rod: the angle of a ring point about the rod axis, measured
from the rod-frame convention of :func:`pipeline.robot_model.rod_frames` (x away
from the robot's centroid). The phase is defined modulo 2*pi/3.

Procedure at rest (one rod lies in the centre, two on the sides):

1. the centre rod is the one whose middle is closest, on the ground plane, to
   the robot's centroid;
2. its point A is on top of the end cap (the paper's robot); B and C follow at
   +-2*pi/3, and the other cap's ring is parallel. The mirrored arrangement (A at
   the bottom) is the other construction a ring symmetric about the vertical
   plane can have; the one whose modelled cable lengths match the rest readings
   better is chosen (the twin is built the mirrored way);
3. the side rods' points follow from where their cables meet the centre rod's
   (G and H next to B and C). The cable sensors measure exactly these distances,
   so each side rod's phase is the one whose modelled rest lengths match the
   readings best, with the other phases held (two sweeps, 1-degree grid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig
from pipeline.robot_model import build_cables, cable_lengths_from_caps, rod_frames, rod_of_cap

_THIRD = 2 * np.pi / 3
_GRID = 120  # phase samples over 2*pi/3 (1 deg apart)


@dataclass(frozen=True)
class AttachmentEstimate:
    """``phase_rad`` (3,) per rod; ``centre_rod``; ``arrangement`` 'top' or 'bottom'
    (where the centre rod's point A is); ``points_m`` (6, 3, 3): each end cap's three
    attachment points in the world at rest; ``cable_residual_m`` (9,): modelled minus
    sensed rest lengths (m)."""

    phase_rad: tuple[float, float, float]
    centre_rod: int
    arrangement: str
    points_m: np.ndarray
    cable_residual_m: np.ndarray

    def site_errors_m(self, sites: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """Distance (m) from each known site (end cap, world point (3,)) to the nearest
        inferred point on the same end cap."""
        return np.array([np.linalg.norm(self.points_m[cap] - point, axis=1).min() for cap, point in sites])

    def overlay(self) -> dict[str, object]:
        """The robot-config overlay that the engine reads."""
        return {"attachment": {"phase_rad": [float(p) for p in self.phase_rad]}}


def _wrap_phase(angle: np.ndarray | float) -> np.ndarray | float:
    """Map angles to (-pi/3, pi/3] (a ring's phase is defined modulo 2*pi/3)."""
    return -(np.mod(-np.asarray(angle) + np.pi / 3, _THIRD) - np.pi / 3)


def ring_points(robot: RobotConfig, caps: np.ndarray, phases: np.ndarray) -> np.ndarray:
    """World attachment points (6, 3, 3) of every end cap for rod phases (3,) at caps (6, 3)."""
    _, rotations = rod_frames(robot, caps)
    r = robot.end_cap.radius_m
    out = np.empty((6, 3, 3))
    for cap, rod in rod_of_cap(robot).items():
        angles = phases[rod] + _THIRD * np.arange(3)
        local = np.column_stack([r * np.cos(angles), r * np.sin(angles), np.zeros(3)])
        out[cap] = caps[cap] + local @ rotations[rod].T
    return out


def _rest_misfit(robot: RobotConfig, caps: np.ndarray, phases: np.ndarray, sensed: np.ndarray) -> np.ndarray:
    """Modelled minus sensed rest cable lengths (9,) for rod phases (3,)."""
    return cable_lengths_from_caps(robot, build_cables(robot, tuple(phases)), caps) - sensed


def _side_phases(
    robot: RobotConfig, caps: np.ndarray, centre: int, centre_phase: float, sensed: np.ndarray
) -> np.ndarray:
    """Phases (3,) with the centre rod's fixed: each side rod's rings are turned to the
    phase whose cable lengths best match the rest readings (two sweeps over the side
    rods, on a 1-degree grid)."""
    phases = np.zeros(3)
    phases[centre] = centre_phase
    grid = np.linspace(-np.pi / 3, np.pi / 3, _GRID, endpoint=False)
    for _ in range(2):
        for rod in (r for r in range(3) if r != centre):
            trial = np.repeat(phases[None], _GRID, axis=0)
            trial[:, rod] = grid
            misfit = [np.sum(_rest_misfit(robot, caps, p, sensed) ** 2) for p in trial]
            phases[rod] = grid[int(np.argmin(misfit))]
    return phases


def infer_attachment(robot: RobotConfig, caps_rest: np.ndarray, cables_rest_m: np.ndarray) -> AttachmentEstimate:
    """Attachment points from the rest-state end-cap centres ``caps_rest`` (6, 3) m
    (world, z up) and the sensed rest cable lengths ``cables_rest_m`` (9,) m."""
    caps = np.asarray(caps_rest, float)
    sensed = np.asarray(cables_rest_m, float)
    if caps.shape != (6, 3) or not np.isfinite(caps).all():
        raise ValueError(f"caps_rest must be finite with shape (6, 3), got {caps.shape}")
    if sensed.shape != (9,) or not np.isfinite(sensed).all():
        raise ValueError(f"cables_rest_m must be finite with shape (9,), got {sensed.shape}")
    centres, rotations = rod_frames(robot, caps)
    centroid = caps.mean(axis=0)
    centre = int(np.argmin(np.linalg.norm(centres[:, :2] - centroid[:2], axis=1)))
    axis = rotations[centre][:, 2]
    up = np.array([0.0, 0.0, 1.0]) - axis[2] * axis
    top = float(np.arctan2(up @ rotations[centre][:, 1], up @ rotations[centre][:, 0]))
    candidates = {}
    for arrangement, angle in (("top", top), ("bottom", top + np.pi)):
        phases = _side_phases(robot, caps, centre, float(_wrap_phase(angle)), sensed)
        candidates[arrangement] = (phases, _rest_misfit(robot, caps, phases, sensed))
    arrangement = min(candidates, key=lambda k: float(np.sum(candidates[k][1] ** 2)))
    phases, residual = candidates[arrangement]
    return AttachmentEstimate(
        phase_rad=tuple(float(p) for p in phases),
        centre_rod=centre,
        arrangement=arrangement,
        points_m=ring_points(robot, caps, phases),
        cable_residual_m=residual,
    )


def config_attachment(robot: RobotConfig, caps_rest: np.ndarray) -> AttachmentEstimate:
    """The robot config's attachment points placed on the rest-state end caps ``caps_rest`` (6, 3)
    m: what a recording without cable readings (end caps only) can say. ``arrangement`` is
    ``config`` and the residuals are NaN (nothing was sensed to compare with)."""
    caps = np.asarray(caps_rest, float)
    centres, _ = rod_frames(robot, caps)
    phases = np.asarray(robot.attachment.phase_rad, float)
    return AttachmentEstimate(
        phase_rad=tuple(float(p) for p in phases),
        centre_rod=int(np.argmin(np.linalg.norm(centres[:, :2] - caps.mean(axis=0)[:2], axis=1))),
        arrangement="config",
        points_m=ring_points(robot, caps, phases),
        cable_residual_m=np.full(9, np.nan),
    )
