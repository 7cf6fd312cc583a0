"""Trajectory-following planner: time per replan on one CPU thread.

A table of the Tribar paper's size (51 actions, 3 faces, 2 directions; random motions of a
roll's size) and a 2 m line resampled every 2 cm; each replan searches every sequence of
``depth`` actions, the turns in place in either direction (:func:`pipeline.follow.planner.plan`;
a third of the random table's entries are turns: they end on their face). Reports the
median over ``--repeats`` replans from random poses near the line at depth 2 (the paper's), the
same with the table corrected online after 30 observed actions first
(:mod:`pipeline.follow.correction`, as ``r2s2r follow`` replans by default), the same with the
actions in the rolling direction only (the paper's search, ``turn_either_way: false``) and, as
the anchor measured in the same run, at depth 1.
Prints one JSON object (last line).

Usage: ``python -m benchmarks.planner [--quick] [--repeats 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from pipeline.config.follow import PlannerConfig
from pipeline.follow.correction import Correction
from pipeline.follow.motion import ActionTable, Pose
from pipeline.follow.paths import from_waypoints, line
from pipeline.follow.planner import plan

ACTIONS, FACES = 51, 3


def _table(rng: np.random.Generator) -> ActionTable:
    shape = (ACTIONS, FACES, 2)
    return ActionTable(
        tuple(f"action{a}" for a in range(ACTIONS)),
        rng.uniform(-0.02, 0.15, shape),
        rng.uniform(-0.03, 0.03, shape),
        rng.uniform(-0.4, 0.4, shape),
        rng.integers(0, FACES, shape),
    )


def _median_ms(
    table: ActionTable, segment: np.ndarray, config: PlannerConfig, poses: list[Pose], correction: Correction | None
) -> float:
    times = []
    for k, pose in enumerate(poses):
        start = time.perf_counter()
        plan(table if correction is None else correction.applied(), segment, pose, k % FACES, k % 2, config)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 replans")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 20
    rng = np.random.default_rng(0)
    table = _table(rng)
    config = PlannerConfig()
    segment = from_waypoints(line(2.0), config.corner_deg, config.waypoint_spacing_m).segments[0]
    poses = [Pose(*rng.uniform([0.0, -0.2, -np.pi], [2.0, 0.2, np.pi])) for _ in range(args.repeats)]
    correction = Correction(table, 2.0)
    for k in range(30):
        correction.observe(k % ACTIONS, k % FACES, k % 2, tuple(rng.normal(0.0, 0.03, 3)), int(rng.integers(FACES)))
    _median_ms(table, segment, config, poses[:5], None)  # warm-up
    depth2 = _median_ms(table, segment, config, poses, None)
    corrected = _median_ms(table, segment, config, poses, correction)
    confined = _median_ms(table, segment, config.model_copy(update={"turn_either_way": False}), poses, None)
    depth1 = _median_ms(table, segment, config.model_copy(update={"depth": 1}), poses, None)
    result = {
        "actions": ACTIONS,
        "faces": FACES,
        "waypoints": len(segment),
        "replan_ms_depth2": round(depth2, 3),
        "replan_ms_depth2_corrected": round(corrected, 3),
        "replan_ms_depth2_rolling_direction": round(confined, 3),
        "anchor_replan_ms_depth1": round(depth1, 3),
        "goal_ms": 50.0,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
