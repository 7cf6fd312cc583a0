"""Wall time of an R2S2R iteration, of a two-iteration campaign, and the overhead of a cached rerun.

In a fresh campaign under a temporary runs folder, from a shell (the README's CLI):

1. ``r2s2r iterate -k 1``: one full iteration (collect on the twin ... evaluate);
2. ``r2s2r campaign -n 2``: the campaign; iteration 1 is cached, so this is iteration 2 plus the
   cached pass over iteration 1 (the campaign's wall time is 1. + 2.);
3. ``r2s2r rerun evaluate -k 2``: one stage recomputed, every upstream stage from the cache.

Then, in this process (its Prefect server already up), the same rerun of ``evaluate`` through
the flow: the **cached-rerun overhead** is the flow's wall time minus the recomputed stage's own
wall time (time spent outside the stage: config, MLflow run, cache look-ups of the six upstream
stages). The anchor, measured in the same run: ``r2s2r --help`` (interpreter and imports, no work).
Headline metrics per iteration come from the iterations' MLflow runs.

Usage: ``python -m benchmarks.iteration [--quick]`` (``--quick``: a 4-target random policy, a
depth-2 search and one redeploy policy, for a smoke run of a few minutes). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
R2S2R = str(REPO / ".venv" / "bin" / "r2s2r")
QUICK = {
    "collect.random.n_targets": 4,
    "gaits.search": {"depth": 2, "validate_top": 2},
    "gaits.straight_cycles": 1,
    "gaits.turn_cycles": 1,
    "redeploy.policies": ["straight"],
}


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small policy and search (a few minutes)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="r2s2r-bench-") as tmp:
        runs = Path(tmp) / "runs"
        overrides: dict[str, object] = {"runs_dir": str(runs), "campaign": "bench", **(QUICK if args.quick else {})}
        sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
        env = {
            **os.environ,
            "PREFECT_HOME": str(runs / ".prefect"),
            "MUJOCO_GL": "egl",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        iteration_1 = _timed([R2S2R, "iterate", "-k", "1", *sets], env)
        campaign_call = _timed([R2S2R, "campaign", "-n", "2", *sets], env)
        rerun_cli = _timed([R2S2R, "rerun", "evaluate", "-k", "2", *sets], env)

        from flows.environment import configure_environment
        from storage.layout import RunLayout

        os.environ.update({k: env[k] for k in ("PREFECT_HOME", "MUJOCO_GL", "PREFECT_SERVER_ANALYTICS_ENABLED")})
        configure_environment(RunLayout(runs, "bench"))
        from flows.iteration import r2s2r_iteration, with_runner
        from pipeline.config import load_all
        from storage.tracking import HEADLINE_PREFIX, ITERATION_TAG, client_for

        config = str(REPO / "configs" / "pipeline" / "default.yaml")
        configs = load_all(config, overrides)
        flow = with_runner(r2s2r_iteration, configs)
        flow(config, 2, overrides, ["collect"])  # starts this process's Prefect server (not measured)
        start = time.perf_counter()
        summary = flow(config, 2, overrides, None, ["evaluate"], False)
        in_process = time.perf_counter() - start
        stages = summary["stages"]
        stage_wall = stages["evaluate"]["wall_s"]  # a KeyError if evaluate was not recomputed
        client = client_for(RunLayout(runs, "bench"))
        experiment = client.get_experiment_by_name("bench").experiment_id
        headline = {
            run.data.tags[ITERATION_TAG]: {k: v for k, v in run.data.metrics.items() if k.startswith(HEADLINE_PREFIX)}
            for run in client.search_runs([experiment])
            if ITERATION_TAG in run.data.tags
        }
    anchor = _timed([R2S2R, "--help"], env)
    print(
        json.dumps(
            {
                "iteration_1_wall_s": iteration_1,
                "campaign_2_iterations_wall_s": iteration_1 + campaign_call,
                "campaign_call_with_iteration_1_cached_wall_s": campaign_call,
                "rerun_evaluate_cli_wall_s": rerun_cli,
                "rerun_evaluate_in_process_wall_s": in_process,
                "rerun_evaluate_stage_wall_s": stage_wall,
                "cached_rerun_overhead_s": in_process - stage_wall,
                "cached_stages": sorted(s for s, info in stages.items() if info.get("cached")),
                "anchor_cli_help_wall_s": anchor,
                "headline_by_iteration": headline,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
