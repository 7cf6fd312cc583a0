"""MLflow tracking helper: SQLite store under the runs folder (or the server in
``MLFLOW_TRACKING_URI``), explicit run ids.

One experiment per campaign, one run per iteration (tag ``r2s2r.iteration``). The
client API is used with explicit run ids throughout, because MLflow's fluent API
keeps its active run per thread and Prefect runs tasks on worker threads.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from importlib.metadata import version

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import RunStatus, RunTag
from mlflow.tracking import MlflowClient

from storage.layout import RunLayout

ITERATION_TAG = "r2s2r.iteration"
CAMPAIGN_TAG = "r2s2r.campaign"
CAMPAIGN_RUN_TAG = "r2s2r.campaign_run"
ENVIRONMENT_TAG = "r2s2r.env"
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
    layout.runs_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{layout.mlflow_db.resolve()}"


def is_server_uri(uri: str) -> bool:
    """Whether ``uri`` is a tracking server (HTTP), which stores artifacts itself (``mlflow-artifacts:``)."""
    return uri.startswith(("http://", "https://"))


def client_for(layout: RunLayout) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(layout))


def experiment_id(client: MlflowClient, layout: RunLayout) -> str:
    """The campaign's experiment, created if new: with an absolute artifact location under the
    runs folder, or, on a tracking server, where the server keeps artifacts."""
    existing = client.get_experiment_by_name(layout.campaign)
    if existing is not None:
        return existing.experiment_id
    if is_server_uri(client.tracking_uri):
        return client.create_experiment(layout.campaign, tags={CAMPAIGN_TAG: layout.campaign})
    artifacts = (layout.mlflow_artifacts / layout.campaign).resolve()
    artifacts.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(
        layout.campaign, artifact_location=artifacts.as_uri(), tags={CAMPAIGN_TAG: layout.campaign}
    )


def iteration_run(client: MlflowClient, layout: RunLayout, iteration: int) -> tuple[str, bool]:
    """Run id of the iteration's MLflow run, creating it if needed.

    Returns ``(run_id, created)``. A second invocation of the same iteration
    reuses the run, so there is exactly one run per iteration.
    """
    exp = experiment_id(client, layout)
    found = client.search_runs([exp], filter_string=f"tags.`{ITERATION_TAG}` = '{iteration}'", max_results=1)
    if found:
        return found[0].info.run_id, False
    run = client.create_run(
        exp, run_name=f"iter_{iteration}", tags={ITERATION_TAG: str(iteration), CAMPAIGN_TAG: layout.campaign}
    )
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


def finish_run(client: MlflowClient, run_id: str, ok: bool) -> None:
    status = RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED)
    client.set_terminated(run_id, status=status)
