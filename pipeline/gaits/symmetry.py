"""Symmetry maps of target shapes between the robot's faces (seed 002, SM S6).

A target is six normalised actuated-cable lengths ``[a0..a5]``: cables 0-2 on the
odd side, 3-5 on the even side. Rolling onto the next face left-shifts each side,
the clockwise turning gait rolls the other way and right-shifts.
"""

from __future__ import annotations

import itertools

import numpy as np

_LEFT = np.array([1, 2, 0, 4, 5, 3])
_RIGHT = np.array([2, 0, 1, 5, 3, 4])


def shift_left(targets: np.ndarray) -> np.ndarray:
    """``[a0..a5] -> [a1, a2, a0, a4, a5, a3]`` on the last axis of ``targets`` (..., 6)."""
    return np.asarray(targets)[..., _LEFT]


def shift_right(targets: np.ndarray) -> np.ndarray:
    """``[a0..a5] -> [a2, a0, a1, a5, a3, a4]``, the inverse of :func:`shift_left`."""
    return np.asarray(targets)[..., _RIGHT]


FACES = ((0, 2, 3, 5), (1, 2, 4, 5), (0, 1, 3, 4))
"""The robot's three rolling faces (seed 002): the four end caps nearest the ground.
Rolling forward with the published gait visits them in this order; face k's gait
is the face-0 gait left-shifted k times."""


def bottom_face(caps_m: np.ndarray) -> int:
    """Index into :data:`FACES` of the face lying on the ground.

    ``caps_m`` (6, 3) end-cap centres (m, world, z up): the face whose four caps
    have the lowest mean height.
    """
    heights = np.asarray(caps_m)[:, 2]
    return int(np.argmin([heights[list(face)].mean() for face in FACES]))


def count_rolls(faces: np.ndarray, min_dwell: int = 1) -> tuple[int, int]:
    """Count forward and backward rolls in a sequence of :func:`bottom_face` indices.

    A face must persist for ``min_dwell`` samples to count, so brief rocking does
    not. Forward is face k -> k+1 (mod 3). Returns ``(forward, backward)``.
    """
    settled: list[int] = []
    run_face, run_length = None, 0
    for face in np.asarray(faces, int):
        run_length = run_length + 1 if face == run_face else 1
        run_face = face
        if run_length == min_dwell and (not settled or settled[-1] != face):
            settled.append(int(face))
    forward = sum(1 for a, b in itertools.pairwise(settled) if b == (a + 1) % 3)
    return forward, max(len(settled) - 1, 0) - forward
