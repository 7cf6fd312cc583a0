"""The ``gaits`` stage: gait search in the identified engine, expansion, smoothing (DESIGN §1.5).

:func:`run_gaits` builds the engine on the robot config with the attachment and
sysid overlays, searches the best forward, backward, ccw and cw gaits from rest on
face 0 (:mod:`pipeline.gaits.search`), scores the published Tribar gaits in the same
engine for comparison (nominal, and their means over the search's parameter ensemble, as the
found gaits are ranked), expands the found gaits by symmetry into a straight policy
(forward cycles) and a turning policy, smooths their transitions
(re-validated in the engine) and simulates both. It writes ``gaits.json`` (gaits,
published comparison, search figures), ``policies.json`` (the expanded policies the
redeploy stage runs) and ``gaits.parquet`` (the gait table).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import yaml
from prefect import task
from prefect.context import TaskRunContext

from pipeline.config import GaitsConfig, LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.gaits.ensemble import ensemble_mean, ensemble_outcome, ensemble_params, perturbed_starts, scenarios
from pipeline.gaits.expansion import expand_in_engine
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.gaits.published import published_gait
from pipeline.gaits.search import OBJECTIVES, FoundGait, SearchResult, merge_results, objective_score, search_gaits
from pipeline.gaits.smoothing import Tolerance, smooth_validated
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.engine import State
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.policies import REST_TARGET, Policy, check_policy
from pipeline.robot_model import reference_prism, resting_on_face
from storage.files import atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.tables import write_table
from storage.tracking import client_for
from tasks.caching import stage_cache_key
from tasks.sysid import OVERLAY_FILE as SYSID_OVERLAY
from tasks.sysid import sysid_robot

log = logging.getLogger(__name__)

STAGE = "gaits"
STAGE_VERSION = "6"
GAITS_FILE = "gaits.json"
POLICIES_FILE = "policies.json"
TABLE_FILE = "gaits.parquet"
PUBLISHED = {
    "rolling": np.vstack([published_gait("rolling")[:2], REST_TARGET]),
    "ccw": published_gait("ccw"),
    "cw": published_gait("cw")[:4],
}
"""One cycle of each published gait from face 0, ending at rest: the rolling unit (one roll),
the ccw turn, the first unit of the cw turn."""


def identified_robot(configs: LoadedConfigs, attach_ref: Ref, sysid_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's and the sysid stage's overlays."""
    path = Path(sysid_ref.path) / SYSID_OVERLAY
    return robot_with_overlay(sysid_robot(configs, attach_ref), yaml.safe_load(path.read_text()), path)


def rest_start(engine: Engine, params: Params, robot: RobotConfig) -> State:
    """The robot at rest on face 0 (support triangle 0, 2, 5), settled in ``engine``."""
    caps = resting_on_face(robot, reference_prism(robot))
    return settle(engine, params, state_from_caps(engine, params, caps), robot.pid, torch.ones(6), duration_s=1.0)


def _figures(outcome: Outcome) -> dict[str, float]:
    """The figures of ``outcome``'s first row (the nominal parameters' in an ensemble's outcome)."""
    return {
        "forward_m": float(outcome.forward_m[0]),
        "lateral_m": float(outcome.lateral_m[0]),
        "rotation_deg": math.degrees(float(outcome.rotation_rad[0])),
        "face_steps": int(outcome.faces_changed[0]),
        "reached": bool(outcome.reached[0]),
        "collapsed": bool(outcome.collapsed[0]),
    }


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
    :func:`pick_expansion` picks one.

    Every candidate is expanded and run, because the best single cycle need not repeat well: in
    a main job's iteration 1 the best forward gait (0.342 m a cycle) left the robot, after its
    first cycle, where the mapped next cycle rolled nothing, 0.056 m in three cycles, while the
    third-ranked one (0.339 m) made 0.651 m. Each whole policy runs as the robot will: the
    expansion's own cycle-by-cycle runs restart the controller at each cycle and can reach where
    the whole run does not. And one start is a knife edge: in a main job's iteration 2 the
    policy that rolled furthest from the search's start (0.59 m) reached every target from none
    of 8 starts 2 mm away (0.14 m on average from them) and moved the twin 0.10 m; the pick with
    the perturbed starts reached from all 8 and moved the twin 0.29 m (:mod:`pipeline.gaits.ensemble`)."""
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
    configs: LoadedConfigs,
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    start: State,
    candidates: dict[str, list[FoundGait]],
) -> dict[str, Expansion]:
    """The straight policy (``straight_cycles`` forward cycles) and the turning policy
    (``turn_cycles`` of the ``turn`` gait), expanded by symmetry in the engine (unsmoothed).

    Each repeats the one of its objective's ranked ``candidates`` whose expansion does best in
    the engine over the parameter ensemble and ``expansion_starts`` perturbed starts and reaches
    every target (:func:`judged_expansions`, :func:`pick_expansion`): a gait that works once can
    leave the robot where its next cycle's shapes cannot be made, or do nothing, or work from one
    start alone.
    If none reaches, the best single cycle (with a warning)."""
    c = configs.pipeline.gaits
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    ensemble = ensemble_params(params, c.search.ensemble_motor_speed, c.search.ensemble_friction)
    starts = None
    if c.expansion_starts:
        starts = perturbed_starts(engine, params, robot, start, c.expansion_starts, c.expansion_start_sigma_m)
    plans = {"straight": ("forward", c.straight_cycles), "turning": (c.turn, c.turn_cycles)}
    out = {}
    for name, (objective, cycles) in plans.items():
        ranked = candidates[objective]
        judged = judged_expansions(engine, params, robot, start, ranked, cycles, timeout_s, ensemble, starts)
        found = pick_expansion(judged, c.expansion_min_reached)
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
            if found.reached_share < c.expansion_min_reached:
                log.warning(
                    "%s policy: no %s gait reaches every target from %.0f %% of %d perturbed starts; the best "
                    "reaches from %.0f %%",
                    name,
                    objective,
                    100 * c.expansion_min_reached,
                    c.expansion_starts,
                    100 * found.reached_share,
                )
        out[name] = Expansion(Policy(f"{name}-{objective}", targets), ranked[rank], rank, found)
    return out


def search_setup(configs: LoadedConfigs, attach_ref: Ref, sysid_ref: Ref) -> tuple[RobotConfig, Engine, Params, State]:
    """The identified robot, its engine (the search's time step), parameters and rest start."""
    robot = identified_robot(configs, attach_ref, sysid_ref)
    engine = Engine(
        RobotModel.from_robot(robot), dt=configs.pipeline.gaits.search.dt_s, compiled=configs.pipeline.engine.compiled
    )
    params = Params.from_robot(robot)
    return robot, engine, params, rest_start(engine, params, robot)


def run_search_shard(configs: LoadedConfigs, attach_ref: Ref, sysid_ref: Ref, shard: int) -> SearchResult:
    """Shard ``shard`` of the search (of ``gaits.search.shards``) in the identified engine."""
    search = configs.pipeline.gaits.search
    robot, engine, params, start = search_setup(configs, attach_ref, sysid_ref)
    return search_gaits(engine, params, robot, start, search, shard, search.shards)


def run_gaits(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    sysid_ref: Ref,
    shard_results: list[SearchResult] | None = None,
) -> tuple[Ref, dict]:
    """Search (or take the searched ``shard_results``), expand, smooth, simulate; write the stage
    output. Returns the ref and summary."""
    c = configs.pipeline.gaits
    robot, engine, params, start = search_setup(configs, attach_ref, sysid_ref)
    if shard_results is None:
        shard_results = [
            search_gaits(engine, params, robot, start, c.search, k, c.search.shards) for k in range(c.search.shards)
        ]
    result = merge_results(shard_results).require_gaits()
    timeout_s = configs.pipeline.redeploy.segment_timeout_s

    ensemble = ensemble_params(params, c.search.ensemble_motor_speed, c.search.ensemble_friction)
    published = {}
    for name, targets in PUBLISHED.items():
        outcome = ensemble_outcome(engine, ensemble, robot, start, targets[None], timeout_s, c.search.settle_s)
        published[name] = {
            "targets": targets.tolist(),
            **_figures(outcome),
            "ensemble_forward_m": float(ensemble_mean(outcome.credited(outcome.forward_m), 1)[0]),
            "ensemble_rotation_deg": math.degrees(float(ensemble_mean(outcome.credited(outcome.rotation_rad), 1)[0])),
        }

    policies = {}
    tolerance = Tolerance(c.smoothing_tolerance_m, math.radians(c.smoothing_tolerance_deg))
    for name, expansion in expanded_policies(configs, engine, params, robot, start, result.candidates).items():
        policy = expansion.policy
        targets = policy.targets
        removed = 0
        if c.smoothing:
            smoothed, _ = smooth_validated(engine, params, robot, start, targets, timeout_s, tolerance)
            removed = len(targets) - len(smoothed)
            targets = smoothed
        checked = check_policy(robot, Policy(name=policy.name, targets=targets))
        outcome = simulate_targets(engine, params, robot, start, checked.targets, timeout_s)
        policies[name] = {
            "name": checked.name,
            "policy_id": checked.policy_id,
            "targets": checked.targets.tolist(),
            "unsmoothed_targets": policy.targets.tolist(),
            "gait": _gait_json(expansion.gait),
            "gait_rank": expansion.rank,
            "expansion": None if expansion.judged is None else _judged_json(expansion.judged, c),
            "targets_removed_by_smoothing": removed,
            "simulated": _figures(outcome),
        }

    stage_dir = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    gaits = {
        "found": {k: _gait_json(g) for k, g in result.gaits.items()},
        "published": published,
        "search": result.stats.as_dict(),
    }
    atomic_write_json(stage_dir / GAITS_FILE, gaits)
    atomic_write_json(stage_dir / POLICIES_FILE, policies)
    write_table(stage_dir / TABLE_FILE, gait_table(result.gaits, published), {"stage": STAGE})
    summary = _summary(result.gaits, published, policies, result.stats.as_dict())
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def _judged_json(judged: Candidate, c: GaitsConfig) -> dict[str, float | int]:
    """How the gaits stage judged a policy (:func:`judged_expansions`): its unsmoothed expansion's mean
    score (m or rad) over the parameter ensemble and the perturbed starts, and the share of those
    starts from which it reached every target."""
    return {
        "score": judged.score,
        "reached_share": judged.reached_share,
        "perturbed_starts": c.expansion_starts,
        "start_sigma_m": c.expansion_start_sigma_m,
    }


def _gait_json(gait: FoundGait) -> dict[str, object]:
    rotation_rad = gait.ensemble_rotation_rad
    return {
        "targets": gait.targets.tolist(),
        "forward_m": gait.forward_m,
        "lateral_m": gait.lateral_m,
        "rotation_deg": math.degrees(gait.rotation_rad),
        "face_steps": gait.face_steps,
        "duration_s": gait.duration_s,
        "reached": gait.reached,
        "ensemble_forward_m": gait.ensemble_forward_m,
        "ensemble_rotation_deg": None if rotation_rad is None else math.degrees(rotation_rad),
    }


def gait_table(found: dict[str, FoundGait], published: dict[str, dict]) -> pa.Table:
    """One row per gait, found and published: forward and lateral displacement (m), rotation
    (deg) and face steps per cycle, simulated in the same engine, and the mean forward
    displacement and rotation over the parameter ensemble."""
    entries = [("found", k, _gait_json(g)) for k, g in found.items()]
    entries += [("published", k, p) for k, p in published.items()]
    columns = ["forward_m", "lateral_m", "rotation_deg", "face_steps", "ensemble_forward_m", "ensemble_rotation_deg"]
    table = {"source": [e[0] for e in entries], "gait": [e[1] for e in entries]}
    table.update({c: [e[2][c] for e in entries] for c in columns})
    return pa.table(table)


def _summary(found: dict[str, FoundGait], published: dict, policies: dict, search: dict) -> dict[str, object]:
    summary: dict[str, object] = {
        "search_wall_s": search["wall_s"],
        "search_simulated": search["simulated"],
        "search_pruned": search["pruned"],
        "search_collapsed": sum(search["collapsed_per_level"]),
    }
    for objective in OBJECTIVES:
        gait = found[objective]
        summary[f"{objective}.forward_m"] = gait.forward_m
        summary[f"{objective}.rotation_deg"] = math.degrees(gait.rotation_rad)
    for name, figures in published.items():
        for figure in ("forward_m", "rotation_deg", "ensemble_forward_m", "ensemble_rotation_deg"):
            summary[f"published.{name}.{figure}"] = figures[figure]
    for name, policy in policies.items():
        summary[f"policy.{name}.forward_m"] = policy["simulated"]["forward_m"]
        summary[f"policy.{name}.rotation_deg"] = policy["simulated"]["rotation_deg"]
        summary[f"policy.{name}.targets_removed_by_smoothing"] = policy["targets_removed_by_smoothing"]
        summary[f"policy.{name}.gait_rank"] = policy["gait_rank"]
        if policy["expansion"] is not None:
            summary[f"policy.{name}.expansion_score"] = policy["expansion"]["score"]
            summary[f"policy.{name}.expansion_reached_share"] = policy["expansion"]["reached_share"]
    return summary


def cache_key(context: TaskRunContext | None, parameters: dict) -> str:
    """The Prefect cache key of this stage for the task parameters ``parameters``."""
    inputs = {k: parameters[f"{k}_ref"] for k in ("attach", "sysid")}
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name="gait-search-shard")
def search_shard(configs: LoadedConfigs, attach_ref: dict[str, str], sysid_ref: dict[str, str], shard: int) -> dict:
    """Prefect task: one shard of the gait search (:func:`run_search_shard`), as JSON."""
    return run_search_shard(configs, Ref.from_json(attach_ref), Ref.from_json(sysid_ref), shard).to_json()


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def gaits(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    shard_results: list[dict] | None = None,
) -> dict[str, str]:
    """Prefect task: run :func:`run_gaits` on the search shards' results (JSON, from
    :func:`search_shard` task runs the flow spread over its task runner; searched here, one
    after another, if None); log the gait table and search figures to MLflow."""
    attach, identified = Ref.from_json(attach_ref), Ref.from_json(sysid_ref)
    if shard_results is None:
        shards = [run_search_shard(configs, attach, identified, k) for k in range(configs.pipeline.gaits.search.shards)]
    else:
        shards = [SearchResult.from_json(result) for result in shard_results]
    ref, summary = run_gaits(configs, iteration, attach, identified, shards)
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    for key, value in summary.items():
        client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
    for name in (GAITS_FILE, POLICIES_FILE, TABLE_FILE):
        client.log_artifact(mlflow_run_id, str(Path(ref.path) / name), artifact_path=STAGE)
    return ref.to_json()
