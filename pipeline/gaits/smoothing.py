"""Transition smoothing of expanded policies (R2S2R paper, Fig. 22).

An expanded policy returns to the rest shape (all ones) between gait cycles. At a
transition ``A -> rest -> B0 -> B1 -> ...`` the reset is redundant actuation: the
policy can go from ``A`` straight on to the next gait. A shortcut ``A -> Bk`` drops
the rest step(s) and ``B0 .. B(k-1)``; it is a candidate when every skipped ``Bj``
lies, cable by cable, between ``A`` and ``Bk`` (going straight to ``Bk`` passes each
skipped shape, so no cable reverses; ``A -> B0`` is always a candidate). Among the
candidates the one that changes the fewest actuated cables at once wins (ties: the
one that skips more). Shortcuts can fail when the centre of gravity moves
differently, so :func:`smooth_validated` re-runs them in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.policies import REST_TARGET

ATOL = 1e-9
"""Two target values closer than this are the same (normalised length)."""


@dataclass(frozen=True)
class Shortcut:
    """At a transition of the unsmoothed targets, go from row ``after`` straight to row ``to``;
    ``cables`` actuated cables change in that jump."""

    after: int
    to: int
    cables: int

    @property
    def removed(self) -> tuple[int, ...]:
        """Rows of the unsmoothed targets the shortcut drops (the reset step(s) first)."""
        return tuple(range(self.after + 1, self.to))


@dataclass(frozen=True)
class Tolerance:
    """How far a smoothed policy's outcome may differ from the unsmoothed one's:
    ``forward_m`` centre-of-mass travel along the start heading (m), ``rotation_rad``
    heading change (rad)."""

    forward_m: float
    rotation_rad: float


def _is_rest(targets: np.ndarray) -> np.ndarray:
    """Whether each row of ``targets`` (n, 6) is the rest shape (n,)."""
    return (np.abs(targets - REST_TARGET) <= ATOL).all(axis=-1)


def candidates(targets: np.ndarray) -> list[list[Shortcut]]:
    """Candidate shortcuts of each transition of ``targets`` (n, 6), best first.

    A transition is a run of rest rows after a non-rest row ``A`` and before the end; the
    next gait's rows ``B0 ..`` run up to the next rest row. See the module docstring for
    which jumps ``A -> Bk`` are candidates and how they rank.
    """
    targets = np.asarray(targets, float)
    rest = _is_rest(targets)
    n = len(targets)
    out = []
    start = 1
    while start < n:
        if not rest[start] or rest[start - 1]:
            start += 1
            continue
        first = start
        while first < n and rest[first]:
            first += 1
        if first == n:
            break
        stop = first
        while stop < n and not rest[stop]:
            stop += 1
        origin = targets[start - 1]
        options = []
        for to in range(first, stop):
            low, high = np.minimum(origin, targets[to]) - ATOL, np.maximum(origin, targets[to]) + ATOL
            skipped = targets[first:to]
            if ((skipped >= low) & (skipped <= high)).all():
                cables = int((np.abs(targets[to] - origin) > ATOL).sum())
                options.append(Shortcut(after=start - 1, to=to, cables=cables))
        out.append(sorted(options, key=lambda s: (s.cables, -s.to)))
        start = stop
    return out


def apply(targets: np.ndarray, shortcuts: list[Shortcut]) -> np.ndarray:
    """``targets`` (n, 6) without the rows the ``shortcuts`` remove -> (n - removed, 6)."""
    removed = [row for shortcut in shortcuts for row in shortcut.removed]
    return np.delete(np.asarray(targets, float), removed, axis=0)


def smooth(targets: np.ndarray) -> tuple[np.ndarray, list[Shortcut]]:
    """Take the best candidate shortcut at every transition of ``targets`` (n, 6).

    Returns the smoothed targets (m, 6) and the shortcuts taken (what was removed).
    """
    taken = [options[0] for options in candidates(targets)]
    return apply(targets, taken), taken


def agrees(outcome: Outcome, reference: Outcome, tolerance: Tolerance) -> np.ndarray:
    """Whether each environment (B,) of ``outcome`` reached all its targets without folding the
    prism flat, ended on the face environment 0 of ``reference`` ended on, and moved and turned
    within ``tolerance`` of it."""
    return (
        outcome.succeeded
        & (outcome.end_face == reference.end_face[0])
        & (np.abs(outcome.forward_m - reference.forward_m[0]) <= tolerance.forward_m)
        & (np.abs(outcome.rotation_rad - reference.rotation_rad[0]) <= tolerance.rotation_rad)
    )


def _simulate(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    state: State,
    policies: list[np.ndarray],
    timeout_s: float,
) -> Outcome:
    """Run ``policies`` (each (n_i, 6)) as one batch from the single-environment ``state``.

    Shorter policies are padded with their last target, which is reached at once.
    """
    if state.batch_size != 1 or params.batch_size != 1:
        raise ValueError(
            f"smoothing needs one start environment, got state {state.batch_size} and params {params.batch_size}"
        )
    length = max(len(p) for p in policies)
    padded = np.stack([np.vstack([p, np.repeat(p[-1:], length - len(p), axis=0)]) for p in policies])
    batch = len(policies)
    return simulate_targets(engine, params.expand(batch), robot, state.repeat(batch), padded, timeout_s)


def smooth_validated(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    state: State,
    targets: np.ndarray,
    timeout_s: float,
    tolerance: Tolerance,
) -> tuple[np.ndarray, list[Shortcut]]:
    """:func:`smooth` with every shortcut checked in the engine from ``state`` (one environment).

    One batch runs the unsmoothed ``targets`` (n, 6) and, for every candidate shortcut, the
    policy with only that shortcut; each transition keeps its best candidate that
    :func:`agrees` with the unsmoothed run, or none (its reset stays). A second batch runs
    the policies with the first 2, 3, .. kept shortcuts together, and the longest one that
    still agrees is returned with its shortcuts. ``timeout_s`` is the per-target timeout (s).
    """
    targets = np.asarray(targets, float)
    ranked = candidates(targets)
    flat = [shortcut for options in ranked for shortcut in options]
    if not flat:
        return targets.copy(), []
    single = [apply(targets, [shortcut]) for shortcut in flat]
    first = _simulate(engine, params, robot, state, [targets, *single], timeout_s)
    passed = dict(zip(flat, agrees(first, first, tolerance)[1:], strict=True))
    chosen = [next(s for s in options if passed[s]) for options in ranked if any(passed[s] for s in options)]
    if len(chosen) <= 1:
        return apply(targets, chosen), chosen
    combined = [apply(targets, chosen[:count]) for count in range(2, len(chosen) + 1)]
    second = agrees(_simulate(engine, params, robot, state, combined, timeout_s), first, tolerance)
    count = 1 + max((i + 1 for i, ok in enumerate(second) if ok), default=0)
    return apply(targets, chosen[:count]), chosen[:count]
