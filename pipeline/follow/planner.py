"""The Tribar paper's trajectory-following planner (seed 002): an exhaustive search over an
action table.

Poses and action tables are those of :mod:`pipeline.follow.motion`.

:func:`plan` tries every sequence of ``depth`` actions (the paper: two) from the current pose,
face and rolling direction (a turn in place also reversed, where ``turn_either_way``), and
returns the first action of the sequence that costs least (``cost``: the sum over the poses
after each of its actions, or the paper's, its final pose), a pose costing

    w_d * |x - p_i| + w_a * angle(h, b_i) + w_p * (n - 1 - i) / (n - 1)

with ``p_i`` the segment's waypoint nearest the predicted position ``x`` (of ``n``), ``h`` the
heading the robot rolls along (reversed when it rolls in reverse) and ``b_i`` the direction it
should head in: towards the path's point ``lookahead_m`` further along than ``p_i`` (the paper's,
with ``lookahead_m`` 0: the segment's tangent at ``p_i``). Distance from the path, angle to it,
and how far from the segment's end the robot still is.

:class:`Follower` keeps the segment and the direction: a segment ends within ``switch_radius_m``
of its last waypoint or where that waypoint is the nearest; at each new segment the robot rolls
forward if its heading points along the segment (``h . u >= 0``, the paper's principal-axis
cross product) and in reverse otherwise, as its symmetry allows. The path ends within
``end_radius_m`` of its last waypoint, or where that waypoint is the nearest and the cheapest
sequence is not predicted to bring the robot closer. With ``correction_prior`` set the planner
searches the table as corrected by what the robot did so far in the run
(:mod:`pipeline.follow.correction`).
Everything here is pure (numpy); :func:`follow_table` runs the loop on a table's motion.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.config.follow import PlannerConfig
from pipeline.follow.correction import Correction
from pipeline.follow.motion import FORWARD, REVERSE, ActionTable, Pose
from pipeline.follow.paths import Path
from pipeline.robot_model import wrapped_rad


@dataclass(frozen=True)
class Step:
    """One replan: the action chosen (index) and the direction it runs in, the pose it predicts,
    the pose the whole cheapest sequence predicts, and that sequence's cost."""

    action: int
    direction: int
    predicted: Pose
    final: Pose
    cost: float


def _nearest(segment: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Index of the waypoint of ``segment`` (n, 2) nearest each position (...)."""
    d2 = (x[..., None] - segment[:, 0]) ** 2 + (y[..., None] - segment[:, 1]) ** 2
    return np.argmin(d2, axis=-1)


def path_cost(
    segment: np.ndarray, x: np.ndarray, y: np.ndarray, heading: np.ndarray, config: PlannerConfig
) -> np.ndarray:
    """The cost (module docstring) of poses (...) on ``segment`` (n, 2); ``heading`` is the one the
    robot rolls along."""
    i = _nearest(segment, x, y)
    n = len(segment)
    distance = np.hypot(x - segment[i, 0], y - segment[i, 1])
    angle = np.abs(wrapped_rad(heading - _heading_target(segment, i, x, y, config.lookahead_m)))
    progress = (n - 1 - i) / (n - 1)
    return (
        config.distance_weight_per_m * distance
        + config.angle_weight_per_rad * angle
        + config.progress_weight * progress
    )


def _heading_target(segment: np.ndarray, i: np.ndarray, x: np.ndarray, y: np.ndarray, lookahead_m: float) -> np.ndarray:
    """The heading (rad) a robot at (``x``, ``y``) nearest waypoint ``i`` of ``segment`` should have:
    towards the point ``lookahead_m`` further along the segment (past its end, along its last
    leg), or with ``lookahead_m`` 0 along the segment's tangent at ``i``."""
    legs = np.diff(segment, axis=0)
    if lookahead_m == 0:
        tangent = np.vstack([legs, legs[-1:]])[i]
        return np.arctan2(tangent[..., 1], tangent[..., 0])
    along = np.concatenate([[0.0], np.cumsum(np.hypot(legs[:, 0], legs[:, 1]))])
    wanted = along[i] + lookahead_m
    beyond = np.maximum(wanted - along[-1], 0.0)
    last = legs[-1] / np.hypot(*legs[-1])
    target = np.stack([np.interp(wanted, along, segment[:, k]) + beyond * last[k] for k in (0, 1)], axis=-1)
    return np.arctan2(target[..., 1] - y, target[..., 0] - x)


def plan(table: ActionTable, segment: np.ndarray, pose: Pose, face: int, direction: int, config: PlannerConfig) -> Step:
    """The first action of the cheapest sequence of ``config.depth`` actions (module docstring),
    ``direction`` the one the robot rolls in. Every action of a sequence runs in ``direction``;
    with ``config.turn_either_way`` a turn in place (:meth:`ActionTable.turns_in_place`) may also
    run in the other."""
    x = np.array([pose.x_m])
    y = np.array([pose.y_m])
    heading = np.array([pose.heading_rad])
    faces = np.array([face])
    cost = np.zeros(1)
    flip = math.pi if direction == REVERSE else 0.0  # the heading the robot rolls along
    directions = (FORWARD, REVERSE) if config.turn_either_way else (direction,)
    entries = len(table.names) * len(directions)  # entry e: action e // len(directions), that direction
    allowed = table.turns_in_place(config.turn_max_step_m)
    allowed[..., direction] = True
    if table.usable is not None:
        allowed &= table.usable
    blocked = np.zeros(1, bool)  # a sequence with an entry it may not take

    def per_entry(values: np.ndarray) -> np.ndarray:
        """``values`` (A, F, 2) of each sequence's face, (B, entries)."""
        return values[:, faces][..., directions].transpose(1, 0, 2).reshape(len(faces), entries)

    for _ in range(config.depth):  # every sequence so far (B,) times every entry: (B * entries,)
        blocked = np.repeat(blocked, entries) | ~per_entry(allowed).ravel()
        forward, lateral = per_entry(table.forward_m), per_entry(table.lateral_m)
        c, s = np.cos(heading)[:, None], np.sin(heading)[:, None]
        x = (x[:, None] + c * forward - s * lateral).ravel()
        y = (y[:, None] + s * forward + c * lateral).ravel()
        heading = (heading[:, None] + per_entry(table.rotation_rad)).ravel()
        faces = per_entry(table.next_face).ravel()
        here = path_cost(segment, x, y, heading + flip, config)
        cost = here if config.cost == "final" else np.repeat(cost, entries) + here
    if not blocked.all():
        cost = np.where(blocked, np.inf, cost)
    best = int(np.argmin(cost))
    first, chosen = divmod(best // entries ** (config.depth - 1), len(directions))
    final = Pose(float(x[best]), float(y[best]), float(heading[best]))
    moved = pose.moved(*table.motion(first, face, directions[chosen]))
    return Step(first, directions[chosen], moved, final, float(cost[best]))


def moving(table: ActionTable, min_step_m: float, min_turn_rad: float) -> ActionTable:
    """``table`` with ``usable`` cleared where an entry moves the robot less than ``min_step_m``
    (m) and turns it less than ``min_turn_rad`` (rad): a gait cycle for nothing. Every depth-limited
    search is blind to time: it would pick such an action (it costs nothing and spoils nothing)
    turn after turn where every useful action costs something first, as at a corner, where
    a turn in place that shifts the robot by a few centimetres is what gets it round."""
    still = (np.hypot(table.forward_m, table.lateral_m) < min_step_m) & (np.abs(table.rotation_rad) < min_turn_rad)
    usable = ~still if table.usable is None else table.usable & ~still
    return dataclasses.replace(table, usable=usable)


def rolling_direction(segment: np.ndarray, heading_rad: float) -> int:
    """:data:`FORWARD` if the heading points along ``segment``'s first leg, else :data:`REVERSE`."""
    u = segment[1] - segment[0]
    return FORWARD if math.cos(heading_rad) * u[0] + math.sin(heading_rad) * u[1] >= 0 else REVERSE


@dataclass
class Follower:
    """Follows ``path`` segment by segment: :meth:`step` takes the pose and face observed after
    the last action and returns the next action (None once the path is done); :meth:`observe`
    tells it what the action did, for the ``correction`` of the table where there is one
    (:mod:`pipeline.follow.correction`) and to keep an action that did next to nothing from
    being run again straight away (:meth:`planning_table`)."""

    table: ActionTable
    path: Path
    config: PlannerConfig
    end_radius_m: float
    correction: Correction | None = None
    segment: int = 0
    direction: int = FORWARD
    started: bool = field(default=False, init=False)
    idle: tuple[int, int, int] | None = field(default=None, init=False)

    def _last_segment(self) -> bool:
        return self.segment == len(self.path.segments) - 1

    def _passed(self, pose: Pose) -> bool:
        """Whether the segment's last waypoint is the one nearest ``pose``."""
        points = self.path.segments[self.segment]
        return int(_nearest(points, np.array(pose.x_m), np.array(pose.y_m))) == len(points) - 1

    def _to_end_m(self, pose: Pose) -> float:
        return math.hypot(*(self.path.segments[self.segment][-1] - (pose.x_m, pose.y_m)))

    def _segment_done(self, pose: Pose) -> bool:
        """A segment is done within ``switch_radius_m`` of its last waypoint or where that waypoint
        is the nearest; the path's last one within ``end_radius_m`` (and see :meth:`step`)."""
        if self._last_segment():
            return self._to_end_m(pose) <= self.end_radius_m
        return self._passed(pose) or self._to_end_m(pose) <= self.config.switch_radius_m

    def planning_table(self) -> ActionTable:
        """The table the planner searches: the corrected one where there is a correction, without
        the entries that move the robot less than ``min_step_m`` and turn it less than
        ``min_turn_deg`` (:func:`moving`), nor the last action's entry where it did so on the
        robot: the robot is as it was, on the same face, and the same action would do the same
        again (on the twin, a gait that turns the robot 15 deg after a roll and 1 deg after
        itself, which the correction's mean, still weighed by the 15, predicts to turn 4)."""
        table = self.table if self.correction is None else self.correction.applied()
        table = moving(table, self.config.min_step_m, math.radians(self.config.min_turn_deg))
        usable = np.ones(table.forward_m.shape, dtype=bool) if table.usable is None else table.usable.copy()
        if self.idle is not None:
            usable[self.idle] = False
        return dataclasses.replace(table, usable=usable)

    def step(self, pose: Pose, face: int) -> Step | None:
        """The next action from ``pose`` on ``face``; moves to the next segment (choosing the
        rolling direction there) when this one is done; None at the end of the path: within
        ``end_radius_m`` of its last waypoint, or with that waypoint the nearest and the cheapest
        sequence not predicted to end closer to it."""
        if not self.started:
            self.direction = rolling_direction(self.path.segments[0], pose.heading_rad)
            self.started = True
        while self._segment_done(pose):
            if self._last_segment():
                return None
            self.segment += 1
            self.direction = rolling_direction(self.path.segments[self.segment], pose.heading_rad)
        step = plan(self.planning_table(), self.path.segments[self.segment], pose, face, self.direction, self.config)
        if self._last_segment() and self._passed(pose) and self._to_end_m(step.final) >= self._to_end_m(pose):
            return None
        return step

    def observe(self, step: Step, face: int, before: Pose, after: Pose, end_face: int) -> None:
        """``step``'s action, run from ``face`` in its direction, took the robot from ``before``
        to ``after`` and onto ``end_face``."""
        motion = before.motion_to(after)
        if self.correction is not None:
            self.correction.observe(step.action, face, step.direction, motion, end_face)
        still = math.hypot(motion[0], motion[1]) < self.config.min_step_m
        still = still and abs(motion[2]) < math.radians(self.config.min_turn_deg) and end_face == face
        self.idle = (step.action, face, step.direction) if still else None


@dataclass(frozen=True)
class FollowResult:
    """Poses (n + 1) and faces visited, the actions taken (n) and their directions."""

    poses: list[Pose]
    faces: list[int]
    actions: list[int]
    directions: list[int]
    finished: bool


def follow_table(
    table: ActionTable,
    path: Path,
    start: Pose,
    face: int,
    config: PlannerConfig,
    end_radius_m: float,
    max_actions: int,
    motion: ActionTable | None = None,
) -> FollowResult:
    """The closed loop on ``motion`` (default: the table itself): plan with ``table``, move as
    ``motion`` says, replan; stops at the path's end or after ``max_actions``."""
    motion = table if motion is None else motion
    correction = None if config.correction_prior is None else Correction(table, config.correction_prior)
    follower = Follower(table, path, config, end_radius_m, correction)
    poses, faces, actions, directions = [start], [face], [], []
    pose = start
    for _ in range(max_actions):
        step = follower.step(pose, face)
        if step is None:
            return FollowResult(poses, faces, actions, directions, True)
        a, d = step.action, step.direction
        before, pose = pose, pose.moved(*motion.motion(a, face, d))
        follower.observe(step, face, before, pose, int(motion.next_face[a, face, d]))
        face = int(motion.next_face[a, face, d])
        poses.append(pose)
        faces.append(face)
        actions.append(a)
        directions.append(d)
    return FollowResult(poses, faces, actions, directions, follower.step(pose, face) is None)


def distances_to_path(path: Path, poses: list[Pose]) -> np.ndarray:
    """Each pose's distance (m) to the nearest waypoint of the whole path."""
    points = path.waypoints
    xy = np.array([(p.x_m, p.y_m) for p in poses])
    return np.min(np.linalg.norm(xy[:, None, :] - points[None], axis=-1), axis=1)
