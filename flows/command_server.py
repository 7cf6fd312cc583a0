"""A process with the commands' imports done, kept running between commands, that runs them for the CLI.

A command spends seconds importing torch, Prefect, MLflow and the stage table before it does
anything: most of a cached rerun, nearly all of ``status``. Beside the shared Prefect server
(:mod:`flows.local_server`), each Prefect home (one per runs folder) can have a *command server*:
a process that imports all of that once, then waits on a Unix socket named after the Prefect home
(Linux's abstract namespace: no file; it takes commands of its own user only). A command that
finds it hands it its arguments, working folder, environment and standard streams;
the server forks a child that runs the command as the command would have run itself (the same
streams, so its output, progress rows and exit status are the command's), and the command waits
for the child's exit status. Ctrl-C in the command reaches the child's process group; a command
that dies takes its child with it.

Every command that reads a runs folder's configs is handed on so (not ``serve-twin`` or
``--help``). The first command that finds no server runs in its own process and, as it exits,
starts one for the next. The server stops after ``R2S2R_PREFECT_SERVER_IDLE_S`` seconds without a
command (the shared Prefect server's setting; ``0``: neither server), and as soon as a command
comes from another interpreter or project folder or the project's source files changed since it
imported them: that command runs in its own process and starts a fresh server.
``R2S2R_COMMAND_SERVER=0`` runs every command in its own process. The server's log (one line per
command: its arguments and exit status) is ``r2s2r-commands.log`` in the Prefect home.

Run as ``python -m flows.command_server --idle-s S`` with ``PREFECT_HOME`` set (the CLI does).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

from flows.local_server import idle_seconds

LOG_FILE = "r2s2r-commands.log"
SERVER_ENV = "R2S2R_COMMAND_SERVER"
"""``0``: every command runs in its own process and starts no command server (a profiler or a
debugger sees the command's work); the server's children have it, so a command is handed on once."""
PROJECT_ROOT = Path(__file__).resolve().parents[1]
SOURCE_PACKAGES = ("flows", "pipeline", "storage", "tasks")
FIRST_REPLY_TIMEOUT_S = 120.0
"""How long a command waits for the server to take it before it runs in its own process; the
server drops a command whose side closed."""
REQUEST_TIMEOUT_S = 5.0
"""How long the server waits for a connected command's request."""
ORPHAN_GRACE_S = 2.0
"""A child whose command went (its side of the socket closed) and that has not exited this long
after is stopped (SIGTERM to its process group): the command was killed, not done."""
PRELOAD = (
    "numpy",
    "pandas",
    "pyarrow.parquet",
    "torch",
    "mujoco",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "prefect",
    "flows.iteration",
    "flows.campaign",
    "flows.stages",
    "flows.status",
    "tasks.follow",
    "storage.mcap_export",
)
"""What the server imports once; everything a flow imports below these comes with them. The CLI
module itself is imported by each command: its console looks at the command's terminal."""


def source_signature(root: Path = PROJECT_ROOT) -> list[tuple[str, int, int]]:
    """(path, mtime in ns, size in bytes) of every Python file of the project's packages under ``root``."""
    files = sorted(path for package in SOURCE_PACKAGES for path in (root / package).rglob("*.py"))
    return [(str(path.relative_to(root)), path.stat().st_mtime_ns, path.stat().st_size) for path in files]


def socket_address(prefect_home: Path) -> str:
    """The command server's socket of ``prefect_home``: a name in Linux's abstract socket namespace
    (no file to leave behind, no limit from the folder's path), a hash of the folder."""
    digest = hashlib.sha256(os.fsencode(prefect_home.resolve())).hexdigest()[:32]
    return f"\0r2s2r-commands-{digest}"


def running(prefect_home: Path) -> bool:
    """Whether a command server of ``prefect_home`` takes commands (it listens once its imports are done)."""
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as probe:
        try:
            probe.connect(socket_address(prefect_home))
        except OSError:
            return False
    return True


def wait_running(prefect_home: Path, timeout_s: float) -> bool:
    """Whether a command server of ``prefect_home`` takes commands within ``timeout_s`` seconds
    (asked every 0.2 s): one just started listens once its imports are done."""
    deadline = time.monotonic() + timeout_s
    while not running(prefect_home):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _enabled() -> bool:
    return sys.platform == "linux" and os.environ.get(SERVER_ENV, "1") != "0" and idle_seconds() > 0


def delegate(prefect_home: Path, argv: list[str]) -> int | None:
    """Run the command ``argv`` (without the program name) in the command server of ``prefect_home``
    and return its exit status; None where it must run in this process (no server, one that
    refused it, or the servers are off), in which case a server is started as this process exits."""
    if not _enabled():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_address(prefect_home))
        socket.send_fds(sock, [b"F"], [0, 1, 2])
        request = {
            "argv": argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "executable": sys.executable,
            "root": str(PROJECT_ROOT),
        }
        sock.sendall(json.dumps(request).encode() + b"\n")
        replies = sock.makefile("rb")
        sock.settimeout(FIRST_REPLY_TIMEOUT_S)
        first = json.loads(replies.readline() or b"{}")
        sock.settimeout(None)
    except (OSError, ValueError):
        first = {}
    if "pid" not in first:  # none answered, or it refused (stale) and stops: run here, start another after
        sock.close()
        atexit.register(start, prefect_home)
        return None
    return _wait(sock, replies, int(first["pid"]))


def _wait(sock: socket.socket, replies, pid: int) -> int:
    """Wait for the child ``pid``'s exit status on ``replies``, passing Ctrl-C and SIGTERM on to its group."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        line = replies.readline()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    try:
        return int(json.loads(line)["exit"])
    except (ValueError, KeyError, TypeError):
        print("r2s2r: the command server's child ended without an exit status", file=sys.stderr)
        return 1


def start(prefect_home: Path) -> None:
    """Start the command server of ``prefect_home`` (detached) unless one is running; returns at once."""
    if not _enabled() or running(prefect_home):
        return
    prefect_home.mkdir(parents=True, exist_ok=True)
    with (prefect_home / LOG_FILE).open("ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "flows.command_server", "--idle-s", str(idle_seconds())],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PREFECT_HOME": str(prefect_home)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def stop(prefect_home: Path) -> bool:
    """Stop the command server of ``prefect_home`` (it takes no more commands and exits once the
    running ones end); whether one was running."""
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        try:
            sock.connect(socket_address(prefect_home))
            socket.send_fds(sock, [b"S"], [])
            sock.sendall(b'{"stop": true}\n')
            return json.loads(sock.makefile("rb").readline() or b"{}").get("stopped", False)
        except (OSError, ValueError):
            return False


def _bind(address: str) -> socket.socket | None:
    """A socket bound to ``address``; None where another server has it (two started at once: one
    binds, the other leaves before its imports). Commands connect once it listens."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError:
        listener.close()
        return None
    return listener


class CommandServer:
    """Forks a child per command from a process that has :data:`PRELOAD` imported."""

    def __init__(self, listener: socket.socket, idle_s: float) -> None:
        self.listener = listener
        self.idle_s = idle_s
        self.signature = source_signature()
        self.children: dict[int, tuple[socket.socket, list[str]]] = {}
        self.orphans: dict[int, float] = {}
        """Children whose command went: when to stop them (monotonic s)."""
        self.last = time.monotonic()
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.stopping = False

    def serve(self) -> None:
        """Take commands until idle for ``idle_s`` or told to stop; the socket goes with it."""
        try:
            while not (self.stopping and not self.children):
                for key, _ in self.selector.select(timeout=0.5):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._client_event(key.fileobj, key.data)
                self._reap()
                self._end_orphans()
                if not self.children and time.monotonic() - self.last > self.idle_s:
                    self._stop_listening()
                    break
        finally:
            self._stop_listening()

    def _stop_listening(self) -> None:
        if self.listener.fileno() < 0:
            return
        self.selector.unregister(self.listener)
        self.listener.close()
        self.stopping = True

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != os.getuid():  # an abstract socket has no file permissions: its own user's commands only
            conn.close()
            return
        try:
            conn.settimeout(REQUEST_TIMEOUT_S)
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            request = json.loads(conn.makefile("rb").readline())
            conn.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                if conn.recv(1, socket.MSG_PEEK) == b"":  # the command gave up waiting and ran itself
                    raise ConnectionError
            conn.setblocking(True)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        if request.get("stop"):
            reply = b'{"stopped": true}\n'
        elif not (
            request.get("executable") == sys.executable
            and request.get("root") == str(PROJECT_ROOT)
            and source_signature() == self.signature
            and len(fds) == 3
        ):
            reply = b'{"refused": "stale"}\n'
        else:
            reply = b""
        if reply:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(reply)
            conn.close()
            self._stop_listening()
            return
        pid = os.fork()
        if pid == 0:
            _run_child(conn, request, fds, self)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # the child may have set it already
            os.setpgid(pid, pid)
        self.children[pid] = (conn, request["argv"])
        self.selector.register(conn, selectors.EVENT_READ, pid)
        self.last = time.monotonic()

    def _client_event(self, conn: socket.socket, pid: int) -> None:
        """The command's side of ``conn`` wrote or closed: it has gone, so its child goes too."""
        with contextlib.suppress(OSError):
            if conn.recv(1, socket.MSG_PEEK):
                return
        self.selector.unregister(conn)
        self.orphans[pid] = time.monotonic() + ORPHAN_GRACE_S

    def _end_orphans(self) -> None:
        """Stop the children whose commands went more than :data:`ORPHAN_GRACE_S` ago."""
        now = time.monotonic()
        for pid, deadline in list(self.orphans.items()):
            if pid not in self.children:
                del self.orphans[pid]
            elif now > deadline:
                del self.orphans[pid]
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid not in self.children:
                continue
            conn, argv = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if code < 0:  # killed: the child could not say; the command's status as a shell shows it
                code = 128 - code
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
            _log(f"pid {pid}: r2s2r {' '.join(argv)} -> {code}")
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            conn.close()
            self.last = time.monotonic()


def _run_child(conn: socket.socket, request: dict, fds: list[int], server: CommandServer) -> None:
    """In the forked child: become the command (streams, folder, environment, arguments), run the
    CLI, send its exit status on ``conn`` and exit. Never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        server.listener.close()
        for other, _ in server.children.values():
            other.close()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[SERVER_ENV] = "0"
        sys.argv = ["r2s2r", *request["argv"]]
        _refresh_prefect()
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        from flows.cli import main

        main(prog_name="r2s2r")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        os._exit(code)


def _refresh_prefect() -> None:
    """Prefect read its settings and set up its logging at import, in the server's environment:
    read them again in the command's."""
    import prefect.context
    from prefect.logging.configuration import setup_logging

    prefect.context.refresh_global_settings_context()
    setup_logging(incremental=False)


def _log(message: str) -> None:
    """One line of the server's log (its stdout), stamped."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-s", type=float, required=True)
    args = parser.parse_args()
    prefect_home = Path(os.environ["PREFECT_HOME"])
    listener = _bind(socket_address(prefect_home))
    if listener is None:
        return
    import importlib

    start_s = time.perf_counter()
    for module in PRELOAD:
        importlib.import_module(module)
    listener.listen(16)
    _log(f"serving {prefect_home} (imports {time.perf_counter() - start_s:.1f} s)")
    CommandServer(listener, args.idle_s).serve()
    _log("stopped")


if __name__ == "__main__":
    main()
