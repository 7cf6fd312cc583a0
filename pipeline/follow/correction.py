"""Online correction of the action table from what the robot did (``follow.planner.correction_prior``).

The table comes from the identified simulator; the robot does not quite do what it says (the
sim-to-real gap as the planner feels it). A planner that trusts a biased table keeps choosing the
action whose prediction looks best, however often the robot then does something else: on the
twin, a roll the table says moves 4 cm to the right moves 1.5 cm to the left, and the robot
drifts off an arc one roll after another. So after every action the residual, the motion
observed minus the table's (body frame before the action: forward m, lateral m, rotation rad),
is kept per action, rolling direction and outcome (the face step it ended with), and the planner
plans with the table plus each action's shrunk mean residual

    correction_a = (sum of a's residuals + k * mean residual of a's group) / (n_a + k)

with ``k`` the prior weight (in actions) and the group the actions that roll the robot onto
another face, or those that do not (they share most of their bias: the same contact, the same
motors). An action never taken gets its group's mean; one taken often, its own.

An action that ended on another face than the table says (a turn in place that rolled the robot
over, a roll that rocked it back) did not do the table's motion a little wrong: it did something
else, at a tipping point the simulator put on the other side. Its residual says nothing of its
group's bias, so it stays out of the group's mean. An action is planned to end as it ended most
often in the run (the latest outcome among equals), with the mean residual of those times only:
averaged with the times it ended otherwise, a turn in place that rolled once in four would be
planned as a quarter of a roll. Where that outcome is the table's, the mean is shrunk towards the group's
as above; where it is not, it is the motion the action was seen to make (``k`` = 0: shrunk
towards its group, one such observation would count a third, and spread over the group, a turn
in place that rolled 0.26 m would have the planner expect every turn in place to roll).

The table itself is never changed: the correction lives for one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.follow.motion import ActionTable
from pipeline.robot_model import wrapped_rad


@dataclass
class Correction:
    """The residuals of one run, for a table of A actions and F faces: sums (A, 2, F, 3) and counts
    (A, 2, F) per action, direction and face step observed; whether each step is the table's (A, 2,
    F); the latest step seen (A, 2; -1 where none); and the group of each action (A, 2)."""

    table: ActionTable
    prior_weight: float
    sums: np.ndarray = field(init=False)
    counts: np.ndarray = field(init=False)
    agrees: np.ndarray = field(init=False)
    latest: np.ndarray = field(init=False)
    rolls: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        actions, faces = len(self.table.names), self.table.faces
        self.sums = np.zeros((actions, 2, faces, 3))
        self.counts = np.zeros((actions, 2, faces))
        self.agrees = np.zeros((actions, 2, faces), dtype=bool)
        self.latest = np.full((actions, 2), -1)
        self.rolls = self.table.next_face[:, 0, :] != 0

    def observe(
        self, action: int, face: int, direction: int, motion: tuple[float, float, float], end_face: int
    ) -> None:
        """The robot did ``motion`` (forward m, lateral m, rotation rad) and ended on ``end_face``
        when it ran ``action`` from ``face`` in ``direction``."""
        residual = np.subtract(motion, self.table.motion(action, face, direction))
        residual[2] = wrapped_rad(residual[2])
        faces = self.table.faces
        step = (end_face - face) % faces
        self.sums[action, direction, step] += residual
        self.counts[action, direction, step] += 1
        self.agrees[action, direction, step] = step == (self.table.next_face[action, face, direction] - face) % faces
        self.latest[action, direction] = step

    def outcomes(self) -> np.ndarray:
        """The face step each action is planned with (A, 2): the one it was seen to make most often,
        the latest among equals; -1 where it was never run."""
        most = self.counts.max(axis=-1, keepdims=True)
        latest = np.take_along_axis(self.counts, np.maximum(self.latest, 0)[..., None], axis=-1)
        step = np.where(latest == most, self.latest[..., None], np.argmax(self.counts, axis=-1)[..., None])[..., 0]
        return np.where(self.latest >= 0, step, -1)

    def residuals(self) -> np.ndarray:
        """The correction of each action and direction (A, 2, 3), as the module docstring says."""
        agreeing_sums = (self.sums * self.agrees[..., None]).sum(axis=2)
        agreeing_counts = (self.counts * self.agrees).sum(axis=2)
        group = np.zeros_like(agreeing_sums)
        for rolls in (True, False):
            for direction in (0, 1):
                members = self.rolls[:, direction] == rolls
                n = agreeing_counts[members, direction].sum()
                if n:
                    group[members, direction] = agreeing_sums[members, direction].sum(axis=0) / n
        outcomes = self.outcomes()
        step = np.maximum(outcomes, 0)[..., None]
        own_sums = np.take_along_axis(self.sums, step[..., None], axis=2)[:, :, 0]
        own_counts = np.take_along_axis(self.counts, step, axis=2)
        seen_otherwise = (outcomes >= 0) & ~np.take_along_axis(self.agrees, step, axis=2)[..., 0]
        k = np.where(seen_otherwise, 0.0, self.prior_weight)[..., None]
        return (own_sums + k * group) / (own_counts + k)

    def applied(self) -> ActionTable:
        """The table with :meth:`residuals` added to every face's motion and the outcomes seen."""
        t = self.table
        r = self.residuals()[:, None, :, :]  # (A, 1, 2, 3): the same on every face
        faces = np.arange(t.faces)[None, :, None]
        outcomes = self.outcomes()[:, None, :]
        next_face = np.where(outcomes >= 0, (faces + outcomes) % t.faces, t.next_face)
        return ActionTable(
            t.names, t.forward_m + r[..., 0], t.lateral_m + r[..., 1], t.rotation_rad + r[..., 2], next_face, t.usable
        )
