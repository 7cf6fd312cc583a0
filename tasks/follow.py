"""Trajectory following on the hardware, closed loop (seed 002): ``r2s2r follow PATH -k K``.

:func:`run_follow` follows a path (:func:`storage.path_file.read_path`) with iteration K's
action table (the ``actions`` stage) and planner (:class:`pipeline.follow.planner.Follower`): a
file's waypoints are in the world frame, a built-in path is placed in the middle of the ground
the camera sees (:func:`view_centre`); the robot is placed at the path's start, heading along
it, then after every action its pose comes from the camera tracker on the newest frames
(:func:`pipeline.follow.online.pose_after`), the planner picks the next action, and the loop
stops at the path's end, after ``follow.max_actions``, when the robot folds flat or when it
leaves the corridor of ``follow.corridor_m`` around the path (:mod:`pipeline.follow.stops`).

Written to ``iter_<K>/follow/<path>/``: the recording as a redeploy run has it (hardware stream,
ground truth where the backend has it, frames, ``tracked.parquet`` of the whole run),
``steps.parquet`` (per action: its name, face, direction, the pose before it, the pose predicted
from the table and the pose observed, the motion predicted and observed in the body frame, and
their difference), ``action_errors.parquet`` (per action taken: how often, its mean predicted and
observed motion, the table's error; :func:`pipeline.follow.metrics.action_errors`),
``path.json`` (the waypoints), a plot of the path and the robot's track, and the manifest; its
figures are logged as the iteration's ``follow`` run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.errors import ConfigError, DataError
from pipeline.follow.actions import Action, iteration_actions, on_face
from pipeline.follow.correction import Correction
from pipeline.follow.metrics import MOTIONS, action_errors, path_figures, prediction_errors
from pipeline.follow.motion import REVERSE, ActionTable
from pipeline.follow.online import pose_after
from pipeline.follow.paths import Path as FollowPath
from pipeline.follow.paths import builtin, from_waypoints
from pipeline.follow.planner import Follower, distances_to_path
from pipeline.follow.stops import OUT_OF_VIEW, stop_reason
from pipeline.follow.table import planning_table
from pipeline.hardware import robot_for
from pipeline.hardware.base import (
    CameraInfo,
    ClockPacket,
    FramePacket,
    GapPacket,
    GroundTruthPacket,
    Packet,
    Robot,
    SensorPacket,
    StartPose,
)
from pipeline.perception.tracker import NothingTracked
from pipeline.plots import follow_plot
from pipeline.policies import Policy
from pipeline.progress import progress
from pipeline.robot_model import REST_TARGET
from storage.action_table import read_action_table
from storage.catalog import ACTIONS_FILE, attach_iteration, attached_robot, read_found_gaits
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import RunLayout, existing_ref, set_aside, write_manifest
from storage.path_file import read_path
from storage.recording import open_recording
from storage.tables import write_table
from storage.tracked import TRACKED_FILE, track_recording, write_tracked
from storage.tracking import StageContext, client_for, iteration_run

STAGE = "follow"
STEPS_FILE = "steps.parquet"
ACTION_ERRORS_FILE = "action_errors.parquet"
PATH_FILE = "path.json"


def in_view(camera: CameraInfo, points: np.ndarray, height_m: float) -> np.ndarray:
    """Whether each ground point (n, 2), m, raised to ``height_m``, projects inside the image."""
    world = np.column_stack([points, np.full(len(points), height_m), np.ones(len(points))])
    cam = np.linalg.inv(camera.camera_to_world) @ world.T
    with np.errstate(divide="ignore", invalid="ignore"):
        u = camera.fx * cam[0] / cam[2] + camera.cx
        v = camera.fy * cam[1] / cam[2] + camera.cy
    return (cam[2] > 0) & (u >= 0) & (u < camera.width_px) & (v >= 0) & (v < camera.height_px)


def view_centre(camera: CameraInfo, height_m: float) -> np.ndarray:
    """The middle (2,) of the ground the camera sees at ``height_m``: the mean of the points where
    the rays through the image's four corners meet that plane (m, world)."""
    corners = np.array([[0, 0], [camera.width_px, 0], [camera.width_px, camera.height_px], [0, camera.height_px]])
    rays = np.column_stack(
        [(corners[:, 0] - camera.cx) / camera.fx, (corners[:, 1] - camera.cy) / camera.fy, np.ones(4)]
    )
    rotation, origin = camera.camera_to_world[:3, :3], camera.camera_to_world[:3, 3]
    directions = rays @ rotation.T
    if (directions[:, 2] >= 0).any():
        raise ConfigError("follow: the camera sees the horizon; place the built-in path with a path file")
    reach = (height_m - origin[2]) / directions[:, 2]
    return (origin[None, :2] + reach[:, None] * directions[:, :2]).mean(axis=0)


def _shifted(packet: Packet, t_offset: float, segment_offset: int) -> Packet:
    """``packet`` on the follow run's clock and segment count (each action starts both at 0)."""
    if isinstance(packet, FramePacket):
        return dataclasses.replace(packet, t_s=packet.t_s + t_offset)
    if isinstance(packet, GapPacket):
        return GapPacket(packet.t_start_s + t_offset, packet.t_end_s + t_offset, packet.missing)
    if isinstance(packet, ClockPacket):
        return packet
    return dataclasses.replace(packet, t_s=packet.t_s + t_offset, segment=packet.segment + segment_offset)


class _Run:
    """The hardware, the recording and the clock of one follow run."""

    def __init__(self, configs: LoadedConfigs, iteration: int, name: str, folder: Path, hardware: Robot) -> None:
        self.hardware = hardware
        self.name = name
        self.timeout_s = configs.pipeline.redeploy.segment_timeout_s
        self.recording = open_recording(configs, iteration, name, folder, hardware, self.timeout_s)
        self.t_offset = 0.0
        self.placed_t = 0.0  # when the robot was placed at the path's start (s, on the run's clock)
        self.segments = 0
        self.tick_s = 1.0 / configs.robot.pid.control_rate_hz

    def execute(self, policy: Policy) -> tuple[list[FramePacket], list[SensorPacket]]:
        """Run ``policy`` into the recording; the action's frames and sensor packets (own clock)."""
        frames, sensors, last_t = [], [], 0.0
        for packet in self.hardware.execute(policy, self.timeout_s, record_frames=True):
            if isinstance(packet, FramePacket):
                frames.append(packet)
            elif isinstance(packet, SensorPacket):
                sensors.append(packet)
            if isinstance(packet, SensorPacket | GroundTruthPacket):
                last_t = max(last_t, packet.t_s)
            self.recording.add(_shifted(packet, self.t_offset, self.segments))
        self.t_offset += last_t + self.tick_s
        self.segments += len(policy)
        return frames, sensors


def run_follow(
    configs: LoadedConfigs, iteration: int, spec: str, hardware: Robot | None = None
) -> tuple[Path, dict[str, object]]:
    """Follow the path ``spec`` with iteration ``iteration``'s action table (module docstring) on
    ``hardware`` (default: the configured backend); returns the run's folder and its figures. Bad
    paths are refused before the robot moves."""
    name, points = read_path(spec)
    with robot_for(configs, hardware) as robot:
        return _follow_on(configs, iteration, spec, name, points, robot)


def _follow_on(
    configs: LoadedConfigs, iteration: int, spec: str, name: str, points: np.ndarray, hardware: Robot
) -> tuple[Path, dict[str, object]]:
    """:func:`run_follow` on ``hardware``: the path ``spec`` named ``name``, waypoints ``points`` (n, 2) m."""
    c = configs.pipeline.follow
    layout = RunLayout.of(configs)
    camera = hardware.camera
    if camera is None:
        raise ConfigError(f"follow: the {configs.pipeline.hardware_backend} hardware has no camera to track with")
    if builtin(spec) is not None:  # a built-in is placed in the middle of what the camera sees
        points = points - (points.min(axis=0) + points.max(axis=0)) / 2 + view_centre(camera, 0.0)
    path = from_waypoints(points, c.planner.corner_deg, c.planner.waypoint_spacing_m, spec)
    unseen = ~in_view(camera, path.waypoints, configs.robot.end_cap.radius_m)
    if unseen.any():
        first = path.waypoints[np.flatnonzero(unseen)[0]]
        raise ConfigError(f"path {spec!r}: waypoint ({first[0]:.2f}, {first[1]:.2f}) m lies outside the camera's view")
    actions_ref = existing_ref(layout, iteration, "actions")
    gaits_ref = existing_ref(layout, iteration, "gaits")
    robot = attached_robot(configs, existing_ref(layout, attach_iteration(configs, iteration), "attach"))
    tabulated = read_action_table(Path(actions_ref.path) / ACTIONS_FILE)
    table = planning_table(tabulated, c.planner)
    actions = iteration_actions(robot, read_found_gaits(gaits_ref), c.table.paper_actions)
    if tuple(a.name for a in actions) != table.names:
        raise DataError(f"{actions_ref.path}: the action table does not list this iteration's actions; rerun actions")
    folder = layout.stage_dir(iteration, STAGE) / _folder_name(name)
    if folder.exists():
        set_aside(layout, folder, "replaced")
    folder.mkdir(parents=True)
    atomic_write_json(folder / PATH_FILE, {"spec": spec, "waypoints": path.waypoints.tolist()})
    run = _Run(configs, iteration, f"follow-{folder.name}", folder, hardware)
    started = time.perf_counter()
    try:
        steps, reason = _loop(configs, robot, camera, path, table, actions, run)
    except BaseException as exc:
        hardware.stop()
        run.recording.close(complete=False, reason=f"{type(exc).__name__}: {exc}")
        raise
    run.recording.close(complete=True)
    tracked, figures = track_recording(robot, configs.pipeline.track, folder)
    write_tracked(folder / TRACKED_FILE, tracked, figures, robot, configs, iteration, run.recording.identity.policy_id)
    frame = pd.DataFrame(steps)
    write_table(folder / STEPS_FILE, pa.Table.from_pandas(frame, preserve_index=False), {"stage": STAGE, "path": spec})
    errors = action_errors(frame) if len(frame) else pd.DataFrame()
    write_table(
        folder / ACTION_ERRORS_FILE, pa.Table.from_pandas(errors, preserve_index=False), {"stage": STAGE, "path": spec}
    )
    placed = tracked["t"].to_numpy() >= run.placed_t  # the run proper, from the robot at the path's start
    caps = tracked[[f"cap{i}_{a}" for i in range(6) for a in "xy"]].to_numpy()[placed]
    track = caps.reshape(-1, 6, 2).mean(axis=1)
    wall_s, robot_s = time.perf_counter() - started, run.t_offset - run.placed_t
    summary = _summary(path, frame, track, reason, wall_s, robot_s, c.corridor_m)
    atomic_write_bytes(folder / "follow.png", follow_plot(path.waypoints, track, f"follow {spec}: {reason}"))
    write_manifest(folder, STAGE, complete=True, summary=summary)
    return folder, summary


def _folder_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in name).strip("-.") or "path"


def _loop(
    configs: LoadedConfigs,
    robot: RobotConfig,
    camera: CameraInfo,
    path: FollowPath,
    table: ActionTable,
    actions: list[Action],
    run: _Run,
) -> tuple[list[dict], str]:
    """Place the robot, then plan, act and observe until the path ends; the steps and why it stopped."""
    c = configs.pipeline.follow
    rest = Policy("rest", REST_TARGET[None])
    run.hardware.reset()
    pose, _, _ = pose_after(robot, configs.pipeline.track, camera, *run.execute(rest))
    leg = path.segments[0][1] - path.segments[0][0]
    yaw = math.atan2(leg[1], leg[0]) - pose.heading_rad  # turn the rest pose to head along the path
    start = path.waypoints[0] - np.array([pose.x_m, pose.y_m])
    run.hardware.reset(StartPose(float(start[0]), float(start[1]), yaw))
    run.placed_t = run.t_offset
    pose, face, _ = pose_after(robot, configs.pipeline.track, camera, *run.execute(rest))
    prior = c.planner.correction_prior
    follower = Follower(table, path, c.planner, c.end_radius_m, None if prior is None else Correction(table, prior))
    steps: list[dict] = []
    detail = "{action}, {distance:.3f} m from the path"
    with progress(f"follow {run.name}", c.max_actions, "actions", detail, action="-", distance=math.nan) as row:
        for _ in range(c.max_actions):
            step = follower.step(pose, face)
            if step is None:
                return steps, "end of path"
            action = actions[step.action]
            direction = step.direction
            targets = on_face(action, robot, face, direction == REVERSE)
            before = pose
            recorded = run.execute(Policy(action.name, targets))
            try:
                pose, new_face, caps = pose_after(robot, configs.pipeline.track, camera, *recorded)
            except NothingTracked:
                return steps, OUT_OF_VIEW
            follower.observe(step, face, before, pose, new_face)
            distance = float(distances_to_path(path, [pose])[0])
            row.advance(action=action.name, distance=distance)
            motions = {
                "table": table.motion(step.action, face, direction),
                "predicted": before.motion_to(step.predicted),
                "observed": before.motion_to(pose),
            }
            steps.append(
                {
                    "action": action.name,
                    "face": face,
                    "direction": direction,
                    "x_m": before.x_m,
                    "y_m": before.y_m,
                    "heading_rad": before.heading_rad,
                    "predicted_x_m": step.predicted.x_m,
                    "predicted_y_m": step.predicted.y_m,
                    "predicted_heading_rad": step.predicted.heading_rad,
                    "observed_x_m": pose.x_m,
                    "observed_y_m": pose.y_m,
                    "observed_heading_rad": pose.heading_rad,
                    "observed_face": new_face,
                    **{f"{k}_{m}": v for k, motion in motions.items() for m, v in zip(MOTIONS, motion, strict=True)},
                    "distance_to_path_m": distance,
                }
            )
            face = new_face
            reason = stop_reason(caps, distance, c.corridor_m, robot.rod.length_m)
            if reason is not None:
                return steps, reason
        return steps, f"stopped after {c.max_actions} actions"


def _summary(
    path: FollowPath,
    steps: pd.DataFrame,
    track: np.ndarray,
    reason: str,
    wall_s: float,
    robot_s: float,
    corridor_m: float,
) -> dict[str, object]:
    """The run's figures: distance from the path (mean, max over the tracked run from the robot's
    placement at the start), end-point error and progress (:func:`path_figures`, looking no farther
    ahead than the corridor), times (robot time
    from the placement), actions, and the mean error per action of the table and of the planner's
    prediction (the table corrected online; position, m, and rotation, deg)."""
    nan = np.full(1, np.nan)
    table_position, table_rotation = prediction_errors(steps, "table") if len(steps) else (nan, nan)
    position, rotation = prediction_errors(steps, "predicted") if len(steps) else (nan, nan)
    return {
        "stopped": reason,
        "reached_end": reason == "end of path",
        "actions": len(steps),
        **path_figures(path.waypoints, track, corridor_m),
        "robot_time_s": robot_s,
        "wall_s": wall_s,
        "table_error_m": float(table_position.mean()),
        "table_error_deg": math.degrees(float(table_rotation.mean())),
        "prediction_error_m": float(position.mean()),
        "prediction_error_deg": math.degrees(float(rotation.mean())),
    }


def follow_and_log(configs: LoadedConfigs, iteration: int, spec: str) -> tuple[Path, dict[str, object]]:
    """:func:`run_follow`, its figures, plot and step table logged as the iteration's ``follow``
    MLflow run (a child of the iteration's run; one per follow run)."""
    folder, summary = run_follow(configs, iteration, spec)
    layout = RunLayout.of(configs)
    run_id, _ = iteration_run(client_for(layout), layout, iteration)
    tags = {"path": spec, "stopped": str(summary["stopped"])}
    with StageContext(configs, iteration, STAGE, run_id) as context:
        context.log(
            summary,
            [folder / "follow.png", folder / STEPS_FILE, folder / ACTION_ERRORS_FILE],
            folder=folder.name,
            tags=tags,
        )
    return folder, summary
