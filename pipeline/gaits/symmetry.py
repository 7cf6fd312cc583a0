"""Symmetry maps of target shapes between the robot's faces (seed 002, SM S6).

A target is six normalised actuated-cable lengths ``[a0..a5]``: cables 0-2 on the
odd side, 3-5 on the even side. Rolling onto the next face left-shifts each side,
the clockwise turning gait rolls the other way and right-shifts.
"""

from __future__ import annotations

import numpy as np

_LEFT = np.array([1, 2, 0, 4, 5, 3])
_RIGHT = np.array([2, 0, 1, 5, 3, 4])


def shift_left(targets: np.ndarray) -> np.ndarray:
    """``[a0..a5] -> [a1, a2, a0, a4, a5, a3]`` on the last axis of ``targets`` (..., 6)."""
    return np.asarray(targets)[..., _LEFT]


def shift_right(targets: np.ndarray) -> np.ndarray:
    """``[a0..a5] -> [a2, a0, a1, a5, a3, a4]``, the inverse of :func:`shift_left`."""
    return np.asarray(targets)[..., _RIGHT]
