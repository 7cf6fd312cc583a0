"""The published Tribar gaits (Tribar paper), written for bottom caps (0, 2, 5).

Values are normalised actuated-cable targets. The rolling and clockwise gaits roll
onto a new face every cycle, so their full versions chain the unit over the three
faces by symmetry (left shift for rolling, right shift for clockwise turning); the
counter-clockwise gait keeps its face.
"""

from __future__ import annotations

from typing import get_args

import numpy as np

from pipeline.config.stages import CollectPolicyName
from pipeline.robot_model import REST_TARGET, shift_left, shift_right

ROLLING_UNIT = np.array([[1, 1, 0.1, 1, 1, 0.1], [0, 1, 1, 0, 1, 0.1]])
CCW_TURN = np.array([[1, 1, 1, 0, 1, 1], [1, 0, 1, 0, 1, 1], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], float)
CW_TURN_UNIT = np.array([[0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 1], [0, 0, 0.8, 0, 1, 1], [1, 1, 1, 1, 1, 1]])


def _over_three_faces(unit: np.ndarray, shift) -> np.ndarray:
    faces = [unit, shift(unit), shift(shift(unit))]
    return np.concatenate(faces, axis=0)


def published_gait(name: str) -> np.ndarray:
    """One full cycle (n, 6) of a published gait that returns to its starting face.

    Names: ``rolling`` (3 rolls, 6 targets), ``cw`` (12 targets), ``ccw`` (4 targets).
    """
    if name == "rolling":
        return _over_three_faces(ROLLING_UNIT, shift_left)
    if name == "cw":
        return _over_three_faces(CW_TURN_UNIT, shift_right)
    if name == "ccw":
        return CCW_TURN.copy()
    raise KeyError(name)


PUBLISHED_GAITS: tuple[str, ...] = tuple(name for name in get_args(CollectPolicyName) if name != "random")


PUBLISHED_CYCLES = {
    "rolling": np.vstack([published_gait("rolling")[:2], REST_TARGET]),
    "ccw": published_gait("ccw"),
    "cw": published_gait("cw")[:4],
}
"""One cycle of each published gait from face 0, ending at rest: the rolling unit (one roll),
the ccw turn, the first unit of the cw turn; the gaits stage scores them beside the gaits it finds."""
