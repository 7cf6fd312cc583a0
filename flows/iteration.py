"""The ``r2s2r_iteration`` flow: one R2S2R iteration (DESIGN §1, §6).

Stages: ``collect`` -> ``track`` -> ``attach`` -> ``sysid`` -> ``gaits`` -> ``redeploy`` ->
``evaluate``. Iteration
k > 1 collects iteration k - 1's redeploy runs, reuses iteration 1's attachment overlay (unless
``attach.every_iteration``) and identifies from the trajectories of every iteration so far (or
the last ``sysid.data_window``). The flow owns the
iteration's MLflow run (one per iteration, reused on re-invocation) and hands its
id to the stage tasks, which log through the client API. A stage that is not
asked for but whose output a later stage needs is read from disk (its complete
manifest), never recomputed.

The stages that drive the hardware (:data:`HARDWARE_STAGES`) run only when the flow is allowed
to (``hardware``); ``refresh`` names stages recomputed even when their cache is valid (``r2s2r
rerun``). The parallel parts (gait-search shards, redeploy runs) are task runs of their own, so
the task runner the caller picks (:func:`with_runner`, ``runner`` in the config) spreads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prefect import Flow, Task, flow
from prefect.runtime import flow_run
from prefect.states import State

from flows.runners import task_runner
from pipeline.config import LoadedConfigs, config_hash, load_all
from pipeline.errors import DataError
from storage.layout import Ref, RunLayout, complete_stage_ref
from storage.tracking import (
    client_for,
    environment_tags,
    finish_run,
    flatten,
    iteration_run,
    log_params_once,
    set_tags,
)
from tasks import collect as collect_module
from tasks import gaits as gaits_module
from tasks import redeploy as redeploy_module
from tasks.attach import attach
from tasks.caching import is_cached, on_disk
from tasks.collect import collect
from tasks.evaluate import evaluate
from tasks.gaits import gaits, search_shard
from tasks.redeploy import redeploy, redeploy_run, set_aside_other_runs
from tasks.sysid import sysid
from tasks.track import track

STAGES = ("collect", "track", "attach", "sysid", "gaits", "redeploy", "evaluate")
HARDWARE_STAGES = ("collect", "redeploy")
"""Stages that drive the hardware: never rerun unless asked (``r2s2r rerun --recollect``)."""
STAGE_TASKS: dict[str, Task] = {
    "collect": collect,
    "track": track,
    "attach": attach,
    "sysid": sysid,
    "gaits": gaits,
    "redeploy": redeploy,
    "evaluate": evaluate,
}


def with_runner(flow_object: Flow, configs: LoadedConfigs) -> Flow:
    """``flow_object`` with the task runner of the config's ``runner`` section."""
    return flow_object.with_options(task_runner=task_runner(configs.pipeline.runner))


def existing_ref(layout: RunLayout, iteration: int, stage: str) -> Ref:
    """The ref of a stage's complete output on disk; :class:`DataError` if there is none."""
    stage_dir = layout.stage_dir(iteration, stage)
    ref = complete_stage_ref(stage_dir)
    if ref is None:
        raise DataError(f"{stage_dir}: stage '{stage}' has no complete output for iteration {iteration}; run it first")
    return ref


def attach_iteration(configs: LoadedConfigs, iteration: int) -> int:
    """The iteration whose attachment overlay ``iteration`` uses: its own (iteration 1, or
    ``attach.every_iteration``) or iteration 1's."""
    return iteration if iteration == 1 or configs.pipeline.attach.every_iteration else 1


def earlier_data_refs(
    configs: LoadedConfigs, layout: RunLayout, iteration: int
) -> dict[int, tuple[dict[str, str], dict[str, str]]]:
    """The collect and track refs (JSON) of the earlier iterations whose trajectories the sysid of
    ``iteration`` also uses (all so far, or the last ``sysid.data_window`` with this one)."""
    window = configs.pipeline.sysid.data_window or iteration
    return {
        k: (existing_ref(layout, k, "collect").to_json(), existing_ref(layout, k, "track").to_json())
        for k in range(max(1, iteration - window + 1), iteration)
    }


@flow(name="r2s2r_iteration")
def r2s2r_iteration(
    pipeline_config: str,
    iteration: int = 1,
    overrides: dict[str, object] | None = None,
    stages: list[str] | None = None,
    refresh: list[str] | None = None,
    hardware: bool = True,
) -> dict[str, object]:
    """Run iteration ``iteration`` of the campaign in ``pipeline_config``.

    ``overrides`` are dotted-key config overrides; ``stages`` limits which stages run (default:
    all). ``refresh`` stages are recomputed even if cached. With ``hardware`` false the stages
    that drive the hardware are read from disk, and if the redeploy runs on disk are not of the
    current gaits, ``redeploy`` and ``evaluate`` are skipped (the robot would have to run the new
    gaits first); their summary entries say so. A later iteration's collect still runs where it
    only copies the previous iteration's redeploy runs (:func:`tasks.collect.needs_hardware`), so
    that it never holds a copy of runs since recorded again. Returns a summary with
    the MLflow run id and, per stage, its ref, whether it came from the cache and its wall time
    (s; shards and redeploy runs included), or why it was skipped.
    """
    configs = load_all(pipeline_config, overrides)
    wanted = list(STAGES) if stages is None else stages
    fresh = set(refresh or ())
    unknown = [s for s in [*wanted, *fresh] if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; available: {', '.join(STAGES)}")
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    client = client_for(layout)
    run_id, created = iteration_run(client, layout, iteration)
    if created:
        params = flatten(
            "pipeline",
            configs.pipeline.model_dump(mode="json", exclude={"runs_dir", "robot_config", "hardware_config"}),
        )
        params.update(flatten("robot", configs.robot.model_dump(mode="json")))
        params["robot.config_hash"] = config_hash(configs.robot)
        params["pipeline.config_file"] = Path(pipeline_config).name
        log_params_once(client, run_id, params)
    client.set_tag(run_id, "prefect.flow_run_id", str(flow_run.id))
    set_tags(client, run_id, environment_tags())  # the latest invocation's install and CPU
    summary: dict[str, object] = {"iteration": iteration, "mlflow_run_id": run_id, "stages": {}}
    try:
        refs: dict[str, dict[str, str]] = {}

        def run(stage: str, call: Callable[[Task], State]) -> None:
            """Run ``stage`` (if wanted and allowed) by ``call(stage task)``; note its ref."""
            if stage not in wanted:
                return
            without_robot = stage == "collect" and not collect_module.needs_hardware(configs, iteration)
            if not hardware and stage in HARDWARE_STAGES and not without_robot:
                if stage == "collect" or is_cached(redeploy_key()):  # the recording on disk is this config's
                    summary["stages"][stage] = {"ref": ref(stage), "cached": True, "note": "hardware not run"}
                else:
                    blocked.add(stage)
                    summary["stages"][stage] = {"skipped": "needs the hardware to run the new gaits (--recollect)"}
                return
            if stage == "evaluate" and "redeploy" in blocked:
                summary["stages"][stage] = {"skipped": "its redeploy runs are stale (--recollect)"}
                return
            stage_task = STAGE_TASKS[stage]
            start = time.perf_counter()
            state = call(stage_task.with_options(refresh_cache=True) if stage in fresh else stage_task)
            if state.name == "Cached" and not on_disk(state.result()):  # replaced by a rerun under another config
                state = call(stage_task.with_options(refresh_cache=True))
            refs[stage] = state.result()
            wall_s = time.perf_counter() - start
            summary["stages"][stage] = {"ref": refs[stage], "cached": state.name == "Cached", "wall_s": wall_s}

        blocked: set[str] = set()

        def redeploy_key() -> str:
            parameters = {
                "configs": configs,
                "iteration": iteration,
                "attach_ref": ref("attach"),
                "gaits_ref": ref("gaits"),
            }
            return redeploy_module.cache_key(None, parameters)

        def ref(stage: str) -> dict[str, str]:
            if stage not in refs:
                refs[stage] = existing_ref(layout, iteration, stage).to_json()
            return refs[stage]

        recollect = "collect" in fresh
        run("collect", lambda t: t(configs, iteration, run_id, recollect, return_state=True))
        run("track", lambda t: t(configs, iteration, run_id, ref("collect"), return_state=True))
        if attach_iteration(configs, iteration) == iteration:
            run("attach", lambda t: t(configs, iteration, run_id, ref("track"), ref("collect"), return_state=True))
        else:
            refs["attach"] = existing_ref(layout, attach_iteration(configs, iteration), "attach").to_json()

        def sysid_call(stage_task: Task) -> State:
            earlier = earlier_data_refs(configs, layout, iteration)
            inputs = (ref("collect"), ref("track"), ref("attach"))
            return stage_task(configs, iteration, run_id, *inputs, earlier_refs=earlier, return_state=True)

        def gaits_call(stage_task: Task) -> State:
            inputs = (ref("attach"), ref("sysid"))
            parameters = {"configs": configs, "iteration": iteration, "attach_ref": inputs[0], "sysid_ref": inputs[1]}
            shards = None
            if "gaits" in fresh or not is_cached(gaits_module.cache_key(None, parameters)):
                count = configs.pipeline.gaits.search.shards
                futures = [search_shard.submit(configs, *inputs, k) for k in range(count)]
                shards = [future.result() for future in futures]
            return stage_task(configs, iteration, run_id, *inputs, shard_results=shards, return_state=True)

        def redeploy_call(stage_task: Task) -> State:
            redeploy_config = configs.pipeline.redeploy
            set_aside_other_runs(configs, iteration, Ref.from_json(ref("gaits")), fresh="redeploy" in fresh)
            futures = []
            for index in range(len(redeploy_config.policies) * len(redeploy_config.starts)):
                futures.append(redeploy_run.submit(configs, iteration, ref("attach"), ref("gaits"), index))
                if not redeploy_config.concurrent_runs:
                    futures[-1].result()
            for future in futures:
                future.result()
            return stage_task(configs, iteration, run_id, ref("attach"), ref("gaits"), return_state=True)

        run("sysid", sysid_call)
        run("gaits", gaits_call)
        run("redeploy", redeploy_call)
        inputs = ("attach", "sysid", "gaits", "redeploy")
        run("evaluate", lambda t: t(configs, iteration, run_id, *map(ref, inputs), return_state=True))
    except BaseException:
        finish_run(client, run_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    return summary
