"""How the pipeline reaches a robot over the network (``hardware_backend: network``,
``docs/robot-protocol.md``) and the camera that watches it (``camera``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.base import Positive, StrictModel


class NetworkConfig(StrictModel):
    """The robot's address and the client's timeouts (all in seconds of wall time)."""

    host: str = Field(default="127.0.0.1", min_length=1, description="The robot's (or its bridge's) host name or IP.")
    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        default=5555, description="The robot's command port; it names its telemetry port in its welcome."
    )
    connect_timeout_s: Positive = Field(default=10.0, description="How long to wait for the robot's welcome.")
    command_timeout_s: Positive = Field(
        default=1.0, description="How long to wait for a command's reply before sending it again (same id)."
    )
    command_tries: Annotated[int, Field(ge=1, le=100)] = Field(
        default=5, description="How often a command is sent before the robot counts as not answering."
    )
    link_timeout_s: Positive = Field(
        default=5.0,
        description="A run fails when no telemetry (samples or heartbeats) arrives for this long; shorter outages "
        "are marked as gaps in the recording.",
    )
    reorder_wait_s: Annotated[float, Field(gt=0, le=5)] = Field(
        default=0.3,
        description="How long a missing message is waited for once later ones arrived (messages out of order), "
        "before it counts as lost.",
    )
    ping_every_s: Positive = Field(
        default=1.0, description="The client's heartbeat during a run: the robot stops when it hears none."
    )


class CameraSourceConfig(StrictModel):
    """Where the RGB-D frames come from (``docs/robot-protocol.md``, *Cameras*)."""

    source: Literal["hardware", "realsense"] = Field(
        default="hardware",
        description="'hardware': the backend's own (the twin renders; a network robot may stream frames); "
        "'realsense': an Intel RealSense beside the robot, its frames put on the robot's clock.",
    )
    serial: str | None = Field(default=None, description="realsense: the device's serial number (default: the first).")
    bag: Path | None = Field(
        default=None, description="realsense: play back this RealSense .bag recording instead of a device."
    )
    width_px: Annotated[int, Field(ge=16, le=4096)] = 640
    height_px: Annotated[int, Field(ge=16, le=4096)] = 480
    fps: Annotated[int, Field(ge=1, le=300)] = 30
    camera_to_world: (
        Annotated[list[Annotated[list[float], Field(min_length=4, max_length=4)]], Field(min_length=4, max_length=4)]
        | None
    ) = Field(
        default=None,
        description="realsense: the camera's pose, 4x4 camera-to-world (OpenCV axes: x right, y down, z forward; "
        "world z up, ground at z = 0), from the calibration.",
    )

    @model_validator(mode="after")
    def _calibrated(self) -> CameraSourceConfig:
        if self.source == "realsense" and self.camera_to_world is None:
            raise ValueError("camera.source 'realsense' needs camera.camera_to_world (its calibrated pose)")
        return self
