"""A run served live on Foxglove's WebSocket while the robot runs (``--live``).

With ``R2S2R_LIVE`` set to ``HOST:PORT`` (the command line's ``--live`` sets it, bound to
127.0.0.1:8765 unless ``--live-address`` says otherwise), every recording the process opens
(collect, redeploy, follow: :func:`storage.recording.open_recording`) also sends its packets to one
Foxglove WebSocket server, started by the first: the channels of :class:`~storage.scene.RobotScene`
(sensors, camera images, the twin's true poses; the tracked end caps come later, from the track
stage, and are in the exported MCAP files). Open Foxglove, "Open connection", ``ws://HOST:PORT``.
"""

from __future__ import annotations

import os
import threading

from pipeline.config import RobotConfig
from pipeline.errors import ConfigError
from pipeline.hardware.base import CameraInfo, FramePacket, GroundTruthPacket, Packet, SensorPacket

LIVE_ENV = "R2S2R_LIVE"
"""``HOST:PORT`` of the live server; unset or empty: no live view."""
DEFAULT_LIVE_ADDRESS = "127.0.0.1:8765"


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); :class:`ConfigError` naming what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"live address {address!r}: expected HOST:PORT with a port in 1-65535")
    return host, int(port)


class LiveScene:
    """A :class:`RobotScene` served on a Foxglove WebSocket server at ``host``:``port``."""

    def __init__(self, robot: RobotConfig, host: str, port: int) -> None:
        import foxglove  # the SDK where a live view is asked for: the command line reads this module

        from storage.scene import RobotScene

        self.scene = RobotScene(robot, ("truth",))
        self.server = foxglove.start_server(name="r2s2r", host=host, port=port, context=self.scene.context)
        self.lock = threading.Lock()  # concurrent runs log from their threads
        self.ground_sent = False
        self.camera_sent = False

    def add(
        self, packet: Packet, frame_png: tuple[bytes, bytes] | None = None, camera: CameraInfo | None = None
    ) -> None:
        """Send ``packet``; a frame as its PNG-encoded colour and depth images ``frame_png``, the
        ``camera``'s pose and intrinsics with the first."""
        with self.lock:
            if isinstance(packet, SensorPacket):
                if not self.ground_sent:
                    self.scene.ground(packet.t_s)
                    self.ground_sent = True
                self.scene.sensors(packet)
            elif isinstance(packet, GroundTruthPacket):
                self.scene.robot_pose("truth", packet.t_s, packet.caps_m)
            elif isinstance(packet, FramePacket) and frame_png is not None:
                if camera is not None and not self.camera_sent:
                    self.scene.camera(packet.t_s, camera)
                    self.camera_sent = True
                self.scene.frame(packet.t_s, *frame_png)

    def stop(self) -> None:
        self.server.stop()


_live: LiveScene | None = None
_lock = threading.Lock()


def live_scene(robot: RobotConfig) -> LiveScene | None:
    """The process's live view (started on first use) where :data:`LIVE_ENV` asks for one, else None."""
    global _live
    address = os.environ.get(LIVE_ENV, "").strip()
    if not address:
        return None
    with _lock:
        if _live is None:
            _live = LiveScene(robot, *parse_address(address))
        return _live


def stop_live() -> None:
    """Stop the process's live server, if one was started (the next recording starts another)."""
    global _live
    with _lock:
        if _live is not None:
            _live.stop()
            _live = None
