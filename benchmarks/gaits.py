"""Gait-search figures: wall time, shapes simulated vs pruned, per-gait motion in sim and on the twin,
and the sim-to-real gap table of an iteration.

* **search**: the gaits stage's search (``configs/pipeline/default.yaml``) in the engine
  with the robot config's parameters, from rest on face 0; its wall time and how many
  edges it simulated and pruned. Anchor, same run: the time one simulated edge costs
  in a batch, times the edges an exhaustive depth-``d`` search would simulate
  (``63 * 62^(d-2)`` shape edges plus a closing edge for each), i.e. what the pruning saves.
* **gaits**: per found and published gait, one cycle from rest on face 0 in the engine
  (simulated) and on the MuJoCo twin (its ground truth): forward displacement along the
  start heading (m), rotation (deg), faces changed.
* **gap** (``--iteration-dir``): the redeploy stage's gap table of a finished iteration,
  before (robot config) and after (identified) sysid, per policy.

Prints one JSON object (last line). ``--quick``: depth-3 search with a narrow beam.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import pandas as pd
import torch

from pipeline.config import load_all
from pipeline.gaits.outcome import simulate_targets
from pipeline.gaits.search import search_gaits
from pipeline.hardware.base import GroundTruthPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.metrics import motion_in_start_frame
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import rest_start
from pipeline.policies import Policy
from pipeline.published_gaits import PUBLISHED_CYCLES as PUBLISHED
from storage.catalog import GAP_FILE


def exhaustive_edges(depth: int, shapes: int = 64) -> int:
    """Edges an exhaustive search simulates: every other shape after every node for levels
    1 .. ``depth - 1`` (``63 * 62^(k-1)`` nodes at level k), and a closing edge per node."""
    nodes = [(shapes - 1) * (shapes - 2) ** (k - 1) for k in range(1, depth)]
    return 2 * sum(nodes)


def twin_cycle(twin: MujocoTwin, targets: np.ndarray, timeout_s: float) -> dict[str, float]:
    """One cycle of ``targets`` on the twin from its rest pose: motion in the start frame."""
    twin.reset()
    caps = np.array(
        [
            p.caps_m
            for p in twin.execute(Policy("cycle", targets), timeout_s, record_frames=False)
            if isinstance(p, GroundTruthPacket)
        ]
    )
    forward, lateral, rotation = motion_in_start_frame(caps)
    return {"forward_m": forward, "lateral_m": lateral, "rotation_deg": rotation}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="depth-3 search, beam 4 (about a minute)")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--iteration-dir", type=Path, help="a finished iteration (e.g. runs/default/iter_1)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot = configs.robot
    config = configs.pipeline.gaits.search
    if args.quick:
        config = config.updated({"depth": 3, "beam_width": 4})
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    params = Params.from_robot(robot)
    start = rest_start(engine, params, robot)

    began = time.perf_counter()
    result = search_gaits(engine, params, robot, start, config)
    wall_s = time.perf_counter() - began
    stats = result.stats.as_dict()
    per_edge_s = wall_s / max(int(stats["simulated"]), 1)
    exhaustive = exhaustive_edges(config.depth)
    figures: dict[str, object] = {
        "search": {
            "depth": config.depth,
            "wall_s": wall_s,
            **stats,
            "anchor_exhaustive_edges": exhaustive,
            "anchor_exhaustive_wall_s_estimate": per_edge_s * exhaustive,
        }
    }

    twin = MujocoTwin(robot, configs.twin)
    timeout_s = configs.pipeline.collect.segment_timeout_s
    gaits: dict[str, dict[str, object]] = {}
    cycles = {f"found.{k}": g.targets for k, g in result.gaits.items()}
    cycles.update({f"published.{k}": t for k, t in PUBLISHED.items()})
    for name, targets in cycles.items():
        sim = simulate_targets(engine, params, robot, start, targets, timeout_s, config.settle_s)
        gaits[name] = {
            "targets": np.asarray(targets).tolist(),
            "sim": {
                "forward_m": float(sim.forward_m[0]),
                "lateral_m": float(sim.lateral_m[0]),
                "rotation_deg": math.degrees(float(sim.rotation_rad[0])),
                "face_steps": int(sim.faces_changed[0]),
            },
            "twin": twin_cycle(twin, targets, timeout_s),
        }
    twin.close()
    figures["gaits"] = gaits

    if args.iteration_dir is not None:
        gap = pd.read_parquet(args.iteration_dir / "evaluate" / GAP_FILE)
        table = gap.groupby(["policy", "engine"])[["com_error_m", "com_error_pct_rod", "heading_error_deg"]].mean()
        figures["gap"] = {f"{p}.{e}": row.to_dict() for (p, e), row in table.iterrows()}
    print(json.dumps(figures, default=float))


if __name__ == "__main__":
    main()
