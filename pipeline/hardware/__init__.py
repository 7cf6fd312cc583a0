"""Hardware backends behind the :class:`~pipeline.hardware.base.Robot` interface."""

from __future__ import annotations

from pipeline.config import LoadedConfigs
from pipeline.hardware.base import Robot


def make_robot(configs: LoadedConfigs) -> Robot:
    """The backend named by ``pipeline.hardware_backend`` (only ``twin`` exists so far)."""
    if configs.pipeline.hardware_backend == "twin":
        from pipeline.hardware.twin import MujocoTwin

        return MujocoTwin(configs.robot, configs.twin)
    raise ValueError(f"unknown hardware backend {configs.pipeline.hardware_backend!r}")
