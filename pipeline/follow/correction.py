"""Online correction of the action table from what the robot did (``follow.planner.correction_prior``).

The table comes from the identified simulator; the robot does not quite do what it says (the
sim-to-real gap as the planner feels it). A planner that trusts a biased table keeps choosing
the action whose prediction looks best, however often the robot then does something else: on
the twin, a roll the table says moves 4 cm to the right moves 1.5 cm to the left, and the robot
drifts off an arc one roll after another. So after every action the residual, the motion
observed minus the table's (body frame before the action: forward m, lateral m, rotation rad),
is kept per action and rolling direction, and the planner plans with the table plus each
action's shrunk mean residual

    correction_a = (sum of a's residuals + k * mean residual of a's group) / (n_a + k)

with ``k`` the prior weight (in actions) and the group the actions that roll the robot onto
another face, or those that do not (they share most of their bias: the same contact, the same
motors). An action never taken gets its group's mean; one taken often, its own.

An action that ended on another face than the table says (a turn in place that rolled the robot
over, a roll that rocked it back) did not do the table's motion a little wrong: it did something
else, at a tipping point the simulator put on the other side. Its residual says nothing of its
group's bias, so it stays out of the group's mean, and the action is planned with its own mean
residual alone (``k`` = 0 for it): the motion it was seen to make. Shrunk towards its group, one
such observation would count a third; spread over the group, a turn in place that rolled 0.26 m
would have the planner expect every turn in place to roll.

The face an action ended on replaces the table's where it was seen. The table itself is never
changed: the correction lives for one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.follow.motion import ActionTable
from pipeline.robot_model import wrapped_rad


@dataclass
class Correction:
    """The residuals of one run, for a table of A actions: sums (A, 2, 3) and counts (A, 2) of
    every observation, the same of those that ended on the table's face (``agreeing_*``), the
    observed face step (A, 2; -1 where not seen) and the group of each action (A, 2)."""

    table: ActionTable
    prior_weight: float
    sums: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    agreeing_sums: np.ndarray = field(init=False)
    agreeing_counts: np.ndarray = field(init=False)
    face_steps: np.ndarray = field(init=False)
    rolls: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        actions = len(self.table.names)
        self.sums = np.zeros((actions, 2, 3))
        self.counts = np.zeros((actions, 2))
        self.agreeing_sums = np.zeros((actions, 2, 3))
        self.agreeing_counts = np.zeros((actions, 2))
        self.face_steps = np.full((actions, 2), -1)
        self.rolls = self.table.next_face[:, 0, :] != 0

    def observe(
        self, action: int, face: int, direction: int, motion: tuple[float, float, float], end_face: int
    ) -> None:
        """The robot did ``motion`` (forward m, lateral m, rotation rad) and ended on ``end_face``
        when it ran ``action`` from ``face`` in ``direction``."""
        residual = np.subtract(motion, self.table.motion(action, face, direction))
        residual[2] = wrapped_rad(residual[2])
        self.sums[action, direction] += residual
        self.counts[action, direction] += 1
        step = (end_face - face) % self.table.faces
        if step == (self.table.next_face[action, face, direction] - face) % self.table.faces:
            self.agreeing_sums[action, direction] += residual
            self.agreeing_counts[action, direction] += 1
        self.face_steps[action, direction] = step

    def residuals(self) -> np.ndarray:
        """The correction of each action and direction (A, 2, 3), as the module docstring says."""
        group = np.zeros_like(self.sums)
        for rolls in (True, False):
            for direction in (0, 1):
                members = self.rolls[:, direction] == rolls
                n = self.agreeing_counts[members, direction].sum()
                if n:
                    group[members, direction] = self.agreeing_sums[members, direction].sum(axis=0) / n
        k = np.where(self.agreeing_counts < self.counts, 0.0, self.prior_weight)[..., None]
        return (self.sums + k * group) / (self.counts[..., None] + k)

    def applied(self) -> ActionTable:
        """The table with :meth:`residuals` added to every face's motion and the faces seen."""
        t = self.table
        r = self.residuals()[:, None, :, :]  # (A, 1, 2, 3): the same on every face
        faces = np.arange(t.faces)[None, :, None]
        seen = self.face_steps[:, None, :] >= 0
        next_face = np.where(seen, (faces + self.face_steps[:, None, :]) % t.faces, t.next_face)
        return ActionTable(
            t.names, t.forward_m + r[..., 0], t.lateral_m + r[..., 1], t.rotation_rad + r[..., 2], next_face, t.usable
        )
