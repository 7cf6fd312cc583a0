"""The ``r2s2r_iteration`` flow: one R2S2R iteration (DESIGN §1, §6).

Stages: ``collect`` -> ``track`` -> ``attach`` -> ``sysid`` -> ``gaits`` -> ``redeploy``. Iteration
k > 1 collects iteration k - 1's redeploy runs, reuses iteration 1's attachment overlay (unless
``attach.every_iteration``) and identifies from the trajectories of every iteration so far (or
the last ``sysid.data_window``). The flow owns the
iteration's MLflow run (one per iteration, reused on re-invocation) and hands its
id to the stage tasks, which log through the client API. A stage that is not
asked for but whose output a later stage needs is read from disk (its complete
manifest), never recomputed.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from pipeline.config import LoadedConfigs, config_hash, load_all
from pipeline.errors import DataError
from storage.layout import Ref, RunLayout, complete_stage_ref
from storage.tracking import client_for, finish_run, flatten, iteration_run, log_params_once
from tasks.attach import attach
from tasks.collect import collect
from tasks.gaits import gaits
from tasks.redeploy import redeploy, redeploy_run
from tasks.sysid import sysid
from tasks.track import track

STAGES = ("collect", "track", "attach", "sysid", "gaits", "redeploy")


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
) -> dict[str, object]:
    """Run iteration ``iteration`` of the campaign in ``pipeline_config``.

    ``overrides`` are dotted-key config overrides; ``stages`` limits which stages
    run (default: all that exist). Returns a summary with the MLflow run id and,
    per stage, its ref and whether it came from the cache.
    """
    configs = load_all(pipeline_config, overrides)
    wanted = list(STAGES) if stages is None else stages
    unknown = [s for s in wanted if s not in STAGES]
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
    summary: dict[str, object] = {"iteration": iteration, "mlflow_run_id": run_id, "stages": {}}
    try:
        refs: dict[str, dict[str, str]] = {}

        def run(stage: str, submit) -> None:
            if stage in wanted:
                state = submit()
                refs[stage] = state.result()
                summary["stages"][stage] = {"ref": refs[stage], "cached": state.name == "Cached"}

        def ref(stage: str) -> dict[str, str]:
            if stage not in refs:
                refs[stage] = existing_ref(layout, iteration, stage).to_json()
            return refs[stage]

        run("collect", lambda: collect(configs, iteration, run_id, return_state=True))
        run("track", lambda: track(configs, iteration, run_id, ref("collect"), return_state=True))
        if attach_iteration(configs, iteration) == iteration:
            run("attach", lambda: attach(configs, iteration, run_id, ref("track"), ref("collect"), return_state=True))
        else:
            refs["attach"] = existing_ref(layout, attach_iteration(configs, iteration), "attach").to_json()

        def sysid_stage():
            earlier = earlier_data_refs(configs, layout, iteration)
            inputs = (ref("collect"), ref("track"), ref("attach"))
            return sysid(configs, iteration, run_id, *inputs, earlier_refs=earlier, return_state=True)

        run("sysid", sysid_stage)
        run("gaits", lambda: gaits(configs, iteration, run_id, ref("attach"), ref("sysid"), return_state=True))

        def redeploy_stage():
            redeploy_config = configs.pipeline.redeploy
            futures = []
            for index in range(len(redeploy_config.policies) * len(redeploy_config.starts)):
                futures.append(redeploy_run.submit(configs, iteration, ref("attach"), ref("gaits"), index))
                if not redeploy_config.concurrent_runs:
                    futures[-1].result()
            for future in futures:
                future.result()
            return redeploy(configs, iteration, run_id, ref("attach"), ref("sysid"), ref("gaits"), return_state=True)

        run("redeploy", redeploy_stage)
    except BaseException:
        finish_run(client, run_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    return summary
