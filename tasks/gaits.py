"""The ``gaits`` stage: gait search in the identified engine, expansion, smoothing.

:func:`run_gaits` builds the engine on the robot config with the attachment and sysid overlays,
searches the best forward, backward, ccw and cw gaits from rest on face 0
(:mod:`pipeline.gaits.search`), scores the published Tribar gaits in the same engine for
comparison (nominal, and their means over the search's parameter ensemble, as the found gaits
are ranked), expands the found gaits by symmetry into a straight policy (forward cycles) and a
turning policy (:mod:`pipeline.gaits.pick`), smooths their transitions (re-validated in the
engine) and simulates both. It writes ``gaits.json`` (gaits, published comparison, search
figures), ``policies.json`` (the expanded policies the redeploy stage runs) and
``gaits.parquet`` (the gait table).

With ``engine.contact: learned`` the search still runs the fast analytic engine; the published
gaits' scores, the expansion and judging of the finalists, the smoothing and the final
simulation run the hybrid engine with the learn stage's contact network instead, so the picks
are the learned model's (``judged_by`` in ``gaits.json``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
from prefect import task

from pipeline.config import GaitsConfig, LoadedConfigs, RobotConfig
from pipeline.gaits.ensemble import ensemble_mean, ensemble_outcome, ensemble_params
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.gaits.pick import Candidate, expanded_policies
from pipeline.gaits.search import OBJECTIVES, FoundGait, SearchResult, merge_results, search_gaits
from pipeline.gaits.smoothing import Tolerance, smooth_validated
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.engine import State
from pipeline.physics.rollout import rest_start
from pipeline.policies import Policy, check_policy
from pipeline.published_gaits import PUBLISHED_CYCLES
from storage.catalog import GAIT_TABLE_FILE, GAITS_FILE, POLICIES_FILE, identified_robot, learned_engine
from storage.files import atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.tables import write_table
from storage.tracking import StageContext

STAGE = "gaits"


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


def judging_engine(
    configs: LoadedConfigs, robot: RobotConfig, engine: Engine, params: Params, start: State, learn_ref: Ref | None
) -> tuple[Engine, State]:
    """The engine that judges the search's finalists and its rest start: the search's own
    (``engine.contact: analytic``), or the hybrid engine with the learn stage's contact network
    (``learned``; ``learn_ref`` required)."""
    if configs.pipeline.engine.contact == "analytic":
        return engine, start
    if learn_ref is None:
        raise ValueError("engine.contact is 'learned' but the gaits stage was given no learn stage output")
    learned = learned_engine(learn_ref, robot)
    return learned, rest_start(learned, params, robot)


def run_gaits(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    sysid_ref: Ref,
    shard_results: list[SearchResult] | None = None,
    learn_ref: Ref | None = None,
) -> tuple[Ref, dict]:
    """Search in the analytic engine (or take the searched ``shard_results``); expand, judge,
    smooth and simulate the finalists in the engine ``engine.contact`` names
    (:func:`judging_engine`); write the stage output. Returns the ref and summary."""
    c = configs.pipeline.gaits
    robot, search_engine, params, search_start = search_setup(configs, attach_ref, sysid_ref)
    if shard_results is None:
        shard_results = [
            search_gaits(search_engine, params, robot, search_start, c.search, k, c.search.shards)
            for k in range(c.search.shards)
        ]
    result = merge_results(shard_results).require_gaits()
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    engine, start = judging_engine(configs, robot, search_engine, params, search_start, learn_ref)

    ensemble = ensemble_params(params, c.search.ensemble_motor_speed, c.search.ensemble_friction)
    published = {}
    for name, targets in PUBLISHED_CYCLES.items():
        outcome = ensemble_outcome(engine, ensemble, robot, start, targets[None], timeout_s, c.search.settle_s)
        published[name] = {
            "targets": targets.tolist(),
            **_figures(outcome),
            "ensemble_forward_m": float(ensemble_mean(outcome.credited(outcome.forward_m), 1)[0]),
            "ensemble_rotation_deg": math.degrees(float(ensemble_mean(outcome.credited(outcome.rotation_rad), 1)[0])),
        }

    policies = {}
    tolerance = Tolerance(c.smoothing_tolerance_m, math.radians(c.smoothing_tolerance_deg))
    for name, expansion in expanded_policies(c, timeout_s, engine, params, robot, start, result.candidates).items():
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

    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    contact = configs.pipeline.engine.contact
    gaits = {
        "found": {k: _gait_json(g) for k, g in result.gaits.items()},
        "published": published,
        "search": result.stats.as_dict(),
        "judged_by": contact,
    }
    atomic_write_json(stage_dir / GAITS_FILE, gaits)
    atomic_write_json(stage_dir / POLICIES_FILE, policies)
    write_table(
        stage_dir / GAIT_TABLE_FILE, gait_table(result.gaits, published), {"stage": STAGE, "judged_by": contact}
    )
    summary = _summary(result.gaits, published, policies, result.stats.as_dict())
    summary["judged_by_learned_contact"] = contact == "learned"
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


@task(name="gait-search-shard")
def search_shard(configs: LoadedConfigs, attach_ref: dict[str, str], sysid_ref: dict[str, str], shard: int) -> dict:
    """Prefect task: one shard of the gait search (:func:`run_search_shard`), as JSON."""
    return run_search_shard(configs, Ref.from_json(attach_ref), Ref.from_json(sysid_ref), shard).to_json()


@task(name=STAGE)
def gaits(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    shard_results: list[dict] | None = None,
    learn_ref: dict[str, str] | None = None,
) -> dict[str, str]:
    """Prefect task: run :func:`run_gaits` on the search shards' results (JSON, from
    :func:`search_shard` task runs the flow spread over its task runner; searched here, one
    after another, if None) with the learn stage's output where ``engine.contact`` is
    ``learned``; log the gait table and search figures to MLflow."""
    attach, identified = Ref.from_json(attach_ref), Ref.from_json(sysid_ref)
    if shard_results is None:
        shards = [run_search_shard(configs, attach, identified, k) for k in range(configs.pipeline.gaits.search.shards)]
    else:
        shards = [SearchResult.from_json(result) for result in shard_results]
    learned = None if learn_ref is None else Ref.from_json(learn_ref)
    ref, summary = run_gaits(configs, iteration, attach, identified, shards, learned)
    files = [Path(ref.path) / name for name in (GAITS_FILE, POLICIES_FILE, GAIT_TABLE_FILE)]
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, files)
    return ref.to_json()
