"""How an iteration's policies fare in their own engine when the start is not exactly the one the
gaits stage ran them from.

The gaits stage picks and reports each long policy by one engine run from the settled rest pose
(``simulated`` in ``policies.json``). The robot never starts there exactly: its redeploy starts
are tracked to a few millimetres. For each policy of a finished iteration this runs, in the
iteration's identified engine (the gaits stage's robot, time step and segment timeout):

- the exact start the gaits stage used (its ``simulated`` figures reproduce);
- the same end caps settled again (a sub-millimetre change: the rest pose re-settled);
- ``--draws`` starts with Gaussian noise of ``--sigma-mm`` (default 2 mm, the tracking error)
  on every end cap, then settled (:func:`~pipeline.gaits.ensemble.perturbed_starts`, as the
  gaits stage judges its candidate policies since stage version 5).

Prints one JSON object (last line): per policy the figures of each start (forward m along the
start heading, heading change deg, every target reached, the prism folded flat), and over the
perturbed starts the median and range of forward motion, the median heading change, the share
that reached every target and the share that folded the prism flat; the redeploy runs' mean
forward motion and heading change on the hardware (the anchor) when the iteration has them.

Usage: ``python -m benchmarks.policy_starts --iteration 2 [--config configs/pipeline/default.yaml]
[--draws 16 --sigma-mm 2 --seed 1]`` after the main job (or any campaign) has run that iteration.
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
import torch

from pipeline.config import load_all
from pipeline.gaits.ensemble import perturbed_starts
from pipeline.gaits.outcome import Outcome, simulate_targets
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.engine import State
from pipeline.physics.rollout import rest_start
from storage.catalog import POLICIES_FILE, identified_robot
from storage.layout import RunLayout, complete_stage_ref, read_manifest


def figures(outcome: Outcome, row: int) -> dict[str, float | bool]:
    """Forward motion (m), heading change (deg), whether every target was reached and whether the
    prism folded flat, of ``row``."""
    return {
        "forward_m": float(outcome.forward_m[row]),
        "rotation_deg": math.degrees(float(outcome.rotation_rad[row])),
        "reached": bool(outcome.reached[row]),
        "collapsed": bool(outcome.collapsed[row]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--iteration", type=int, required=True)
    parser.add_argument("--draws", type=int, default=16, help="perturbed starts")
    parser.add_argument("--sigma-mm", type=float, default=2.0, help="end-cap noise of the perturbed starts (mm)")
    parser.add_argument(
        "--seed", type=int, default=1, help="noise seed (the gaits stage judges its candidates from seed 0's starts)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    configs = load_all(args.config)
    layout = RunLayout.of(configs)
    refs = {}
    for stage, iteration in (("attach", 1), ("sysid", args.iteration), ("gaits", args.iteration)):
        refs[stage] = complete_stage_ref(layout.stage_dir(iteration, stage))
        if refs[stage] is None:
            parser.error(f"{layout.stage_dir(iteration, stage)}: no complete {stage} stage; run the iteration first")
    robot = identified_robot(configs, refs["attach"], refs["sysid"])
    engine = Engine(RobotModel.from_robot(robot), dt=configs.pipeline.gaits.search.dt_s)
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    nominal = Params.from_robot(robot)
    start = rest_start(engine, nominal, robot)
    settled = State.concat(
        [
            perturbed_starts(engine, nominal, robot, start, 1, 0.0),
            perturbed_starts(engine, nominal, robot, start, args.draws, args.sigma_mm / 1000.0, args.seed),
        ]
    )
    params = nominal.expand(settled.batch_size)
    policies = json.loads((Path(refs["gaits"].path) / POLICIES_FILE).read_text())
    redeploy = complete_stage_ref(layout.stage_dir(args.iteration, "redeploy"))
    anchor = read_manifest(redeploy)["summary"] if redeploy else {}
    out: dict[str, object] = {"iteration": args.iteration, "draws": args.draws, "sigma_mm": args.sigma_mm}
    started = time.perf_counter()
    for name, policy in policies.items():
        targets = np.asarray(policy["targets"], float)
        exact = simulate_targets(engine, nominal, robot, start, targets, timeout_s)
        runs = simulate_targets(engine, params, robot, settled, targets, timeout_s)
        perturbed = [figures(runs, row) for row in range(1, settled.batch_size)]
        forward = np.array([p["forward_m"] for p in perturbed])
        out[name] = {
            "gaits_stage": policy["simulated"],
            "exact_start": figures(exact, 0),
            "resettled_start": figures(runs, 0),
            "perturbed": perturbed,
            "perturbed_forward_m_median": float(np.median(forward)),
            "perturbed_forward_m_min": float(forward.min()),
            "perturbed_forward_m_max": float(forward.max()),
            "perturbed_rotation_deg_median": float(np.median([p["rotation_deg"] for p in perturbed])),
            "perturbed_reached_share": float(np.mean([p["reached"] for p in perturbed])),
            "perturbed_collapsed_share": float(np.mean([p["collapsed"] for p in perturbed])),
            "hardware_forward_m_mean": anchor.get(f"repeatability.{name}.forward_m_mean"),
            "hardware_rotation_deg_mean": anchor.get(f"repeatability.{name}.rotation_deg_mean"),
        }
    out["engine_wall_s"] = time.perf_counter() - started
    print(json.dumps(out))


if __name__ == "__main__":
    main()
