"""Hardware backends behind the :class:`~pipeline.hardware.base.Robot` interface."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from pipeline.config import LoadedConfigs
from pipeline.hardware.base import Robot


def make_robot(configs: LoadedConfigs) -> Robot:
    """The backend named by ``pipeline.hardware_backend``: the in-process twin, or the robot at
    ``pipeline.network`` (connected on return); with ``camera.source: realsense``, a RealSense
    beside it (:class:`~pipeline.hardware.camera.CameraRobot`)."""
    if configs.pipeline.hardware_backend == "twin":
        from pipeline.hardware.twin import MujocoTwin

        assert configs.twin is not None  # PipelineConfig requires hardware_config for the twin
        robot: Robot = MujocoTwin(configs.robot, configs.twin)
    elif configs.pipeline.hardware_backend == "network":
        from pipeline.hardware.network import NetworkRobot

        robot = NetworkRobot(configs.robot, configs.pipeline.network)
    else:
        raise ValueError(f"unknown hardware backend {configs.pipeline.hardware_backend!r}")
    camera = configs.pipeline.camera
    if camera.source == "hardware":
        return robot
    from pipeline.hardware.camera import CameraRobot, RealSenseCamera

    try:
        rgbd = RealSenseCamera(
            np.array(camera.camera_to_world), camera.serial, camera.bag, camera.width_px, camera.height_px, camera.fps
        )
    except BaseException:
        robot.close()
        raise
    return CameraRobot(robot, rgbd)


@contextlib.contextmanager
def robot_for(configs: LoadedConfigs, given: Robot | None = None) -> Iterator[Robot]:
    """``given``, or the configured backend made now and closed on leaving."""
    if given is not None:
        yield given
        return
    robot = make_robot(configs)
    try:
        yield robot
    finally:
        robot.close()
