"""Hardware backends behind the :class:`~pipeline.hardware.base.Robot` interface."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pipeline.config import LoadedConfigs
from pipeline.hardware.base import Robot


def make_robot(configs: LoadedConfigs) -> Robot:
    """The backend named by ``pipeline.hardware_backend``: the in-process twin, or the robot at
    ``pipeline.network`` (connected on return)."""
    if configs.pipeline.hardware_backend == "twin":
        from pipeline.hardware.twin import MujocoTwin

        assert configs.twin is not None  # PipelineConfig requires hardware_config for the twin
        return MujocoTwin(configs.robot, configs.twin)
    if configs.pipeline.hardware_backend == "network":
        from pipeline.hardware.network import NetworkRobot

        return NetworkRobot(configs.robot, configs.pipeline.network)
    raise ValueError(f"unknown hardware backend {configs.pipeline.hardware_backend!r}")


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
