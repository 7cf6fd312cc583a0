"""Server mode, end to end with real processes: a Prefect server, an MLflow tracking server,
``r2s2r deploy``, ``prefect deployment run`` and a process worker that runs the campaign flow.

The deployment runs one iteration of a small campaign limited to its first stages (collect,
track, attach: about half a minute of work), so the test takes about two minutes, most of it
starting the servers and importing the pipeline in each process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, write_test_pipeline

BIN = Path(sys.executable).parent
STAGES = ("collect", "track", "attach")
"""The stages the deployment runs (the cheap ones)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _base_env(prefect_home: Path) -> dict[str, str]:
    """This environment without any server settings, with its own Prefect home."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        MUJOCO_GL="egl",
        PYTHONUNBUFFERED="1",
    )
    return env


def _r2s2r(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from flows.cli import main; main()", *args],
        cwd=REPO,
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Wait until ``url`` answers 200; fail with the log's tail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[:3]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    pytest.fail(f"{url} did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started in its own session, with its children (SIGTERM, then SIGKILL)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@dataclass(frozen=True)
class Servers:
    prefect_api: str
    mlflow_uri: str
    mlflow_artifacts: Path
    client_env: dict[str, str]
    """Environment for Prefect clients (deploy, deployment run, worker): PREFECT_API_URL set."""


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """A Prefect server and an MLflow tracking server (SQLite store, served artifacts) on 127.0.0.1."""
    started: list[subprocess.Popen] = []

    def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with log.open("w") as out:
            proc = subprocess.Popen(
                args, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(proc)
        return proc

    try:
        prefect_port, mlflow_port = _free_port(), _free_port()
        server_env = _base_env(tmp_path / "prefect-server")
        prefect_args = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)]
        prefect_log = tmp_path / "prefect-server.log"
        prefect = start([*prefect_args, "--no-ui"], server_env, prefect_log)
        artifacts = tmp_path / "mlflow-artifacts"
        mlflow_args = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri"]
        mlflow_args += [f"sqlite:///{tmp_path / 'mlflow-server.db'}", "--artifacts-destination", str(artifacts)]
        mlflow_args += ["--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"]
        mlflow_log = tmp_path / "mlflow-server.log"
        mlflow = start(mlflow_args, _base_env(tmp_path / "prefect-unused"), mlflow_log)
        prefect_api = f"http://127.0.0.1:{prefect_port}/api"
        _wait_http(f"{prefect_api}/health", prefect, prefect_log, 240)
        _wait_http(f"http://127.0.0.1:{mlflow_port}/health", mlflow, mlflow_log, 240)
        client_env = {**_base_env(tmp_path / "prefect-client"), "PREFECT_API_URL": prefect_api}
        yield Servers(prefect_api, f"http://127.0.0.1:{mlflow_port}", artifacts, client_env)
    finally:
        for proc in reversed(started):
            _stop(proc)


def _api(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_deployment_runs_the_campaign_on_a_worker_and_logs_to_the_mlflow_server(
    servers: Servers, tmp_path: Path
) -> None:
    config = write_test_pipeline(tmp_path / "campaign", campaign="servermode", n_targets=2)
    pool, name = "r2s2r-test", "servertest"

    # deploy: the MLflow server's URI goes into the deployment's job environment
    deploy_env = {**servers.client_env, "MLFLOW_TRACKING_URI": servers.mlflow_uri}
    args = ["deploy", "--config", str(config), "-n", "1", "--pool", pool, "--name", name, "--stages", ",".join(STAGES)]
    deployed = _r2s2r(*args, "--set", "collect.random.seed=3", env=deploy_env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert f"deployment 'r2s2r_campaign/{name}' id " in deployed.stdout
    assert f"worker start --pool {pool}" in deployed.stdout
    assert f"deployment run 'r2s2r_campaign/{name}'" in deployed.stdout
    assert f"MLflow: {servers.mlflow_uri}" in deployed.stdout
    deployment = _api(f"{servers.prefect_api}/deployments/name/r2s2r_campaign/{name}")
    assert deployment["work_pool_name"] == pool, deployment
    assert deployment["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
    ], deployment
    assert deployment["job_variables"]["env"]["MLFLOW_TRACKING_URI"] == servers.mlflow_uri
    assert deployment["global_concurrency_limit"]["limit"] == 1, deployment  # one run at a time
    assert deployment["parameters"] == {
        "pipeline_config": str(config.resolve()),
        "iterations": 1,
        "overrides": {"collect.random.seed": 3},
        "stages": list(STAGES),
    }
    assert _api(f"{servers.prefect_api}/work_pools/{pool}")["type"] == "process"
    again = _r2s2r(*args, "--set", "collect.random.seed=3", env=deploy_env)  # an update, same id
    assert again.returncode == 0 and deployment["id"] in again.stdout, again.stdout + again.stderr

    # trigger a run, then a worker (its shell has no MLFLOW_TRACKING_URI) runs it and exits
    triggered = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", f"r2s2r_campaign/{name}"],
        cwd=tmp_path,
        env=servers.client_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert triggered.returncode == 0, triggered.stdout + triggered.stderr
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", triggered.stdout).group(1)
    worker_log = tmp_path / "worker.log"
    with worker_log.open("w") as out:
        worker = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", pool, "--run-once"],
            cwd=tmp_path,
            env=servers.client_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        worker.wait(timeout=900)
    finally:
        _stop(worker)
    flow_run = _api(f"{servers.prefect_api}/flow_runs/{flow_run_id}")
    assert flow_run["state"]["type"] == "COMPLETED", worker_log.read_text()[-5000:]
    assert flow_run["deployment_id"] == deployment["id"]

    # the stage outputs on disk
    runs = tmp_path / "campaign" / "runs"
    iteration_dir = runs / "servermode" / "iter_1"
    for stage in STAGES:
        assert json.loads((iteration_dir / stage / "manifest.json").read_text())["complete"], stage
    assert sorted(p.name for p in iteration_dir.iterdir()) == sorted(STAGES)  # nothing else ran
    assert not (runs / "mlflow.db").exists()  # nothing went to the local store

    # the MLflow server holds the iteration run and the campaign run, artifacts served by it
    from mlflow.tracking import MlflowClient

    from storage.tracking import CAMPAIGN_RUN_TAG, ITERATION_TAG, STAGE_TAG, stage_runs

    client = MlflowClient(tracking_uri=servers.mlflow_uri)
    experiment = client.get_experiment_by_name("servermode")
    assert experiment is not None and experiment.artifact_location.startswith("mlflow-artifacts:")
    found = client.search_runs([experiment.experiment_id])
    iteration = next(r for r in found if r.data.tags.get(ITERATION_TAG) == "1")
    assert iteration.info.status == "FINISHED"
    assert iteration.data.params["pipeline.collect.random.seed"] == "3"  # the deployment's override
    subflow = _api(f"{servers.prefect_api}/flow_runs/{iteration.data.tags['prefect.flow_run_id']}")
    assert subflow["state"]["type"] == "COMPLETED"  # the iteration subflow of the deployment's run
    assert _api(f"{servers.prefect_api}/task_runs/{subflow['parent_task_run_id']}")["flow_run_id"] == flow_run_id
    assert iteration.data.metrics["collect/n_frames"] > 0 and "attach/phase_rad_0" in iteration.data.metrics
    (collect_run,) = stage_runs(client, iteration.info.run_id, "collect")
    assert {a.path for a in client.list_artifacts(collect_run.info.run_id)} >= {"top_view.png"}
    assert any(p.name == "top_view.png" for p in servers.mlflow_artifacts.rglob("*"))
    campaign = next(r for r in found if r.data.tags.get(CAMPAIGN_RUN_TAG) == "1")
    assert campaign.info.status == "FINISHED"
    assert sorted(r.data.tags[STAGE_TAG] for r in found if STAGE_TAG in r.data.tags) == ["attach", "collect", "track"]
    assert len(found) == 2 + 3  # the campaign run, the iteration run and its three stages' runs


def test_deploy_rejects_unknown_stages(tmp_path: Path) -> None:
    config = write_test_pipeline(tmp_path, campaign="badstages")
    result = _r2s2r("deploy", "--config", str(config), "--stages", "collect,frobnicate", env=_base_env(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "expected some of collect, track" in result.stderr


@pytest.mark.parametrize("server", ["unset", "down"])
def test_deploy_without_a_prefect_server_says_how_to_start_one(server: str, tmp_path: Path) -> None:
    config = write_test_pipeline(tmp_path, campaign="noserver")
    env = _base_env(tmp_path / "prefect-client")
    if server == "down":
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{_free_port()}/api"
    result = _r2s2r("deploy", "--config", str(config), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "prefect server start --host 127.0.0.1" in result.stderr and "export PREFECT_API_URL=" in result.stderr


def test_mlflow_tracking_uri_replaces_the_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.layout import RunLayout
    from storage.tracking import is_server_uri, tracking_uri

    layout = RunLayout(tmp_path / "runs", "uri")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(layout) == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")
    assert tracking_uri(layout) == "http://127.0.0.1:5001" and is_server_uri(tracking_uri(layout))
    assert not is_server_uri(f"sqlite:///{tmp_path}/x.db")
