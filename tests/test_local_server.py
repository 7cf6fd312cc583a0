"""The Prefect server the commands share (flows.local_server): reused while it answers, kept alive
by a command that runs, gone once idle, started anew after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from flows import local_server
from pipeline.errors import R2S2RError
from tests.conftest import wait_until

REPO = Path(__file__).resolve().parents[1]
IDLE_S = 3.0
"""Short enough for the test, long enough that a flow's requests come well within it."""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not a zombie); asks the server nothing, which would keep it up."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _python(code: str, url: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "PREFECT_API_URL": url, "PREFECT_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env)


def test_commands_share_one_server_until_it_is_idle(tmp_path, monkeypatch) -> None:
    home = tmp_path / ".prefect"
    monkeypatch.setenv(local_server.IDLE_ENV, str(IDLE_S))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    started = []
    try:
        url = local_server.connect(home, timeout_s=120, keep_alive=False)
        record = json.loads((home / local_server.STATE_FILE).read_text())
        started.append(record["pid"])
        assert url == record["url"] and os.environ["PREFECT_API_URL"] == url

        monkeypatch.delenv("PREFECT_API_URL")  # the next command
        assert local_server.connect(home, keep_alive=False) == url
        assert json.loads((home / local_server.STATE_FILE).read_text())["pid"] == record["pid"]

        flow = _python(
            """
            from prefect import flow

            @flow(name="shared-server-check")
            def check() -> int:
                return 7

            assert check() == 7
            """,
            url,
            home,
        )
        assert flow.wait(timeout=120) == 0
        runs = httpx.post(f"{url}/flow_runs/filter", json={}, timeout=10).json()
        assert [run["state_type"] for run in runs] == ["COMPLETED"]  # the flow ran on this server

        # a command that runs longer than the idle time keeps the server up (it asks every IDLE_S / 4)
        command = _python(
            f"""
            import time
            from pathlib import Path
            from flows import local_server
            assert local_server.connect(Path({str(home)!r})) == {url!r}
            time.sleep({3 * IDLE_S})
            """,
            "",
            home,
        )
        time.sleep(2.5 * IDLE_S)
        assert local_server.running_server(home) is not None
        assert command.wait(timeout=60) == 0
        assert wait_until(lambda: not _alive(started[0]), IDLE_S + 15)  # idle: gone
        assert local_server.running_server(home) is None

        monkeypatch.delenv("PREFECT_API_URL")
        again = local_server.connect(home, timeout_s=120, keep_alive=False)
        started.append(json.loads((home / local_server.STATE_FILE).read_text())["pid"])
        assert again is not None and started[1] != started[0] and local_server.running_server(home) is not None
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def test_no_shared_server_where_one_is_given_or_it_is_off(tmp_path, monkeypatch) -> None:
    home = tmp_path / ".prefect"
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.setenv(local_server.IDLE_ENV, "60")
    assert local_server.connect(home) is None  # the user's server
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv(local_server.IDLE_ENV, "0")
    assert local_server.connect(home) is None and "PREFECT_API_URL" not in os.environ  # Prefect's own
    assert not home.exists()
    monkeypatch.setenv(local_server.IDLE_ENV, "soon")
    with pytest.raises(R2S2RError, match="R2S2R_PREFECT_SERVER_IDLE_S='soon'"):
        local_server.connect(home)
