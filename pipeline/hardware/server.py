"""The MuJoCo twin served over the robot protocol (``r2s2r serve-twin``, ``docs/robot-protocol.md``).

:class:`TwinServer` answers commands on a ZeroMQ ROUTER socket and publishes telemetry on a PUB
socket, in one thread: between the twin's packets it reads commands, sends heartbeats and keeps
its pace (``speed`` robot seconds per wall second; a real robot runs at 1, a simulator may run
as fast as it can with 0). :class:`WireFaults` puts faults on its own link, so that clients can
be tested against a bad network on the loopback: the link closed for a while (both sockets
unbound, then bound again), every message delayed, a share lost, a share held back so that later
ones overtake it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import zmq
from pydantic import BaseModel

from pipeline.errors import HardwareError
from pipeline.hardware.base import GroundTruthPacket, Packet, SensorPacket, StartPose
from pipeline.hardware.protocol import (
    PROTOCOL_VERSION,
    Ack,
    CameraMsg,
    Heartbeat,
    Hello,
    Ping,
    ProtocolError,
    Refusal,
    Reset,
    RunControls,
    RunEnd,
    RunTargets,
    Stop,
    VersionMismatch,
    Welcome,
    decode_command,
    encode,
    telemetry_message,
)
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import Policy
from pipeline.robot_model import cable_pairs, length_to_target

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 0.2
REPLIES_KEPT = 256
"""How many replies the server keeps to answer a repeated command id without running it again."""


@dataclass(frozen=True)
class WireFaults:
    """Faults on the server's link (wall time). ``drop_at_s`` counts from the first run's start."""

    drop_at_s: float | None = None
    drop_for_s: float = 0.0
    delay_s: float = 0.0
    loss: float = 0.0
    reorder: float = 0.0
    reorder_hold_s: float = 0.05
    seed: int = 0


@dataclass
class _Link:
    """The server's two sockets, with :class:`WireFaults` applied to every message in and out."""

    context: zmq.Context
    host: str
    port: int
    telemetry_port: int
    faults: WireFaults
    _rng: np.random.Generator = field(init=False)
    _outbox: list[tuple[float, int, bytes | None, bytes]] = field(default_factory=list, init=False)
    _inbox: list[tuple[float, bytes, bytes]] = field(default_factory=list, init=False)
    _order: int = field(default=0, init=False)
    _up: bool = field(default=True, init=False)
    dropped_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.faults.seed)
        self._bind()

    def _bind(self) -> None:
        self.commands = self.context.socket(zmq.ROUTER)
        self.commands.setsockopt(zmq.LINGER, 0)
        self.commands.bind(f"tcp://{self.host}:{self.port}")
        self.telemetry = self.context.socket(zmq.PUB)
        self.telemetry.setsockopt(zmq.LINGER, 0)
        self.telemetry.setsockopt(zmq.SNDHWM, 0)  # a simulator running ahead of its client loses nothing
        self.telemetry.bind(f"tcp://{self.host}:{self.telemetry_port}")

    @property
    def up(self) -> bool:
        return self._up

    def close(self) -> None:
        if self.up:
            self.commands.close()
            self.telemetry.close()
            self._up = False

    def update(self, run_started: float | None) -> None:
        """Close or reopen the link as :attr:`WireFaults.drop_at_s` says."""
        f = self.faults
        if f.drop_at_s is None or run_started is None:
            return
        now = time.monotonic()
        if self.up and self.dropped_at is None and now >= run_started + f.drop_at_s:
            log.warning("serve-twin: link down for %.1f s (fault)", f.drop_for_s)
            self.close()
            self.dropped_at = now
            self._outbox.clear()
            self._inbox.clear()
        elif not self.up and self.dropped_at is not None and now >= self.dropped_at + f.drop_for_s:
            self._bind()
            self._up = True
            log.warning("serve-twin: link up again")

    def _lost(self) -> bool:
        return self.faults.loss > 0 and self._rng.random() < self.faults.loss

    def receive(self, timeout_s: float) -> list[tuple[bytes, bytes]]:
        """Commands that arrived (waiting up to ``timeout_s``), as (sender, bytes), after the faults."""
        now = time.monotonic()
        if self.up and self.commands.poll(max(0, round(timeout_s * 1000))):
            while self.commands.poll(0):
                sender, data = self.commands.recv_multipart()[:2]
                if not self._lost():
                    self._inbox.append((now + self.faults.delay_s, sender, data))
        elif not self.up:
            time.sleep(timeout_s)
        due = [(sender, data) for at, sender, data in self._inbox if at <= time.monotonic()]
        self._inbox = [item for item in self._inbox if item[0] > time.monotonic()]
        return due

    def send(self, data: bytes, to: bytes | None = None) -> None:
        """Queue a reply (``to`` a sender) or a telemetry message (``to`` None) through the faults."""
        if not self.up or self._lost():
            return
        hold = self.faults.reorder_hold_s if self.faults.reorder > 0 and self._rng.random() < self.faults.reorder else 0
        self._order += 1
        self._outbox.append((time.monotonic() + self.faults.delay_s + hold, self._order, to, data))
        self.flush()

    def flush(self) -> None:
        """Send every queued message whose time has come, in the order of their times."""
        if not self.up or not self._outbox:
            return
        now = time.monotonic()
        self._outbox.sort()
        while self._outbox and self._outbox[0][0] <= now:
            _, _, to, data = self._outbox.pop(0)
            if to is None:
                self.telemetry.send(data)
            else:
                self.commands.send_multipart([to, data])


@dataclass
class _Run:
    """The run in progress: its id, the twin's packet stream, and what was sent of it."""

    run: int
    packets: Iterator[Packet]
    started: float
    sent: int = 0
    next_packet: Packet | None = None
    stop_reason: str | None = None


class TwinServer:
    """Serve ``twin`` over the robot protocol on ``host``:``port`` (telemetry on ``port + 1``).

    ``speed``: robot seconds per wall second (0: as fast as it can); ``watchdog_s``: a run stops
    when no command or ping came for this long; ``version``: the protocol version it speaks (another
    one only to test clients against it); ``truth``: whether it streams the simulator's truth.
    """

    def __init__(
        self,
        twin: MujocoTwin,
        host: str = "127.0.0.1",
        port: int = 5555,
        speed: float = 1.0,
        watchdog_s: float = 5.0,
        faults: WireFaults | None = None,
        version: int = PROTOCOL_VERSION,
        truth: bool = True,
        name: str = "tribar-twin",
    ) -> None:
        self.twin = twin
        self.host, self.port, self.telemetry_port = host, port, port + 1
        self.speed = speed
        self.watchdog_s = watchdog_s
        self.faults = faults or WireFaults()
        self.version = version
        self.truth = truth
        self.name = name
        self._session: str | None = None
        self._replies: OrderedDict[int, bytes] = OrderedDict()
        self._run: _Run | None = None
        self._last_end: RunEnd | None = None
        self._last_run = -1
        self._last_sent = 0
        self._last_t = 0.0
        self._heard = time.monotonic()
        self._first_run_at: float | None = None
        self._started = time.monotonic()
        self._base_robot = twin.robot
        self._link: _Link | None = None

    # --------------------------------------------------------------------- loop
    def serve(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Answer commands and run runs until ``should_stop()`` says so."""
        context = zmq.Context()
        try:
            self._link = _Link(context, self.host, self.port, self.telemetry_port, self.faults)
        except zmq.ZMQError as exc:
            context.term()
            raise HardwareError(
                f"serve-twin: cannot bind tcp://{self.host}:{self.port} and {self.telemetry_port}: {exc}"
            ) from None
        log.info(
            "serve-twin: %s on tcp://%s:%d (telemetry %d), protocol %d, speed %s",
            self.name,
            self.host,
            self.port,
            self.telemetry_port,
            self.version,
            self.speed or "unpaced",
        )
        next_heartbeat = time.monotonic()
        wait = 0.05  # s to wait for commands before the next step
        try:
            while not should_stop():
                link = self._link
                link.update(self._first_run_at)
                for sender, data in link.receive(wait):
                    link.send(self._answer(data), to=sender)
                wait = self._advance() if self._run is not None else 0.05
                now = time.monotonic()
                if now >= next_heartbeat:
                    link.send(encode(self._heartbeat(), self.version))
                    next_heartbeat = now + HEARTBEAT_EVERY_S
                link.flush()
        finally:
            self._link.close()
            context.term()
            self.twin.close()

    # ----------------------------------------------------------------- commands
    def _answer(self, data: bytes) -> bytes:
        """The reply to one command (the same bytes again for a repeated id: never run twice)."""
        try:
            command = decode_command(data, "client", self.version)
        except VersionMismatch as exc:
            return encode(Refusal(id=-1, code="version", message=str(exc), protocol_version=self.version), self.version)
        except ProtocolError as exc:
            return encode(Refusal(id=-1, code="invalid", message=str(exc)), self.version)
        if isinstance(command, Hello):
            if command.session != self._session:
                if self._run is not None:
                    return self._refuse(command.id, "busy", "a run of another session is on; try again when it ends")
                self._open(command.session)
            return self._reply(command.id, self._welcome(command.id))
        if command.id in self._replies:
            self._replies.move_to_end(command.id)
            return self._replies[command.id]
        self._heard = time.monotonic()
        if isinstance(command, Ping):
            return encode(Ack(id=command.id), self.version)
        if isinstance(command, Stop):
            if self._run is not None:
                self._run.stop_reason = "stopped"
                self.twin.stop()
            return self._reply(command.id, Ack(id=command.id))
        if self._run is not None:
            return self._refuse(command.id, "busy", f"run {self._run.run} is on; stop it first")
        if isinstance(command, Reset):
            start = None if command.start is None else StartPose(**command.start.model_dump())
            self.twin.reset(start)
            return self._reply(command.id, Ack(id=command.id))
        if isinstance(command, RunTargets):
            problem = self._apply_pid(command)
            if problem is not None:
                return self._refuse(command.id, "invalid", problem)
            policy = Policy(name=f"run{command.id}", targets=np.array(command.targets))
            packets = self.twin.execute(
                policy, command.segment_timeout_s, record_frames=command.frames, final_hold_s=command.final_hold_s
            )
        else:
            assert isinstance(command, RunControls)
            self.twin.robot = self._base_robot
            packets = self.twin.execute_controls(np.array(command.controls), command.duration_s, command.frames)
        self._start(command.id, packets)
        return self._reply(command.id, Ack(id=command.id))

    def _reply(self, command_id: int, message: BaseModel) -> bytes:
        data = encode(message, self.version)
        self._replies[command_id] = data
        while len(self._replies) > REPLIES_KEPT:
            self._replies.popitem(last=False)
        return data

    def _refuse(self, command_id: int, code: str, message: str) -> bytes:
        return encode(Refusal(id=command_id, code=code, message=message, protocol_version=self.version), self.version)

    def _open(self, session: str) -> None:
        """A new session: the simulated robot as if powered on (rest pose, its noise seed)."""
        self._session = session
        self._replies.clear()
        self.twin.robot = self._base_robot
        self.twin.reset(seed=self.twin.twin.seed)
        log.info("serve-twin: session %s", session)

    def _welcome(self, command_id: int) -> Welcome:
        camera = self.twin.camera.as_dict()
        return Welcome(
            id=command_id,
            robot=self.name,
            cables=cable_pairs(self.twin.robot),
            control_rate_hz=self.twin.robot.pid.control_rate_hz,
            imu_rods=list(self.twin.robot.sensors.imu_rods),
            telemetry_port=self.telemetry_port,
            camera=CameraMsg(**camera),
            truth=self.truth,
            placement=True,
        )

    def _apply_pid(self, command: RunTargets) -> str | None:
        """Set the twin's firmware to the command's PID settings; what cannot be set, or None."""
        robot = self._base_robot
        pid = command.pid
        fixed = {
            "min_length_m": robot.actuated_cable.min_length_m,
            "range_m": robot.actuated_cable.range_m,
            "control_rate_hz": robot.pid.control_rate_hz,
        }
        for name, value in fixed.items():
            if not np.isclose(getattr(pid, name), value):
                return f"pid.{name} = {getattr(pid, name)}: this robot's is {value} and cannot be changed"
        self.twin.robot = robot.updated(
            {
                "pid.kp": pid.kp,
                "pid.ki": pid.ki,
                "pid.kd": pid.kd,
                "pid.tolerance": pid.tolerance,
                "motor.speed": pid.max_speed,
            }
        )
        return None

    # --------------------------------------------------------------------- runs
    def _start(self, run: int, packets: Iterator[Packet]) -> None:
        now = time.monotonic()
        self._run = _Run(run=run, packets=packets, started=now)
        self._last_run, self._last_sent, self._last_end, self._last_t = run, 0, None, 0.0
        self._heard = now
        if self._first_run_at is None:
            self._first_run_at = now

    def _advance(self, most: int = 8) -> float:
        """Send up to ``most`` of the run's packets whose time has come; end the run when its stream
        does. Returns how long the loop may wait for commands before the next packet is due (s)."""
        run = self._run
        assert run is not None and self._link is not None
        if time.monotonic() - self._heard > self.watchdog_s and run.stop_reason is None:
            log.warning("serve-twin: no command or ping for %.1f s; stopping run %d", self.watchdog_s, run.run)
            run.stop_reason = "stopped"
            self.twin.stop()
        for _ in range(most):
            if run.next_packet is None:
                try:
                    run.next_packet = next(run.packets)
                except StopIteration:
                    self._end(run, run.stop_reason or "done", "")
                    return 0.0
                except HardwareError as exc:
                    self._end(run, "fault", str(exc))
                    return 0.0
            packet = run.next_packet
            due = run.started + packet.t_s / self.speed - time.monotonic() if self.speed > 0 else 0.0
            if due > 0:
                return min(due, 0.01)
            run.next_packet = None
            if isinstance(packet, GroundTruthPacket) and not self.truth:
                continue
            reached = isinstance(packet, SensorPacket) and self._reached(packet)
            self._link.send(encode(telemetry_message(packet, run.run, run.sent, reached), self.version))
            run.sent += 1
            self._last_sent = run.sent
            self._last_t = packet.t_s
        return 0.0

    def _reached(self, packet: SensorPacket) -> bool:
        position = length_to_target(self.twin.robot, packet.cable_m[:6])
        return bool((np.abs(position - packet.target) < self.twin.robot.pid.tolerance).all())

    def _end(self, run: _Run, reason: str, message: str) -> None:
        end = RunEnd(run=run.run, seq=run.sent, t_s=self._last_t, reason=reason, message=message)
        assert self._link is not None
        self._link.send(encode(end, self.version))
        self._last_end = end
        self._run = None
        self.twin.robot = self._base_robot
        log.info("serve-twin: run %d ended (%s) after %d messages", run.run, reason, run.sent)

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            t_s=time.monotonic() - self._started,
            state="idle" if self._run is None else "running",
            run=self._last_run,
            sent=self._last_sent,
            end=self._last_end,
        )
