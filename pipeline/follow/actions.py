"""The Tribar paper's action set for trajectory following (seed 002), on our robot.

Each action is one gait cycle from bottom face 0 that ends at the rest shape (targets (n, 6)):

- ``roll_<R>``: the quasistatic rolling gait's one roll (:data:`pipeline.published_gaits.ROLLING_UNIT`)
  at range R mm, R = 90, 100, ..., 150;
- ``roll_<L>_<R>``: the same roll with range L on the robot's left side (the cables joining the
  odd end caps, left of the heading) and R on its right (the even caps): a larger step on one side
  turns the robot gradually towards the other (42 ordered pairs of different ranges);
- ``ccw`` and ``cw``: the turning gaits in place at range 100 mm.

The paper's range is a gait parameter: a gait's target t commands the cable length
min + t * R, with the minimum length 100 mm. Ours are the robot config's
``actuated_cable.min_length_m`` (100 mm for the Tribar, as in the paper) and ``range_m``, the
length a normalised target of 1 commands (100 mm). So a range R scales the gait's targets by
R / ``range_m``: 0.9 to 1.5 on the Tribar, whose cables reach the 250 mm that 150 mm of range
asks for. Targets above 1 are the point: on our robot a roll at less than 0.95 of the config's
range rocks the prism and lets it fall back (``docs/follow.md``). The rest shape that ends each
action is not scaled, so every action starts and ends at the same rest.

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


def scaled(robot: RobotConfig, shapes: np.ndarray, left_mm: float, right_mm: float) -> np.ndarray:
    """``shapes`` (n, 6) normalised targets at the gait ranges ``left_mm`` and ``right_mm`` (mm)
    on each side (module docstring), then the rest shape: targets (n + 1, 6)."""
    config_range_mm = 1000.0 * robot.actuated_cable.range_m
    scale = np.full(6, right_mm / config_range_mm)
    scale[list(LEFT_CABLES)] = left_mm / config_range_mm
    return np.vstack([np.asarray(shapes, float) * scale, REST_TARGET])


def paper_actions(robot: RobotConfig) -> list[Action]:
    """The 51 actions of the module docstring for ``robot``, in order: rolls, gradual turns,
    turns in place."""
    actions = [Action(f"roll_{r}", scaled(robot, ROLLING_UNIT, r, r)) for r in ROLLING_RANGES_MM]
    actions += [
        Action(f"roll_{left}_{right}", scaled(robot, ROLLING_UNIT, left, right))
        for left in ROLLING_RANGES_MM
        for right in ROLLING_RANGES_MM
        if left != right
    ]
    turns = {"ccw": CCW_TURN[:-1], "cw": CW_TURN_UNIT[:-1]}  # their last shape is the rest
    actions += [
        Action(name, scaled(robot, shapes, TURNING_RANGE_MM, TURNING_RANGE_MM)) for name, shapes in turns.items()
    ]
    return actions


def iteration_actions(
    robot: RobotConfig, found_gaits: dict[str, np.ndarray], names: tuple[str, ...] | None = None
) -> list[Action]:
    """The actions of an iteration's table: :func:`paper_actions` (those ``names``, all if None),
    then each gait the gaits stage found (targets (n, 6) from face 0, ending at rest) as
    ``gait_<objective>``. :class:`ConfigError` for a name that is no paper action."""
    paper = paper_actions(robot)
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
