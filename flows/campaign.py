"""The ``r2s2r_campaign`` flow: n R2S2R iterations in a row, and the campaign's MLflow run.

Each iteration is an ``r2s2r_iteration`` subflow (iteration k > 1 starts from iteration
k - 1's redeploy runs), whose MLflow run is a child of the campaign run; each copies its
headline figures (:data:`storage.tracking.HEADLINE`) to the campaign run at step = k, so the
MLflow UI charts the trend across iterations.
"""

from __future__ import annotations

from prefect import flow

from flows.iteration import r2s2r_iteration, with_runner
from pipeline.config import load_all
from storage.layout import RunLayout
from storage.tracking import campaign_run, client_for, finish_run


@flow(name="r2s2r_campaign")
def r2s2r_campaign(
    pipeline_config: str,
    iterations: int,
    overrides: dict[str, object] | None = None,
    stages: list[str] | None = None,
) -> dict:
    """Run iterations 1 .. ``iterations`` of the campaign in ``pipeline_config`` (cached stages are
    reused; ``stages`` limits each iteration to those, e.g. for a smoke run of a deployment), each
    with the config's task runner. Returns the campaign run id and each iteration's summary and
    headline metrics."""
    configs = load_all(pipeline_config, overrides)
    layout = RunLayout.of(configs)
    client = client_for(layout)
    run_id = campaign_run(client, layout)
    summaries = []
    try:
        for k in range(1, iterations + 1):
            summaries.append(with_runner(r2s2r_iteration, configs)(pipeline_config, k, overrides, stages))
    except BaseException:
        finish_run(client, run_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    return {"campaign_run_id": run_id, "iterations": summaries}
