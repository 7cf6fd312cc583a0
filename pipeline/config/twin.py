"""The twin's hidden config (``configs/hardware/*.yaml``): the MuJoCo twin's true physical
parameters. Only the twin backend and evaluation read it."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, model_validator

from pipeline.config.base import NonNegative, Positive, StrictModel


class GroundConfig(StrictModel):
    friction_sliding: Positive
    friction_torsional: NonNegative
    friction_rolling: NonNegative
    contact_time_constant_s: Annotated[float, Field(gt=0, le=0.1)] = Field(
        default=0.02, description="MuJoCo's solref time constant of every contact (s): the contact's stiffness."
    )
    contact_damping_ratio: Annotated[float, Field(gt=0, le=4)] = Field(
        default=1.0,
        description="MuJoCo's solref damping ratio of every contact: 1 is critically damped (no bounce), "
        "below 1 a landing end cap bounces (restitution exp(-pi z / sqrt(1 - z^2)) for a linear spring-damper).",
    )

    def restitution(self) -> float:
        """The coefficient of restitution of a linear spring-damper with ``contact_damping_ratio``
        (0 at or above critical damping): the engine's counterpart of the twin's soft contact."""
        z = self.contact_damping_ratio
        return 0.0 if z >= 1.0 else math.exp(-math.pi * z / math.sqrt(1.0 - z * z))


class TwinPhysicsConfig(StrictModel):
    timestep_s: Annotated[float, Field(gt=0, le=0.01)]
    gravity_m_s2: Positive


class TwinMotorConfig(StrictModel):
    omega_max_rad_s: Positive
    speed_scale: tuple[Positive, Positive, Positive, Positive, Positive, Positive] = Field(
        description="Per-motor multiplier on omega_max (manufacturing spread)."
    )
    time_constant_s: NonNegative = Field(
        default=0.0,
        description="First-order lag of the motor speed behind its command (rotor and gearbox inertia); "
        "0 = instant. With a lag the winch keeps turning, decelerating, after the PID enters its dead band.",
    )


class TwinCableConfig(StrictModel):
    actuated_stiffness_n_per_m: Positive
    actuated_damping_n_s_per_m: NonNegative
    passive_stiffness_n_per_m: Positive
    passive_cubic_stiffness_n_per_m3: NonNegative
    passive_damping_n_s_per_m: NonNegative
    passive_rest_length_m: Positive


class TwinSensorConfig(StrictModel):
    cable_noise_std_m: NonNegative
    cable_bias_m: tuple[float, float, float, float, float, float, float, float, float]
    imu_noise_std_rad: NonNegative
    sample_jitter_s: NonNegative = Field(description="Std of time-stamp jitter of sensor packets.")


class CameraConfig(StrictModel):
    width_px: Annotated[int, Field(ge=16, le=4096)]
    height_px: Annotated[int, Field(ge=16, le=4096)]
    fovy_deg: Annotated[float, Field(gt=1, lt=170)]
    position_m: tuple[float, float, float]
    look_at_m: tuple[float, float, float]
    rate_hz: Positive
    depth_scale_m: Positive = Field(description="Metres per depth unit of the uint16 depth image.")
    depth_noise_std_m: NonNegative
    max_depth_m: Positive

    @model_validator(mode="after")
    def _check_view(self) -> CameraConfig:
        if self.position_m == self.look_at_m:
            raise ValueError("position_m and look_at_m must differ")
        if self.max_depth_m / self.depth_scale_m > 65535:
            raise ValueError("max_depth_m / depth_scale_m must fit in uint16 (<= 65535)")
        return self


class TwinConfig(StrictModel):
    """Hidden parameters of the MuJoCo twin: the stand-in for the physical robot."""

    physics: TwinPhysicsConfig
    ground: GroundConfig
    motor: TwinMotorConfig
    cables: TwinCableConfig
    attachment_phase_rad: tuple[float, float, float]
    control_latency_s: NonNegative
    sensors: TwinSensorConfig
    camera: CameraConfig
    settle_s: Positive = Field(description="Simulated time to settle into the rest state.")
    seed: int
