"""The ``r2s2r_iteration`` flow: one R2S2R iteration, the stage table run in order.

Stages (:mod:`flows.stages`): ``collect`` -> ``track`` -> ``attach`` -> ``sysid`` -> ``learn``
-> ``gaits`` -> ``actions`` -> ``redeploy`` -> ``evaluate``. Iteration k > 1 collects iteration
k - 1's redeploy runs, reuses iteration 1's attachment overlay (unless
``attach.every_iteration``) and identifies from the trajectories of every iteration so far (or
the last ``sysid.data.window``). The flow owns the iteration's MLflow run (one per iteration,
reused on re-invocation) and hands its id to the stage tasks, which log through the client API.
A stage that is not asked for but whose output a later stage needs is read from disk (its
complete manifest), never recomputed.

The stages that drive the hardware run only when the flow is allowed to (``hardware``);
``refresh`` names stages recomputed even when their cache is valid (``r2s2r rerun``). The
parallel parts (gait-search shards, redeploy runs) are task runs of their own, so the task
runner the caller picks (:func:`with_runner`, ``runner`` in the config) spreads them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import Flow, flow
from prefect.runtime import flow_run

from flows import stages as stage_table
from flows.caching import on_disk
from flows.runners import task_runner
from flows.stages import Call, Stage
from pipeline.config import LoadedConfigs, config_hash, load_all
from pipeline.errors import DataError
from pipeline.progress import stage_line
from storage.layout import RunLayout, existing_ref, set_aside, stage_state
from storage.tracking import (
    campaign_run,
    client_for,
    environment_tags,
    finish_run,
    flatten,
    headline_metrics,
    headline_order,
    iteration_run,
    log_metrics,
    log_params_once,
    set_tags,
    write_campaign_view,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def with_runner(flow_object: Flow, configs: LoadedConfigs) -> Flow:
    """``flow_object`` with the task runner of the config's ``runner`` section."""
    return flow_object.with_options(task_runner=task_runner(configs.pipeline.runner))


def _log_iteration_params(configs: LoadedConfigs, client: MlflowClient, run_id: str, pipeline_config: str) -> None:
    """The iteration run's params: the pipeline and robot configs, flattened, and the robot config's hash."""
    params = flatten(
        "pipeline", configs.pipeline.model_dump(mode="json", exclude={"runs_dir", "robot_config", "hardware_config"})
    )
    params.update(flatten("robot", configs.robot.model_dump(mode="json")))
    params["robot.config_hash"] = config_hash(configs.robot)
    params["pipeline.config_file"] = Path(pipeline_config).name
    log_params_once(client, run_id, params)


def _log_headline(client: MlflowClient, run_id: str, campaign_id: str, iteration: int) -> dict[str, float]:
    """Copy the iteration's headline figures (:func:`storage.tracking.headline_metrics`) to
    ``headline/*`` on its run and, at step = iteration, on the campaign run, and store the
    campaign view with a column for each (:func:`storage.tracking.write_campaign_view`); returns them."""
    run = client.get_run(run_id)
    headline = headline_metrics(run.data.metrics)
    for target in (run_id, campaign_id):
        log_metrics(client, target, headline, step=iteration)
    columns = sorted(headline, key=headline_order)
    write_campaign_view(client, run.info.experiment_id, columns, list(stage_table.stage_names()))
    return headline


def _run_stage(stage: Stage, call: Call, run_id: str) -> tuple[dict[str, str], bool]:
    """Run ``stage`` through its Prefect task (after its fan-out); its ref and whether it was cached."""
    parameters = stage.parameters(call, run_id)
    if stage.fan_out is not None:
        parameters.update(stage.fan_out(call, stage.is_cached(call)))
    state = stage.prefect_task(call.fresh)(**parameters, return_state=True)
    if state.name == "Cached" and not on_disk(state.result()):  # replaced by a rerun under another config
        state = stage.prefect_task(fresh=True)(**parameters, return_state=True)
    return state.result(), state.name == "Cached"


def _close_stage(client: MlflowClient, run_id: str, stage: Stage, entry: dict[str, object]) -> None:
    """Print the stage's closing line (:func:`~pipeline.progress.stage_line`) from its summary
    ``entry`` and its key figures on the iteration run ``run_id``; keep it in ``entry["line"]``."""
    if "skipped" in entry:
        outcome = f"skipped: {entry['skipped']}"
    elif entry.get("cached"):
        outcome = "cached" + (" (hardware not run)" if "note" in entry else "")
    else:
        outcome = f"done in {entry['wall_s']:.1f} s"
    entry["line"] = stage_line(stage.name, outcome, stage.figure_text(client.get_run(run_id).data.metrics))


def _set_aside_corrupt(layout: RunLayout, iteration: int, stage: Stage) -> None:
    """Keep a stage output whose files do not match its manifest aside (``set-aside/``) so that it
    is recomputed, never reused; a hardware stage's recording is not recorded again behind the
    user's back: :class:`DataError` says what was found and where the recording now is."""
    stage_dir = layout.stage_dir(iteration, stage.name)
    state = stage_state(stage_dir)
    if state.kind != "corrupt":
        return
    kept = set_aside(layout, stage_dir, "corrupt")
    if stage.hardware:
        raise DataError(
            f"{state.problem}: the {stage.name} stage's recording does not match its manifest; it was kept at "
            f"{kept}. Run the iteration again to record it anew (the robot runs), or restore the file."
        )


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
    that drive the hardware are read from disk, and if a hardware stage's output on disk is not
    the current one (the redeploy runs of other gaits), it and the stages that read it are
    skipped (the robot would have to run first); their summary entries say so. A hardware stage
    that would not drive the robot now still runs (a later iteration's collect copying the
    previous redeploy runs, :func:`tasks.collect.needs_hardware`), so that it never holds a copy
    of runs since recorded again. Returns a summary with the MLflow run id and, per stage, its
    ref, whether it came from the cache and its wall time (s; fan-outs included), or why it was
    skipped, and the iteration's headline figures (also logged as ``headline/*`` on its MLflow
    run and on the campaign run, at step = iteration). ``cpu_s``: the stage's CPU time in this
    process, every thread (s; a task runner's workers not included); a stage computed (not
    cached) logs both as ``time/<stage>_wall_s`` and ``time/<stage>_cpu_s`` on the iteration run.
    """
    configs = load_all(pipeline_config, overrides)
    names = stage_table.stage_names()
    wanted = list(names) if stages is None else stages
    fresh = set(refresh or ())
    unknown = [s for s in [*wanted, *fresh] if s not in names]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; available: {', '.join(names)}")
    layout = RunLayout.of(configs)
    client = client_for(layout)
    run_id, created = iteration_run(client, layout, iteration)
    campaign_id = campaign_run(client, layout)
    owns_campaign = flow_run.parent_flow_run_id is None  # not a campaign's subflow: its status follows this flow
    if owns_campaign:
        client.update_run(campaign_id, status="RUNNING")
    if created:
        _log_iteration_params(configs, client, run_id, pipeline_config)
    client.set_tag(run_id, "prefect.flow_run_id", str(flow_run.id))
    set_tags(client, run_id, environment_tags())  # the latest invocation's install and CPU
    summary: dict[str, object] = {"iteration": iteration, "mlflow_run_id": run_id, "stages": {}}
    refs: dict[str, dict[str, str]] = {}

    def ref(name: str) -> dict[str, str]:
        if name not in refs:
            refs[name] = existing_ref(layout, iteration, name).to_json()
        return refs[name]

    blocked: set[str] = set()
    try:
        for stage in stage_table.table():
            source = stage.source_iteration(configs, iteration)
            if source != iteration:
                refs[stage.name] = existing_ref(layout, source, stage.name).to_json()
                continue
            if stage.name not in wanted:
                continue
            inputs = stage.inputs_of(configs)
            waiting = [name for name in inputs if name in blocked]
            if waiting:
                blocked.add(stage.name)
                summary["stages"][stage.name] = {"skipped": f"its {waiting[0]} output is stale (--recollect)"}
                _close_stage(client, run_id, stage, summary["stages"][stage.name])
                continue
            _set_aside_corrupt(layout, iteration, stage)
            call = Call(configs, iteration, {name: ref(name) for name in inputs}, stage.name in fresh)
            if not hardware and stage.hardware and stage.needs_robot(configs, iteration):
                if not inputs:
                    ref(stage.name)  # no recording at all: DataError, run it first
                if inputs and stage.is_cached(call):  # the output on disk is this config's
                    summary["stages"][stage.name] = {"ref": ref(stage.name), "cached": True, "note": "hardware not run"}
                else:
                    blocked.add(stage.name)
                    why = "run the new gaits" if inputs else "record under this config"
                    summary["stages"][stage.name] = {"skipped": f"needs the hardware to {why} (--recollect)"}
                _close_stage(client, run_id, stage, summary["stages"][stage.name])
                continue
            start, start_cpu = time.perf_counter(), time.process_time()
            refs[stage.name], cached = _run_stage(stage, call, run_id)
            wall_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
            entry = {"ref": refs[stage.name], "cached": cached, "wall_s": wall_s, "cpu_s": cpu_s}
            summary["stages"][stage.name] = entry
            if not cached:
                times = {f"time/{stage.name}_wall_s": wall_s, f"time/{stage.name}_cpu_s": cpu_s}
                log_metrics(client, run_id, times, step=iteration)
            _close_stage(client, run_id, stage, entry)
        summary["headline"] = _log_headline(client, run_id, campaign_id, iteration)
    except BaseException:
        finish_run(client, run_id, ok=False)
        if owns_campaign:
            finish_run(client, campaign_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    if owns_campaign:
        finish_run(client, campaign_id, ok=True)
    return summary
