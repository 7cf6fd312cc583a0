"""Which searched gait each long policy repeats: expand every ranked candidate, judge the whole
policies in the engine, pick one.

The best single cycle need not repeat well: a gait can leave the robot where the mapped next
cycle's shapes roll nothing, and a policy that rolls far from one start can fail from starts a
few millimetres away. So :func:`judged_expansions` expands each of an objective's ranked gaits
to the whole policy and runs it as the robot will (one run, the controller never restarted)
over the parameter ensemble and over perturbed starts (:mod:`pipeline.gaits.ensemble`), and
:func:`pick_expansion` picks the policy that reaches every target from enough of those starts
and scores best. :func:`expanded_policies` does both for the straight and the turning policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from pipeline.config import GaitsConfig, RobotConfig
from pipeline.gaits.ensemble import ensemble_mean, ensemble_outcome, ensemble_params, perturbed_starts, scenarios
from pipeline.gaits.expansion import expand_in_engine
from pipeline.gaits.search import FoundGait, objective_score
from pipeline.physics import Engine, Params
from pipeline.physics.engine import State
from pipeline.policies import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A candidate long policy as :func:`judged_expansions` judged it: its gait's ``rank`` among its
    objective's ranked gaits, the expanded ``policy`` (cycles * n, 6), whether it ``reached`` every
    target without folding the prism flat with the nominal parameters from the search's start,
    its mean ``score`` on the objective (m or rad) over every run it was judged by (a run that
    folded the prism flat scoring 0), and the ``reached_share`` of the perturbed starts from
    which it reached every target without folding it (1.0 when there were none)."""

    rank: int
    policy: np.ndarray
    reached: bool
    score: float
    reached_share: float


@dataclass(frozen=True)
class Expansion:
    """A policy expanded from a searched gait: the ``policy`` (unsmoothed), the ``gait`` it repeats
    and that gait's ``rank`` among its objective's candidates (0: the best); ``judged``: how
    :func:`judged_expansions` scored it (None where no candidate reached every target)."""

    policy: Policy
    gait: FoundGait
    rank: int
    judged: Candidate | None


def judged_expansions(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    start: State,
    ranked: list[FoundGait],
    cycles: int,
    timeout_s: float,
    ensemble: Params | None = None,
    starts: State | None = None,
) -> list[Candidate]:
    """Each of ``ranked`` (one objective's gaits) expanded to ``cycles`` cycles in the engine from
    ``start`` (one environment; gaits of one length as one batch; ``timeout_s`` per target) and
    judged, in rank order.

    Each policy runs under each parameter set of ``ensemble``
    (:func:`~pipeline.gaits.ensemble.ensemble_params`, the nominal ``params`` first; None:
    ``params`` alone) from ``start``, and under ``params`` from each of ``starts``
    (:func:`~pipeline.gaits.ensemble.perturbed_starts`; None: none). Its score is the mean of
    :func:`~pipeline.gaits.search.objective_score` over all those runs, its reached share the
    share of ``starts`` from which it reaches every target; a run that folds the prism flat
    (:attr:`~pipeline.gaits.outcome.Outcome.collapsed`) scores 0 and reaches nothing.
    Every candidate is expanded and run as the robot will run it: the expansion's own
    cycle-by-cycle runs restart the controller at each cycle and can reach where the whole
    run does not."""
    sets, set_starts = scenarios(params if ensemble is None else ensemble, start, params, starts)
    perturbed = 0 if starts is None else starts.batch_size
    judged: list[Candidate] = []
    for length in sorted({len(g.targets) for g in ranked}):
        ranks = [r for r, g in enumerate(ranked) if len(g.targets) == length]
        gaits = np.stack([ranked[r].targets for r in ranks])
        policies = expand_in_engine(engine, params, robot, start, gaits, cycles, timeout_s)
        outcome = ensemble_outcome(engine, sets, robot, set_starts, policies, timeout_s)
        scores = outcome.credited(objective_score(ranked[0].objective, outcome.forward_m, outcome.rotation_rad))
        means = ensemble_mean(scores, len(ranks))
        reached = np.asarray(outcome.succeeded, dtype=float).reshape(-1, len(ranks))
        shares = reached[len(reached) - perturbed :].mean(0) if perturbed else np.ones(len(ranks))
        judged += [
            Candidate(rank, policies[row], bool(reached[0, row]), float(means[row]), float(shares[row]))
            for row, rank in enumerate(ranks)
        ]
    return sorted(judged, key=lambda c: c.rank)


def pick_expansion(candidates: list[Candidate], min_reached: float) -> Candidate | None:
    """Of ``candidates``, those whose policy reaches every target from the search's start; of
    those, the ones reaching from at least ``min_reached`` of the perturbed starts ranked by score
    (ties: the better-ranked gait); where none reaches from that many, the highest share wins.
    None if no candidate reaches from the search's start."""
    eligible = [c for c in candidates if c.reached]
    if not eligible:
        return None
    return max(eligible, key=lambda c: (min(c.reached_share, min_reached), c.score, -c.rank))


def expanded_policies(
    config: GaitsConfig,
    timeout_s: float,
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    start: State,
    candidates: dict[str, list[FoundGait]],
) -> dict[str, Expansion]:
    """The straight policy (``straight_cycles`` forward cycles) and the turning policy
    (``turn_cycles`` of the ``turn`` gait), expanded by symmetry in the engine (unsmoothed,
    ``timeout_s`` per target).

    Each repeats the one of its objective's ranked ``candidates`` whose expansion does best in
    the engine over the parameter ensemble and ``expansion_starts`` perturbed starts and reaches
    every target (:func:`judged_expansions`, :func:`pick_expansion`). If none reaches, the best
    single cycle (with a warning)."""
    ensemble = ensemble_params(params, config.search.ensemble_motor_speed, config.search.ensemble_friction)
    starts = None
    if config.expansion_starts:
        starts = perturbed_starts(engine, params, robot, start, config.expansion_starts, config.expansion_start_sigma_m)
    plans = {"straight": ("forward", config.straight_cycles), "turning": (config.turn, config.turn_cycles)}
    out = {}
    for name, (objective, cycles) in plans.items():
        ranked = candidates[objective]
        judged = judged_expansions(engine, params, robot, start, ranked, cycles, timeout_s, ensemble, starts)
        found = pick_expansion(judged, config.expansion_min_reached)
        if found is None:
            log.warning(
                "%s policy: no %s gait of %d reaches every target over %d cycles in the engine; using the best",
                name,
                objective,
                len(ranked),
                cycles,
            )
            rank, targets = 0, expand_in_engine(engine, params, robot, start, ranked[0].targets, cycles, timeout_s)
        else:
            rank, targets = found.rank, found.policy
            if found.reached_share < config.expansion_min_reached:
                log.warning(
                    "%s policy: no %s gait reaches every target from %.0f %% of %d perturbed starts; the best "
                    "reaches from %.0f %%",
                    name,
                    objective,
                    100 * config.expansion_min_reached,
                    config.expansion_starts,
                    100 * found.reached_share,
                )
        out[name] = Expansion(Policy(f"{name}-{objective}", targets), ranked[rank], rank, found)
    return out
