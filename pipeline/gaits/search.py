"""Depth-limited graph search for gaits in the engine (R2S2R paper, "symmetry reduction").

Nodes are target shapes with binary cable lengths (0 retracted, 1 extended); an edge
changes any set of cables (retract, extend or hold each). A gait is a path from the
rest shape (all extended) back to it, at most ``depth`` edges long, searched from the
robot resting on face 0 (caps 0, 2, 3, 5): gaits for the other faces and for the reverse
direction follow by symmetry (:mod:`pipeline.gaits.symmetry`), so one face is searched.

The search simulates each tree level as one batch of the engine, every child
continuing from its parent's end state (:func:`~pipeline.gaits.outcome.simulate_targets`).
Where it prunes, and why:

* **infeasible shapes**: a binary shape whose side triangle cannot close (one cable
  extended against two retracted; the Tribar paper) is repaired as the policy checker repairs
  it (the long cable shortened to the longest feasible length, e.g. 1 -> 0.8), not
  dropped; shapes that the repair makes identical are one node;
* **unreachable edges**: a child whose cables did not reach its target before
  ``transition_timeout_s`` is dropped (the robot could not make that shape from there), and so
  is one whose move folded the prism flat (:attr:`~pipeline.gaits.outcome.Outcome.collapsed`;
  the flat robot's crawl is no gait; many flat runs reach their shape all the same, and the
  search would go on from them; ``gaits.json`` counts the moves dropped per level);
* **beam** (from level ``exact_levels + 1`` on, if ``beam_width`` is set): a level's
  nodes are ranked per objective by the gait they make when closed with the rest shape
  now, and the best ``beam_width`` per objective are expanded; the rest are pruned.
  Levels up to ``exact_levels`` are searched exhaustively;
* **merged states**: children with the same shape whose end states agree, up to a
  planar rigid motion, within ``merge_position_m`` and ``merge_velocity_m_s`` have the
  same future; per merged class only the best path for each objective is kept (four at
  most). This is exact up to the tolerances.

Every surviving path is closed with the rest shape (a leaf) and scored after a
``settle_s`` hold: centre-of-mass displacement along the start heading (forward,
backward) and heading change (ccw, cw). The best ``validate_top * pool`` leaves per
objective are then run again as whole gaits from the start state, exactly as the robot
would execute them (no pause between targets), once under each parameter set of an
ensemble around the search's parameters (:mod:`pipeline.gaits.ensemble`); per objective
they are ranked by their mean score over the ensemble (a run that folds the prism flat
counting as no motion), those that reached every target without folding it (nominal
parameters) first, the ``validate_top`` best are kept, and the first is the
objective's gait. The ranking lets a caller fall back to the next gait where the
best one fails when repeated (the gaits stage expands each into a policy of several cycles).

With ``shards`` > 1 the search splits by first shape into independent searches (each
with the same depth, exact levels and beam, so the beam keeps more nodes in total) that
a task runner can spread; :func:`merge_results` combines them. Exhaustive levels give the
same answer however they are split.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from pipeline.config import GaitSearchConfig, RobotConfig
from pipeline.errors import PolicyError
from pipeline.gaits.ensemble import ensemble_mean, ensemble_outcome, ensemble_params
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.policies import feasible_target
from pipeline.progress import ProgressRow, progress
from pipeline.robot_model import N_ACTUATED, heading_rad, wrapped_rad

OBJECTIVES = ("forward", "backward", "ccw", "cw")
"""What the search maximises: forward / backward CoM displacement along the start heading,
counter-clockwise / clockwise heading change."""


@dataclass(frozen=True)
class FoundGait:
    """A gait from the search: ``targets`` (n, 6) ending at the rest shape, for face 0; its
    validated ``forward_m`` (m along the start heading), ``lateral_m`` (m), ``rotation_rad`` (ccw
    positive), ``face_steps`` (forward face changes per cycle, mod 3), ``duration_s`` (s),
    whether it ``reached`` every target without folding the prism flat, and
    ``ensemble_forward_m`` (m) and ``ensemble_rotation_rad`` its mean forward displacement and
    rotation over the validation's parameter ensemble, a run that folded the prism flat counted
    as none (:mod:`pipeline.gaits.ensemble`; None: not validated in one)."""

    objective: str
    targets: np.ndarray
    forward_m: float
    lateral_m: float
    rotation_rad: float
    face_steps: int
    duration_s: float
    reached: bool
    ensemble_forward_m: float | None = None
    ensemble_rotation_rad: float | None = None

    def score(self) -> float:
        """The objective's value of the validated figures (m or rad)."""
        return objective_score(self.objective, self.forward_m, self.rotation_rad)

    def ranking_score(self) -> float:
        """What the ranking compares: the objective's score of the ensemble's means, else the nominal one."""
        if self.ensemble_forward_m is None or self.ensemble_rotation_rad is None:
            return self.score()
        return objective_score(self.objective, self.ensemble_forward_m, self.ensemble_rotation_rad)


@dataclass
class SearchStats:
    """What the search did, level by level: simulated edges, dropped as unreachable (of those, how
    many folded the prism flat), merged away."""

    simulated: list[int] = field(default_factory=list)
    unreachable: list[int] = field(default_factory=list)
    collapsed: list[int] = field(default_factory=list)
    merged: list[int] = field(default_factory=list)
    beam_pruned: list[int] = field(default_factory=list)
    leaves: int = 0
    unclosed: int = 0
    validated: int = 0
    shapes: int = 0
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "shapes": self.shapes,
            "simulated_per_level": self.simulated,
            "unreachable_per_level": self.unreachable,
            "collapsed_per_level": self.collapsed,
            "merged_per_level": self.merged,
            "beam_pruned_per_level": self.beam_pruned,
            "simulated": int(sum(self.simulated)) + self.leaves,
            "pruned": int(sum(self.unreachable) + sum(self.merged) + sum(self.beam_pruned) + self.unclosed),
            "leaves": self.leaves,
            "unclosed": self.unclosed,
            "validated": self.validated,
            "wall_s": self.wall_s,
        }


def _rank_key(gait: FoundGait) -> tuple[bool, float]:
    """Sort key, best first: gaits that reached every target, then the higher ranking score."""
    return (not gait.reached, -gait.ranking_score())


@dataclass(frozen=True)
class SearchResult:
    """The validated gaits per objective, ranked best first (:func:`_rank_key`), and the search's figures."""

    candidates: dict[str, list[FoundGait]]
    stats: SearchStats

    @property
    def gaits(self) -> dict[str, FoundGait]:
        """The best gait per objective (every objective must have one: :meth:`require_gaits`)."""
        return {objective: ranked[0] for objective, ranked in self.candidates.items()}

    def require_gaits(self) -> SearchResult:
        """This result, if every objective has a gait; else a :class:`~pipeline.errors.PolicyError`
        that says which have none and what the search dropped."""
        missing = [objective for objective, ranked in self.candidates.items() if not ranked]
        if missing:
            s = self.stats
            raise PolicyError(
                f"gait search: no {' / '.join(missing)} gait from the start: of {sum(s.simulated)} simulated "
                f"moves {sum(s.unreachable)} did not reach their shape or folded the prism flat "
                f"({sum(s.collapsed)} folded it), {s.unclosed} paths did not return to rest; is the "
                "start flat, or are the identified parameters far off?"
            )
        return self

    def to_json(self) -> dict[str, object]:
        candidates = {
            k: [{**asdict(g), "targets": g.targets.tolist()} for g in ranked] for k, ranked in self.candidates.items()
        }
        return {"candidates": candidates, "stats": asdict(self.stats)}

    @classmethod
    def from_json(cls, payload: dict) -> SearchResult:
        candidates = {
            k: [FoundGait(**{**g, "targets": np.asarray(g["targets"], float)}) for g in ranked]
            for k, ranked in payload["candidates"].items()
        }
        return cls(candidates, SearchStats(**payload["stats"]))


@dataclass
class _Frontier:
    """Nodes of one level: ``paths`` (N, L) shape indices, end ``state`` (N envs), accumulated
    CoM displacement ``com_m`` (N, 2) from the root (world) and heading change ``turn_rad`` (N,)."""

    paths: np.ndarray
    state: State
    com_m: np.ndarray
    turn_rad: np.ndarray


def objective_score(objective: str, forward_m: float | np.ndarray, rotation_rad: float | np.ndarray):
    """The value an objective maximises (m for displacement, rad for rotation)."""
    return {"forward": forward_m, "backward": -forward_m, "ccw": rotation_rad, "cw": -rotation_rad}[objective]


def search_shapes(robot: RobotConfig) -> np.ndarray:
    """The search's nodes (K, 6): every binary shape, infeasible ones repaired (deduplicated);
    row 0 is the rest shape."""
    binary = np.array(list(itertools.product((1.0, 0.0), repeat=N_ACTUATED)))
    repaired = np.stack([feasible_target(robot, shape, "gait-search shape")[0] for shape in binary])
    _, first = np.unique(repaired.round(9), axis=0, return_index=True)
    return repaired[np.sort(first)]


def _index_state(state: State, rows: np.ndarray) -> State:
    return state.index(torch.as_tensor(rows, dtype=torch.long))


class GaitSearch:
    """The search of ``config`` in ``engine`` with ``params`` (one environment) from ``start``
    (one environment, at rest on face 0)."""

    def __init__(
        self,
        engine: Engine,
        params: Params,
        robot: RobotConfig,
        start: State,
        config: GaitSearchConfig,
        shard: int = 0,
        shards: int = 1,
    ) -> None:
        if not 0 <= shard < shards:
            raise ValueError(f"shard must be in [0, {shards}), got {shard}")
        self.engine, self.params, self.robot, self.start, self.config = engine, params, robot, start, config
        self.name = "gait search" + (f" {shard + 1}/{shards}" if shards > 1 else "")
        self.shapes = search_shapes(robot)
        self.first_shapes = np.arange(1, len(self.shapes))[shard::shards]
        heading = float(heading_rad(engine.cap_positions(start).numpy()[0]))
        self.forward_dir = np.array([np.cos(heading), np.sin(heading)])

    def _edges(
        self, frontier: _Frontier, children: np.ndarray, settle_s: float
    ) -> tuple[_Frontier, np.ndarray, np.ndarray]:
        """Simulate each frontier node going to each of its ``children`` (N, C) shape indices (-1:
        none) in one batch; returns the children as a frontier, which reached their shape without
        folding the prism flat, and which folded it."""
        parent, slot = np.nonzero(children >= 0)
        shape = children[parent, slot]
        state = _index_state(frontier.state, parent)
        targets = torch.as_tensor(self.shapes[shape][:, None, :], dtype=state.pos.dtype)
        outcome = simulate_targets(
            self.engine,
            self.params.expand(len(parent)),
            self.robot,
            state,
            targets,
            self.config.transition_timeout_s,
            final_hold_s=settle_s,
        )
        first = outcome.trace.caps_m[:, 0].numpy()
        last = self.engine.cap_positions(outcome.final).numpy()
        com = frontier.com_m[parent] + last.mean(1)[:, :2] - first.mean(1)[:, :2]
        turn = frontier.turn_rad[parent] + wrapped_rad(heading_rad(last) - heading_rad(first))
        paths = np.concatenate([frontier.paths[parent], shape[:, None]], axis=1)
        finite = np.isfinite(last).all(axis=(1, 2)) & np.isfinite(first).all(axis=(1, 2))
        return _Frontier(paths, outcome.final, com, turn), outcome.succeeded & finite, outcome.collapsed

    def _scores(self, frontier: _Frontier) -> np.ndarray:
        """(N, 4) objective values of the nodes' accumulated motion."""
        forward = (frontier.com_m * self.forward_dir).sum(-1)
        return np.stack([objective_score(o, forward, frontier.turn_rad) for o in OBJECTIVES], axis=-1)

    def _merge(self, frontier: _Frontier) -> np.ndarray:
        """Rows to keep: per class of equivalent end states (same shape, same pose up to a planar
        rigid motion and same velocities within the tolerances), the best path per objective."""
        state = frontier.state
        caps = self.engine.cap_positions(state).numpy()
        heading = heading_rad(caps)
        cos, sin = np.cos(-heading), np.sin(-heading)
        rotation = np.zeros((len(caps), 3, 3))
        rotation[:, 0, 0], rotation[:, 0, 1], rotation[:, 1, 0], rotation[:, 1, 1] = cos, -sin, sin, cos
        rotation[:, 2, 2] = 1.0
        centred = caps - np.concatenate([caps.mean(1)[:, :2], np.zeros((len(caps), 1))], -1)[:, None]
        local = np.einsum("nij,nkj->nki", rotation, centred)
        velocity = np.einsum("nij,nkj->nki", rotation, state.vel.numpy())
        scores = self._scores(frontier)
        keep: list[int] = []
        for shape in np.unique(frontier.paths[:, -1]):
            rows = np.flatnonzero(frontier.paths[:, -1] == shape)
            unassigned = list(rows)
            while unassigned:
                head = unassigned[0]
                close = [
                    r
                    for r in unassigned
                    if np.abs(local[r] - local[head]).max() <= self.config.merge_position_m
                    and np.abs(velocity[r] - velocity[head]).max() <= self.config.merge_velocity_m_s
                ]
                keep.extend({close[int(np.argmax(scores[close, k]))] for k in range(len(OBJECTIVES))})
                unassigned = [r for r in unassigned if r not in close]
        return np.array(sorted(keep), dtype=int)

    def run(self) -> SearchResult:
        """The search, its levels and its validation shown as a progress row (:mod:`pipeline.progress`)."""
        detail = "{nodes} nodes simulated, {judged} candidates judged"
        with progress(self.name, self.config.depth, "levels", detail, nodes=0, judged=0) as row:
            return self._run(row)

    def _run(self, row: ProgressRow) -> SearchResult:
        began = time.perf_counter()
        stats = SearchStats(shapes=len(self.shapes))
        n_shapes = len(self.shapes)
        frontier = _Frontier(np.zeros((1, 0), dtype=int), self.start, np.zeros((1, 2)), np.zeros(1))
        leaves: list[_Frontier] = []
        for level in range(1, self.config.depth):
            previous = frontier.paths[:, -1] if level > 1 else np.zeros(1, dtype=int)
            children = np.tile(np.arange(1, n_shapes), (len(frontier.paths), 1))
            children[children == previous[:, None]] = -1
            if level == 1:
                children = self.first_shapes[None, :]
            if level > 1:
                leaf, closed_rows = self._close(frontier, stats)
                leaves.append(leaf)
                if self.config.beam_width is not None and level > self.config.exact_levels:
                    keep = self._beam(leaf, closed_rows)
                    stats.beam_pruned.append(len(frontier.paths) - len(keep))
                    frontier, children = self._subset(frontier, keep), children[keep]
            frontier, reached, collapsed = self._edges(frontier, children, settle_s=0.0)
            stats.simulated.append(len(reached))
            row.advance(nodes=sum(stats.simulated))
            stats.unreachable.append(int((~reached).sum()))
            stats.collapsed.append(int(collapsed.sum()))
            frontier = self._subset(frontier, np.flatnonzero(reached))
            if not len(frontier.paths):
                break
            keep = self._merge(frontier)
            stats.merged.append(len(frontier.paths) - len(keep))
            frontier = self._subset(frontier, keep)
        if len(frontier.paths):
            leaves.append(self._close(frontier, stats)[0])
        stats.leaves = sum(len(leaf.paths) for leaf in leaves)
        row.update(completed=self.config.depth - 1)
        candidates = self._validate(leaves, stats)
        row.advance(judged=stats.validated)
        stats.wall_s = time.perf_counter() - began
        return SearchResult(candidates, stats)

    def _subset(self, frontier: _Frontier, rows: np.ndarray) -> _Frontier:
        return _Frontier(
            frontier.paths[rows], _index_state(frontier.state, rows), frontier.com_m[rows], frontier.turn_rad[rows]
        )

    def _close(self, frontier: _Frontier, stats: SearchStats) -> tuple[_Frontier, np.ndarray]:
        """Every node of ``frontier`` back to the rest shape, settled (the leaves), and the
        frontier rows they close; those that did not reach the rest shape, or folded the prism
        flat, are dropped (counted in ``stats.unclosed``)."""
        closed, reached, _ = self._edges(frontier, np.zeros((len(frontier.paths), 1), dtype=int), self.config.settle_s)
        rows = np.flatnonzero(reached)
        stats.unclosed += int((~reached).sum())
        return self._subset(closed, rows), rows

    def _beam(self, leaf: _Frontier, closed_rows: np.ndarray) -> np.ndarray:
        """Frontier rows of the best ``beam_width`` closed gaits per objective."""
        scores = self._scores(leaf)
        best = {
            int(closed_rows[r])
            for k in range(len(OBJECTIVES))
            for r in np.argsort(-scores[:, k])[: self.config.beam_width]
        }
        return np.array(sorted(best), dtype=int)

    def _validate(self, leaves: list[_Frontier], stats: SearchStats) -> dict[str, list[FoundGait]]:
        """Re-run the best ``validate_top * pool`` leaves per objective as whole gaits from the start,
        under each parameter set of the ensemble; per objective, its ``validate_top`` best
        validated gaits, ranked by their mean score over the ensemble (none where there is no leaf)."""
        if not sum(len(leaf.paths) for leaf in leaves):
            return {objective: [] for objective in OBJECTIVES}
        candidates: dict[tuple[int, ...], None] = {}
        paths = [leaf.paths[:, :-1] for leaf in leaves]
        scores = np.concatenate([self._scores(leaf) for leaf in leaves])
        width = max(p.shape[1] for p in paths)
        flat = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-1) for p in paths])
        for k in range(len(OBJECTIVES)):
            for row in np.argsort(-scores[:, k])[: self.config.validate_top * self.config.pool]:
                candidates[tuple(int(i) for i in flat[row] if i >= 0)] = None
        sequences = list(candidates)
        n = max(len(s) for s in sequences)
        targets = np.stack(
            [np.vstack([self.shapes[list(s)], np.ones((n + 1 - len(s), N_ACTUATED))]) for s in sequences]
        )
        ensemble = ensemble_params(self.params, self.config.ensemble_motor_speed, self.config.ensemble_friction)
        outcome = ensemble_outcome(
            self.engine,
            ensemble,
            self.robot,
            self.start,
            targets,
            self.config.transition_timeout_s,
            final_hold_s=self.config.settle_s,
        )
        stats.validated = len(sequences)
        forward_m = ensemble_mean(outcome.credited(outcome.forward_m), len(sequences))
        rotation_rad = ensemble_mean(outcome.credited(outcome.rotation_rad), len(sequences))
        found = {}
        for objective in OBJECTIVES:
            gaits = (
                self._found(objective, sequences, outcome, row, (forward_m[row], rotation_rad[row]))
                for row in range(len(sequences))
            )
            found[objective] = sorted(gaits, key=_rank_key)[: self.config.validate_top]
        return found

    def _found(
        self,
        objective: str,
        sequences: list[tuple[int, ...]],
        outcome: Outcome,
        row: int,
        ensemble_means: tuple[float, float],
    ) -> FoundGait:
        """Sequence ``row``'s gait with the nominal figures (the ensemble's first rows) of ``outcome``
        and its ``ensemble_means`` (forward m, rotation rad)."""
        finished = np.flatnonzero(outcome.trace.finished[row].numpy())
        end_s = float(outcome.trace.t_s[finished[0]]) if len(finished) else float(outcome.trace.t_s[-1])
        return FoundGait(
            objective=objective,
            targets=np.vstack([self.shapes[list(sequences[row])], np.ones((1, N_ACTUATED))]),
            forward_m=float(outcome.forward_m[row]),
            lateral_m=float(outcome.lateral_m[row]),
            rotation_rad=float(outcome.rotation_rad[row]),
            face_steps=int(outcome.faces_changed[row]),
            duration_s=end_s - self.config.settle_s,
            reached=bool(outcome.succeeded[row]),
            ensemble_forward_m=float(ensemble_means[0]),
            ensemble_rotation_rad=float(ensemble_means[1]),
        )


def search_gaits(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    start: State,
    config: GaitSearchConfig,
    shard: int = 0,
    shards: int = 1,
) -> SearchResult:
    """Search the best forward, backward, ccw and cw gaits (see the module docstring); with
    ``shards`` > 1 only the subtrees under every ``shards``-th first shape from ``shard`` on
    (combine the shards with :func:`merge_results`)."""
    return GaitSearch(engine, params, robot, start, config, shard, shards).run()


def merge_results(results: list[SearchResult]) -> SearchResult:
    """The shards of one search as one: each objective's candidates of all shards, ranked, the
    counts summed level by level (``wall_s``: the shards' total)."""
    candidates = {o: sorted((g for r in results for g in r.candidates[o]), key=_rank_key) for o in OBJECTIVES}
    stats = SearchStats(shapes=results[0].stats.shapes)
    for name in ("simulated", "unreachable", "collapsed", "merged", "beam_pruned"):
        per_level = [getattr(r.stats, name) for r in results]
        width = max(len(levels) for levels in per_level)
        setattr(stats, name, [sum(levels[i] for levels in per_level if i < len(levels)) for i in range(width)])
    for name in ("leaves", "unclosed", "validated", "wall_s"):
        setattr(stats, name, sum(getattr(r.stats, name) for r in results))
    return SearchResult(candidates, stats)
