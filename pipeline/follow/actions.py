"""The Tribar paper's action set for trajectory following (seed 002), on our robot.

Each action is one gait cycle from bottom face 0 that ends at the rest shape (targets (n, 6)):

- ``roll_<R>``: the quasistatic rolling gait's one roll (:data:`pipeline.published_gaits.ROLLING_UNIT`)
  at range R mm, R = 90, 100, ..., 150;
- ``roll_<L>_<R>``: the same roll with range L on the robot's left side (the cables joining the
  odd end caps, left of the heading) and R on its right (the even caps): a larger step on one side
  turns the robot gradually towards the other (42 ordered pairs of different ranges);
- ``ccw`` and ``cw``: the turning gaits in place at range 100 mm.

The paper's ranges are millimetres of cable travel above the minimum length on a robot whose
largest range is 150 mm; ours is ``actuated_cable.range_m``. A range R becomes the scale
R / 150 mm on the normalised targets (the paper's largest range is our whole range): each target
t of the gait's shapes becomes t * R / 150, so 0 stays the minimum length. The rest shape that
ends each action is not scaled, so every action starts and ends at the same rest.

An action is written once, for face 0; :func:`on_face` maps it to another bottom face and to
rolling in reverse by the gait symmetries (:mod:`pipeline.gaits.symmetry`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig
from pipeline.errors import ConfigError
from pipeline.gaits.symmetry import reverse, to_face
from pipeline.published_gaits import CCW_TURN, CW_TURN_UNIT, ROLLING_UNIT
from pipeline.robot_model import REST_TARGET

PAPER_FULL_RANGE_MM = 150.0
"""The Tribar paper's largest gait range, mapped to our whole cable range."""
ROLLING_RANGES_MM = tuple(range(90, 151, 10))
TURNING_RANGE_MM = 100.0
LEFT_CABLES = (0, 1, 2)
"""Actuated cables joining the odd end caps: the robot's left side, looking along its heading
(the principal axis points from the odd caps to the even ones, the heading 90 deg to its left)."""


@dataclass(frozen=True)
class Action:
    """One action: its name and its targets (n, 6) from bottom face 0, ending at rest."""

    name: str
    targets: np.ndarray


def _scaled(shapes: np.ndarray, left_mm: float, right_mm: float) -> np.ndarray:
    """``shapes`` (n, 6) at the given ranges on each side, then the rest shape."""
    scale = np.full(6, right_mm / PAPER_FULL_RANGE_MM)
    scale[list(LEFT_CABLES)] = left_mm / PAPER_FULL_RANGE_MM
    return np.vstack([np.asarray(shapes, float) * scale, REST_TARGET])


def paper_actions() -> list[Action]:
    """The 51 actions of the module docstring, in order: rolls, gradual turns, turns in place."""
    actions = [Action(f"roll_{r}", _scaled(ROLLING_UNIT, r, r)) for r in ROLLING_RANGES_MM]
    actions += [
        Action(f"roll_{left}_{right}", _scaled(ROLLING_UNIT, left, right))
        for left in ROLLING_RANGES_MM
        for right in ROLLING_RANGES_MM
        if left != right
    ]
    turns = {"ccw": CCW_TURN[:-1], "cw": CW_TURN_UNIT[:-1]}  # their last shape is the rest
    actions += [Action(name, _scaled(shapes, TURNING_RANGE_MM, TURNING_RANGE_MM)) for name, shapes in turns.items()]
    return actions


def iteration_actions(found_gaits: dict[str, np.ndarray], names: tuple[str, ...] | None = None) -> list[Action]:
    """The actions of an iteration's table: :func:`paper_actions` (those ``names``, all if None),
    then each gait the gaits stage found (targets (n, 6) from face 0, ending at rest) as
    ``gait_<objective>``. :class:`ConfigError` for a name that is no paper action."""
    paper = paper_actions()
    if names is not None:
        unknown = sorted(set(names) - {a.name for a in paper})
        if unknown:
            raise ConfigError(f"follow.table.paper_actions: unknown actions {unknown}; see pipeline.follow.actions")
        paper = [a for a in paper if a.name in names]
    return paper + [Action(f"gait_{name}", np.asarray(t, float)) for name, t in found_gaits.items()]


def on_face(action: Action, robot: RobotConfig, face: int, reverse_direction: bool) -> np.ndarray:
    """The action's targets (n, 6) from bottom ``face``, rolling forward or in reverse."""
    targets = to_face(action.targets, 0, face)
    return reverse(targets, robot, face) if reverse_direction else targets
