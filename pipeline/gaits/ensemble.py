"""Parameter ensembles for ranking gaits by how well they do when the engine is a little wrong.

A search that keeps the best of thousands of simulated gaits also keeps the ones whose motion
hangs on a marginal event (a rod that just tips over an edge in the engine and not on the
robot). On the rolling engine with the twin's own values, the search's best forward gaits moved
0.05 to 1.2 m over three cycles when the motor speed changed by 5 % or the friction by 15 %,
and the one chosen rolled 0.75 m in the engine and 0.26 m on the twin. Scoring each gait by its
mean over an ensemble of nearby parameters prefers those whose motion holds up.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params


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


def ensemble_outcome(
    engine: Engine,
    ensemble: Params,
    robot: RobotConfig,
    start: State,
    targets: np.ndarray,
    timeout_s: float,
    final_hold_s: float = 1.0,
) -> Outcome:
    """Each of ``targets`` (N, n, 6) from ``start`` (one environment) under each of the K
    parameter sets of ``ensemble``, as one batch: row ``k * N + i`` is policy i under set k
    (:func:`~pipeline.gaits.outcome.simulate_targets`, its final hold ``final_hold_s``)."""
    k, n = ensemble.batch_size, len(targets)
    params = Params(**{name: value.repeat_interleave(n) for name, value in ensemble.as_dict().items()})
    return simulate_targets(
        engine, params, robot, start.repeat(k * n), np.tile(targets, (k, 1, 1)), timeout_s, final_hold_s=final_hold_s
    )


def ensemble_mean(values: np.ndarray, n: int) -> np.ndarray:
    """Per policy (n,), the mean of ``values`` (K * n,) over the ensemble's rows (:func:`ensemble_outcome`'s layout)."""
    return np.asarray(values, dtype=float).reshape(-1, n).mean(0)
