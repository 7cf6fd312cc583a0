"""The ``r2s2r_campaign`` flow: n R2S2R iterations in a row, and the campaign's MLflow run.

Each iteration is an ``r2s2r_iteration`` subflow (iteration k > 1 starts from iteration
k - 1's redeploy runs). After each, its headline metrics (:data:`HEADLINE`, and every
sysid error against the twin's truth) are copied to the campaign-level MLflow run at
step = k, so the MLflow UI charts the trend across iterations.
"""

from __future__ import annotations

from prefect import flow

from flows.iteration import r2s2r_iteration, with_runner
from pipeline.config import load_all
from storage.layout import RunLayout
from storage.tracking import campaign_run, client_for, finish_run

HEADLINE = (
    "evaluate.gap.before.com_error_m",
    "evaluate.gap.after.com_error_m",
    "evaluate.gap.before.heading_error_deg",
    "evaluate.gap.after.heading_error_deg",
    "sysid.holdout.before.key_frame_error_mm",
    "sysid.holdout.after.key_frame_error_mm",
    "sysid.holdout.before.key_frame_error_median_mm",
    "sysid.holdout.after.key_frame_error_median_mm",
    "sysid.holdout.truth.key_frame_error_mm",
    "sysid.holdout.truth.key_frame_error_median_mm",
    "sysid.final_loss",
    "sysid.recordings",
    "track.error_cap_error_mean_mm",
    "gaits.search_wall_s",
    "gaits.forward.forward_m",
    "gaits.ccw.rotation_deg",
)
"""Metrics of an iteration's run that the campaign run charts by iteration."""


def headline_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The subset of an iteration's ``metrics`` the campaign run keeps."""
    return {k: v for k, v in metrics.items() if k in HEADLINE or k.startswith("sysid.truth_error_pct.")}


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
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    run_id = campaign_run(client, RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    summaries = []
    try:
        for k in range(1, iterations + 1):
            summary = with_runner(r2s2r_iteration, configs)(pipeline_config, k, overrides, stages)
            metrics = headline_metrics(client.get_run(summary["mlflow_run_id"]).data.metrics)
            for key, value in metrics.items():
                client.log_metric(run_id, key, value, step=k)
            summaries.append({**summary, "headline": metrics})
    except BaseException:
        finish_run(client, run_id, ok=False)
        raise
    finish_run(client, run_id, ok=True)
    return {"campaign_run_id": run_id, "iterations": summaries}
