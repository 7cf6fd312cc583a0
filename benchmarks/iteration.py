"""Wall and CPU time of an R2S2R iteration, stage by stage, of a campaign, and of a cached rerun.

In a fresh campaign under a temporary runs folder, from a shell (the README's CLI), the commands
sharing one local Prefect server (``flows.local_server``; the first command starts it):

1. ``r2s2r iterate -k 1``: one full iteration (collect on the twin ... evaluate);
2. ``r2s2r campaign -n 2``: iteration 2, iteration 1 coming from the cache;
3. ``r2s2r iterate -k 2``: every stage cached, so all of its time is overhead (imports, Prefect,
   MLflow, cache look-ups), in its own process; it starts the command server as it exits
   (``flows.command_server``: commands 1 and 2 run with ``R2S2R_COMMAND_SERVER=0``, so that
   py-spy sees their work);
4. once the command server serves, ``r2s2r iterate -k 2`` again, run by it;
5. ``r2s2r rerun evaluate -k 2``, run by the command server: one stage recomputed, every upstream
   stage from the cache; the **cached-rerun overhead** is the command's wall time minus the
   stage's own.

Per iteration and stage: the wall and CPU time (s) the iteration run logged in MLflow
(``time/<stage>_wall_s``, ``time/<stage>_cpu_s``; CPU of every thread of the command's process).
The anchor, measured in the same run: ``r2s2r --help`` (interpreter and imports, no work).
Headline metrics per iteration come from the iterations' MLflow runs.

**Where a stage's time goes**: commands 1 and 2 run under py-spy (sampling every Python thread of
the command 50 times a second, without pausing it). Each sample is put in the stage whose task
module (``tasks/<stage>.py``) is on its stack, and in the first of these costs its stack shows:
``compile`` (numba, torch's compiler), ``engine kernel`` (the compiled steps and their
gradient), ``engine eager`` (the rollouts' own torch work between the steps, and the learned
engine's physics), ``learned network``, ``twin physics`` and ``rendering`` (MuJoCo), ``vision``
(decoding, segmentation and fitting frames), ``plots``, ``storage`` (Parquet, files),
``mlflow``, ``prefect``, ``imports``, else ``other``. Per stage: the
seconds sampled (threads that were running), each cost's share, and the three functions of the
project where most of its samples were (innermost project frame).

Usage: ``python -m benchmarks.iteration [--quick] [--no-profile]`` (``--quick``: a 4-target random
policy, a depth-2 search and one redeploy policy, for a smoke run of a few minutes). Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from flows.command_server import SERVER_ENV, wait_running
from flows.command_server import stop as stop_command_server

REPO = Path(__file__).resolve().parents[1]
R2S2R = str(REPO / ".venv" / "bin" / "r2s2r")
PYSPY = str(REPO / ".venv" / "bin" / "py-spy")
SAMPLE_HZ = 50
COSTS = (
    ("compile", ("numba/core/", "torch/_dynamo/", "torch/_inductor/")),
    (
        "engine kernel",
        ("pipeline/physics/engine.py:Engine._run_kernel", "pipeline/physics/engine.py:Engine._run_adjoint"),
    ),
    ("learned network", ("pipeline/learned/network.py", "pipeline/learned/training.py")),
    ("engine eager", ("pipeline/physics/", "pipeline/learned/engine.py")),
    ("rendering", ("mujoco/renderer.py", "pipeline/hardware/camera.py")),
    ("twin physics", ("pipeline/hardware/twin.py",)),
    ("vision", ("pipeline/perception/", "storage/frames.py")),
    ("plots", ("pipeline/plots.py", "matplotlib/")),
    ("storage", ("storage/", "pyarrow/", "pandas/")),
    ("mlflow", ("mlflow/",)),
    ("prefect", ("prefect/",)),
    ("imports", ("<frozen importlib",)),
)
"""A sample's cost: the first of these, in this order, that a frame of its stack matches (the frame's
``file:function`` starts with one of the patterns, or its file contains one)."""
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):\d+\)$")
_PROJECT = ("pipeline/", "storage/", "tasks/", "flows/")
QUICK = {
    "collect.random.n_targets": 4,
    "gaits.search": {"depth": 2, "validate_top": 2},
    "gaits.straight_cycles": 1,
    "gaits.turn_cycles": 1,
    "redeploy.policies": ["straight"],
}


def _timed(cmd: list[str], env: dict[str, str], profile: Path | None = None) -> float:
    """Wall time (s) of ``cmd``; with ``profile``, run under py-spy, its raw samples written there."""
    if profile is not None:
        spy = [PYSPY, "record", "--format", "raw", "--nonblocking", "--rate", str(SAMPLE_HZ), "-o", str(profile), "--"]
        cmd = [*spy, str(REPO / ".venv" / "bin" / "python"), *cmd]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _cost(frames: list[tuple[str, str]]) -> str:
    """The :data:`COSTS` name of a sample's stack ``frames`` ((file, function), outermost first)."""
    for name, patterns in COSTS:
        for file, function in reversed(frames):
            if any(f"{file}:{function}".startswith(p) or p in file for p in patterns):
                return name
    return "other"


def stage_costs(profiles: list[Path]) -> dict[str, dict[str, object]]:
    """Per stage, from py-spy raw profiles (``stack count`` lines): seconds sampled, each cost's
    share (%) and the three innermost project functions with most samples (%)."""
    samples: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    functions: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for profile in profiles:
        for line in profile.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [(m["file"], m["function"]) for m in map(_FRAME.match, stack.split(";")) if m]
            stage = next((Path(file).stem for file, _ in frames if file.startswith("tasks/")), None)
            if stage is None:
                continue
            samples[stage][_cost(frames)] += int(count)
            inner = next((f"{file}:{function}" for file, function in reversed(frames) if file.startswith(_PROJECT)))
            functions[stage][inner] += int(count)
    result = {}
    for stage, costs in samples.items():
        total = sum(costs.values())
        result[stage] = {
            "sampled_s": round(total / SAMPLE_HZ, 1),
            "costs_pct": {name: round(100 * n / total, 1) for name, n in costs.most_common()},
            "top_functions_pct": {name: round(100 * n / total, 1) for name, n in functions[stage].most_common(3)},
        }
    return result


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
    parser.add_argument("--no-profile", action="store_true", help="run the commands without py-spy")
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
        env.pop(SERVER_ENV, None)
        own_process = {**env, SERVER_ENV: "0"}
        from flows.local_server import stop

        try:
            profiles = [] if args.no_profile else [Path(tmp) / "iteration-1.txt", Path(tmp) / "campaign.txt"]
            iteration_1 = _timed([R2S2R, "iterate", "-k", "1", *sets], own_process, *profiles[:1])
            campaign_call = _timed([R2S2R, "campaign", "-n", "2", *sets], own_process, *profiles[1:])
            costs = stage_costs(profiles)
            all_cached = _timed([R2S2R, "iterate", "-k", "2", *sets], env)
            if not wait_running(runs / ".prefect", 120):
                raise RuntimeError("no command server within 120 s")
            all_cached_served = _timed([R2S2R, "iterate", "-k", "2", *sets], env)
            rerun_cli = _timed([R2S2R, "rerun", "evaluate", "-k", "2", *sets], env)
        finally:
            stop(runs / ".prefect")
            stop_command_server(runs / ".prefect")

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
                "iterate_all_cached_cli_served_wall_s": all_cached_served,
                "rerun_evaluate_cli_wall_s": rerun_cli,
                "rerun_evaluate_stage_wall_s": rerun_stage,
                "cached_rerun_overhead_s": rerun_cli - rerun_stage,
                "anchor_cli_help_wall_s": anchor,
                "stage_times_s": times,
                "stage_costs_both_iterations": costs,
                "headline_by_iteration": headline,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
