"""Symmetry maps of target shapes between the robot's faces (Tribar paper, SM S6).

A target is six normalised actuated-cable lengths ``[a0..a5]``: cables 0-2 on the
odd side, 3-5 on the even side. Rolling onto the next face left-shifts each side,
the clockwise turning gait rolls the other way and right-shifts (:func:`shift_left`,
:func:`shift_right`, defined with the robot model's conventions). Reversing a gait
(rolling backward instead of forward) relabels the cables by the prism's 2-fold
symmetry found from geometry (R2S2R paper), which swaps the odd and even sides.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from pipeline.config import RobotConfig
from pipeline.robot_model import N_CAPS, reference_prism, resting_on_face, shift_left

FACES = ((0, 2, 3, 5), (1, 2, 4, 5), (0, 1, 3, 4))
"""The robot's three rolling faces (Tribar paper): the four end caps nearest the ground.
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


def to_face(targets: np.ndarray, from_face: int, to_face: int) -> np.ndarray:
    """Map targets (..., 6) written for bottom face ``from_face`` to face ``to_face``.

    Faces are indices into :data:`FACES`; one forward face step (k -> k + 1 mod 3) is one
    :func:`shift_left`, so the map is ``(to_face - from_face) mod 3`` left shifts.
    """
    out = np.asarray(targets)
    for _ in range((to_face - from_face) % 3):
        out = shift_left(out)
    return out


def support_triangle(robot: RobotConfig, face: int) -> tuple[int, int, int]:
    """Three caps of :data:`FACES` ``[face]`` the reference prism can rest on.

    The first triple (in ``itertools.combinations`` order) for which the prism placed on it
    with :func:`~pipeline.robot_model.resting_on_face` has every other cap above the
    ground; for face 0 that is (0, 2, 5), the published gaits' starting triangle.
    """
    caps = reference_prism(robot)
    for triangle in itertools.combinations(FACES[face], 3):
        heights = resting_on_face(robot, caps, triangle)[:, 2]
        others = [i for i in range(N_CAPS) if i not in triangle]
        if (heights[others] > robot.end_cap.radius_m + 1e-6).all():
            return triangle
    raise ValueError(f"the reference prism cannot rest on any three caps of face {face} {FACES[face]}")


@functools.lru_cache(maxsize=16)
def reversal_caps(robot: RobotConfig, face: int) -> tuple[int, ...]:
    """End-cap relabelling (6,) of the reversal on ``face``: cap ``i`` -> ``out[i]`` (R2S2R paper).

    The reference prism resting on :func:`support_triangle` is rotated by pi about the
    vertical through its centroid; each rotated cap ``i`` is matched to the closest
    original cap ``out[i]``. Raises ``ValueError`` if the matching is not a bijection.
    """
    caps = resting_on_face(robot, reference_prism(robot), support_triangle(robot, face))
    rotated = caps.copy()
    rotated[:, :2] = 2 * caps[:, :2].mean(axis=0) - caps[:, :2]
    distances = np.linalg.norm(rotated[:, None, :] - caps[None, :, :], axis=-1)
    closest = distances.argmin(axis=1)
    if len(set(closest.tolist())) != N_CAPS:
        raise ValueError(
            f"reversal on face {face}: rotated caps match original caps {closest.tolist()}, not a bijection"
        )
    return tuple(int(i) for i in closest)


def cable_permutation(robot: RobotConfig, cap_map: tuple[int, ...], label: str) -> np.ndarray:
    """The actuated-cable relabelling (6,) int of an end-cap relabelling ``cap_map`` (cap ``i`` ->
    ``cap_map[i]``): cable ``j`` (caps a, b) -> the cable joining ``cap_map[a]``, ``cap_map[b]``.
    Raises ``ValueError`` (naming ``label``) if no actuated cable joins them."""
    index = {frozenset(pair): j for j, pair in enumerate(robot.topology.actuated)}
    image = []
    for j, (a, b) in enumerate(robot.topology.actuated):
        mapped = frozenset((cap_map[a], cap_map[b]))
        if mapped not in index:
            raise ValueError(
                f"{label}: actuated cable {j} ({a}-{b}) maps to caps {cap_map[a]}-{cap_map[b]}, "
                "which no actuated cable joins"
            )
        image.append(index[mapped])
    return np.array(image)


def relabel(targets: np.ndarray, permutation: np.ndarray) -> np.ndarray:
    """Targets (..., 6) with cable ``j``'s value moved to cable ``permutation[j]``."""
    targets = np.asarray(targets)
    out = np.empty_like(targets)
    out[..., permutation] = targets
    return out


def reversal_permutation(robot: RobotConfig, face: int) -> np.ndarray:
    """Actuated-cable relabelling (6,) int that reverses a gait written for bottom face ``face``.

    Cable ``j`` (joining caps a, b) maps to cable ``out[j]``, the cable joining the caps that
    :func:`reversal_caps` maps a and b to. The reversed gait gives cable ``out[j]`` the
    target the original gives cable ``j`` (:func:`reverse`), so the robot performs the
    original motion rotated by pi about the vertical: rolling forward becomes rolling
    backward. The map swaps the odd-side and even-side cables.
    """
    return cable_permutation(robot, reversal_caps(robot, face), f"reversal on face {face}")


def reverse(targets: np.ndarray, robot: RobotConfig, face: int) -> np.ndarray:
    """Targets (..., 6) for bottom face ``face`` -> the mirror-direction gait on the same face."""
    return relabel(targets, reversal_permutation(robot, face))
