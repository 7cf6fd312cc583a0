"""Where the data of a recorded robot are in a ROS bag (``r2s2r import-bag``, ``docs/data.md``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from pipeline.config.base import Positive, StrictModel

Pose = Annotated[list[Annotated[list[float], Field(min_length=4, max_length=4)]], Field(min_length=4, max_length=4)]


class BagTopicsConfig(StrictModel):
    """The topic map of a Tribar-style robot's ROS 1 or ROS 2 bag. Arrays are
    ``std_msgs/Float32MultiArray`` or ``Float64MultiArray`` (stamped by when the bag logged them);
    IMUs are ``sensor_msgs/Imu`` and images ``sensor_msgs/Image`` (stamped by their headers)."""

    cables: str = Field(
        default="/tribar/cable_lengths", description="The nine cable lengths, actuated 0-5 then passive 6-8: one "
        "message a sample."
    )  # fmt: skip
    cable_scale_m: Positive = Field(default=1.0, description="Metres per unit of the cable lengths.")
    targets: str = Field(default="/tribar/targets", description="The six normalised targets the PID holds.")
    controls: str | None = Field(default="/tribar/controls", description="The six motor commands in [-1, 1].")
    motors: str | None = Field(default=None, description="The six winch angles (rad).")
    imu: dict[Annotated[int, Field(ge=0, le=2)], str] = Field(
        default_factory=lambda: {0: "/tribar/imu0", 1: "/tribar/imu1", 2: "/tribar/imu2"},
        description="sensor_msgs/Imu topic per rod.",
    )
    color: str | None = Field(
        default=None, description="RGB images (rgb8 or bgr8), e.g. realsense-ros's /camera/color/image_raw."
    )
    depth: str | None = Field(
        default=None,
        description="Depth aligned to colour (16UC1 or mono16), e.g. /camera/aligned_depth_to_color/image_raw.",
    )
    camera_info: str | None = Field(
        default=None, description="The colour camera's sensor_msgs/CameraInfo, e.g. /camera/color/camera_info."
    )
    depth_scale_m: Positive = Field(default=0.001, description="Metres per depth unit.")
    camera_to_world: Pose | None = Field(
        default=None, description="The camera's calibrated pose, 4x4 camera-to-world (OpenCV axes), for the frames."
    )

    @model_validator(mode="after")
    def _frames_complete(self) -> BagTopicsConfig:
        image = (self.color, self.depth, self.camera_info)
        if any(image) and not all(image):
            raise ValueError("color, depth and camera_info come together (set all three, or none for no frames)")
        if self.color is not None and self.camera_to_world is None:
            raise ValueError("frames need camera_to_world (the camera's calibrated pose); or set color: null")
        return self
