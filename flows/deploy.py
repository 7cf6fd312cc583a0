"""Server mode: a Prefect deployment of the ``r2s2r_campaign`` flow on a process work pool.

The deployment points at this project's source folder (no Docker image): a worker
started with ``prefect worker start --pool <pool>`` on this machine runs each flow run
as a subprocess in that folder, with the worker's Python environment. The deployment's
parameters are the absolute path of the pipeline config, the number of iterations, the
``--set`` overrides and, if given, the stages each iteration runs. When
``MLFLOW_TRACKING_URI`` is set at deploy time it is written into the deployment's job
environment, so its runs log to that MLflow server whatever the worker's shell has.
Runs of one deployment go one at a time (they share the campaign's stage folders and
its hardware); a run triggered while another is going waits for it.

Needs a running Prefect server (``PREFECT_API_URL``): without one Prefect would fall
back to a throw-away ephemeral server that no worker can see, so that is refused.
Import Prefect only after :func:`flows.environment.configure_environment`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError, R2S2RError
from storage.tracking import TRACKING_URI_ENV

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The source folder the deployment runs from."""
ENTRYPOINT = "flows/campaign.py:r2s2r_campaign"
"""The flow, relative to :data:`PROJECT_ROOT`."""
FLOW_NAME = "r2s2r_campaign"
DEFAULT_POOL = "r2s2r"
POOL_TYPE = "process"
SERVER_HINT = (
    "start one with `prefect server start --host 127.0.0.1 --port 4200` and "
    "`export PREFECT_API_URL=http://127.0.0.1:4200/api`"
)


class ServerError(R2S2RError):
    """No Prefect server to deploy to, or a work pool that cannot take the deployment."""


@dataclass(frozen=True)
class DeploymentInfo:
    """What :func:`deploy_campaign` created or updated."""

    deployment_id: str
    flow_name: str
    name: str
    pool: str
    pool_created: bool
    api_url: str
    parameters: dict[str, object]
    mlflow_tracking_uri: str | None

    @property
    def full_name(self) -> str:
        """``flow/deployment``, as ``prefect deployment run`` takes it."""
        return f"{self.flow_name}/{self.name}"

    @property
    def ui_url(self) -> str:
        """The Prefect UI for this server (the API URL without its ``/api``)."""
        return self.api_url.removesuffix("/").removesuffix("/api")


def require_server() -> str:
    """The URL of the Prefect API, checked to answer; :class:`ServerError` if unset or down."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    if not api_url:
        raise ServerError(f"PREFECT_API_URL is not set, so there is no Prefect server to deploy to: {SERVER_HINT}")
    with get_client(sync_client=True) as client:
        failure = client.api_healthcheck()
    if failure is not None:
        raise ServerError(f"no Prefect server answers at PREFECT_API_URL={api_url} ({failure}): {SERVER_HINT}")
    return str(api_url)


def ensure_process_pool(name: str) -> bool:
    """Create the work pool ``name`` of type ``process`` (default job template) unless it exists.

    Returns whether it was created. An existing pool of another type raises :class:`ServerError`.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type=POOL_TYPE, base_job_template=template))
            except ObjectAlreadyExists:  # created meanwhile by someone else
                return False
            return True
    if pool.type != POOL_TYPE:
        raise ServerError(f"work pool '{name}' is of type '{pool.type}', not '{POOL_TYPE}': choose another --pool")
    return False


def deploy_campaign(
    pipeline_config: Path,
    iterations: int,
    overrides: dict[str, object],
    name: str,
    pool: str = DEFAULT_POOL,
    stages: list[str] | None = None,
) -> DeploymentInfo:
    """Create or update the deployment ``r2s2r_campaign/<name>`` on the process work pool ``pool``
    (created if missing), with the config's absolute path, ``iterations``, ``overrides`` and
    ``stages`` (None: every stage) as its parameters. The config should already be validated
    (:func:`pipeline.config.load_all`)."""
    if stages is not None:
        from flows.stages import stage_names

        unknown = [s for s in stages if s not in stage_names()]
        if unknown or not stages:
            raise ConfigError(f"--stages {','.join(stages)!r}: expected some of {', '.join(stage_names())}")
    api_url = require_server()
    pool_created = ensure_process_pool(pool)
    from prefect import flow

    parameters: dict[str, object] = {
        "pipeline_config": str(Path(pipeline_config).resolve()),
        "iterations": iterations,
        "overrides": overrides,
    }
    if stages is not None:
        parameters["stages"] = stages
    env = {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"), "MLFLOW_DISABLE_TELEMETRY": "true"}
    mlflow_uri = os.environ.get(TRACKING_URI_ENV, "").strip() or None
    if mlflow_uri is not None:
        env[TRACKING_URI_ENV] = mlflow_uri
    campaign_flow = flow.from_source(source=str(PROJECT_ROOT), entrypoint=ENTRYPOINT)
    deployment_id = campaign_flow.deploy(
        name=name,
        work_pool_name=pool,
        parameters=parameters,
        job_variables={"env": env},
        description="R2S2R campaign: iterations 1..N of the pipeline config (cached stages reused).",
        tags=["r2s2r"],
        concurrency_limit=1,
        print_next_steps=False,
        ignore_warnings=True,
    )
    return DeploymentInfo(
        deployment_id=str(deployment_id),
        flow_name=FLOW_NAME,
        name=name,
        pool=pool,
        pool_created=pool_created,
        api_url=api_url,
        parameters=parameters,
        mlflow_tracking_uri=mlflow_uri,
    )
