"""The robot's 2D pose and how actions move it: the vocabulary of trajectory following (seed 002).

A pose is the end caps' centroid (x, y, m, world frame) and the heading (rad,
:func:`pipeline.robot_model.heading_rad`: the principal axis, odd caps' centroid to the even
caps', turned 90 deg counter-clockwise). An :class:`ActionTable` says, per action, bottom face
(:data:`pipeline.gaits.symmetry.FACES`) and rolling direction (:data:`FORWARD` or
:data:`REVERSE`), how the pose moves: forward and lateral along the heading before the action
(m), the heading's change (rad, counter-clockwise positive), and the face the robot ends on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.gaits.symmetry import bottom_face
from pipeline.robot_model import heading_rad, wrapped_rad

FORWARD, REVERSE = 0, 1


@dataclass(frozen=True)
class ActionTable:
    """Motion of each action (A,) from each face (F,) in each direction (2,): arrays (A, F, 2);
    ``usable`` (A, F, 2) bool, the entries the planner may choose (None: all)."""

    names: tuple[str, ...]
    forward_m: np.ndarray
    lateral_m: np.ndarray
    rotation_rad: np.ndarray
    next_face: np.ndarray
    usable: np.ndarray | None = None

    def __post_init__(self) -> None:
        shape = (len(self.names), self.forward_m.shape[1], 2)
        for name in ("forward_m", "lateral_m", "rotation_rad", "next_face", "usable"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(f"ActionTable.{name}: shape {value.shape}, expected {shape}")

    @property
    def faces(self) -> int:
        return self.forward_m.shape[1]

    def turns_in_place(self, max_step_m: float) -> np.ndarray:
        """(A, F, 2) bool: the entries that end on the face they start from, having moved the robot
        less than ``max_step_m`` (m); one that ends there farther away rolled through every face."""
        step_m = np.hypot(self.forward_m, self.lateral_m)
        return (self.next_face == np.arange(self.faces)[None, :, None]) & (step_m < max_step_m)

    def motion(self, action: int, face: int, direction: int) -> tuple[float, float, float]:
        """The motion (forward m, lateral m, rotation rad) of ``action`` from ``face`` in ``direction``."""
        return (
            float(self.forward_m[action, face, direction]),
            float(self.lateral_m[action, face, direction]),
            float(self.rotation_rad[action, face, direction]),
        )


@dataclass(frozen=True)
class Pose:
    """The robot's 2D pose: centroid (m, world) and heading (rad)."""

    x_m: float
    y_m: float
    heading_rad: float

    def moved(self, forward_m: float, lateral_m: float, rotation_rad: float) -> Pose:
        """The pose after a motion given along the heading before it."""
        c, s = math.cos(self.heading_rad), math.sin(self.heading_rad)
        return Pose(
            self.x_m + c * forward_m - s * lateral_m,
            self.y_m + s * forward_m + c * lateral_m,
            self.heading_rad + rotation_rad,
        )

    def motion_to(self, after: Pose) -> tuple[float, float, float]:
        """The motion (forward m, lateral m, rotation rad) that takes this pose to ``after``: the
        inverse of :meth:`moved`, the rotation wrapped to [-pi, pi)."""
        dx, dy = after.x_m - self.x_m, after.y_m - self.y_m
        c, s = math.cos(self.heading_rad), math.sin(self.heading_rad)
        return c * dx + s * dy, -s * dx + c * dy, float(wrapped_rad(after.heading_rad - self.heading_rad))


def observed(caps_m: np.ndarray) -> tuple[Pose, int]:
    """The pose and the bottom face of the robot whose end caps are ``caps_m`` (6, 3), m, world."""
    centre = np.asarray(caps_m, float).mean(axis=0)
    return Pose(float(centre[0]), float(centre[1]), float(heading_rad(caps_m))), bottom_face(caps_m)
