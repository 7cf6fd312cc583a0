"""Gradient-descent identification through the differentiable engine (R2S2R paper, sim-to-real notes).

:func:`identify` runs Adam on the scaled coordinates of a
:class:`~pipeline.sysid.parameters.ParameterSpace` to minimise a trajectory loss
(KFL by default) plus the optional prior, with an exponentially decaying learning
rate, projection into the physical bounds after every step, and an early stop once
no parameter has moved more than ``tolerance`` (in its scale) for ``patience`` steps.

The gradient is gathered per unit of the loss (a key frame, or a window): each
unit's gradient is clipped to ``unit_clip`` times the median unit norm before they
are summed, so one key frame whose gradient explodes through a contact event does
not decide the step (it still counts, with the weight of a typical one).

The engine's gradients hold the discrete events of a rollout fixed (which tick a
target is reached, which contacts are active), so their *direction* is informative
but their *size* is not: it jumps when an event moves by a tick (e.g. a gradient 20
times larger just below the true motor speed than just above it), and such jumps
would steer Adam's moment estimates for tens of steps. Each step's gradient is
therefore normalised to unit norm before Adam sees it (normalised gradient descent;
Adam's per-parameter scaling still applies), with less momentum than Adam's
default (``adam_betas`` (0.5, 0.9)) so it does not overshoot on a kinked loss. The
candidate answer is the mean of the last ``average_last`` iterates (iterate
averaging, for the oscillation left by noisy key frames).

The masked KFL is not one fixed function (the mask changes with the parameters), so
the answer is chosen by the *unfiltered* loss (every scored key frame): the averaged
iterate, unless an evaluated iterate (the start included) scored lower. So the
result is never worse than the start on the fitting data's key frames.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from pipeline.config import GradientConfig, SysidConfig
from pipeline.physics.params import Params
from pipeline.sysid.evolution import PROFILE_MOVES, refine
from pipeline.sysid.losses import KeyFrameLoss, LossValue, TrajectoryLoss
from pipeline.sysid.parameters import ParameterSpace
from pipeline.sysid.result import Identification, Step
from pipeline.sysid.shooting import GaitShooting

log = logging.getLogger(__name__)


def identify(
    loss_fn: TrajectoryLoss,
    space: ParameterSpace,
    config: GradientConfig,
    progress: Callable[[Step], None] | None = None,
) -> Identification:
    """Minimise ``loss_fn`` over ``space``'s parameters; ``progress`` is called after every step
    (its gradient is the aggregated one, before normalisation)."""
    theta = space.initial().clone().requires_grad_(True)
    optimiser = torch.optim.Adam([theta], lr=config.lr, betas=config.adam_betas)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimiser, gamma=config.lr_decay)
    history: list[Step] = []
    start = time.perf_counter()
    still = 0
    converged = False
    iterates: list[torch.Tensor] = []
    for iteration in range(config.iterations):
        optimiser.zero_grad()
        value, per_unit = unit_gradients(loss_fn, space, theta)
        gradient = robust_sum(per_unit, config.unit_clip)
        prior = space.prior_penalty(theta)
        if prior.requires_grad:
            prior_gradient = torch.autograd.grad(prior / max(loss_fn.units, 1), theta)[0]
            gradient = gradient + prior_gradient
        if not torch.isfinite(gradient).all():
            raise FloatingPointError(f"sysid: non-finite gradient at step {iteration}: {gradient.tolist()}")
        before = theta.detach().clone()
        step = Step(
            iteration=iteration,
            values={n: float(v) for n, v in space.values(before).items()},
            loss=float(value.loss.detach()),
            unfiltered_loss=value.unfiltered,
            prior=float(prior.detach()),
            kept_fraction=float(np.mean(value.kept)),
            gradient={n: float(g) for n, g in zip(space.names, gradient, strict=True)},
            lr=float(optimiser.param_groups[0]["lr"]),
            wall_s=time.perf_counter() - start,
        )
        history.append(step)
        if progress is not None:
            progress(step)
        theta.grad = gradient / gradient.norm().clamp(min=1e-300)
        optimiser.step()
        space.project(theta)
        iterates.append(theta.detach().clone())
        schedule.step()
        moved = float((theta.detach() - before).abs().max())
        still = still + 1 if moved < config.tolerance else 0
        if iteration + 1 >= config.min_iterations and still >= config.patience:
            converged = True
            break
    averaged = torch.stack(iterates[-config.average_last :]).mean(0)
    with torch.no_grad():
        averaged_loss = _objective(loss_fn, space, averaged)
    best = min(history, key=lambda s: s.unfiltered_loss + s.prior / max(loss_fn.units, 1))
    final = averaged
    if best.unfiltered_loss + best.prior / max(loss_fn.units, 1) < averaged_loss:
        final = torch.tensor([space.theta_of(n, best.values[n]) for n in space.names], dtype=torch.float64)
    return Identification.at(
        space,
        final,
        history=history,
        converged=converged,
        wall_s=time.perf_counter() - start,
    )


def _objective(loss_fn: TrajectoryLoss, space: ParameterSpace, theta: torch.Tensor) -> float:
    """Unfiltered loss plus the prior (per unit) at ``theta``."""
    value = loss_fn(space.params(theta).expand(loss_fn.units))
    return value.unfiltered + float(space.prior_penalty(theta)) / max(loss_fn.units, 1)


def unit_gradients(
    loss_fn: TrajectoryLoss, space: ParameterSpace, theta: torch.Tensor
) -> tuple[LossValue, torch.Tensor]:
    """The loss at ``theta`` and each unit's gradient with respect to ``theta``, (units, P)."""
    values = space.values(theta)
    dtype = space.start.motor_speed.dtype
    leaves = {n: v.detach().to(dtype).expand(loss_fn.units).clone().requires_grad_(True) for n, v in values.items()}
    base = {n: v.expand(loss_fn.units) for n, v in space.start.as_dict().items()}
    value = loss_fn(Params(**{**base, **leaves}))
    grads = torch.autograd.grad(value.loss, list(leaves.values()), allow_unused=True)
    chain = torch.stack([torch.autograd.grad(values[n], theta, retain_graph=True)[0] for n in space.names])
    per_unit = torch.stack([torch.zeros(loss_fn.units) if g is None else g.to(torch.float64) for g in grads], -1)
    return value, _finite_rows(per_unit, torch.as_tensor(value.kept)) @ chain


def _finite_rows(per_unit: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """``per_unit`` gradients (units, P) with those of units outside the loss (``kept`` false)
    set to exactly zero, and those of counted units that are not finite set to zero with a
    warning. A rollout whose derivatives overflowed (a long, stuck gait pressed into the ground)
    turns the loss's zero weight on an uncounted unit into NaN (0 * inf); a counted one's
    gradient says nothing then, and the other units' still do."""
    broken = kept & ~torch.isfinite(per_unit).all(-1)
    if bool(broken.any()):
        log.warning(
            "sysid: the gradient of %d of %d counted units is not finite (a rollout's derivatives "
            "overflowed); they count as having none this step",
            int(broken.sum()),
            int(kept.sum()),
        )
    return torch.where((kept & ~broken)[:, None], per_unit, torch.zeros_like(per_unit))


def robust_sum(unit_gradients: torch.Tensor, clip: float) -> torch.Tensor:
    """Sum of the units' gradients (U, P), each first scaled down to at most ``clip`` times the
    median norm of the units that have a gradient."""
    norms = unit_gradients.norm(dim=-1)
    nonzero = norms[norms > 0]
    if len(nonzero) == 0:
        return unit_gradients.sum(0)
    bound = clip * nonzero.median()
    scale = torch.where(norms > bound, bound / norms.clamp(min=1e-300), torch.ones_like(norms))
    return (unit_gradients * scale[:, None]).sum(0)


def identify_staged(
    loss_fn: TrajectoryLoss,
    start: Params,
    config: SysidConfig,
    progress: Callable[[Step], None] | None = None,
) -> Identification:
    """Identify ``config.parameters`` from ``start`` (one environment) in stages:

    1. a warm-up that fits ``config.gradient.warmup_parameters`` alone by gradient for
       ``config.gradient.warmup_iterations`` steps. Timing parameters (motor speed) decide which key
       frames are compared at all; while they are far off, the other parameters' gradients
       mostly answer the timing error, so they are fitted first;
    2. :func:`identify` (gradient) of the parameters not in ``config.search.parameters``;
    3. :func:`~pipeline.sysid.evolution.refine` (CMA-ES on the robust loss) of those in
       ``config.search.parameters``, from the values the gradient stages reached (a warmed-up
       parameter may be searched again: the warm-up only gives the search its start).

    With the Key Frame Loss and ``config.start_fit.iterations``, the lead-in chunks' start states
    are then ``config.start_fit.refits`` times fitted at the estimate and carried through the
    lead-ins (:meth:`~pipeline.sysid.losses.KeyFrameLoss.with_fitted_starts`), each time followed
    by the search again (or, without a search, the gradient stages). The first pass uses the
    settled starts: a fit at parameters far from the data's (the nominal motor speed) would bend
    them.

    With the Key Frame Loss and ``config.gait_shooting.iterations``, gait-wise multiple shooting
    (:class:`~pipeline.sysid.shooting.GaitShooting`) then refines ``config.gait_shooting.parameters``
    from there, with every fitted gait's start state free; the search's profile widths of those
    parameters are dropped (they describe the search's answer).

    The history holds every stage in order, each step with every parameter's value (those not
    fitted in a stage at their current values, with zero gradient).
    """
    searched, stages = _plan(config)
    began = time.perf_counter()
    history: list[Step] = []
    profile: dict[str, tuple[float, float]] = {}
    current = start
    converged = True
    fits_starts = isinstance(loss_fn, KeyFrameLoss) and config.start_fit.iterations > 0
    for fit_round in range(1 + (config.start_fit.refits if fits_starts else 0)):
        if fit_round > 0:
            loss_fn = loss_fn.with_fitted_starts(current)
        for names, stage_config in stages if fit_round == 0 or not searched else []:
            result = identify(loss_fn, ParameterSpace.configured(names, current, config), stage_config, progress)
            history += _with_every_value(result.history, current, config.parameters, len(history))
            current, converged = result.params, result.converged
        if searched:
            result = refine(loss_fn, ParameterSpace.configured(searched, current, config), config, progress)
            history += _with_every_value(result.history, current, config.parameters, len(history))
            current, profile = result.params, result.profile
    shot = _shot(config)
    if isinstance(loss_fn, KeyFrameLoss) and shot:
        fit = GaitShooting(loss_fn, ParameterSpace.configured(shot, current, config), config).solve(progress)
        log.info(
            "sysid: gait shooting %s; data cost %.0f for %d residuals; continuity defects %s; %d windows dropped",
            fit.identification.values,
            fit.data_cost,
            fit.residual_count,
            fit.defect_rms,
            fit.dropped_windows,
        )
        history += _with_every_value(fit.identification.history, current, config.parameters, len(history))
        current, converged = fit.identification.params, fit.identification.converged
        profile = {n: width for n, width in profile.items() if n not in shot}
    return Identification(
        values={n: float(getattr(current, n)[0]) for n in config.parameters},
        params=current,
        history=history,
        converged=converged,
        wall_s=time.perf_counter() - began,
        profile=profile,
        standard_error=fit.identification.standard_error if isinstance(loss_fn, KeyFrameLoss) and shot else {},
    )


def planned_steps(config: SysidConfig) -> int:
    """The most steps :func:`identify_staged` takes with ``config`` (gradient steps, generations
    and the search's profile moves, :data:`~pipeline.sysid.evolution.PROFILE_MOVES`)."""
    searched, stages = _plan(config)
    refits = config.start_fit.refits if config.loss.kind == "kfl" and config.start_fit.iterations else 0
    gradient_steps = sum(c.iterations for _, c in stages)
    weight_passes = (1 + config.gait_shooting.restarts) * len(config.gait_shooting.weights)
    shooting_steps = weight_passes * config.gait_shooting.iterations if _shot(config) else 0
    if searched:
        return gradient_steps + (1 + refits) * (config.search.generations + PROFILE_MOVES) + shooting_steps
    return (1 + refits) * gradient_steps + shooting_steps


def _shot(config: SysidConfig) -> tuple[str, ...]:
    """The parameters gait shooting refines with ``config`` (none: it is off)."""
    if config.loss.kind != "kfl" or config.gait_shooting.iterations == 0:
        return ()
    return tuple(n for n in config.parameters if n in config.gait_shooting.parameters)


def _plan(config: SysidConfig) -> tuple[tuple[str, ...], list[tuple[tuple[str, ...], GradientConfig]]]:
    """The searched parameters and the gradient stages (parameters, their gradient config) of ``config``."""
    searched = tuple(n for n in config.parameters if n in config.search.parameters) if config.search.generations else ()
    by_gradient = tuple(n for n in config.parameters if n not in searched)
    warmup = tuple(n for n in config.gradient.warmup_parameters if n in config.parameters)
    stages = []
    if warmup and config.gradient.warmup_iterations > 0 and set(warmup) != set(by_gradient):
        stages.append((warmup, config.gradient.updated({"iterations": config.gradient.warmup_iterations})))
    if by_gradient:
        stages.append((by_gradient, config.gradient))
    return searched, stages


def _with_every_value(steps: list[Step], current: Params, names: tuple[str, ...], offset: int) -> list[Step]:
    """``steps`` numbered from ``offset``, with every parameter of ``names`` in their values
    (those the steps did not fit at ``current``'s value, with zero gradient)."""
    fixed = {n: float(getattr(current, n)[0]) for n in names}
    return [
        replace(
            s,
            iteration=s.iteration + offset,
            values={**fixed, **s.values},
            gradient={**dict.fromkeys(fixed, 0.0), **s.gradient},
        )
        for s in steps
    ]
