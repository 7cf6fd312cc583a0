"""The Tribar paper's trajectory-following planner (seed 002): an exhaustive search over an
action table.

The robot's pose is its end caps' centroid (x, y, m) and its heading (rad,
:func:`pipeline.robot_model.heading_rad`: the principal axis turned 90 deg counter-clockwise).
An :class:`ActionTable` says, per action, bottom face (:data:`pipeline.gaits.symmetry.FACES`) and
rolling direction (0 forward, 1 reverse), how the pose moves: forward and lateral along the
heading before the action (m) and the heading's change (rad), and the face the robot ends on.

:func:`plan` tries every sequence of ``depth`` actions (the paper: two) from the current pose,
face and direction, and returns the first action of the sequence whose final pose costs least:

    cost = w_d * |x - p_i| + w_a * angle(h, tangent_i) + w_p * (n - 1 - i) / (n - 1)

with ``p_i`` the segment's waypoint nearest the predicted position ``x`` (of ``n``), ``h`` the
heading the robot rolls along (reversed when it rolls in reverse) and the tangent that of the
segment at ``p_i``: distance from the path, angle to it, and how far from the segment's end the
robot still is. :class:`Follower` keeps the segment and the direction: a segment ends within
``switch_radius_m`` of its last waypoint or where that waypoint is the nearest; at each new
segment the robot rolls forward if its heading points along the segment (``h . u >= 0``, the
paper's principal-axis cross product) and in reverse otherwise, as its symmetry allows.
Everything here is pure (numpy); :func:`follow_table` runs the loop on the table's own motion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.config.follow import PlannerConfig
from pipeline.follow.paths import Path
from pipeline.gaits.symmetry import bottom_face
from pipeline.robot_model import heading_rad

FORWARD, REVERSE = 0, 1


@dataclass(frozen=True)
class ActionTable:
    """Motion of each action (A,) from each face (F,) in each direction (2,): arrays (A, F, 2)."""

    names: tuple[str, ...]
    forward_m: np.ndarray
    lateral_m: np.ndarray
    rotation_rad: np.ndarray
    next_face: np.ndarray

    def __post_init__(self) -> None:
        shape = (len(self.names), self.forward_m.shape[1], 2)
        for name in ("forward_m", "lateral_m", "rotation_rad", "next_face"):
            if getattr(self, name).shape != shape:
                raise ValueError(f"ActionTable.{name}: shape {getattr(self, name).shape}, expected {shape}")

    @property
    def faces(self) -> int:
        return self.forward_m.shape[1]


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


def observed(caps_m: np.ndarray) -> tuple[Pose, int]:
    """The pose and the bottom face of the robot whose end caps are ``caps_m`` (6, 3), m, world."""
    centre = np.asarray(caps_m, float).mean(axis=0)
    return Pose(float(centre[0]), float(centre[1]), float(heading_rad(caps_m))), bottom_face(caps_m)


@dataclass(frozen=True)
class Step:
    """One replan: the action chosen (index), the pose it predicts, and the sequence's cost."""

    action: int
    predicted: Pose
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
    tangent = np.diff(segment, axis=0)
    tangent = np.vstack([tangent, tangent[-1:]])[i]
    distance = np.hypot(x - segment[i, 0], y - segment[i, 1])
    angle = np.abs((heading - np.arctan2(tangent[..., 1], tangent[..., 0]) + np.pi) % (2 * np.pi) - np.pi)
    progress = (n - 1 - i) / (n - 1)
    return (
        config.distance_weight_per_m * distance
        + config.angle_weight_per_rad * angle
        + config.progress_weight * progress
    )


def plan(table: ActionTable, segment: np.ndarray, pose: Pose, face: int, direction: int, config: PlannerConfig) -> Step:
    """The first action of the cheapest sequence of ``config.depth`` actions (module docstring)."""
    x = np.array([pose.x_m])
    y = np.array([pose.y_m])
    heading = np.array([pose.heading_rad])
    faces = np.array([face])
    for _ in range(config.depth):  # every sequence so far (B,) times every action (A,): (B * A,)
        forward = table.forward_m[:, faces, direction].T
        lateral = table.lateral_m[:, faces, direction].T
        c, s = np.cos(heading)[:, None], np.sin(heading)[:, None]
        x = (x[:, None] + c * forward - s * lateral).ravel()
        y = (y[:, None] + s * forward + c * lateral).ravel()
        heading = (heading[:, None] + table.rotation_rad[:, faces, direction].T).ravel()
        faces = table.next_face[:, faces, direction].T.ravel()
    rolling = heading + (math.pi if direction == REVERSE else 0.0)
    cost = path_cost(segment, x, y, rolling, config)
    best = int(np.argmin(cost))
    first = best // len(table.names) ** (config.depth - 1)
    predicted = pose.moved(
        float(table.forward_m[first, face, direction]),
        float(table.lateral_m[first, face, direction]),
        float(table.rotation_rad[first, face, direction]),
    )
    return Step(first, predicted, float(cost[best]))


def rolling_direction(segment: np.ndarray, heading_rad: float) -> int:
    """:data:`FORWARD` if the heading points along ``segment``'s first leg, else :data:`REVERSE`."""
    u = segment[1] - segment[0]
    return FORWARD if math.cos(heading_rad) * u[0] + math.sin(heading_rad) * u[1] >= 0 else REVERSE


@dataclass
class Follower:
    """Follows ``path`` segment by segment: :meth:`step` takes the pose and face observed after
    the last action and returns the next action (None once the path is done)."""

    table: ActionTable
    path: Path
    config: PlannerConfig
    end_radius_m: float
    segment: int = 0
    direction: int = FORWARD
    started: bool = field(default=False, init=False)

    def _segment_done(self, pose: Pose) -> bool:
        """A segment is done within ``switch_radius_m`` of its last waypoint or where that waypoint
        is the nearest; the path's last one within ``end_radius_m``, or once past its end while
        within ``switch_radius_m`` of it."""
        points = self.path.segments[self.segment]
        passed = int(_nearest(points, np.array(pose.x_m), np.array(pose.y_m))) == len(points) - 1
        distance = math.hypot(*(points[-1] - (pose.x_m, pose.y_m)))
        if self.segment < len(self.path.segments) - 1:
            return passed or distance <= self.config.switch_radius_m
        return distance <= self.end_radius_m or (passed and distance <= self.config.switch_radius_m)

    def step(self, pose: Pose, face: int) -> Step | None:
        """The next action from ``pose`` on ``face``; moves to the next segment (choosing the
        rolling direction there) when this one is done; None at the end of the path."""
        if not self.started:
            self.direction = rolling_direction(self.path.segments[0], pose.heading_rad)
            self.started = True
        while self._segment_done(pose):
            if self.segment == len(self.path.segments) - 1:
                return None
            self.segment += 1
            self.direction = rolling_direction(self.path.segments[self.segment], pose.heading_rad)
        return plan(self.table, self.path.segments[self.segment], pose, face, self.direction, self.config)


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
    follower = Follower(table, path, config, end_radius_m)
    poses, faces, actions, directions = [start], [face], [], []
    pose = start
    for _ in range(max_actions):
        step = follower.step(pose, face)
        if step is None:
            return FollowResult(poses, faces, actions, directions, True)
        a, d = step.action, follower.direction
        pose = pose.moved(
            float(motion.forward_m[a, face, d]),
            float(motion.lateral_m[a, face, d]),
            float(motion.rotation_rad[a, face, d]),
        )
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
