"""The command server (flows.command_server): commands run in a child of a process that has the
flows' imports done, with the command's own streams, folder, environment and exit status; a
command from another project or after a source change is refused; an idle server goes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flows import command_server, local_server
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[1]
IDLE_S = 60.0
"""Long enough that the server does not go idle while the test's commands start."""
CLIENT = """
import sys
from pathlib import Path
from flows.command_server import delegate
status = delegate(Path(sys.argv[1]), sys.argv[2:])
sys.exit(99 if status is None else status)
"""
"""A command handed to the server; 99: it was not."""


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A Prefect home with a command server started in it (stopped after the test)."""
    monkeypatch.setenv(local_server.IDLE_ENV, str(IDLE_S))
    monkeypatch.delenv(command_server.SERVER_ENV, raising=False)
    prefect_home = tmp_path / ".prefect"
    command_server.start(prefect_home)
    assert command_server.wait_running(prefect_home, 120)
    yield prefect_home
    command_server.stop(prefect_home)


def _client(home: Path, *argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", CLIENT, str(home), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _request(home: Path, overrides: dict) -> dict:
    """Send a request by hand (this process's streams) and read the first reply."""
    request = {"argv": ["--help"], "cwd": str(REPO), "env": {}, "executable": sys.executable, "root": str(REPO)}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(command_server.socket_address(home))
        socket.send_fds(sock, [b"F"], [0, 1, 2])
        sock.sendall(json.dumps({**request, **overrides}).encode() + b"\n")
        return json.loads(sock.makefile("rb").readline())


def test_a_command_runs_in_the_server_with_its_own_streams_and_exit_status(home, tmp_path) -> None:
    in_process = subprocess.run(
        [str(REPO / ".venv" / "bin" / "r2s2r"), "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    served = _client(home, "--help")
    assert served.returncode == 0, served.stderr
    assert "Usage" in served.stdout and served.stdout == in_process.stdout

    # a user error: exit status 2 and the one-line message on the command's stderr; the config path is
    # taken from the command's working folder, not the server's
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "bad.yaml").write_text("campaign: [not, a, name]\n")
    failed = _client(home, "campaign", "--config", "bad.yaml", cwd=elsewhere)
    assert failed.returncode == 2, failed.stderr
    assert str(elsewhere / "bad.yaml") in failed.stderr.replace("\n", "") and "Traceback" not in failed.stderr

    def logged() -> bool:
        log = (home / command_server.LOG_FILE).read_text()
        return "r2s2r --help -> 0" in log and "r2s2r campaign --config bad.yaml -> 2" in log

    assert wait_until(logged, 10)

    assert command_server.stop(home)
    assert wait_until(lambda: "stopped" in (home / command_server.LOG_FILE).read_text(), 30)
    assert not command_server.running(home) and not command_server.stop(home)


def test_the_command_sees_its_own_environment(home) -> None:
    widths = {}
    for columns in (50, 150):
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": str(columns)}
        result = subprocess.run(
            [sys.executable, "-c", CLIENT, str(home), "--help"], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        widths[columns] = max(len(line) for line in result.stdout.splitlines())
    assert widths[50] <= 50 < widths[150]  # the help is laid out for the command's terminal width


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_twin(home: Path) -> tuple[subprocess.Popen, int]:
    """A client running ``serve-twin`` (until Ctrl-C) in the server, once the twin answers on its port."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = ["serve-twin", "--port", str(port)]
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(home), *argv], cwd=REPO, env=env)

    def answers() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    assert wait_until(answers, 120)
    return client, port


def test_ctrl_c_reaches_the_command_and_a_killed_command_takes_its_child_with_it(home) -> None:
    client, port = _serve_twin(home)
    client.send_signal(signal.SIGINT)
    assert client.wait(timeout=30) == 0  # serve-twin stops on Ctrl-C, with its own exit status

    client, port = _serve_twin(home)
    client.kill()  # no chance to pass anything on
    client.wait(timeout=10)
    line = f"r2s2r serve-twin --port {port} -> 0"  # stopped by SIGTERM, which serve-twin takes as Ctrl-C
    assert wait_until(lambda: line in (home / command_server.LOG_FILE).read_text(), 30)


def test_a_command_from_elsewhere_or_after_a_source_change_is_refused_and_the_server_stops(home) -> None:
    assert _request(home, {"root": "/elsewhere"}) == {"refused": "stale"}
    assert wait_until(lambda: not command_server.running(home), 30)
    assert _client(home, "--help").returncode == 99  # nobody serves: the command runs in its own process


def test_the_source_signature_follows_every_project_file(tmp_path) -> None:
    for package in command_server.SOURCE_PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "m.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not a source\n")
    before = command_server.source_signature(tmp_path)
    assert len(before) == len(command_server.SOURCE_PACKAGES)
    (tmp_path / "notes.txt").write_text("changed\n")
    assert command_server.source_signature(tmp_path) == before
    (tmp_path / "tasks" / "sub" / "m.py").write_text("x = 22\n")
    assert command_server.source_signature(tmp_path) != before


def test_an_idle_server_goes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(local_server.IDLE_ENV, "2")
    monkeypatch.delenv(command_server.SERVER_ENV, raising=False)
    home = tmp_path / ".prefect"
    command_server.start(home)
    assert command_server.wait_running(home, 120)
    assert wait_until(lambda: "stopped" in (home / command_server.LOG_FILE).read_text(), 30)
    assert not command_server.running(home)


@pytest.mark.parametrize(("name", "value"), [(local_server.IDLE_ENV, "0"), (command_server.SERVER_ENV, "0")])
def test_no_server_where_it_is_off(tmp_path, monkeypatch, name, value) -> None:
    monkeypatch.setenv(local_server.IDLE_ENV, str(IDLE_S))
    monkeypatch.setenv(name, value)
    home = tmp_path / ".prefect"
    command_server.start(home)
    assert command_server.delegate(home, ["--help"]) is None
    assert not home.exists()


def test_the_cli_runs_a_flow_command_itself_then_hands_the_next_to_the_server_it_started(tmp_path) -> None:
    home = tmp_path / ".prefect"
    env = {
        **os.environ,
        local_server.IDLE_ENV: str(IDLE_S),
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": "http://127.0.0.1:9/api",  # a server of one's own: no local one is started
    }
    env.pop(command_server.SERVER_ENV, None)
    command = [str(REPO / ".venv" / "bin" / "r2s2r"), "rerun", "nosuch", "--set", f"runs_dir={tmp_path / 'runs'}"]
    try:
        first = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert first.returncode == 2 and "unknown stage" in first.stderr
        assert command_server.wait_running(home, 120)  # started as the first command exited
        second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert (second.returncode, second.stderr) == (first.returncode, first.stderr)
        assert wait_until(lambda: "r2s2r rerun nosuch" in (home / command_server.LOG_FILE).read_text(), 10)
    finally:
        command_server.stop(home)


def test_every_runs_folder_has_its_own_socket_whatever_the_length_of_its_path(tmp_path) -> None:
    deep = tmp_path / ("deep" * 50) / ".prefect"
    addresses = {command_server.socket_address(home) for home in (deep, tmp_path / ".prefect")}
    assert len(addresses) == 2 and all(len(a.encode()) < 108 for a in addresses)  # Linux's limit: 108 bytes
