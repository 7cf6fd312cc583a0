"""A local Prefect API server that the ``r2s2r`` commands share, kept running between them.

Prefect runs every flow against an API server. With none configured (``PREFECT_API_URL``),
Prefect starts a temporary one inside each process, which costs 5-13 s on two cores before the
first stage runs. Instead, the first command that runs a flow starts one server for its Prefect
home (the runs folder's, :mod:`flows.environment`) as a process of its own, and the commands
after it reuse that server. It stops by itself once no request has come for ``idle_s`` seconds.
Each command that uses it asks it for its health every ``idle_s / 4`` while the command runs,
so a stage that computes for an hour does not outlive it.

``R2S2R_PREFECT_SERVER_IDLE_S`` sets ``idle_s`` (default 900); ``0`` leaves each process to
Prefect's temporary server. A ``PREFECT_API_URL`` already set (a Prefect server of your own,
docs/orchestration.md) is used as it is. The server's address and process id are in
``<PREFECT_HOME>/r2s2r-server.json``, its log in ``r2s2r-server.log`` beside it.

Run as ``python -m flows.local_server --port P --idle-s S`` (:func:`connect` does).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx

from pipeline.errors import R2S2RError
from storage.files import atomic_write_json

IDLE_ENV = "R2S2R_PREFECT_SERVER_IDLE_S"
DEFAULT_IDLE_S = 900.0
STATE_FILE = "r2s2r-server.json"
LOG_FILE = "r2s2r-server.log"
LOCK_FILE = "r2s2r-server.lock"
_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
"""What Prefect sets for its temporary server: no UI, no background services."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def idle_seconds() -> float:
    """``R2S2R_PREFECT_SERVER_IDLE_S`` (s; 0: no shared server), else :data:`DEFAULT_IDLE_S`."""
    value = os.environ.get(IDLE_ENV, "")
    try:
        idle_s = float(value) if value else DEFAULT_IDLE_S
    except ValueError:
        raise R2S2RError(f"{IDLE_ENV}={value!r}: expected a number of seconds (0: no shared server)") from None
    if idle_s < 0:
        raise R2S2RError(f"{IDLE_ENV}={value!r}: expected 0 or more seconds")
    return idle_s


def _healthy(url: str, timeout_s: float = 1.0) -> bool:
    """Whether the Prefect API at ``url`` answers its health check."""
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def running_server(prefect_home: Path) -> dict[str, object] | None:
    """The shared server recorded in ``prefect_home`` (``url``, ``pid``, ``idle_s``) if it answers."""
    try:
        record = json.loads((prefect_home / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and _healthy(str(record.get("url", ""))) else None


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(prefect_home: Path, idle_s: float, timeout_s: float) -> dict[str, object]:
    """Start a server for ``prefect_home`` (detached: it outlives this process) and wait for it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = (prefect_home / LOG_FILE).open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "flows.local_server", "--port", str(port), "--idle-s", str(idle_s)],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PREFECT_HOME": str(prefect_home)},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,  # Ctrl-C in the command's terminal does not stop it
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while not _healthy(url, timeout_s=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
            raise R2S2RError(
                f"the local Prefect server did not start within {timeout_s:.0f} s (its log: "
                f"{prefect_home / LOG_FILE}); set {IDLE_ENV}=0 to let Prefect start a temporary one instead"
            )
        time.sleep(0.1)
    record: dict[str, object] = {"url": url, "pid": process.pid, "idle_s": idle_s}
    atomic_write_json(prefect_home / STATE_FILE, record)
    return record


def connect(prefect_home: Path, timeout_s: float = 180.0, keep_alive: bool = True) -> str | None:
    """Point this process's Prefect at the shared server of ``prefect_home`` (started if none
    answers within ``timeout_s``) by setting ``PREFECT_API_URL``; with ``keep_alive``, keep the
    server alive while this process runs. Call before ``prefect`` is imported. Returns the API
    URL, or None where ``PREFECT_API_URL`` is set already or the shared server is off
    (``R2S2R_PREFECT_SERVER_IDLE_S=0``)."""
    idle_s = idle_seconds()
    if os.environ.get("PREFECT_API_URL") or idle_s == 0:
        return None
    prefect_home.mkdir(parents=True, exist_ok=True)
    with (prefect_home / LOCK_FILE).open("a") as lock:  # one starter at a time per Prefect home
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = running_server(prefect_home) or _start(prefect_home, idle_s, timeout_s)
    url = str(record["url"])
    os.environ["PREFECT_API_URL"] = url
    if keep_alive:
        interval_s = float(record.get("idle_s", idle_s)) / 4
        threading.Thread(target=_keep_alive, args=(url, interval_s), name="prefect-keep-alive", daemon=True).start()
    return url


def stop(prefect_home: Path) -> bool:
    """Stop the shared server of ``prefect_home`` now (SIGTERM); whether one was running."""
    record = running_server(prefect_home)
    if record is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(record["pid"]), signal.SIGTERM)
    return True


def _keep_alive(url: str, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        _healthy(url)


class IdleWatch:
    """ASGI middleware around ``app`` that notes when the last request came and how many are open."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.last = time.monotonic()
        self.open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        self.open += 1
        self.last = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1
            self.last = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last request ended (0 while one is open)."""
        return 0.0 if self.open else time.monotonic() - self.last


def serve(port: int, idle_s: float) -> None:
    """Serve the Prefect API on 127.0.0.1:``port`` until ``idle_s`` pass without a request."""
    os.environ.update(_SERVER_ENV)
    import uvicorn
    from prefect.server.api.server import create_app

    watch = IdleWatch(create_app(final=True))
    server = uvicorn.Server(uvicorn.Config(watch, host="127.0.0.1", port=port, log_level="error", lifespan="on"))

    def watchdog() -> None:
        while not server.started:  # the idle time counts from when it serves
            time.sleep(0.1)
        watch.last = time.monotonic()
        while not server.should_exit:
            time.sleep(min(idle_s / 10, 5.0))
            if watch.idle_for() > idle_s:
                server.should_exit = True

    threading.Thread(target=watchdog, daemon=True).start()
    server.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    args = parser.parse_args()
    serve(args.port, args.idle_s)


if __name__ == "__main__":
    main()
