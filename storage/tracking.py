"""MLflow tracking: SQLite store under the runs folder (or the server in ``MLFLOW_TRACKING_URI``),
explicit run ids.

One experiment per campaign (tagged a model-training experiment), holding a tree of runs::

    campaign_<name>          headline/* at step = iteration: the campaign's learning curve
      iter_<k>               params: the configs; metrics: headline/* and <stage>/* per stage
        <stage>              params: the stage's config section; metrics <stage>/*; artifacts;
                             sysid also logs the identified robot as an MLflow model

Metric names are grouped by ``/``, so the UI's chart view makes one section per prefix,
``headline`` first (:data:`HEADLINE`). A stage task logs through :class:`StageContext`. The
client API is used with explicit run ids throughout, because MLflow's fluent API keeps its
active run per thread and Prefect runs tasks on worker threads.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import LoggedModelOutput, Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient

from pipeline.config import LoadedConfigs, config_hash
from storage.layout import RunLayout

ITERATION_TAG = "r2s2r.iteration"
CAMPAIGN_TAG = "r2s2r.campaign"
CAMPAIGN_RUN_TAG = "r2s2r.campaign_run"
STAGE_TAG = "r2s2r.stage"
ROBOT_HASH_TAG = "r2s2r.robot_config_hash"
ENVIRONMENT_TAG = "r2s2r.env"
PARENT_TAG = "mlflow.parentRunId"
"""MLflow's own tag: the run's parent in the UI's run tree."""
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""MLflow's own experiment tag: ``custom_model_development`` marks a model-training experiment."""
EXPERIMENT_KIND = "custom_model_development"
HEADLINE_PREFIX = "headline/"
HEADLINE = {
    "evaluate/gap.before.com_error_m": "gap_before_m",
    "evaluate/gap.after.com_error_m": "gap_after_m",
    "evaluate/gap.before.heading_error_deg": "heading_gap_before_deg",
    "evaluate/gap.after.heading_error_deg": "heading_gap_after_deg",
    "evaluate/gap.learned.com_error_m": "gap_learned_m",
    "evaluate/gap.learned.heading_error_deg": "heading_gap_learned_deg",
    "evaluate/gap.truth.com_error_m": "gap_truth_m",
    "evaluate/gap.truth.heading_error_deg": "heading_gap_truth_deg",
    "evaluate/gap.before.com_error_median_m": "gap_median_before_m",
    "evaluate/gap.after.com_error_median_m": "gap_median_after_m",
    "evaluate/gap.learned.com_error_median_m": "gap_median_learned_m",
    "evaluate/gap.truth.com_error_median_m": "gap_median_truth_m",
    "sysid/holdout.before.key_frame_error_mm": "heldout_before_mm",
    "sysid/holdout.after.key_frame_error_mm": "heldout_after_mm",
    "sysid/holdout.truth.key_frame_error_mm": "heldout_truth_mm",
    "learn/holdout.learned.key_frame_error_mm": "heldout_learned_mm",
    "gaits/policy.straight.forward_m": "straight_forward_sim_m",
    "gaits/policy.turning.rotation_deg": "turning_rotation_sim_deg",
    "redeploy/repeatability.straight.forward_m_mean": "straight_forward_real_m",
    "redeploy/repeatability.turning.rotation_deg_mean": "turning_rotation_real_deg",
}
"""The figures that say whether an iteration worked, by their stage metric: the sim-to-real gap
of the redeploy runs before and after identification, in the learned engine and (on the twin)
with the twin's own values (final centre of mass, m, mean and median over the runs; heading, deg),
the held-out key-frame error before, after and (on the twin) with the twin's own values (mm),
the chosen policies' motion in the engine and on the robot; besides these, every identified
value and, on the twin, its error against the truth (:data:`HEADLINE_PREFIXES`)."""
HEADLINE_PREFIXES = {"sysid/value.": "identified.", "sysid/truth_error_pct.": "identified_error_pct."}
VIEW_KEY = "r2s2r"
"""The campaign view's share key: the MLflow UI opens it with ``?viewStateShareKey=r2s2r``."""
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
"""The experiment tag holding the campaign view (the MLflow UI's shared view state, JSON)."""
RESULT_PACKAGES = ("torch", "mujoco", "numpy", "scipy", "cma", "opencv-python-headless", "open3d")
"""The installed packages whose numerics the identified values and gaits depend on."""


TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
"""MLflow's own variable: when set, it replaces the local store (e.g. an ``mlflow server``)."""


def tracking_uri(layout: RunLayout) -> str:
    """``$MLFLOW_TRACKING_URI`` when set (e.g. ``http://127.0.0.1:5001`` for an ``mlflow server``
    shared by concurrent flow runs), else the ``sqlite:///`` URI of the campaign's MLflow
    database under the runs folder (absolute path)."""
    override = os.environ.get(TRACKING_URI_ENV, "").strip()
    if override:
        return override
    return f"sqlite:///{layout.mlflow_db.resolve()}"


def is_server_uri(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (HTTP), which stores artifacts itself (``mlflow-artifacts:``)."""
    return uri.startswith(("http://", "https://"))


def client_for(layout: RunLayout) -> MlflowClient:
    """A client of the campaign's tracking store (the local database is created, with its folder, if new)."""
    layout.runs_dir.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=tracking_uri(layout))


def experiment_id(client: MlflowClient, layout: RunLayout) -> str:
    """The campaign's experiment, created if new (a model-training experiment): with an absolute
    artifact location under the runs folder, or, on a tracking server, where the server keeps
    artifacts."""
    tags = {CAMPAIGN_TAG: layout.campaign, EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
    existing = client.get_experiment_by_name(layout.campaign)
    if existing is not None:
        if existing.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
            client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return existing.experiment_id
    if is_server_uri(client.tracking_uri):
        return client.create_experiment(layout.campaign, tags=tags)
    artifacts = (layout.mlflow_artifacts / layout.campaign).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(layout.campaign, artifact_location=artifacts.as_uri(), tags=tags)


def iteration_run(client: MlflowClient, layout: RunLayout, iteration: int) -> tuple[str, bool]:
    """Run id of the iteration's MLflow run (a child of the campaign run), creating it if needed.

    Returns ``(run_id, created)``. A second invocation of the same iteration
    reuses the run, so there is exactly one run per iteration.
    """
    exp = experiment_id(client, layout)
    found = client.search_runs([exp], filter_string=f"tags.`{ITERATION_TAG}` = '{iteration}'", max_results=1)
    if found:
        return found[0].info.run_id, False
    tags = {ITERATION_TAG: str(iteration), CAMPAIGN_TAG: layout.campaign, PARENT_TAG: campaign_run(client, layout)}
    run = client.create_run(exp, run_name=f"iter_{iteration}", tags=tags)
    return run.info.run_id, True


def campaign_run(client: MlflowClient, layout: RunLayout) -> str:
    """Run id of the campaign-level MLflow run (headline metrics at step = iteration), created
    if needed: one per campaign."""
    exp = experiment_id(client, layout)
    found = client.search_runs([exp], filter_string=f"tags.`{CAMPAIGN_RUN_TAG}` = '1'", max_results=1)
    if found:
        return found[0].info.run_id
    tags = {CAMPAIGN_RUN_TAG: "1", CAMPAIGN_TAG: layout.campaign}
    return client.create_run(exp, run_name=f"campaign_{layout.campaign}", tags=tags).info.run_id


def stage_runs(client: MlflowClient, iteration_run_id: str, stage: str) -> list:
    """The stage's child runs of an iteration run (one per execution of the stage), newest first."""
    run = client.get_run(iteration_run_id)
    query = f"tags.`{PARENT_TAG}` = '{iteration_run_id}' and tags.`{STAGE_TAG}` = '{stage}'"
    return client.search_runs([run.info.experiment_id], filter_string=query, order_by=["attributes.start_time DESC"])


def headline_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The headline figures (:data:`HEADLINE`, :data:`HEADLINE_PREFIXES`) among an iteration run's
    stage ``metrics``, named ``headline/<name>``, in that order."""
    out = {HEADLINE_PREFIX + name: metrics[key] for key, name in HEADLINE.items() if key in metrics}
    for prefix, name in HEADLINE_PREFIXES.items():
        found = {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
        out.update({f"{HEADLINE_PREFIX}{name}{key}": value for key, value in found.items()})
    return out


def flatten(prefix: str, value: object) -> dict[str, str]:
    """Flatten nested dicts/lists into ``a.b.0``-style keys with string values."""
    out: dict[str, str] = {}
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), item))
    elif isinstance(value, list | tuple) and any(isinstance(v, Mapping | list | tuple) for v in value):
        for i, item in enumerate(value):
            out.update(flatten(f"{prefix}.{i}", item))
    else:
        out[prefix] = str(value)
    return out


def log_params_once(client: MlflowClient, run_id: str, params: Mapping[str, str]) -> None:
    """Log params not yet on the run (MLflow params are immutable once set)."""
    existing = client.get_run(run_id).data.params
    new = {k: v for k, v in params.items() if k not in existing}
    for key, value in new.items():
        client.log_param(run_id, key, value[:6000])


def environment_tags() -> dict[str, str]:
    """Tags ``r2s2r.env.<name>``: the version of each of :data:`RESULT_PACKAGES`, Python's, the
    machine architecture and the CPU's vector instruction set that torch uses (e.g. ``AVX512``).

    Rollouts through contact are chaotic, so the last bits of floating-point arithmetic can move
    identified values and the gait picked: two runs of the same config and data on different
    installs or CPUs may differ, and these tags tell such runs apart in the MLflow UI.
    """
    import torch  # here, not at module import: the CLI's MLflow commands need no torch

    tags = {f"{ENVIRONMENT_TAG}.{name}": version(name) for name in RESULT_PACKAGES}
    tags[f"{ENVIRONMENT_TAG}.python"] = platform.python_version()
    tags[f"{ENVIRONMENT_TAG}.machine"] = platform.machine()
    tags[f"{ENVIRONMENT_TAG}.cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return tags


def set_tags(client: MlflowClient, run_id: str, tags: Mapping[str, str]) -> None:
    """Set ``tags`` on the run in one batch write."""
    client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])


def headline_order(name: str) -> tuple[int, str]:
    """Sort key of a ``headline/`` metric: :data:`HEADLINE`'s order, then the identified values and
    their errors (:data:`HEADLINE_PREFIXES`), each by name."""
    short = name.removeprefix(HEADLINE_PREFIX)
    fixed = list(HEADLINE.values())
    if short in fixed:
        return fixed.index(short), ""
    groups = list(HEADLINE_PREFIXES.values())
    group = next((i for i, prefix in enumerate(groups) if short.startswith(prefix)), len(groups))
    return len(fixed) + group, short


def write_campaign_view(client: MlflowClient, experiment: str, headline: list[str], stages: list[str]) -> None:
    """Store the campaign's view of its runs in the experiment (:data:`VIEW_TAG`): the iteration
    runs, one row each in order, with a column per ``headline`` metric, and the chart view's
    sections ``headline`` first, then one per stage in ``stages`` order."""
    sections = [HEADLINE_PREFIX.rstrip("/"), *stages]
    view = {
        "searchFilter": f"tags.`{ITERATION_TAG}` LIKE '%'",
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "selectedColumns": [f"metrics.`{name}`" for name in headline],
        "compareRunCharts": [],
        "compareRunSections": [
            {"uuid": f"r2s2r-{name}", "name": name, "display": True, "isReordered": False, "deleted": False}
            for name in sections
        ],
        "isAccordionReordered": True,
    }
    client.set_experiment_tag(experiment, VIEW_TAG, json.dumps(view))


def campaign_view_url(base_url: str, experiment: str) -> str:
    """The MLflow UI's page of the campaign view (:func:`write_campaign_view`) under ``base_url``,
    in the UI's model-training mode."""
    return f"{base_url}/#/experiments/{experiment}/runs?workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"


def finish_run(client: MlflowClient, run_id: str, ok: bool) -> None:
    """Mark the run finished (``ok``) or failed, and any of its child runs still running failed."""
    status = RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED)
    run = client.get_run(run_id)
    query = f"tags.`{PARENT_TAG}` = '{run_id}' and attributes.status = 'RUNNING'"
    for child in client.search_runs([run.info.experiment_id], filter_string=query):
        client.set_terminated(child.info.run_id, status=RunStatus.to_string(RunStatus.FAILED))
    client.set_terminated(run_id, status=status)


def is_metric(value: object) -> bool:
    """Whether ``value`` is logged as a metric: a finite int or float (a bool is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def log_metric_points(client: MlflowClient, run_id: str, points: Iterable[tuple[str, float, int]]) -> None:
    """Log ``(key, value, step)`` points on the run in batches (MLflow takes at most 1000 a call)."""
    stamp = int(time.time() * 1000)
    batch = [Metric(key, float(value), stamp, step) for key, value, step in points]
    for start in range(0, len(batch), 1000):
        client.log_batch(run_id, metrics=batch[start : start + 1000])


def log_metrics(client: MlflowClient, run_id: str, metrics: Mapping[str, float], step: int) -> None:
    """Log ``metrics`` at ``step`` on the run."""
    log_metric_points(client, run_id, ((key, value, step) for key, value in metrics.items()))


@dataclass(frozen=True)
class StageContext:
    """What a stage task works in: the configs, the iteration, the stage's name and the iteration's
    MLflow run. Used as a context manager around the task's logging: the first :meth:`log`
    creates the stage's child run of the iteration run (params: the stage's config section and
    the robot config's hash), which ends finished, or failed if the block raises."""

    configs: LoadedConfigs
    iteration: int
    stage: str
    iteration_run_id: str

    @cached_property
    def layout(self) -> RunLayout:
        return RunLayout.of(self.configs)

    @cached_property
    def client(self) -> MlflowClient:
        return client_for(self.layout)

    @cached_property
    def run_id(self) -> str:
        """The stage's child run of the iteration run, created on first use."""
        experiment = self.client.get_run(self.iteration_run_id).info.experiment_id
        tags = {
            PARENT_TAG: self.iteration_run_id,
            STAGE_TAG: self.stage,
            CAMPAIGN_TAG: self.layout.campaign,
        }
        run_id = self.client.create_run(experiment, run_name=self.stage, tags=tags).info.run_id
        section = getattr(self.configs.pipeline, self.stage, None)
        params = flatten(self.stage, section.model_dump(mode="json")) if section is not None else {}
        params["robot.config_hash"] = config_hash(self.configs.robot)
        self.client.log_batch(run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
        return run_id

    def __enter__(self) -> StageContext:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if "run_id" in self.__dict__:  # a stage run has no child runs to close
            status = RunStatus.FINISHED if kind is None else RunStatus.FAILED
            self.client.set_terminated(self.run_id, status=RunStatus.to_string(status))

    def metric_name(self, key: str) -> str:
        return f"{self.stage}/{key}"

    def log(
        self,
        summary: Mapping[str, object],
        artifacts: Iterable[Path] = (),
        folder: str = "",
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        """Log the stage's figures: every metric value of ``summary`` (:func:`is_metric`) as
        ``<stage>/<key>`` at step = iteration on the stage run and on the iteration run (whose
        charts compare iterations), ``tags`` and ``params`` (those not yet there: MLflow params
        are immutable) as ``<stage>.<key>`` on both, and each of ``artifacts`` under ``folder``
        of the stage run."""
        metrics = {self.metric_name(k): float(v) for k, v in summary.items() if is_metric(v)}
        for run in (self.run_id, self.iteration_run_id):
            log_metrics(self.client, run, metrics, self.iteration)
            if tags:
                set_tags(self.client, run, {f"{self.stage}.{k}": v for k, v in tags.items()})
            if params:
                log_params_once(self.client, run, {f"{self.stage}.{k}": v for k, v in params.items()})
        for path in artifacts:
            self.client.log_artifact(self.run_id, str(path), artifact_path=folder or None)

    def log_series(self, name: str, values: Iterable[tuple[int, float]]) -> None:
        """Log metric ``<stage>/<name>`` on the stage run as a series of ``(step, value)`` pairs
        (e.g. a loss curve over optimiser steps)."""
        key = self.metric_name(name)
        log_metric_points(self.client, self.run_id, ((key, value, step) for step, value in values))

    def log_model(self, name: str, files: Iterable[Path], params: Mapping[str, str]) -> str:
        """Log ``files`` as MLflow model ``name`` (the UI's Models tab) made by the stage run, with
        ``params`` and the robot config's hash as a tag (:data:`ROBOT_HASH_TAG`); returns its
        model id. ``mlflow.artifacts.download_artifacts("models:/<model id>")`` fetches the files."""
        experiment = self.client.get_run(self.run_id).info.experiment_id
        tags = {ROBOT_HASH_TAG: config_hash(self.configs.robot), ITERATION_TAG: str(self.iteration)}
        model = self.client.create_logged_model(
            experiment, name=name, source_run_id=self.run_id, tags=tags, params=dict(params)
        )
        with tempfile.TemporaryDirectory() as folder:
            for path in files:
                shutil.copy2(path, Path(folder) / path.name)
            self.client.log_model_artifacts(model.model_id, folder)
        self.client.finalize_logged_model(model.model_id, "READY")
        self.client.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, step=self.iteration)])
        return model.model_id
