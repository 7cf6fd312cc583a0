"""The r2s2r command line: help texts and readable errors for user mistakes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from mcap.reader import make_reader

from .conftest import DEFAULT_PIPELINE, REPO, write_test_pipeline


def _r2s2r(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from flows.cli import main; main()", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_collect_iterate_campaign_and_status_run_a_tiny_campaign(tmp_path: Path) -> None:
    """Each command's real path, in the order a user meets them (``rerun``, ``compare``, ``ui``,
    ``deploy`` and ``import-tribar`` have tests of their own): ``collect`` records, ``iterate``
    runs the other stages on that recording, ``campaign -n 1`` finds everything cached, and
    ``status`` says so. Each stage prints its closing line, and with ``--progress`` the long stages
    their progress rows, on stderr (not a terminal here)."""
    from typer.testing import CliRunner

    from flows.cli import app
    from flows.stages import stage_names
    from storage.layout import RunLayout, complete_stage_ref

    config = str(write_test_pipeline(tmp_path, campaign="tiny", n_targets=2))
    layout = RunLayout(tmp_path / "runs", "tiny")

    errors = []

    def run(*args: str) -> str:
        result = CliRunner().invoke(app, [*args, "--config", config], env={"COLUMNS": "250", "R2S2R_PROGRESS": ""})
        assert result.exit_code == 0, result.output
        errors.append(result.stderr)
        return result.stdout

    run("collect")
    recorded = complete_stage_ref(layout.stage_dir(1, "collect"))
    assert recorded is not None and [p.name for p in layout.iteration_dir(1).iterdir()] == ["collect"]
    assert " targets" not in errors[-1]  # stderr is not a terminal: no progress rows unless asked
    out = run("--progress", "iterate", "-k", "1")
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in out.splitlines() if "│" in line}
    assert rows == {"collect": "yes", **dict.fromkeys(stage_names()[1:], "no")}  # stage -> cached
    closing = [line for line in errors[-1].splitlines() if line.split(":")[0] in stage_names()]
    assert [line.split(":")[0] for line in closing] == list(stage_names())
    assert closing[0].startswith("collect: cached; ") and "camera frames" in closing[0]
    assert all(line.split(": ")[1].startswith("done in ") for line in closing[1:])
    assert "held-out key-frame error" in closing[stage_names().index("sysid")]
    for row in ("track ", "sysid (", "learn ", "gait search", "run turning-start0", "evaluate replays"):
        assert row in errors[-1], row
    assert complete_stage_ref(layout.stage_dir(1, "collect")) == recorded
    report = (layout.stage_dir(1, "sysid") / "report.md").read_text()  # on the twin: its truth beside each value
    assert "| twin's truth | inside |" in report and "| friction |" in report
    assert "<table>" in (layout.stage_dir(1, "sysid") / "report.html").read_text()
    run("export-mcap", "redeploy", "-k", "1", "--recording", "turning-start0")  # the runs with the engines' ghosts
    replays = pq.read_table(layout.stage_dir(1, "evaluate") / "replays.parquet").to_pandas()
    replays = replays[replays["run"] == "turning-start0"]
    with (layout.exports_dir / "iter_1" / "redeploy" / "turning-start0.mcap").open("rb") as handle:
        summary = make_reader(handle).get_summary()
    counts = {summary.channels[i].topic: n for i, n in summary.statistics.channel_message_counts.items()}
    ghosts = {t.removeprefix("/robot/replay_"): n for t, n in counts.items() if t.startswith("/robot/replay_")}
    assert ghosts == replays.groupby("engine").size().to_dict()
    assert set(ghosts) == {"before", "after", "learned", "truth"}
    assert "headline/gap_after_m" in run("campaign", "-n", "1")
    out = run("status")
    states = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in out.splitlines() if "│" in line}
    assert states == dict.fromkeys(stage_names(), "cached")


def test_bad_config_is_reported_without_traceback(tmp_path: Path) -> None:
    data = yaml.safe_load(DEFAULT_PIPELINE.read_text())
    data["collect"]["segment_timeout_s"] = "soon"
    data["robot_config"] = str(REPO / "configs" / "robot" / "tribar.yaml")
    data["hardware_config"] = str(REPO / "configs" / "hardware" / "twin.yaml")
    data["runs_dir"] = str(tmp_path / "runs")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = _r2s2r("collect", "--config", str(bad))
    assert result.returncode == 2
    assert "collect.segment_timeout_s" in result.stderr and str(bad) in result.stderr.replace("\n", "")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_status_lists_the_iterations_on_disk(tmp_path: Path) -> None:
    """A campaign with only iteration 2's collect folder (complete manifest, but no stored result
    under its key): stale; the stages after it are missing."""
    from flows.stages import stage_names
    from storage.layout import write_manifest

    config = write_test_pipeline(tmp_path, campaign="statuscli")
    stage = tmp_path / "runs" / "statuscli" / "iter_2" / "collect"
    stage.mkdir(parents=True)
    write_manifest(stage, "collect", complete=True, summary={})
    result = _r2s2r("status", "--config", str(config))
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2:-1] for line in result.stdout.splitlines() if "│" in line}
    assert [cell.strip() for cell in rows["collect"]] == ["stale"]  # one column: iteration 2, the only one
    assert all([cell.strip() for cell in rows[stage]] == ["missing"] for stage in stage_names()[1:])


def test_bad_override_and_unknown_option() -> None:
    def error(*args: str) -> str:
        result = _r2s2r(*args)
        assert result.returncode == 2, result.stderr
        return " ".join(result.stderr.split())  # the console wraps long lines (the config's path)

    message = error("iterate", "--set", "collect.random.sed=3")
    assert "no field 'sed'" in message and "Traceback" not in message
    assert "expected key.path=value" in error("iterate", "--set", "novalue")
    assert "No such option" in error("iterate", "--frobnicate")


def test_ui_serves_mlflow_on_loopback(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = yaml.safe_load(DEFAULT_PIPELINE.read_text())
    data["robot_config"] = str(REPO / "configs" / "robot" / "tribar.yaml")
    data["hardware_config"] = str(REPO / "configs" / "hardware" / "twin.yaml")
    data["runs_dir"] = str(tmp_path / "runs")
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(data))
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.cli import main; main()",
            "ui",
            "--config",
            str(config),
            "--port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    status = response.status
            except OSError:
                time.sleep(0.5)
        assert status == 200
        assert (tmp_path / "runs" / "mlflow.db").exists()
        server.send_signal(signal.SIGTERM)  # to r2s2r alone, as a service manager would
        assert server.wait(timeout=30) == 0
        # the MLflow server and its workers went with it: the port is free again
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def test_compare_of_a_campaign_without_runs_says_so_and_creates_nothing(tmp_path: Path) -> None:
    config = write_test_pipeline(tmp_path, campaign="empty")
    result = _r2s2r("compare", "nosuch", "--config", str(config))
    message = " ".join(result.stderr.split())
    assert result.returncode == 2 and "campaign 'nosuch' has no runs" in message and "Traceback" not in message
    assert not (tmp_path / "runs").exists()


RUN_ITERATION_PROBE = """
import sys
from typer.testing import CliRunner
from flows import cli

def probe(*args, **kwargs):
    from flows.caching import result_storage
    print(result_storage())

cli._run_iteration = probe
result = CliRunner().invoke(cli.app, ["rerun", "gaits", "--set", "runs_dir=" + sys.argv[1]])
print(result.output, end="")
"""


def test_rerun_looks_up_the_campaigns_cache_in_its_runs_folder(tmp_path: Path) -> None:
    """In a shell with no ``PREFECT_HOME``, ``r2s2r rerun`` must reach the iteration with Prefect's
    results stored in the runs folder (where ``campaign`` and ``iterate`` keep them), not in
    Prefect's default home: there it would find no cached stage and recompute them all. The
    iteration itself is replaced by a probe that prints where Prefect stores its results."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-c", RUN_ITERATION_PROBE, str(runs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(runs / ".prefect" / "storage")
