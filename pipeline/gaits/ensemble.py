"""Parameter ensembles for ranking gaits by how well they do when the engine is a little wrong.

A search that keeps the best of thousands of simulated gaits also keeps the ones whose motion
hangs on a marginal event (a rod that just tips over an edge in the engine and not on the
robot). On the rolling engine with the twin's own values, the search's best forward gaits moved
0.05 to 1.2 m over three cycles when the motor speed changed by 5 % or the friction by 15 %,
and the one chosen rolled 0.75 m in the engine and 0.26 m on the twin. Scoring each gait by its
mean over an ensemble of nearby parameters prefers those whose motion holds up.

The start is the other thing the engine gets a little wrong: the robot never starts exactly
where the search settled it, only within the tracking error, and a long policy that rolls far
from one start can roll a fraction of that, or reach no target, from starts 2 mm away (docs/gaits.md
gives a measured case). :func:`perturbed_starts` makes such starts, and
:func:`scenarios` joins them to a parameter ensemble for :func:`ensemble_outcome`.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import settle, state_from_caps


def ensemble_params(params: Params, motor_speed: float, friction: float) -> Params:
    """``params`` (one environment) and its variants (K environments, the nominal first): the
    motor speed ``motor_speed`` and the friction ``friction`` (fractions) lower and higher, one at
    a time; zero fractions add no variant."""
    factors = [(1.0, 1.0)]
    factors += [(1.0 + s * motor_speed, 1.0) for s in (-1, 1) if motor_speed > 0]
    factors += [(1.0, 1.0 + s * friction) for s in (-1, 1) if friction > 0]
    scale = torch.tensor(factors, dtype=params.motor_speed.dtype, device=params.motor_speed.device)
    base = params.expand(len(factors))
    return base.replace(motor_speed=base.motor_speed * scale[:, 0], friction=base.friction * scale[:, 1])


def perturbed_starts(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    start: State,
    draws: int,
    sigma_m: float,
    seed: int = 0,
) -> State:
    """``draws`` starts (environments) near ``start`` (one environment, at rest): its end caps with
    independent Gaussian noise of standard deviation ``sigma_m`` (m) on every coordinate, made
    into rods and settled for 1 s under ``params`` (one environment) with the cables at rest length,
    as :func:`~tasks.gaits.rest_start` settles the search's start. The noise is drawn from
    ``seed``; zero ``sigma_m`` gives the start settled again."""
    caps = engine.cap_positions(start).numpy()
    noisy = caps + np.random.default_rng(seed).normal(0.0, sigma_m, (draws, *caps.shape[1:]))
    batch = params.expand(draws)
    return settle(engine, batch, state_from_caps(engine, batch, noisy), robot.pid, torch.ones(6), duration_s=1.0)


def scenarios(ensemble: Params, start: State, params: Params, starts: State | None) -> tuple[Params, State]:
    """The runs a policy is judged by: each of the K sets of ``ensemble`` from ``start`` (one
    environment), then ``params`` (one environment) from each of the S ``starts`` (None: none)
    -> K + S parameter sets and as many starts, for :func:`ensemble_outcome`."""
    if starts is None:
        return ensemble, start.repeat(ensemble.batch_size)
    return Params.concat([ensemble, params.expand(starts.batch_size)]), State.concat(
        [start.repeat(ensemble.batch_size), starts]
    )


def ensemble_outcome(
    engine: Engine,
    ensemble: Params,
    robot: RobotConfig,
    start: State,
    targets: np.ndarray,
    timeout_s: float,
    final_hold_s: float = 1.0,
) -> Outcome:
    """Each of ``targets`` (N, n, 6) under each of the K parameter sets of ``ensemble``, from
    ``start`` (one environment, or K: set k's own start, as :func:`scenarios` pairs them), as one
    batch: row ``k * N + i`` is policy i under set k
    (:func:`~pipeline.gaits.outcome.simulate_targets`, its final hold ``final_hold_s``)."""
    k, n = ensemble.batch_size, len(targets)
    if start.batch_size not in (1, k):
        raise ValueError(f"ensemble_outcome: {start.batch_size} starts for {k} parameter sets; expected 1 or {k}")
    params = Params(**{name: value.repeat_interleave(n) for name, value in ensemble.as_dict().items()})
    starts = start.repeat(k * n) if start.batch_size == 1 else start.repeat(n)
    return simulate_targets(
        engine, params, robot, starts, np.tile(targets, (k, 1, 1)), timeout_s, final_hold_s=final_hold_s
    )


def ensemble_mean(values: np.ndarray, n: int) -> np.ndarray:
    """Per policy (n,), the mean of ``values`` (K * n,) over the ensemble's rows (:func:`ensemble_outcome`'s layout)."""
    return np.asarray(values, dtype=float).reshape(-1, n).mean(0)
