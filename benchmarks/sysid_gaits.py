"""What sysid settings do to the gaits: iteration 1 run through on several collect seeds.

``benchmarks.sysid_floor`` judges sysid settings by the held-out key-frame error; this judges
them by what the pipeline exists for, the gaits found in the identified engine and run on the
twin. For each collect seed, iteration 1 of the pipeline runs whole on the twin (collect a
random policy, track, attach, sysid, gaits, redeploy, evaluate) once per variant of the sysid
settings. The variants share the seed's campaign, so collect, track and attach run once and
every variant identifies from the same tracked trajectories (their cache keys do not hold the
sysid settings); sysid and everything downstream of it run again.

Per seed and variant: the redeploy runs' mean forward displacement of the straight policy
(m, in each start's frame) and mean heading change of the turning one (deg; counter-clockwise
positive, the default ``gaits.turn``), over the redeploy starts; the held-out key-frame error
reduction of sysid (%); the identified values' errors against the twin's hidden truth (%); and
the wall time of the variant's stages (s). Per variant, the means over the seeds.

``--variant NAME KEY=VALUE [KEY=VALUE ...]`` (repeatable) adds a variant with those pipeline
config overrides (values parsed as YAML, as ``r2s2r --set``); the pipeline config's own
settings always run first, as ``defaults``, the anchor the others are measured against.

Prints one JSON object (last line); each seed and variant's row also goes to stderr as it is done,
so a run cut short keeps what it measured. Usage:
``python -m benchmarks.sysid_gaits [--seeds 0 1 2] [--quick]
[--variant four sysid.parameters=[motor_speed,friction,restitution,motor_time_constant] ...]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import numpy as np
import torch

from flows.cli import parse_overrides
from flows.iteration import r2s2r_iteration
from pipeline.config import load_all
from pipeline.truth import truth_errors
from storage.layout import Ref, read_manifest

DOWNSTREAM = ("sysid", "gaits", "redeploy", "evaluate")
QUICK = {
    "collect.random.n_targets": 10,
    "gaits.search": {"depth": 2, "validate_top": 2},
    "gaits.straight_cycles": 1,
    "gaits.turn_cycles": 1,
}


def variant_figures(config: str, seed: int, runs_dir: str, settings: dict[str, object]) -> dict[str, object]:
    """Iteration 1 with collect seed ``seed`` in campaign ``seed<seed>`` under ``runs_dir``, with
    the pipeline config overrides ``settings`` (the runs folder, campaign and collect seed take
    precedence); its gait, held-out and truth figures (module docstring)."""
    overrides = {**settings, "runs_dir": runs_dir, "campaign": f"seed{seed}", "collect.random.seed": seed}
    summary = r2s2r_iteration(config, iteration=1, overrides=overrides)
    stages = summary["stages"]
    redeploy = read_manifest(Ref.from_json(stages["redeploy"]["ref"]))["summary"]
    sysid = read_manifest(Ref.from_json(stages["sysid"]["ref"]))["summary"]
    values = {k.removeprefix("value."): v for k, v in sysid.items() if k.startswith("value.")}
    truth = truth_errors(load_all(config, overrides), values)
    return {
        "straight_forward_m": redeploy["repeatability.straight.forward_m_mean"],
        "straight_lateral_m": redeploy["repeatability.straight.lateral_m_mean"],
        "turning_rotation_deg": redeploy["repeatability.turning.rotation_deg_mean"],
        "holdout_reduction_pct": sysid["holdout.key_frame_error_reduction_pct"],
        "identified": {**values, "latency_s": sysid["latency_s"]},
        "truth_error_pct": {k.removeprefix("truth_error_pct."): v for k, v in truth.items() if "_pct." in k},
        "stages_wall_s": float(sum(stages[s].get("wall_s", 0.0) for s in DOWNSTREAM)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="collect seeds")
    parser.add_argument("--quick", action="store_true", help="seed 0 only, 10 targets, a depth-2 search, one cycle")
    parser.add_argument(
        "--variant",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME KEY=VALUE",
        help="a variant's name and its pipeline config overrides",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    base = QUICK if args.quick else {}
    variants = {"defaults": dict(base)}
    for name, *items in args.variant:
        if name in variants:
            parser.error(f"--variant {name}: the name is taken")
        variants[name] = {**base, **parse_overrides(items)}
    seeds = [0] if args.quick else args.seeds
    figures: dict[str, object] = {"seeds": seeds, "variants": {name: {} for name in variants}}
    with tempfile.TemporaryDirectory(prefix="r2s2r-sysid-gaits-") as runs_dir:
        for seed in seeds:
            for name, settings in variants.items():
                start = time.perf_counter()
                row = variant_figures(args.config, seed, runs_dir, settings)
                row["wall_s"] = time.perf_counter() - start
                figures["variants"][name][str(seed)] = row
                print(json.dumps({"seed": seed, "variant": name, **row}, default=float), file=sys.stderr, flush=True)
    for name in variants:
        rows = figures["variants"][name].values()
        figures[f"{name}.mean"] = {
            key: float(np.mean([r[key] for r in rows]))
            for key in ("straight_forward_m", "turning_rotation_deg", "holdout_reduction_pct")
        }
    print(json.dumps(figures, default=float))


if __name__ == "__main__":
    main()
