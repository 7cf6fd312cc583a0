"""Gait search, the published gaits in the engine, and the gaits stage's outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import GaitsConfig, GaitSearchConfig, SysidConfig
from pipeline.errors import PolicyError
from pipeline.gaits.ensemble import ensemble_outcome, ensemble_params, perturbed_starts, scenarios
from pipeline.gaits.expansion import expand_in_engine
from pipeline.gaits.outcome import COLLAPSE_HEIGHT_FRACTION, simulate_targets, summarise
from pipeline.gaits.pick import Candidate, judged_expansions, pick_expansion
from pipeline.gaits.search import (
    OBJECTIVES,
    FoundGait,
    SearchResult,
    merge_results,
    objective_score,
    search_gaits,
    search_shapes,
)
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import Trace, rest_start
from pipeline.policies import REST_TARGET
from pipeline.published_gaits import PUBLISHED_CYCLES as PUBLISHED
from pipeline.published_gaits import published_gait
from tests.conftest import FOLD


@pytest.fixture(scope="module")
def default_engine(default_configs):
    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005, compiled=True)  # as the gaits stage runs it
    params = Params.from_robot(robot)
    return engine, params, rest_start(engine, params, robot)


def test_search_shapes_are_the_repaired_binary_shapes(default_configs) -> None:
    shapes = search_shapes(default_configs.robot)
    assert len(shapes) == 64 and np.array_equal(shapes[0], np.ones(6))
    assert len(np.unique(shapes.round(9), axis=0)) == 64
    assert set(np.unique(shapes.round(6))) == {0.0, 0.9, 1.0}  # 1 -> 0.9 where a side cannot close
    # [0, 0, 1] on a side is the infeasible pattern (Tribar paper): its 1 is shortened
    repaired = shapes[(shapes[:, :3] > 0.5).sum(1) == 1][:, :3]
    assert repaired.max() == pytest.approx(0.9)


def test_published_gaits_move_in_their_published_sense(default_configs, default_engine) -> None:
    """Default parameters: the rolling gait rolls forward (along the heading) onto new faces, the
    ccw gait turns counter-clockwise, the cw gait (extended over three faces by symmetry) clockwise."""
    engine, params, start = default_engine
    robot = default_configs.robot
    targets = [np.vstack([published_gait(g), REST_TARGET]) for g in ("rolling", "ccw", "cw")]
    n = max(len(t) for t in targets)
    padded = np.stack([np.vstack([t, np.ones((n - len(t), 6))]) for t in targets])
    batch = Params(**{k: v.expand(3).clone() for k, v in params.as_dict().items()})
    starts = start.index(torch.zeros(3, dtype=torch.long))
    outcome = simulate_targets(engine, batch, robot, starts, padded, 8.0)
    rolling, ccw, cw = range(3)
    assert outcome.forward_m[rolling] > 0.2 and outcome.faces_changed[rolling] != 0
    assert math.degrees(outcome.rotation_rad[ccw]) > 2.0
    assert math.degrees(outcome.rotation_rad[cw]) < -5.0
    assert outcome.reached.all()


def test_exhaustive_search_finds_the_best_single_shape_gait(default_configs, default_engine) -> None:
    """Depth 2 (rest -> shape -> rest) without merging is exhaustive: its answers are the best of
    every one-shape gait run directly."""
    engine, params, start = default_engine
    robot = default_configs.robot
    config = GaitSearchConfig(depth=2, merge_position_m=0.0, merge_velocity_m_s=0.0, validate_top=64)
    result = search_gaits(engine, params, robot, start, config)
    shapes = search_shapes(robot)[1:]
    direct = simulate_targets(
        engine,
        Params(**{k: v.expand(len(shapes)).clone() for k, v in params.as_dict().items()}),
        robot,
        start.index(torch.zeros(len(shapes), dtype=torch.long)),
        np.stack([np.vstack([s, REST_TARGET]) for s in shapes]),
        config.transition_timeout_s,
        final_hold_s=config.settle_s,
    )
    stats = result.stats
    assert stats.simulated[0] == 63 and stats.leaves + stats.unclosed == 63 - stats.unreachable[0]
    assert stats.leaves == int(direct.succeeded.sum())
    for objective in OBJECTIVES:
        scores = np.where(direct.succeeded, objective_score(objective, direct.forward_m, direct.rotation_rad), -np.inf)
        found = result.gaits[objective]
        assert found.score() == pytest.approx(scores.max(), abs=1e-6), objective
        assert np.allclose(found.targets[0], shapes[int(np.argmax(scores))])
    assert result.gaits["forward"].forward_m > 0 > result.gaits["backward"].forward_m
    # no single shape turns the robot counter-clockwise from this start (the best: -0.005 rad)
    assert result.gaits["ccw"].rotation_rad > result.gaits["cw"].rotation_rad and result.gaits["cw"].rotation_rad < 0


def test_a_run_that_folds_the_prism_flat_is_a_failure(default_configs, default_engine) -> None:
    """The engine lays the prism flat under :data:`FOLD` and not under the published rolling gait:
    the first run is collapsed, does not succeed and is credited no motion; the other keeps its
    figures."""
    engine, params, start = default_engine
    robot = default_configs.robot
    rolling = PUBLISHED["rolling"]
    padded = np.stack([np.vstack([FOLD] + [REST_TARGET] * (len(rolling) - len(FOLD))), rolling])
    outcome = simulate_targets(engine, params.expand(2), robot, start.repeat(2), padded, 1.0)
    highest = outcome.trace.caps_m[..., 2].max(-1).values.min(-1).values.numpy() / robot.rod.length_m
    assert highest[0] < 0.08 and highest[1] > 0.3
    np.testing.assert_array_equal(outcome.collapsed, [True, False])
    assert not outcome.succeeded[0] and outcome.succeeded[1] == outcome.reached[1]
    assert abs(outcome.forward_m[0]) > 0.02  # the flat robot did move
    np.testing.assert_array_equal(outcome.credited(outcome.forward_m), [0.0, outcome.forward_m[1]])


def test_the_search_drops_the_moves_that_fold_the_prism_flat(default_configs, default_engine) -> None:
    """From the prism laid flat by :data:`FOLD`, every move to a search shape keeps it flat, and one
    reaches its shape all the same: the search drops them all (counted as folded) and says that it
    found no gait."""
    engine, params, start = default_engine
    robot = default_configs.robot
    folded = simulate_targets(engine, params, robot, start, FOLD, 2.0).final
    flat = folded.replace(vel=torch.zeros_like(folded.vel), omega=torch.zeros_like(folded.omega))
    shapes = search_shapes(robot)[1:]
    moves = simulate_targets(engine, params.expand(len(shapes)), robot, flat.repeat(len(shapes)), shapes[:, None], 2.0)
    assert moves.collapsed.all() and moves.reached.any()
    config = GaitSearchConfig(depth=2, merge_position_m=0.0, merge_velocity_m_s=0.0)
    result = search_gaits(engine, params, robot, flat, config)
    assert result.stats.collapsed == [63] and result.stats.unreachable == [63] and result.stats.leaves == 0
    with pytest.raises(PolicyError, match=r"no forward / backward / ccw / cw gait .* \(63 folded it\)"):
        result.require_gaits()


def test_a_fold_counts_only_before_the_run_is_done(default_configs) -> None:
    """Collapsed means flat at some tick up to the one the run finished: two hand-made runs of three
    ticks, one flat at tick 1 and done at tick 2, the other done at tick 1 and flat at tick 2 (a
    batch's finished runs are padded while others go on)."""
    robot = default_configs.robot
    half, low = robot.rod.length_m / 2, COLLAPSE_HEIGHT_FRACTION * robot.rod.length_m
    standing = np.array(
        [[-half, 0, 0.02], [half, 0, 0.2], [0, -half, 0.02], [0, half, 0.2], [0.1, 0.1, 0.02], [0.1, -0.1, 0.2]]
    )
    flat = standing * [1, 1, 0] + [0, 0, 0.9 * low]
    caps = torch.as_tensor(np.stack([[standing, flat, standing], [standing, standing, flat]]))
    trace = Trace(
        t_s=torch.tensor([0.0, 0.02, 0.04]),
        caps_m=caps,
        cables_m=torch.zeros(2, 3, 9),
        segment=torch.zeros(2, 3, dtype=torch.long),
        control=torch.zeros(2, 3, 6),
        finished=torch.tensor([[False, False, True], [False, True, True]]),
    )
    outcome = summarise(robot, trace, torch.ones(2, 1, 6), 0.0, None)
    np.testing.assert_array_equal(outcome.collapsed, [True, False])


def test_sharded_exhaustive_search_gives_the_same_gaits(default_configs, default_engine) -> None:
    """Split by first shape into three shards (as the gaits stage's task runs do), an exhaustive
    search merges to the same answer; the result survives its JSON form (task results)."""
    engine, params, start = default_engine
    robot = default_configs.robot
    config = GaitSearchConfig(depth=2, merge_position_m=0.0, merge_velocity_m_s=0.0, validate_top=64)
    whole = search_gaits(engine, params, robot, start, config)
    parts = [
        SearchResult.from_json(search_gaits(engine, params, robot, start, config, k, 3).to_json()) for k in range(3)
    ]
    assert sorted(len(p.stats.simulated) and p.stats.simulated[0] for p in parts) == [21, 21, 21]
    merged = merge_results(parts)
    assert merged.stats.simulated == whole.stats.simulated and merged.stats.leaves == whole.stats.leaves
    for objective in OBJECTIVES:
        assert merged.gaits[objective].score() == pytest.approx(whole.gaits[objective].score(), abs=1e-6)
        np.testing.assert_array_equal(merged.gaits[objective].targets, whole.gaits[objective].targets)
        ranked = merged.candidates[objective]  # reached ones first, each part by its ensemble's score
        assert len(ranked) == sum(len(p.candidates[objective]) for p in parts) > 1
        keys = [(not g.reached, -g.ranking_score()) for g in ranked]
        assert keys == sorted(keys) and ranked[0] is merged.gaits[objective]


def test_policy_repeats_the_gait_whose_expansion_does_best(default_configs, default_engine) -> None:
    """The gaits stage expands every ranked gait of an objective (one batch per length) and
    repeats the one whose whole policy reaches every target and goes furthest in the engine: a
    gait with a shape the cables cannot make is passed over, and so are better-ranked ones that
    reach but do not roll, or roll once (the published rolling unit's first two shapes: 0.228 m
    in one cycle, 0.018 m in two) where the first three shapes roll 0.184 m in two."""
    engine, params, start = default_engine
    robot = default_configs.robot
    once = np.vstack([published_gait("rolling")[:2], REST_TARGET])
    rolling = np.vstack([published_gait("rolling")[:3], REST_TARGET])
    stuck = np.vstack([rolling[:1], np.full((1, 6), 3.0), REST_TARGET])  # cables cannot extend that far
    wiggle = np.vstack([[0.9, 1, 1, 1, 1, 1], [1, 0.9, 1, 1, 1, 1], [1, 1, 0.9, 1, 1, 1], REST_TARGET])

    def found(targets: np.ndarray) -> FoundGait:
        return FoundGait("forward", targets, 0.3, 0.0, 0.0, 1, 2.0, reached=True)

    ranked = [found(stuck), found(wiggle), found(once), found(rolling)]
    picked = pick_expansion(judged_expansions(engine, params, robot, start, ranked, 2, 1.0), 1.0)
    rank, targets, forward_m = picked.rank, picked.policy, picked.score
    assert rank == 3 and picked.reached and picked.reached_share == 1.0
    single = expand_in_engine(engine, params, robot, start, rolling, 2, 1.0)
    np.testing.assert_array_equal(targets, single)
    alone = simulate_targets(engine, params, robot, start, single, 1.0)
    assert forward_m == pytest.approx(float(alone.forward_m[0]), abs=1e-6) and forward_m > 0.1
    batch = expand_in_engine(engine, params, robot, start, np.stack([wiggle, rolling]), 2, 1.0)
    np.testing.assert_array_equal(batch[0], expand_in_engine(engine, params, robot, start, wiggle, 2, 1.0))
    np.testing.assert_array_equal(batch[1], single)
    assert pick_expansion(judged_expansions(engine, params, robot, start, [found(stuck)], 1, 1.0), 1.0) is None


def test_an_ensemble_runs_each_policy_under_every_parameter_set(default_configs, default_engine) -> None:
    """The ensemble is the nominal parameters, the motor speed 5 % lower and higher, then the
    friction 15 % lower and higher; its outcome's row ``k * N + i`` is policy i run alone under
    set k, and the gaits stage scores an expansion by its mean over the sets."""
    engine, params, start = default_engine
    robot = default_configs.robot
    ensemble = ensemble_params(params, 0.05, 0.15)
    speed, friction = float(params.motor_speed[0]), float(params.friction[0])
    np.testing.assert_allclose(ensemble.motor_speed.numpy(), speed * np.array([1, 0.95, 1.05, 1, 1]))
    np.testing.assert_allclose(ensemble.friction.numpy(), friction * np.array([1, 1, 1, 0.85, 1.15]))
    assert ensemble_params(params, 0.0, 0.15).batch_size == 3 and ensemble_params(params, 0.0, 0.0).batch_size == 1
    rolling = PUBLISHED["rolling"]
    policies = np.stack([rolling, np.vstack([[0.9, 1, 1, 1, 1, 1], [1, 0.9, 1, 1, 1, 1], REST_TARGET])])
    outcome = ensemble_outcome(engine, ensemble, robot, start, policies, 1.0)

    def under(k: int) -> Params:
        return Params(**{name: value[k : k + 1] for name, value in ensemble.as_dict().items()})

    for k in (1, 4):
        alone = simulate_targets(engine, under(k), robot, start, policies[0], 1.0)
        assert outcome.forward_m[2 * k] == pytest.approx(float(alone.forward_m[0]), abs=1e-9)
    found = FoundGait("forward", rolling, 0.3, 0.0, 0.0, 1, 2.0, reached=True)
    picked = pick_expansion(judged_expansions(engine, params, robot, start, [found], 1, 1.0, ensemble), 1.0)
    rank, targets, score = picked.rank, picked.policy, picked.score
    each = [float(simulate_targets(engine, under(k), robot, start, targets, 1.0).forward_m[0]) for k in range(5)]
    assert rank == 0 and score == pytest.approx(np.mean(each), abs=1e-9)
    assert np.ptp(each) > 1e-3  # the sets do move the robot differently


def test_perturbed_starts_are_settled_reproducible_and_near_the_start(default_configs, default_engine) -> None:
    """Noise of 2 mm on every end cap, settled: the caps move by millimetres, the robot is at rest,
    one seed gives the same starts and another seed others; no noise gives the start settled
    again (which creeps by up to 2 mm: a second settle is not a fixed point)."""
    engine, params, start = default_engine
    robot = default_configs.robot
    caps = engine.cap_positions(start).numpy()
    starts = perturbed_starts(engine, params, robot, start, 4, 0.002, seed=3)
    moved = np.linalg.norm(engine.cap_positions(starts).numpy() - caps, axis=-1)
    assert starts.batch_size == 4 and 3e-4 < moved.mean() < 5e-3 and moved.max() < 0.02
    assert float(starts.vel.abs().max()) == 0.0 and float(starts.omega.abs().max()) == 0.0
    again = perturbed_starts(engine, params, robot, start, 4, 0.002, seed=3)
    other = perturbed_starts(engine, params, robot, start, 4, 0.002, seed=4)
    assert torch.equal(again.pos, starts.pos) and not torch.allclose(other.pos, starts.pos, atol=1e-5)
    still = perturbed_starts(engine, params, robot, start, 1, 0.0)
    assert np.abs(engine.cap_positions(still).numpy() - caps).max() < 2e-3


def test_candidates_are_judged_over_the_ensemble_and_the_perturbed_starts(default_configs, default_engine) -> None:
    """A candidate's score is its mean over every run it is judged by: each parameter set of the
    ensemble from the search's start, then the nominal parameters from each perturbed start (row
    ``k * N + i`` of the joint outcome is policy i run alone that way); its reached share is over
    the perturbed starts. A candidate that folds the prism flat in every run scores 0, however far
    the flat robot moved, and reaches nothing."""
    engine, params, start = default_engine
    robot = default_configs.robot
    ensemble = ensemble_params(params, 0.0, 0.15)
    starts = perturbed_starts(engine, params, robot, start, 2, 0.005, seed=1)
    sets, set_starts = scenarios(ensemble, start, params, starts)
    assert sets.batch_size == set_starts.batch_size == 5
    with pytest.raises(ValueError, match="2 starts for 5 parameter sets"):
        ensemble_outcome(engine, sets, robot, starts, PUBLISHED["rolling"][None], 1.0)
    rolling = FoundGait("forward", PUBLISHED["rolling"], 0.3, 0.0, 0.0, 1, 2.0, reached=True)
    wiggle = FoundGait("forward", np.vstack([np.eye(6)[:2] * -0.1 + 1, REST_TARGET]), 0.0, 0.0, 0.0, 0, 2.0, True)
    fold = FoundGait("forward", FOLD, 0.079, 0.0, 0.0, 0, 2.0, reached=False)
    judged = judged_expansions(engine, params, robot, start, [rolling, wiggle, fold], 1, 1.0, ensemble, starts)
    assert [c.rank for c in judged] == [0, 1, 2]
    policy = judged[0].policy
    alone = []
    for k in range(5):
        one = Params(**{name: value[k : k + 1] for name, value in sets.as_dict().items()})
        alone.append(simulate_targets(engine, one, robot, set_starts.index(slice(k, k + 1)), policy, 1.0))
    joint = ensemble_outcome(engine, sets, robot, set_starts, np.stack([c.policy for c in judged[:2]]), 1.0)
    for k, run in enumerate(alone):
        assert joint.forward_m[2 * k] == pytest.approx(float(run.forward_m[0]), abs=1e-9)
    forward = [float(run.forward_m[0]) for run in alone]
    assert judged[0].score == pytest.approx(np.mean(forward), abs=1e-9)
    assert judged[0].reached_share == np.mean([bool(run.reached[0]) for run in alone[3:]])
    assert np.ptp(forward[3:]) > 1e-3  # the perturbed starts do move the robot differently
    folds = ensemble_outcome(engine, sets, robot, set_starts, judged[2].policy[None], 1.0)
    assert folds.collapsed.all() and np.abs(folds.forward_m).min() > 0.01
    assert judged[2].score == 0.0 and not judged[2].reached and judged[2].reached_share == 0.0


def test_the_pick_passes_over_a_policy_that_works_from_its_one_start_alone() -> None:
    """Forward candidates like those a search leaves: the one that rolled furthest from the
    search's start reached every target from none of 8 perturbed starts (mean 0.30 m over the
    ensemble and the starts); one that reached from all 8 (0.25 m) is picked, as
    long as the share is met. Where no candidate meets it, the highest share wins; a candidate
    that does not reach from the search's start is never picked."""
    policy = np.ones((1, 6))

    def candidate(rank: int, score: float, share: float, reached: bool = True) -> Candidate:
        return Candidate(rank, policy, reached, score, share)

    knife, steady = candidate(2, 0.301, 0.0), candidate(3, 0.254, 1.0)
    unreached, partial = candidate(0, 0.429, 1.0, reached=False), candidate(4, 0.432, 0.25)
    assert pick_expansion([unreached, knife, steady, partial], 0.75) is steady
    assert pick_expansion([unreached, knife, steady, partial], 0.0) is partial
    assert pick_expansion([unreached, knife, partial], 0.75) is partial
    assert pick_expansion([candidate(1, 0.3, 0.8), candidate(5, 0.3, 1.0)], 0.75).rank == 1
    assert pick_expansion([unreached], 0.75) is None


def test_the_learned_contact_judges_the_finalists_only_when_configured(tmp_path, default_engine) -> None:
    """``engine.contact: analytic`` judges in the search's own engine and start; ``learned`` in
    the hybrid engine with the learn stage's network (the file's weights) from that engine's own
    rest (here the free motion and the lift out of the ground: the network's decoder answers no
    contact); ``learned`` without a learn output is refused."""
    from pipeline.config import load_all
    from pipeline.learned.engine import LearnedEngine
    from storage.catalog import CONTACT_MODEL_FILE
    from storage.contact_model import load_contact_model
    from tasks.gaits import judging_engine
    from tests.conftest import empty_overlays, write_test_pipeline

    configs = load_all(write_test_pipeline(tmp_path, campaign="judge", n_targets=1))
    learn = empty_overlays(configs, 1)["learn"]
    engine, params, start = default_engine
    robot = configs.robot
    assert judging_engine(configs, robot, engine, params, start, learn) == (engine, start)
    learned_configs = configs.updated({"pipeline.engine.contact": "learned"})
    judge, judge_start = judging_engine(learned_configs, robot, engine, params, start, learn)
    assert isinstance(judge, LearnedEngine)
    saved, _, _ = load_contact_model(Path(learn.path) / CONTACT_MODEL_FILE, judge.model)
    for name, value in saved.state_dict().items():
        assert torch.equal(judge.network.state_dict()[name], value), name
    # a network that answers no contact leaves the robot to slide and slump: 0.11 m from the
    # analytic rest, held on the ground by the lift alone
    assert float((judge_start.pos - start.pos).abs().max()) > 0.05
    lowest = float((judge.cap_positions(judge_start)[..., 2] - robot.end_cap.radius_m).min())
    assert lowest == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="no learn stage output"):
        judging_engine(learned_configs, robot, engine, params, start, None)


def test_published_comparison_cycles_end_at_rest_and_move_as_published(default_configs, default_engine) -> None:
    """The gaits stage scores each published cycle beside the gaits it finds, which start and end at
    rest: simulated from rest, each reaches every target, so it ends on the rest shape, keeps the
    prism standing, and moves as its name says (measured with the config's values: rolling 0.23 m
    forward, cw -17 deg, ccw +3 deg; asserted at about half that, with the sign)."""
    engine, params, start = default_engine
    robot = default_configs.robot
    names = sorted(PUBLISHED)
    longest = max(len(PUBLISHED[name]) for name in names)
    padded = np.stack([np.vstack([PUBLISHED[n]] + [REST_TARGET] * (longest - len(PUBLISHED[n]))) for n in names])
    outcome = simulate_targets(engine, params.expand(len(names)), robot, start.repeat(len(names)), padded, 3.0)
    assert outcome.reached.all() and not outcome.collapsed.any()
    figures = zip(names, outcome.forward_m, outcome.rotation_rad, strict=True)
    moved = {n: (float(f), math.degrees(float(r))) for n, f, r in figures}
    assert moved["rolling"][0] > 0.1
    assert moved["cw"][1] < -8.0 and moved["ccw"][1] > 1.5


@pytest.mark.slow
def test_search_on_the_twin_identified_engine_beats_the_published_gaits(tmp_path) -> None:
    """The flow on the twin up to ``gaits`` with the default sysid and search: in the identified
    engine, the found forward gait rolls at least as far per cycle as the published rolling unit,
    and the found turning gaits turn at least as much as the published ones, each as the search
    ranks gaits: by its mean over the parameter ensemble (same engine, same ensemble)."""
    from flows.iteration import r2s2r_iteration
    from tests.conftest import write_test_pipeline

    config = write_test_pipeline(tmp_path, campaign="twingaits", n_targets=24)
    overrides = {f"sysid.{k}": v for k, v in SysidConfig().model_dump(mode="json").items()}
    overrides.update({f"gaits.{k}": v for k, v in GaitsConfig().model_dump(mode="json").items()})
    stages = ["collect", "track", "attach", "sysid", "gaits"]
    summary = r2s2r_iteration(str(config), iteration=1, overrides=overrides, stages=stages)
    gaits = json.loads((Path(summary["stages"]["gaits"]["ref"]["path"]) / "gaits.json").read_text())
    found, published = gaits["found"], gaits["published"]
    assert found["forward"]["ensemble_forward_m"] >= published["rolling"]["ensemble_forward_m"] > 0
    assert found["ccw"]["ensemble_rotation_deg"] >= published["ccw"]["ensemble_rotation_deg"]
    assert found["cw"]["ensemble_rotation_deg"] <= published["cw"]["ensemble_rotation_deg"]
