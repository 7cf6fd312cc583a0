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

A profile whose best speed lies at an edge of the factors has not found that latency's best
speed, and scores it too high: the latencies that want a motor beyond that edge lose to those
that do not (a motor 20 % slower than the start wants the shorter latencies, whose best speeds
then lie below the default factors' 0.8). So each profile steps on past the edge, one engine
batch a step of the edge's spacing, until its best lies inside, for at most as many steps as
there are factors, never past the motor speed's search bounds.
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
from pipeline.sysid.parameters import search_bounds


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
    speeds = sorted({float(params.motor_speed[0]) * f for f in speed_factors})
    scores, motor_speeds = {}, {}
    for latency in candidates_s:
        profile = _speed_profile(build(float(latency)), params, speeds, config)
        best = min(profile, key=profile.__getitem__)
        scores[float(latency)], motor_speeds[float(latency)] = profile[best], best
    chosen = min(scores, key=scores.__getitem__)
    return LatencyChoice(chosen, scores, motor_speeds)


def _speed_profile(
    loss: TrajectoryLoss, params: Params, speeds: list[float], config: SysidConfig
) -> dict[float, float]:
    """The search score of ``loss`` at each motor speed of ``speeds`` (``Params.motor_speed``'s
    scale ``s`` in ``omega = s * omega_max * u``, ascending), stepped on past an edge where the best
    lies (module docstring): motor speed -> score."""
    low, high = search_bounds("motor_speed")
    scored = np.asarray(loss.scored, dtype=bool)
    profile: dict[float, float] = {}
    batch = speeds
    for _ in range(len(speeds) + 1):
        candidates = Params.concat([params.replace(motor_speed=params.motor_speed.new_tensor([s])) for s in batch])
        population = loss.population(candidates)
        each = search_scores(population.defects[:, scored], config.search.duration_weight * population.timing, config)
        profile.update(zip(batch, map(float, each), strict=True))
        tried = sorted(profile)
        best = min(profile, key=profile.__getitem__)
        if len(tried) < 2:
            break
        if best == tried[0] and 2 * tried[0] - tried[1] >= low:
            batch = [2 * tried[0] - tried[1]]
        elif best == tried[-1] and 2 * tried[-1] - tried[-2] <= high:
            batch = [2 * tried[-1] - tried[-2]]
        else:
            break
    return profile


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
