"""Wall and CPU time of an R2S2R iteration, stage by stage, of a campaign, and of a cached rerun.

In a fresh campaign under a temporary runs folder, from a shell (the README's CLI), the commands
sharing one local Prefect server (``flows.local_server``; the first command starts it):

1. ``r2s2r iterate -k 1``: one full iteration (collect on the twin ... evaluate);
2. ``r2s2r campaign -n 2``: iteration 2, iteration 1 coming from the cache;
3. ``r2s2r iterate -k 2``: every stage cached, so all of its time is overhead (imports, Prefect,
   MLflow, cache look-ups);
4. ``r2s2r rerun evaluate -k 2``: one stage recomputed, every upstream stage from the cache; the
   **cached-rerun overhead** is the command's wall time minus the stage's own.

Per iteration and stage: the wall and CPU time (s) the iteration run logged in MLflow
(``time/<stage>_wall_s``, ``time/<stage>_cpu_s``; CPU of every thread of the command's process).
The anchor, measured in the same run: ``r2s2r --help`` (interpreter and imports, no work).
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


def _stage_times(client, experiment: str) -> dict[str, dict[str, float]]:
    """Per iteration, its MLflow run's ``time/*`` metrics (the latest value of each)."""
    from storage.tracking import ITERATION_TAG

    return {
        run.data.tags[ITERATION_TAG]: {k[5:]: v for k, v in sorted(run.data.metrics.items()) if k.startswith("time/")}
        for run in client.search_runs([experiment])
        if ITERATION_TAG in run.data.tags
    }


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
        env.pop("PREFECT_API_URL", None)
        from flows.local_server import stop

        try:
            iteration_1 = _timed([R2S2R, "iterate", "-k", "1", *sets], env)
            campaign_call = _timed([R2S2R, "campaign", "-n", "2", *sets], env)
            all_cached = _timed([R2S2R, "iterate", "-k", "2", *sets], env)
            rerun_cli = _timed([R2S2R, "rerun", "evaluate", "-k", "2", *sets], env)
        finally:
            stop(runs / ".prefect")

        os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
        from storage.layout import RunLayout
        from storage.tracking import HEADLINE_PREFIX, ITERATION_TAG, client_for

        client = client_for(RunLayout(runs, "bench"))
        experiment = client.get_experiment_by_name("bench").experiment_id
        times = _stage_times(client, experiment)
        headline = {
            run.data.tags[ITERATION_TAG]: {k: v for k, v in run.data.metrics.items() if k.startswith(HEADLINE_PREFIX)}
            for run in client.search_runs([experiment])
            if ITERATION_TAG in run.data.tags
        }
    anchor = _timed([R2S2R, "--help"], env)
    rerun_stage = times["2"]["evaluate_wall_s"]  # the rerun's (the latest value)
    print(
        json.dumps(
            {
                "iteration_1_wall_s": iteration_1,
                "campaign_2_iterations_wall_s": iteration_1 + campaign_call,
                "campaign_call_with_iteration_1_cached_wall_s": campaign_call,
                "iterate_all_cached_cli_wall_s": all_cached,
                "rerun_evaluate_cli_wall_s": rerun_cli,
                "rerun_evaluate_stage_wall_s": rerun_stage,
                "cached_rerun_overhead_s": rerun_cli - rerun_stage,
                "anchor_cli_help_wall_s": anchor,
                "stage_times_s": times,
                "headline_by_iteration": headline,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
