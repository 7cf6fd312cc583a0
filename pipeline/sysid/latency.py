"""Control latency by grid search, with the motor speed profiled out (the sim-to-real notes' whole-loop view).

The engine applies a command a whole number of control ticks after the sensor
reading it answers (``pid.latency_s``): a discrete choice with no gradient. A latency
and the motor speed trade off in the gaits' timing (a later start is made up by a
faster motor), so scoring each candidate at the start's motor speed picks whichever
latency best excuses the start's speed error. Each candidate is therefore scored at
its own best motor speed among the start's times each of ``speed_factors`` (one engine
batch). The score is the search's robust key-frame loss
(:func:`~pipeline.sysid.evolution.search_scores`) plus ``config.search.duration_weight`` times
the loss's *timing*, the mean squared difference of the gaits' durations: a latency
delays every gait by the same time, a motor speed in proportion to the gait's travel,
so the spread of the gaits' timing errors tells them apart where the search's pooled
timing penalty (the squared mean difference) cannot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig, SysidConfig
from pipeline.physics.engine import Engine
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from pipeline.sysid.data import Gait, Recording
from pipeline.sysid.evolution import search_scores
from pipeline.sysid.losses import TrajectoryLoss, make_loss


@dataclass(frozen=True)
class LatencyChoice:
    """The chosen ``latency_s`` (s); each candidate's profiled search score ``scores`` and the
    motor speed ``motor_speeds`` it was reached at, by latency (s)."""

    latency_s: float
    scores: dict[float, float]
    motor_speeds: dict[float, float]


def best_latency(
    build: Callable[[float], TrajectoryLoss],
    params: Params,
    candidates_s: Sequence[float],
    speed_factors: Sequence[float],
    config: SysidConfig,
) -> LatencyChoice:
    """The candidate latency (s) whose loss (built by ``build(latency_s)``) scores lowest at its
    best motor speed among ``params``' (one environment) times each of ``speed_factors``."""
    if not candidates_s:
        raise ValueError("no latency candidates")
    if not speed_factors:
        raise ValueError("no motor speed factors to profile each latency over")
    speeds = [float(params.motor_speed[0]) * f for f in speed_factors]
    profile = Params.concat([params.replace(motor_speed=params.motor_speed.new_tensor([s])) for s in speeds])
    scores, motor_speeds = {}, {}
    for latency in candidates_s:
        loss = build(float(latency))
        population = loss.population(profile)
        scored = np.asarray(loss.scored, dtype=bool)
        each = search_scores(population.defects[:, scored], config.search.duration_weight * population.timing, config)
        best = int(np.argmin(each))
        scores[float(latency)], motor_speeds[float(latency)] = float(each[best]), speeds[best]
    chosen = min(scores, key=scores.__getitem__)
    return LatencyChoice(chosen, scores, motor_speeds)


def with_latency(robot: RobotConfig, latency_s: float) -> RobotConfig:
    """``robot`` with its control latency set to ``latency_s`` (s)."""
    return robot.model_copy(update={"pid": robot.pid.model_copy(update={"latency_s": latency_s})})


def latency_robot(
    robot: RobotConfig,
    recordings: dict[str, Recording],
    fit: list[Gait],
    config: SysidConfig,
    timeout_s: float,
    compiled: bool = False,
) -> tuple[RobotConfig, LatencyChoice | None]:
    """``robot`` with the control latency of ``config.latency.grid_s`` that scores lowest on the
    ``fit`` gaits at its best motor speed (:func:`best_latency`), and the choice (``robot`` as it
    is, and None, without a grid). ``timeout_s``: the segment timeout (s) of recordings that do
    not say; ``compiled``: the engines' ``compiled`` setting."""
    if not config.latency.grid_s:
        return robot, None
    start = Params.from_robot(robot)

    def build(latency_s: float) -> TrajectoryLoss:
        candidate = with_latency(robot, latency_s)
        engine = Engine(RobotModel.from_robot(candidate), dt=config.dt_s, compiled=compiled)
        return make_loss(engine, candidate, recordings, fit, start, config, timeout_s)

    choice = best_latency(build, start, config.latency.grid_s, config.latency.speed_factors, config)
    return with_latency(robot, choice.latency_s), choice
