"""The task runners of the config's ``runner`` section: Dask (a real ``dask.distributed`` cluster on
127.0.0.1) gives the default thread runner's results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prefect import flow

from flows.iteration import with_runner
from flows.runners import task_runner
from pipeline.config import RunnerConfig, load_all
from pipeline.errors import ConfigError
from tasks.gaits import search_shard
from tests.conftest import empty_overlays, write_test_pipeline


@flow
def _search(configs, attach_ref: dict[str, str], sysid_ref: dict[str, str]) -> dict[str, object]:
    """Two of the gait-search shards, submitted as the iteration flow submits them; their results
    and the futures' types."""
    futures = [search_shard.submit(configs, attach_ref, sysid_ref, k) for k in (0, 1)]
    return {"results": [f.result() for f in futures], "futures": sorted({type(f).__name__ for f in futures})}


def test_dask_runner_gives_the_thread_runners_search(prefect_server, tmp_path: Path) -> None:
    overrides = {"gaits.search": {"depth": 2, "validate_top": 2, "shards": 6}, "runner.kind": "dask"}
    configs = load_all(write_test_pipeline(tmp_path, campaign="runners"), overrides)
    refs = {name: ref.to_json() for name, ref in empty_overlays(configs, 1).items()}
    threads = _search.with_options(task_runner=task_runner(RunnerConfig()))(configs, refs["attach"], refs["sysid"])
    dask = with_runner(_search, configs)(configs, refs["attach"], refs["sysid"])
    assert threads["futures"] == ["PrefectConcurrentFuture"] and dask["futures"] == ["PrefectDaskFuture"]
    assert len(dask["results"]) == 2 and dask["results"][0] != dask["results"][1]  # two different shards
    for result in (*dask["results"], *threads["results"]):
        result["stats"].pop("wall_s")  # the only field that may differ
    assert dask["results"] == threads["results"]


def test_ray_needs_prefect_ray(monkeypatch) -> None:
    """Ray is an optional extra: without prefect-ray (hidden here, whether it is installed or not)
    the config error says how to install it."""
    monkeypatch.setitem(sys.modules, "prefect_ray", None)  # makes `import prefect_ray` fail
    with pytest.raises(ConfigError, match="pip install prefect-ray"):
        task_runner(RunnerConfig(kind="ray"))
