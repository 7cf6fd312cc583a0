"""A robot on the network (``hardware_backend: network``): the :class:`Robot` interface over the
robot protocol (``docs/robot-protocol.md``).

Commands go out on a ZeroMQ DEALER socket and wait for their reply; one that is not answered in
``command_timeout_s`` is sent again with the same id, which the robot answers without running it
twice. Telemetry comes in on a SUB socket; :class:`~pipeline.hardware.reorder.Reorder` puts each
run's messages back in order and marks what was lost. A run fails with
:class:`~pipeline.errors.HardwareError` when nothing at all arrives for ``link_timeout_s``; what
arrived before stays with the caller.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import numpy as np
import zmq

from pipeline.config import NetworkConfig, RobotConfig
from pipeline.errors import HardwareError
from pipeline.hardware.base import CameraInfo, Packet, ProgressCallback, Robot, SensorPacket, StartPose
from pipeline.hardware.protocol import (
    Ack,
    Heartbeat,
    Hello,
    Ping,
    Refusal,
    Reset,
    RunControls,
    RunEnd,
    RunTargets,
    Stop,
    VersionMismatch,
    Welcome,
    decode_reply,
    decode_telemetry,
    encode,
    message_packet,
    pid_settings,
    start_message,
)
from pipeline.hardware.reorder import Reorder
from pipeline.policies import Policy
from pipeline.robot_model import cable_pairs

log = logging.getLogger(__name__)


class NetworkRobot(Robot):
    """The robot (or its bridge) at ``network.host``:``network.port``; connects on construction.

    ``robot`` is the robot config: the robot's cable layout and control rate must match it, and
    its PID settings go with every run.
    """

    def __init__(self, robot: RobotConfig, network: NetworkConfig, client: str = "r2s2r") -> None:
        self.robot = robot
        self.network = network
        self.address = f"tcp://{network.host}:{network.port}"
        self._context = zmq.Context()
        self._commands = self._context.socket(zmq.DEALER)
        self._commands.setsockopt(zmq.LINGER, 0)
        self._commands.connect(self.address)
        self._ids = 0
        self.last_run: Reorder | None = None
        """The last run's reorder state: what was received, lost, late and duplicated, and its gaps."""
        try:
            tries = max(1, int(np.ceil(network.connect_timeout_s / network.command_timeout_s)))
            welcome = self._request(Hello(id=self._next_id(), session=uuid.uuid4().hex, client=client), tries)
            assert isinstance(welcome, Welcome)
            self.welcome = welcome
            self._check(welcome)
            self._telemetry = self._context.socket(zmq.SUB)
            self._telemetry.setsockopt(zmq.LINGER, 0)
            self._telemetry.setsockopt(zmq.RCVHWM, 0)
            self._telemetry.setsockopt(zmq.RECONNECT_IVL, 100)
            self._telemetry.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
            self._telemetry.setsockopt(zmq.SUBSCRIBE, b"")
            self._telemetry.connect(f"tcp://{network.host}:{welcome.telemetry_port}")
            self._await_heartbeat()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _request(self, command: Hello | Reset | RunTargets | Stop, tries: int | None = None) -> Welcome | Ack:
        """Send ``command`` until its reply comes (``tries`` times at most, the same id each time)."""
        data = encode(command)
        timeout_s = self.network.command_timeout_s
        tries = self.network.command_tries if tries is None else tries
        for _ in range(tries):
            self._commands.send(data)
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not self._commands.poll(round(left * 1000)):
                    break
                reply = decode_reply(self._commands.recv(), f"robot at {self.address}")
                if isinstance(reply, Refusal) and reply.code == "version":
                    raise VersionMismatch(f"robot at {self.address}: {reply.message}")
                if reply.id != command.id:
                    continue  # the answer to an earlier try or a ping
                if isinstance(reply, Refusal):
                    if reply.code == "busy" and isinstance(command, Hello):
                        break  # another session's run is ending: ask again
                    raise HardwareError(f"robot at {self.address} refused '{command.type}': {reply.message}")
                return reply
        raise HardwareError(
            f"robot at {self.address} did not answer '{command.type}' (sent {tries} x, {timeout_s:g} s apart); "
            "is it running and is network.host/port right?"
        )

    def _check(self, welcome: Welcome) -> None:
        expected = [tuple(p) for p in cable_pairs(self.robot)]
        if [tuple(p) for p in welcome.cables] != expected:
            raise HardwareError(
                f"robot at {self.address} ('{welcome.robot}') has cables {welcome.cables}; the robot config says "
                f"{expected}"
            )
        if not np.isclose(welcome.control_rate_hz, self.robot.pid.control_rate_hz):
            raise HardwareError(
                f"robot at {self.address} controls at {welcome.control_rate_hz} Hz; the robot config says "
                f"{self.robot.pid.control_rate_hz} Hz"
            )

    def _await_heartbeat(self) -> None:
        """Wait for the first telemetry, so that no run's first messages go to a socket not yet joined."""
        deadline = time.monotonic() + self.network.connect_timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self._telemetry.poll(round(left * 1000)):
                message = decode_telemetry(self._telemetry.recv(), f"robot at {self.address}")
                if isinstance(message, Heartbeat):
                    return
        raise HardwareError(
            f"robot at {self.address} answered but sent no telemetry on port {self.welcome.telemetry_port} "
            f"within {self.network.connect_timeout_s:g} s"
        )

    # ------------------------------------------------------------------ Robot API
    @property
    def camera(self) -> CameraInfo | None:
        cam = self.welcome.camera
        if cam is None:
            return None
        return CameraInfo(**{**cam.model_dump(), "camera_to_world": np.array(cam.camera_to_world)})

    def reset(self, start: StartPose | None = None) -> None:
        if start is not None and not self.welcome.placement and (start.x_m, start.y_m, start.yaw_rad) != (0, 0, 0):
            log.warning("robot at %s cannot be placed: place it at %s by hand", self.address, start)
        self._request(Reset(id=self._next_id(), start=start_message(start)))

    def execute(
        self,
        policy: Policy,
        segment_timeout_s: float,
        record_frames: bool = True,
        progress: ProgressCallback | None = None,
    ) -> Iterator[Packet]:
        """Run ``policy`` on the robot with the robot config's PID (module docstring); frames only
        if the robot has a camera."""
        command = RunTargets(
            id=self._next_id(),
            targets=np.asarray(policy.targets, float).tolist(),
            pid=pid_settings(self.robot),
            segment_timeout_s=segment_timeout_s,
            frames=record_frames and self.welcome.camera is not None,
        )
        yield from self._stream(command, progress)

    def run_controls(self, controls: np.ndarray, duration_s: float) -> Iterator[Packet]:
        """Hold raw motor commands ``controls`` (6,) in [-1, 1] for ``duration_s`` (s, at most 5),
        no PID; the robot stops its motors after."""
        command = RunControls(id=self._next_id(), controls=np.asarray(controls, float).tolist(), duration_s=duration_s)
        yield from self._stream(command, None)

    def _stream(self, command: RunTargets | RunControls, progress: ProgressCallback | None) -> Iterator[Packet]:
        """Start the run ``command`` and yield its telemetry as packets, in order, with gaps."""
        run = command.id
        stream = Reorder(self.network.reorder_wait_s)
        self.last_run = stream
        self._request(command)
        source = f"robot at {self.address}"
        heard = pinged = time.monotonic()
        end: RunEnd | None = None
        while not stream.done:
            if self._telemetry.poll(50):
                message = decode_telemetry(self._telemetry.recv(), source)
                now = heard = time.monotonic()
                if isinstance(message, Heartbeat):
                    if message.run == run and message.end is not None:
                        end = message.end
                elif message.run == run:
                    if isinstance(message, RunEnd):
                        end = message
                    else:
                        stream.add(message.seq, message_packet(message, source), now)
                if end is not None:
                    stream.end(end.seq, end.t_s, now)
            now = time.monotonic()
            for packet in stream.ready(now):
                yield packet
                if progress is not None and isinstance(packet, SensorPacket):
                    progress(packet.t_s)
            if now - heard > self.network.link_timeout_s:
                self._stop_quietly()
                raise HardwareError(
                    f"{source}: no telemetry for {self.network.link_timeout_s:g} s (robot or link down); "
                    f"the run's {stream.received} messages up to t = {stream.last_t_s:.2f} s are kept"
                )
            if now - pinged > self.network.ping_every_s:
                self._commands.send(encode(Ping(id=self._next_id())))
                pinged = now
        if stream.lost:
            log.warning(
                "%s: run %d lost %d of %d messages in %d gaps (marked in the recording)",
                source,
                run,
                stream.lost,
                stream.lost + stream.received,
                len(stream.gaps),
            )
        if end is not None and end.reason == "fault":
            raise HardwareError(f"{source}: run failed: {end.message}")

    def stop(self) -> None:
        try:
            self._request(Stop(id=self._next_id()))
        except HardwareError as exc:
            log.warning("stop: %s", exc)

    def _stop_quietly(self) -> None:
        """Ask the robot to stop once, without waiting (its watchdog stops it if this is lost)."""
        self._commands.send(encode(Stop(id=self._next_id())))

    def close(self) -> None:
        """Close the sockets."""
        self._context.destroy(linger=0)
