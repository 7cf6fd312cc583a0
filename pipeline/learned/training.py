"""Training the learned contact: normalisation from the data, a curriculum of rollout lengths,
and the checkpoint with the lowest validation loss.

The loss is the hybrid graph-network paper's node loss: over a window of ``K`` ticks rolled out
from its start, the mean squared distance of every graph node from where the data put it, after
each tick, divided by ``(tick * sigma)^2`` with ``sigma`` the spread of the one-tick node velocity
changes the network must produce (so the loss reads as a velocity-change error in units of its own
spread, whatever the step). The curriculum trains rollouts of 1, 2, 4, 8 ticks in turn (config),
each phase with its own learning rate; an epoch takes every window in a random order, or at
most ``windows_per_epoch`` of them drawn afresh, so its cost stops growing with the data. Every
batch is turned about the vertical by a random angle (the physics does not care which way the
robot faces) and its start states are jittered by a little noise (:func:`jittered`). Training's
rollouts run without the engine's lift out of the ground (the network learns to keep the rods out
itself); validation's run the engine as it will be used. The validation loss is that of the
longest length over windows that tile the validation trajectories (each tick predicted once;
overlapping windows would cost as many rollouts as the window is long and tell little more),
after every epoch, and the weights of the best epoch are kept.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.config import CurriculumConfig, LearnConfig
from pipeline.errors import DataError
from pipeline.learned.data import StatesAlong, Windows, windows
from pipeline.learned.engine import LearnedEngine, features
from pipeline.learned.graph import RobotGraph
from pipeline.physics.engine import Engine
from pipeline.physics.params import Params
from pipeline.physics.rotations import matrix_to_quat, quat_to_matrix


@dataclass(frozen=True)
class Epoch:
    """One epoch: curriculum ``phase`` and its rollout ``length`` (ticks), mean training and
    validation losses (dimensionless, see the module; a rollout that diverged counts as infinite),
    optimiser ``steps`` so far, the batches ``skipped`` (their loss was not finite), wall time (s)."""

    phase: int
    length: int
    epoch: int
    train_loss: float
    validation_loss: float
    steps: int
    skipped: int
    wall_s: float


@dataclass(frozen=True)
class TrainingResult:
    """The epochs in order and the kept one (lowest validation loss)."""

    history: list[Epoch]
    best: Epoch


def turned(data: Windows, angle_rad: torch.Tensor) -> Windows:
    """``data`` turned about the vertical axis through the origin by ``angle_rad`` (W,) (the ground
    and gravity do not change, so neither does the physics: the paper's augmentation)."""
    cos, sin = torch.cos(angle_rad), torch.sin(angle_rad)
    zero, one = torch.zeros_like(cos), torch.ones_like(cos)
    turn = torch.stack([cos, -sin, zero, sin, cos, zero, zero, zero, one], -1).reshape(-1, 3, 3)
    turn = turn.to(data.start.pos.dtype)

    def apply(vectors: torch.Tensor) -> torch.Tensor:  # (W, ..., 3)
        shape = vectors.shape
        flat = vectors.reshape(shape[0], -1, 3)
        return torch.einsum("wij,wkj->wki", turn, flat).reshape(shape)

    start = data.start
    rotations = quat_to_matrix(start.quat)
    quat = matrix_to_quat(torch.einsum("wij,wrjk->wrik", turn, rotations))
    moved = start.replace(pos=apply(start.pos), quat=quat, vel=apply(start.vel), omega=apply(start.omega))
    return Windows(moved, data.control, apply(data.target))


def jittered(data: Windows, sigma_m: float, tick_s: float, generator: torch.Generator) -> Windows:
    """``data`` with its starts' rod centres moved by Gaussian noise of ``sigma_m`` (m) and their
    velocities by the same noise over one tick: the network sees the small errors a rollout of its
    own makes and learns to correct them, not to build on them."""
    start = data.start
    noise = torch.randn(start.pos.shape, generator=generator, dtype=start.pos.dtype) * sigma_m
    moved = start.replace(pos=start.pos + noise, vel=start.vel + noise / tick_s)
    return Windows(moved, data.control, data.target)


def substeps(engine: Engine, tick_s: float) -> int:
    """Engine steps per control tick; the tick must be a whole number of steps."""
    n = round(tick_s / engine.dt)
    if n < 1 or abs(n * engine.dt - tick_s) > 1e-9:
        raise DataError(f"the control tick {tick_s} s is not a whole number of engine steps of {engine.dt} s")
    return n


def fit_normalisers(engine: LearnedEngine, params: Params, data: Windows, tick_s: float) -> None:
    """Set the network's input and output statistics from one-tick windows ``data``: the features
    at their starts, and the node velocity changes that would bring the free motion to the data."""
    network = engine.network
    with torch.no_grad():
        batch = params.expand(len(data))
        free = engine.free_motion(batch, data.start, data.control[:, 0])
        graph_features, v_free, _ = features(engine.graph, batch, data.start, free)
        nodes = engine.graph.node_positions(data.start.pos, free.rotations)
        change = (data.target[:, 0] - nodes) / tick_s - v_free
        for kind, values in graph_features.items():
            network.normalisers[kind].fit(values)
        network.target.fit(change)


def rollout_loss(engine: LearnedEngine, params: Params, data: Windows, tick_s: float) -> torch.Tensor:
    """The node loss of ``data``'s windows (see the module), differentiable in the network."""
    steps = substeps(engine, tick_s)
    state = data.start
    batch = params.expand(len(data))
    sigma = float(engine.network.target.std.mean())
    total = torch.zeros((), dtype=state.pos.dtype)
    for k in range(data.length):
        for _ in range(steps):
            state = engine.step(batch, state, data.control[:, k])
        nodes = engine.graph.node_positions(state.pos, quat_to_matrix(state.quat))
        total = total + ((nodes - data.target[:, k]) ** 2).sum(-1).mean()
    return total / data.length / (tick_s * sigma) ** 2


def final_node_error_m(engine: Engine, params: Params, data: Windows, graph: RobotGraph, tick_s: float) -> float:
    """Mean distance (m) of ``graph``'s nodes from the data after the last tick of every window of
    ``data``, each rolled out from its start with its commands in ``engine`` (analytic or
    learned; ``params`` one environment)."""
    steps = substeps(engine, tick_s)
    state = data.start
    with torch.no_grad():
        for k in range(data.length):
            for _ in range(steps):
                state = engine.step(params.expand(len(data)), state, data.control[:, k])
    nodes = graph.node_positions(state.pos, quat_to_matrix(state.quat))
    return float((nodes - data.target[:, -1]).norm(dim=-1).mean())


def _mean_loss(engine: LearnedEngine, params: Params, data: Windows, tick_s: float, batch_size: int) -> float:
    """:func:`rollout_loss` over every window of ``data``, in batches; infinite if a rollout diverged."""
    with torch.no_grad():
        total = sum(
            float(rollout_loss(engine, params, data.take(rows), tick_s)) * len(rows)
            for rows in torch.arange(len(data)).split(batch_size)
        )
    mean = total / len(data)
    return mean if math.isfinite(mean) else math.inf


def train(
    engine: LearnedEngine,
    params: Params,
    train_data: list[StatesAlong],
    validation_data: list[StatesAlong],
    tick_s: float,
    config: LearnConfig,
    curriculum: CurriculumConfig,
    fit_statistics: bool = True,
    progress: Callable[[Epoch], None] | None = None,
) -> TrainingResult:
    """Train ``engine.network`` on ``train_data`` through ``curriculum`` (with ``config``'s batch
    size, weight decay, clip and seed) and keep the weights of the epoch with the lowest
    validation loss on ``validation_data`` (rollouts of the curriculum's longest length), among the
    epochs validated (``curriculum.validate_every_epoch``; the others' loss is NaN).
    ``fit_statistics``: set the normalisation from ``train_data`` first (a fine-tuned model
    keeps its pre-training's). ``params`` (one environment) drives the analytic forces."""
    if not train_data or not validation_data:
        raise DataError("the learned contact needs at least one training and one validation trajectory")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    network = engine.network
    if fit_statistics:
        fit_normalisers(engine, params, windows(train_data, 1), tick_s)
    longest = windows(validation_data, max(curriculum.lengths), stride=max(curriculum.lengths))
    history: list[Epoch] = []
    best: Epoch | None = None
    best_state = copy.deepcopy(network.state_dict())
    began = time.perf_counter()
    steps = 0
    for phase, (length, epochs, lr) in enumerate(
        zip(curriculum.lengths, curriculum.epochs, curriculum.learning_rates, strict=True)
    ):
        data = windows(train_data, length)
        optimiser = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=config.weight_decay)
        last_phase = phase == len(curriculum.lengths) - 1
        for epoch in range(epochs):
            order = torch.randperm(len(data), generator=generator)[: curriculum.windows_per_epoch]
            total, counted, skipped = 0.0, 0, 0
            for i in range(0, len(order), config.batch_size):
                rows = order[i : i + config.batch_size]
                batch = data.take(rows)
                batch = turned(batch, (torch.rand(len(rows), generator=generator) * 2 - 1) * math.pi)
                if config.noise_m > 0:
                    batch = jittered(batch, config.noise_m, tick_s, generator)
                optimiser.zero_grad()
                with engine.unlifted():
                    loss = rollout_loss(engine, params, batch, tick_s)
                if not torch.isfinite(loss):
                    skipped += 1
                    continue
                loss.backward()
                torch.nn.utils.clip_grad_norm_(network.parameters(), config.gradient_clip)
                optimiser.step()
                total += float(loss.detach()) * len(rows)
                counted += len(rows)
                steps += 1
            record = Epoch(
                phase=phase,
                length=length,
                epoch=len(history),
                train_loss=total / counted if counted else math.inf,
                validation_loss=_mean_loss(engine, params, longest, tick_s, config.batch_size)
                if curriculum.validate_every_epoch or last_phase or epoch == epochs - 1
                else math.nan,
                steps=steps,
                skipped=skipped,
                wall_s=time.perf_counter() - began,
            )
            history.append(record)
            if not math.isnan(record.validation_loss) and (
                best is None or record.validation_loss < best.validation_loss
            ):
                best = record
                best_state = copy.deepcopy(network.state_dict())
            if progress is not None:
                progress(record)
    network.load_state_dict(best_state)
    assert best is not None
    return TrainingResult(history, best)
