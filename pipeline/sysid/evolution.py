"""Gradient-free refinement (CMA-ES over a robust Key Frame Loss) after the gradient warm-up.

The engine's contact gradients are straight-through (the friction impulse is
detached, R2S2R paper) and a key frame's defect jumps when the robot tips over an
edge in one execution and not in the other. Both break gradient descent for
friction and restitution: their gradients drift, and a mean of squared defects is
dominated by the few key frames where the engine and the data diverge, so it
prefers whatever parameters make the dynamics least eventful (restitution driven
to zero). :func:`refine` therefore fits ``config.search.parameters`` (by default
the contact parameters and, from the warm-up's value, the motor speed) with CMA-ES
(the ``cma`` package) on the *robust* loss

    rho(d) = d / (1 + d / c),    c = ``config.search.robust_scale``

per key frame (``d`` the weighted squared defect, in units of ``position_sigma_m``
squared), averaged over the scored key frames, plus the loss's own penalty (the
KFL's: the mean timing difference of its gaits, which pins the motor speed) and
the prior per key frame.
A typical key frame counts quadratically; a diverged one counts ``c`` at most,
whatever its size. Each generation is one engine batch: the distribution's mean
and its ``config.search.population`` samples run together
(:meth:`~pipeline.sysid.losses.KeyFrameLoss.population`).

:func:`profiles_through` then reports how well the data pins each searched parameter
down: the robust loss along each parameter alone, from -30 % to +30 % of the
answer (one batch), and the range of values whose loss is within
``config.search.profile_tolerance`` (relative) of the profile's minimum. A parameter the
key frames hardly see (friction in quasi-static rolling) has a wide range. A profile
point that scores lower than the answer (a short search that had not settled) becomes
the answer, and the profiles run again through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import cma
import numpy as np
import torch

from pipeline.config import SysidConfig
from pipeline.physics.params import Params
from pipeline.sysid.losses import TrajectoryLoss
from pipeline.sysid.parameters import ParameterSpace
from pipeline.sysid.result import Identification, Step

log = logging.getLogger(__name__)


def robust_defects(defects: np.ndarray, scale: float) -> np.ndarray:
    """``d / (1 + d / scale)`` elementwise: quadratic below ``scale``, bounded by it above."""
    return defects / (1.0 + defects / scale)


def refine(
    loss_fn: TrajectoryLoss,
    space: ParameterSpace,
    config: SysidConfig,
    progress: Callable[[Step], None] | None = None,
) -> Identification:
    """CMA-ES over ``space`` from its start for ``config.search.generations`` generations.

    The answer is the distribution's final mean (or the start, if that scored lower on the
    robust loss). Where a point on one of its profiles (:func:`profiles_through`) scores lower by
    more than ``config.search.profile_tolerance``, the search had not settled: the answer moves there
    and is profiled again, ``PROFILE_MOVES`` times at most. Returns it with a history of one
    step per generation (the mean's values and robust loss, the step size in ``lr``, no
    gradient) and one per move (``method="profile"``, ``lr`` the profile's span), and each
    parameter's profile range.
    """
    began = time.perf_counter()
    strategy = cma.CMAEvolutionStrategy(
        space.initial().numpy(),
        config.search.sigma,
        {
            "bounds": [space.lower.numpy(), space.upper.numpy()],
            "popsize": config.search.population,
            "seed": config.search.seed + 1,
            "verbose": -9,
        },
    )
    units = max(loss_fn.units, 1)
    scored = np.asarray(loss_fn.scored, dtype=bool)
    history: list[Step] = []
    start_score = np.inf
    for generation in range(config.search.generations):
        mean = strategy.result.xfavorite
        samples = strategy.ask()
        thetas = [space.project(torch.tensor(x, dtype=torch.float64)) for x in [mean, *samples]]
        population = loss_fn.population(Params.concat([space.params(t) for t in thetas]))
        defects = population.defects[:, scored]
        priors = np.array([float(space.prior_penalty(t)) for t in thetas])
        scores = search_scores(defects, population.penalty + priors / units, config)
        strategy.tell(samples, scores[1:].tolist())
        if generation == 0:
            start_score = float(scores[0])
        step = Step(
            iteration=generation,
            values={n: float(v) for n, v in space.values(thetas[0]).items()},
            loss=float(scores[0]),
            unfiltered_loss=float(defects[0].mean()),
            prior=float(priors[0]),
            kept_fraction=1.0,
            gradient=dict.fromkeys(space.names, 0.0),
            lr=float(strategy.sigma),
            wall_s=time.perf_counter() - began,
            method="search",
        )
        history.append(step)
        if progress is not None:
            progress(step)
    final = space.project(torch.tensor(strategy.result.xfavorite, dtype=torch.float64))
    population = loss_fn.population(space.params(final))
    final_score = search_scores(
        population.defects[:, scored], population.penalty + float(space.prior_penalty(final)) / units, config
    )
    if start_score < float(final_score[0]):
        final = space.initial()
    profile = profiles_through(loss_fn, space, final, config)
    for move in range(PROFILE_MOVES):
        if profile.settled(config.search.profile_tolerance):
            break
        final, step = profile.best(iteration=len(history), wall_s=time.perf_counter() - began)
        history.append(step)
        if progress is not None:
            progress(step)
        log.info("sysid: a profile scored lower than the search's answer; moved to %s (%d)", step.values, move + 1)
        profile = profiles_through(loss_fn, space, final, config)
    if not profile.settled(config.search.profile_tolerance):
        log.warning("sysid: the answer is still not its profiles' minimum after %d moves", PROFILE_MOVES)
    return Identification.at(
        space,
        final,
        history=history,
        converged=False,
        wall_s=time.perf_counter() - began,
        profile=profile.widths(config.search.profile_tolerance),
    )


PROFILE_SPAN = 0.3
"""The profile runs from (1 - this) to (1 + this) times the identified value."""
PROFILE_POINTS = 13
"""Values per profile (odd: the middle one is the answer itself)."""
PROFILE_MOVES = 3
"""How many times :func:`refine` moves its answer to a profile point that scores lower."""


@dataclass(frozen=True)
class Profile:
    """The loss along each parameter alone through an answer: ``thetas[i][j]`` the ``j``-th
    point of parameter ``i``'s profile (scaled coordinates), ``values`` (N, PROFILE_POINTS) its
    value (SI), ``scores`` the search score, ``defects`` the mean of the scored defects (position
    sigmas squared), ``priors`` the prior penalty; the middle column is the answer."""

    space: ParameterSpace
    thetas: list[list[torch.Tensor]]
    values: np.ndarray
    scores: np.ndarray
    defects: np.ndarray
    priors: np.ndarray

    def settled(self, tolerance: float) -> bool:
        """Whether the answer scores within ``tolerance`` (relative) of every profile's minimum."""
        return bool(self.scores[0, PROFILE_POINTS // 2] <= self.scores.min() * (1 + tolerance))

    def best(self, iteration: int, wall_s: float) -> tuple[torch.Tensor, Step]:
        """The lowest-scoring profile point and its history step (``method="profile"``, number
        ``iteration``, ``wall_s`` into the search)."""
        i, j = np.unravel_index(int(np.argmin(self.scores)), self.scores.shape)
        theta = self.thetas[i][j]
        step = Step(
            iteration=iteration,
            values={n: float(v) for n, v in self.space.values(theta).items()},
            loss=float(self.scores[i, j]),
            unfiltered_loss=float(self.defects[i, j]),
            prior=float(self.priors[i, j]),
            kept_fraction=1.0,
            gradient=dict.fromkeys(self.space.names, 0.0),
            lr=PROFILE_SPAN,
            wall_s=wall_s,
            method="profile",
        )
        return theta, step

    def widths(self, tolerance: float) -> dict[str, tuple[float, float]]:
        """For each parameter: the lowest and highest value (SI) whose score is within
        ``tolerance`` (relative) of its profile's minimum."""
        out = {}
        for i, name in enumerate(self.space.names):
            near = self.values[i][self.scores[i] <= self.scores[i].min() * (1 + tolerance)]
            out[name] = (float(near.min()), float(near.max()))
        return out


def profiles_through(
    loss_fn: TrajectoryLoss, space: ParameterSpace, theta: torch.Tensor, config: SysidConfig
) -> Profile:
    """Each parameter's profile through ``theta`` (the others fixed; ``PROFILE_POINTS`` values
    from (1 -/+ ``PROFILE_SPAN``) times its value, inside the bounds), all as one engine batch.
    :meth:`Profile.widths` says how well the data pins each parameter down; an answer outside its
    own range means the search had not settled along that parameter."""
    values = space.values(theta)
    thetas = []
    for i, name in enumerate(space.names):
        row = []
        for factor in np.linspace(1 - PROFILE_SPAN, 1 + PROFILE_SPAN, PROFILE_POINTS):
            moved = theta.clone()
            moved[i] = space.theta_of(name, max(float(values[name]) * factor, 1e-9))
            row.append(space.project(moved))
        row[PROFILE_POINTS // 2] = theta
        thetas.append(row)
    flat = [t for row in thetas for t in row]
    scored = np.asarray(loss_fn.scored, dtype=bool)
    population = loss_fn.population(Params.concat([space.params(t) for t in flat]))
    priors = np.array([float(space.prior_penalty(t)) for t in flat])
    scores = search_scores(population.defects[:, scored], population.penalty + priors / max(loss_fn.units, 1), config)
    shape = (len(space.names), PROFILE_POINTS)
    return Profile(
        space=space,
        thetas=thetas,
        values=np.array([[float(space.values(t)[n]) for t in row] for n, row in zip(space.names, thetas, strict=True)]),
        scores=scores.reshape(shape),
        defects=population.defects[:, scored].mean(-1).reshape(shape),
        priors=priors.reshape(shape),
    )


def search_scores(defects: np.ndarray, penalties: np.ndarray, config: SysidConfig) -> np.ndarray:
    """Search score (P,) of candidates: robust loss of their scored defects (P, K) plus their
    penalties (P,) (the loss's own and the prior per unit)."""
    return robust_defects(defects, config.search.robust_scale).mean(-1) + penalties
