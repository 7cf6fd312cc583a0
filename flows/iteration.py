"""The ``r2s2r_iteration`` flow: one R2S2R iteration (DESIGN §1, §6).

So far the iteration has one stage, ``collect``. The flow owns the iteration's
MLflow run (one per iteration, reused on re-invocation) and hands its id to the
stage tasks, which log through the client API.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from pipeline.config import config_hash, load_all
from storage.layout import Ref, RunLayout
from storage.tracking import client_for, finish_run, flatten, iteration_run, log_params_once
from tasks.collect import collect

STAGES = ("collect",)


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
        if "collect" in wanted:
            state = collect(configs, iteration, run_id, return_state=True)
            ref = Ref.from_json(state.result())
            summary["stages"]["collect"] = {"ref": ref.to_json(), "cached": state.name == "Cached"}
    except BaseException:
        finish_run(client, run_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    return summary
