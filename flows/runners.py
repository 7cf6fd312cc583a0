"""The Prefect task runner named in the pipeline config (``runner``, :class:`RunnerConfig`).

* ``threads``: Prefect's thread pool, in the flow's own process (the default);
* ``dask``: ``prefect-dask`` on a ``dask.distributed`` cluster: the scheduler at ``address``, or a
  ``LocalCluster`` of ``workers`` single-threaded processes on 127.0.0.1 started for the run;
* ``ray``: ``prefect-ray``, at ``address`` or a local Ray started for the run (an optional extra).

Tasks are shipped to Dask or Ray workers with cloudpickle: their arguments are configs and JSON
refs, and the workers read and write the same runs folder, so a cluster must share that file
system (a local cluster does). The local cluster's workers are pointed at the flow's Prefect API
(the server, or the flow process's temporary one), so they report their task runs there instead of
each starting a temporary server of its own.
"""

from __future__ import annotations

from typing import Any

from prefect.settings import get_current_settings
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from pipeline.config import RunnerConfig
from pipeline.errors import ConfigError


def task_runner(config: RunnerConfig) -> TaskRunner:
    """A fresh task runner for one flow run, as ``config`` says."""
    if config.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=config.workers)
    if config.kind == "dask":
        from prefect_dask import DaskTaskRunner

        if config.address:
            return DaskTaskRunner(address=config.address)
        return DaskTaskRunner(cluster_class=local_dask_cluster, cluster_kwargs={"n_workers": config.workers})
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise ConfigError("runner.kind: 'ray' needs the prefect-ray package: pip install prefect-ray") from exc
    if config.address:
        return RayTaskRunner(address=config.address)
    return RayTaskRunner(init_kwargs={"num_cpus": config.workers, "include_dashboard": False})


def prefect_api_url() -> str | None:
    """The Prefect API this process talks to: the configured one, else its temporary server's."""
    url = get_current_settings().api.url
    if url:
        return url
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    return server.api_url if server.running else None


def local_dask_cluster(n_workers: int, **kwargs: Any) -> Any:
    """A ``dask.distributed.LocalCluster`` on 127.0.0.1 of ``n_workers`` single-threaded processes
    that report to this process's Prefect API (called by the task runner when the flow starts)."""
    from distributed import LocalCluster

    url = prefect_api_url()
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        env={"PREFECT_API_URL": url} if url else {},
        **kwargs,
    )
