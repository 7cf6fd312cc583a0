"""The robot config (``configs/robot/*.yaml``): what the pipeline knows about the robot, its
geometry, masses, topology, nominal cable and motor models, PID and sensors."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pipeline.config.base import CapPair, Fraction, NonNegative, Positive, StrictModel


class RodConfig(StrictModel):
    length_m: Positive = Field(description="Distance between the two end-cap centres.")
    radius_m: Positive
    mass_kg: Positive


class EndCapConfig(StrictModel):
    radius_m: Positive
    mass_kg: Positive


class MotorConfig(StrictModel):
    radius_m: Positive
    length_m: Positive
    mass_kg: Positive
    offset_m: Positive = Field(description="Distance of each motor centre from the rod centre.")
    omega_max_rad_s: Positive = Field(description="Maximum motor angular speed.")
    speed: Annotated[float, Field(gt=0, le=2)] = Field(
        description="Speed scale s in omega = s * omega_max * u (hybrid-GNN paper App. C); the firmware's setting, "
        "or the identified effective value."
    )
    winch_radius_m: Positive
    time_constant_s: NonNegative = Field(default=0.0, description="First-order lag of motor speed (s).")


class ActuatedCableConfig(StrictModel):
    stiffness_n_per_m: Positive
    damping_n_s_per_m: NonNegative
    min_length_m: Positive = Field(description="Length commanded by target 0.")
    range_m: Positive = Field(description="Target 1 commands min_length_m + range_m.")


class PassiveCableConfig(StrictModel):
    stiffness_n_per_m: Positive
    cubic_stiffness_n_per_m3: NonNegative = 0.0
    damping_n_s_per_m: NonNegative
    rest_length_m: Positive


class TopologyConfig(StrictModel):
    rods: tuple[CapPair, CapPair, CapPair]
    actuated: tuple[CapPair, CapPair, CapPair, CapPair, CapPair, CapPair]
    passive: tuple[CapPair, CapPair, CapPair]

    @model_validator(mode="after")
    def _check_pairs(self) -> TopologyConfig:
        caps = sorted(c for rod in self.rods for c in rod)
        if caps != list(range(6)):
            raise ValueError("rods must use each end cap 0..5 exactly once")
        rod_of = {c: i for i, rod in enumerate(self.rods) for c in rod}
        for kind, pairs in (("actuated", self.actuated), ("passive", self.passive)):
            for j, (a, b) in enumerate(pairs):
                if rod_of[a] == rod_of[b]:
                    raise ValueError(f"{kind}[{j}] joins caps {a} and {b} of the same rod")
        return self


class AttachmentConfig(StrictModel):
    """Cable attachment points: three per end cap on the cap's sphere surface, on
    the circle perpendicular to the rod through the cap centre, 2*pi/3 apart."""

    phase_rad: tuple[float, float, float] = Field(
        description="Angle of the first attachment point around each rod's axis."
    )


class PIDConfig(StrictModel):
    kp: NonNegative
    ki: NonNegative
    kd: NonNegative
    tolerance: Annotated[float, Field(gt=0, lt=1)] = Field(
        description="A cable has reached its target when |normalised error| < tolerance."
    )
    control_rate_hz: Positive
    latency_s: NonNegative = Field(default=0.0, description="Delay from a sensor reading to its motor command (s).")


class ContactConfig(StrictModel):
    """Ground contact of the end caps and motors, as the engine models it."""

    friction: NonNegative = Field(default=0.8, description="Coulomb friction coefficient.")
    restitution: Fraction = Field(default=0.0, description="Normal restitution coefficient.")


class SensorConfig(StrictModel):
    imu_rods: tuple[Annotated[int, Field(ge=0, le=2)], ...] = Field(min_length=2)


class FeasibilityConfig(StrictModel):
    min_triangle_slack_m: NonNegative = Field(
        description="Each triangle of actuated cables needs a + b - c >= this slack."
    )
    mode: Literal["reject", "repair"]


class RobotConfig(StrictModel):
    name: str
    rod: RodConfig
    end_cap: EndCapConfig
    motor: MotorConfig
    actuated_cable: ActuatedCableConfig
    passive_cable: PassiveCableConfig
    topology: TopologyConfig
    attachment: AttachmentConfig
    pid: PIDConfig
    sensors: SensorConfig
    feasibility: FeasibilityConfig
    ground: ContactConfig = ContactConfig()

    @model_validator(mode="after")
    def _check_geometry(self) -> RobotConfig:
        half = self.rod.length_m / 2
        motor_end = self.motor.offset_m + self.motor.length_m / 2
        if motor_end > half - self.end_cap.radius_m + 1e-9:
            raise ValueError(
                f"motor.offset_m + motor.length_m/2 = {motor_end:.4f} m overlaps the end cap "
                f"(must be <= rod.length_m/2 - end_cap.radius_m = {half - self.end_cap.radius_m:.4f} m)"
            )
        return self
