"""The robot's pose from the camera while it follows a path: the tracker run on the newest frames.

After each action the robot holds its rest shape; :func:`pose_after` tracks the last frames of the
action (the camera tracker, :class:`pipeline.perception.tracker.CapTracker`, locks onto the
robot from scratch on the first of them) against the action's own cable readings, and returns the
pose and bottom face of the last tracked frame (:func:`pipeline.follow.motion.observed`): what the
Tribar paper's tracking service gives its planner, never the twin's ground truth.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.config import RobotConfig, TrackConfig
from pipeline.follow.motion import Pose, observed
from pipeline.hardware.base import CameraInfo, FramePacket, SensorPacket
from pipeline.perception.tracker import CapTracker
from pipeline.robot_model import build_cables

TRACKED_FRAMES = 3
"""Frames tracked after each action: the last ones, taken while the robot rests."""


def sensor_rows(packets: list[SensorPacket]) -> pd.DataFrame:
    """The cable readings, segments and targets of ``packets`` as the tracker reads them (``t``,
    ``segment``, ``target_0..5``, ``cable_0..8``)."""
    rows = {
        "t": [p.t_s for p in packets],
        "segment": [p.segment for p in packets],
        **{f"target_{i}": [float(p.target[i]) for p in packets] for i in range(6)},
        **{f"cable_{i}": [float(p.cable_m[i]) for p in packets] for i in range(9)},
    }
    return pd.DataFrame(rows)


def pose_after(
    robot: RobotConfig,
    config: TrackConfig,
    camera: CameraInfo,
    frames: list[FramePacket],
    sensors: list[SensorPacket],
) -> tuple[Pose, int, np.ndarray]:
    """The pose, bottom face and tracked end caps (6, 3) after an action whose camera ``frames``
    and sensor packets these are (:data:`TRACKED_FRAMES` last frames tracked)."""
    tracker = CapTracker(robot, camera, config, build_cables(robot, robot.attachment.phase_rad))
    tracked, _ = tracker.track(frames[-TRACKED_FRAMES:], sensor_rows(sensors))
    caps = tracked[[f"cap{i}_{axis}" for i in range(6) for axis in "xyz"]].to_numpy()[-1].reshape(6, 3)
    pose, face = observed(caps)
    return pose, face, caps
