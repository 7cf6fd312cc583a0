"""The ``sysid`` section of the pipeline config: system identification, one sub-section per step
of it (data, latency, loss, start fits, gradient, search, gait shooting), in the order they run."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.config.base import Positive, StrictModel
from pipeline.parameter_specs import NAMES

EngineParameter = Literal[NAMES]
"""Names of the engine's identifiable parameters (:data:`pipeline.parameter_specs.NAMES`)."""


class PriorConfig(StrictModel):
    """A measured value of a parameter and how far to trust it (a prior-regularised fit)."""

    value: float = Field(description="Prior mean, in the parameter's SI unit.")
    scale: Positive = Field(description="Prior standard deviation, same unit.")


class SysidDataConfig(StrictModel):
    """Which recorded gaits identification fits and which it holds out."""

    window: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Identify from the trajectories of the last this many iterations (null: all so far)."
    )
    holdout_fraction: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.3, description="Last fraction of each trajectory's gaits held out for validation."
    )
    monotonic_only: bool = Field(default=False, description="Drop gaits in which a cable's command changed sign.")


class LatencyConfig(StrictModel):
    """The control latency, chosen from a grid before the parameters are fitted."""

    grid_s: tuple[Annotated[float, Field(ge=0)], ...] = Field(
        default=(0.0, 0.02, 0.04, 0.06, 0.08, 0.1),
        description="Control latencies tried (s); the best goes to pid.latency_s. Empty: keep the robot config's.",
    )
    speed_factors: tuple[Positive, ...] = Field(
        default=(0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2),
        min_length=1,
        description="Each latency is scored at its best motor speed among the start's times these factors, "
        "stepped on past the edge where the best lies (a latency and the motor speed trade off in the gaits' timing).",
    )


class SysidLossConfig(StrictModel):
    """The trajectory loss and how its rollouts are cut."""

    kind: Literal["kfl", "last_step", "all_step", "multiple_shooting"] = Field(
        default="kfl", description="Key Frame Loss, or one of the R2S2R paper's alternatives."
    )
    position_sigma_m: Positive = Field(default=0.005, description="Std of a tracked end cap, weighting defects (m).")
    mask_filter: bool = Field(default=True, description="KFL: keep only key frames that agree with the total time.")
    duration_cap: Annotated[float, Field(ge=1)] = Field(
        default=1.25, description="KFL: an engine gait runs at most this times the data gait's duration."
    )
    chunk_s: Positive = Field(
        default=2.0, description="KFL: consecutive gaits run as one engine rollout of about this much data (s)."
    )
    settle_s: Positive = Field(default=0.3, description="Settling time of each window's start state (s).")
    shooting_windows: Annotated[int, Field(ge=1)] = Field(
        default=4, description="multiple_shooting: windows per trajectory."
    )


class StartFitConfig(StrictModel):
    """KFL: the lead-in chunks' start states fitted to the data after them."""

    iterations: Annotated[int, Field(ge=0)] = Field(
        default=8,
        description="Levenberg-Marquardt steps fitting each lead-in chunk's start state to the data after it, "
        "before it is carried through the lead-in (0: carried from the settled observed start).",
    )
    span_s: Positive = Field(default=0.6, description="The data a start state is fitted to, at most this long (s).")
    caps_sigma_m: Positive = Field(default=0.002, description="Std of a tracked end cap (m), the tracking noise.")
    cable_sigma_m: Positive = Field(default=0.001, description="Std of a sensed cable length (m), the sensor noise.")
    refits: Annotated[int, Field(ge=0)] = Field(
        default=0,
        description="Fit the start states at the estimate, carry them through the lead-ins and search again, "
        "this many times (the first search runs on the settled starts).",
    )


class GradientConfig(StrictModel):
    """Adam on the loss's gradient, for the parameters the search does not take."""

    warmup_parameters: tuple[EngineParameter, ...] = Field(
        default=("motor_speed",), description="Identified alone first (those also in `sysid.parameters`)."
    )
    warmup_iterations: Annotated[int, Field(ge=0)] = Field(default=0, description="Steps of the warm-up (0: none).")
    lr: Positive = Field(default=0.1, description="Adam learning rate, in units of each parameter's scale.")
    adam_betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        default=(0.5, 0.9), description="Adam's moment decays (less momentum than the usual (0.9, 0.999))."
    )
    lr_decay: Annotated[float, Field(gt=0, le=1)] = Field(default=0.93, description="Learning-rate factor per step.")
    unit_clip: Annotated[float, Field(gt=0)] = Field(
        default=3.0, description="Clip each key frame's gradient to this times the median key-frame gradient norm."
    )
    iterations: Annotated[int, Field(ge=1)] = Field(default=25, description="Most steps.")
    min_iterations: Annotated[int, Field(ge=1)] = Field(default=10, description="Fewest steps.")
    tolerance: Positive = Field(
        default=2e-3, description="Converged when no parameter moved more than this (in scales) for `patience` steps."
    )
    patience: Annotated[int, Field(ge=1)] = 5
    average_last: Annotated[int, Field(ge=1)] = Field(
        default=5, description="Report the mean of the last this many iterates."
    )


class ParameterSearchConfig(StrictModel):
    """CMA-ES on the robust Key Frame Loss, after the gradient steps."""

    parameters: tuple[EngineParameter, ...] = Field(
        default=("motor_speed", "friction", "restitution"),
        description="Fitted by the search (those also in `sysid.parameters`).",
    )
    generations: Annotated[int, Field(ge=0)] = Field(
        default=12, description="CMA-ES generations (each one engine batch); 0: every parameter by gradient."
    )
    population: Annotated[int, Field(ge=2)] = Field(default=8, description="CMA-ES samples per generation.")
    sigma: Positive = Field(default=0.1, description="CMA-ES initial step, in parameter scales.")
    seed: Annotated[int, Field(ge=0)] = Field(default=0, description="Seed of the CMA-ES sampling.")
    robust_scale: Positive = Field(
        default=4.0,
        description="Loss per key frame d / (1 + d / this), d the squared defect in loss.position_sigma_m units.",
    )
    duration_sigma_s: Positive = Field(
        default=0.02,
        description="Scale of the mean difference of engine and data gait durations (s) in the timing penalty "
        "(difference / this)^2.",
    )
    duration_weight: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="Weight of the timing penalty (0: key frames alone)."
    )
    profile_tolerance: Positive = Field(
        default=0.05, description="Profile width: values whose robust loss is within this fraction of the minimum."
    )


class GaitShootingConfig(StrictModel):
    """KFL: gait-wise multiple shooting after the search, every fitted gait one window with its start
    state free (:mod:`pipeline.sysid.shooting`)."""

    iterations: Annotated[int, Field(ge=0)] = Field(
        default=12, description="Levenberg-Marquardt steps per continuity weight and round; 0: off."
    )
    weights: tuple[Positive, ...] = Field(
        default=(0.3,), min_length=1, description="The continuity weights, in order (one round per weight)."
    )
    restarts: Annotated[int, Field(ge=0)] = Field(
        default=1,
        description="Run the weights again this many times, from start states settled at the answer.",
    )
    parameters: tuple[EngineParameter, ...] = Field(
        default=("motor_speed", "friction", "restitution"),
        description="Refined by gait shooting (those also in `sysid.parameters`).",
    )


class SysidConfig(StrictModel):
    """System identification (``sysid`` stage): which parameters, then a section per step."""

    parameters: tuple[EngineParameter, ...] = Field(
        default=("motor_speed", "friction", "restitution"), min_length=1, description="Parameters to identify."
    )
    dt_s: Positive = Field(default=0.005, description="Engine time step for identification (s).")
    priors: dict[EngineParameter, PriorConfig] = Field(default_factory=dict)
    scales: dict[EngineParameter, Positive] = Field(
        default_factory=dict, description="Override a parameter's optimisation scale (SI unit, or log for log-scaled)."
    )
    data: SysidDataConfig = SysidDataConfig()
    latency: LatencyConfig = LatencyConfig()
    loss: SysidLossConfig = SysidLossConfig()
    start_fit: StartFitConfig = StartFitConfig()
    gradient: GradientConfig = GradientConfig()
    search: ParameterSearchConfig = ParameterSearchConfig()
    gait_shooting: GaitShootingConfig = GaitShootingConfig()
