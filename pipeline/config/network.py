"""How the pipeline reaches a robot over the network (``hardware_backend: network``,
``docs/robot-protocol.md``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

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
