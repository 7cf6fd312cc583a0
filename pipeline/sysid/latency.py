"""Control latency by grid search (seed 003's whole-loop view).

The engine applies a command a whole number of control ticks after the sensor
reading it answers (``pid.latency_s``): a discrete choice with no gradient. Each
candidate is scored by the unfiltered Key Frame Loss at the starting parameters,
and the best one is kept for the gradient-based identification that follows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pipeline.physics.params import Params
from pipeline.sysid.losses import TrajectoryLoss


def best_latency(
    build: Callable[[float], TrajectoryLoss], params: Params, candidates_s: Sequence[float]
) -> tuple[float, dict[float, float]]:
    """The candidate latency (s) whose loss (built by ``build(latency_s)``) is lowest at ``params``
    (one environment), and every candidate's loss."""
    if not candidates_s:
        raise ValueError("no latency candidates")
    scores = {}
    for latency in candidates_s:
        loss = build(float(latency))
        with torch.no_grad():
            scores[float(latency)] = loss(params.expand(loss.units)).unfiltered
    return min(scores, key=scores.__getitem__), scores
