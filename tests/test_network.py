"""The robot protocol, the network backend and ``r2s2r serve-twin``, over real sockets on the loopback.

The twin is served in a separate process as a robot would be; the faults of
``docs/robot-protocol.md`` are put on its link by its own fault options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pandas as pd
import pytest
import yaml
import zmq

from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import ConfigError, HardwareError
from pipeline.hardware.base import GapPacket, GroundTruthPacket, SensorPacket
from pipeline.hardware.network import NetworkRobot
from pipeline.hardware.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Heartbeat,
    Hello,
    ProtocolError,
    Refusal,
    RunTargets,
    Sample,
    VersionMismatch,
    Welcome,
    decode_reply,
    decode_telemetry,
    encode,
    message_packet,
    pid_settings,
    telemetry_message,
)
from pipeline.hardware.reorder import Reorder
from pipeline.hardware.server import TwinServer
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import random_policy
from pipeline.robot_model import cable_pairs
from pipeline.truth import truth_errors
from storage.layout import complete_stage_ref, read_manifest
from storage.recording import GROUNDTRUTH_FILE, HARDWARE_FILE, Recording, RecordingIdentity
from storage.trajectory import TARGET_COLS, read_trajectory
from tasks.collect import run_collect

from .conftest import small_twin, write_test_pipeline

R2S2R = Path(sys.executable).parent / "r2s2r"
CONNECT_S = 90.0
"""Generous: a serve-twin process starting beside a busy test worker takes several seconds."""


def _free_port_pair() -> int:
    """A port p with p and p + 1 free on the loopback (commands and telemetry)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two free ports in a row")


@contextlib.contextmanager
def serve_twin(pipeline: Path, port: int, *options: str) -> Iterator[subprocess.Popen]:
    """``r2s2r serve-twin`` in a process of its own, stopped (SIGTERM) on exit."""
    log = pipeline.parent / f"serve-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(R2S2R), "serve-twin", "-c", str(pipeline), "--port", str(port), *options],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MUJOCO_GL": "egl"},
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _network_configs(pipeline: Path, port: int, **network: object) -> LoadedConfigs:
    settings = {"connect_timeout_s": CONNECT_S, **network}
    return load_all(
        pipeline,
        {"hardware_backend": "network", "network.port": port, **{f"network.{k}": v for k, v in settings.items()}},
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    """A small test pipeline and its collect recorded by the in-process twin: (pipeline, hardware, truth)."""
    folder = tmp_path_factory.mktemp("reference")
    pipeline = write_test_pipeline(folder, n_targets=2, record_frames=False)
    ref, summary = run_collect(load_all(pipeline), 1)
    recording = Path(ref.path) / summary["policy_id"]
    hardware, _ = read_trajectory(recording / HARDWARE_FILE, expect_source="hardware")
    truth, _ = read_trajectory(recording / GROUNDTRUTH_FILE, expect_source="groundtruth")
    return pipeline, hardware, truth


def _copy_pipeline(reference_pipeline: Path, folder: Path) -> Path:
    """The reference's pipeline, writing its runs under ``folder``."""
    configs = load_all(reference_pipeline)
    return write_test_pipeline(folder, n_targets=configs.pipeline.collect.random.n_targets, record_frames=False)


# ------------------------------------------------------------------------------------------ protocol
def test_a_sample_survives_the_wire_bit_for_bit(twin: MujocoTwin) -> None:
    twin.reset()
    packets = twin.execute_controls(np.full(6, 0.3), duration_s=0.1)
    sensor = next(p for p in packets if isinstance(p, SensorPacket))
    truth = next(p for p in packets if isinstance(p, GroundTruthPacket))
    for packet in (sensor, truth):
        message = decode_telemetry(encode(telemetry_message(packet, run=3, seq=7, reached=False)), "test")
        back = message_packet(message, "test")
        assert message.run == 3 and message.seq == 7
        for name, value in vars(packet).items():
            got = getattr(back, name)
            if isinstance(value, dict):
                assert value.keys() == got.keys() and all(np.array_equal(value[k], got[k]) for k in value)
            else:
                assert np.array_equal(value, got), name


def test_bad_messages_are_refused_naming_the_field() -> None:
    sample = Sample(
        run=1, seq=0, t_s=0.0, segment=0, reached=False, target=[0.5] * 6, control=[0.0] * 6,
        cable_m=[0.2] * 9, imu={0: [1, 0, 0, 0]}, motor_rad=[0.0] * 6,
    )  # fmt: skip
    raw = sample.model_dump()
    with pytest.raises(ProtocolError, match="not MessagePack"):
        decode_telemetry(b"\xc1", "robot X")
    with pytest.raises(VersionMismatch, match=f"robot X speaks protocol version 2, not version {PROTOCOL_VERSION}"):
        decode_telemetry(msgpack.packb({**raw, "v": 2}), "robot X")
    with pytest.raises(ProtocolError, match="field 'sample.cable_m'"):
        decode_telemetry(msgpack.packb({**raw, "cable_m": [0.2] * 8}), "robot X")
    with pytest.raises(ProtocolError, match="without the protocol's 'v' and 'type'"):
        decode_telemetry(msgpack.packb([1, 2]), "robot X")
    frame = {"v": 1, "type": "frame", "run": 1, "seq": 0, "t_s": 0.0, "width": 4, "height": 2, "rgb": bytes(24)}
    message = decode_telemetry(msgpack.packb({**frame, "depth": bytes(15)}), "robot X")
    with pytest.raises(ProtocolError, match="15 depth bytes for 4 x 2 px"):
        message_packet(message, "robot X")


# ------------------------------------------------------------------------------------------ reorder
def _sensor(t: float) -> SensorPacket:
    return SensorPacket(t, 0, np.zeros(6), np.zeros(6), np.zeros(9), {}, np.zeros(6))


def test_reorder_restores_order_and_marks_what_is_lost() -> None:
    stream = Reorder(wait_s=0.3)
    for seq, at in ((0, 0.0), (2, 0.1), (1, 0.15), (4, 0.2), (5, 0.25)):
        stream.add(seq, _sensor(seq * 0.02), at)
    assert [p.t_s for p in stream.ready(0.26)] == [0.0, 0.02, 0.04]  # 3 is missing: 4 and 5 wait
    assert stream.ready(0.49) == []
    gap, *rest = stream.ready(0.5)  # 0.3 s after 4 came, 3 counts as lost
    assert isinstance(gap, GapPacket) and (gap.t_start_s, gap.t_end_s, gap.missing) == (0.04, 0.08, 1)
    assert [p.t_s for p in rest] == [0.08, 0.1]
    stream.add(3, _sensor(0.06), 0.6)  # too late: handed on would break the order
    stream.add(5, _sensor(0.1), 0.6)
    stream.end(seq=8, t_s=0.2, now=0.7)  # 6 and 7 never come
    assert not stream.done and stream.ready(0.8) == []
    (tail,) = stream.ready(1.0)
    assert (tail.t_start_s, tail.t_end_s, tail.missing) == (0.1, 0.2, 2)
    assert stream.done
    assert (stream.received, stream.lost, stream.late, stream.duplicates) == (5, 3, 1, 1)


# ------------------------------------------------------------------------------------------ server in a thread
@pytest.fixture
def served(default_configs: LoadedConfigs) -> Iterator[tuple[str, TwinServer]]:
    """The twin served in a thread of this process (unpaced): its address and the server."""
    port = _free_port_pair()
    server = TwinServer(MujocoTwin(default_configs.robot, small_twin(default_configs.twin)), port=port, speed=0)
    stop = threading.Event()
    thread = threading.Thread(target=server.serve, args=(stop.is_set,), daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{port}", server
    stop.set()
    thread.join(timeout=20)


def _dealer(context: zmq.Context, address: str) -> zmq.Socket:
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    return dealer


def _reply(dealer: zmq.Socket, timeout_s: float = 20.0) -> Ack | Refusal:
    assert dealer.poll(round(timeout_s * 1000)), "no reply"
    return decode_reply(dealer.recv(), "test server")


def test_a_command_sent_twice_runs_once(served: tuple[str, TwinServer], default_configs: LoadedConfigs) -> None:
    address, server = served
    context = zmq.Context()
    try:
        dealer = _dealer(context, address)
        dealer.send(encode(Hello(id=1, session="s", client="test")))
        assert _reply(dealer).type == "welcome"
        pid = pid_settings(default_configs.robot)
        command = RunTargets(id=2, targets=[[0.5] * 6], pid=pid, segment_timeout_s=1.0, frames=False)
        dealer.send(encode(command))
        assert isinstance(_reply(dealer), Ack)
        dealer.send(encode(command))  # a retry after a lost reply: the same answer, no second run
        assert isinstance(_reply(dealer), Ack)
        other = command.model_copy(update={"id": 3})
        dealer.send(encode(other))  # a new run while the first is on: refused, not queued
        refusal = _reply(dealer)
        assert isinstance(refusal, Refusal) and refusal.code == "busy"
        dealer.send(b"\x93\x01\x02")  # not a command: refused, the server goes on
        refusal = _reply(dealer)
        assert isinstance(refusal, Refusal) and refusal.code == "invalid"
        deadline = time.monotonic() + 60
        while server._run is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server._last_run == 2 and server._last_end is not None and server._last_end.reason == "done"
    finally:
        context.destroy(linger=0)


def test_raw_motor_controls_turn_the_winches(served: tuple[str, TwinServer], default_configs: LoadedConfigs) -> None:
    address, _ = served
    port = int(address.rsplit(":", 1)[1])
    network = default_configs.pipeline.network.model_copy(update={"port": port, "connect_timeout_s": CONNECT_S})
    robot = NetworkRobot(default_configs.robot, network)
    try:
        packets = list(robot.run_controls(np.array([0.8, -0.8, 0.0, 0.0, 0.0, 0.0]), duration_s=0.5))
    finally:
        robot.close()
    samples = [p for p in packets if isinstance(p, SensorPacket)]
    assert len(samples) == 25  # 0.5 s at 50 Hz
    assert all(np.array_equal(p.control, [0.8, -0.8, 0, 0, 0, 0]) for p in samples)
    turned = samples[-1].motor_rad - samples[0].motor_rad
    # u > 0 winds the cable in (its rest length shrinks) and the winch angle grows; u < 0 lets it out
    assert turned[0] > 0.5 and turned[1] < -0.5 and np.allclose(turned[2:], 0.0)


# ------------------------------------------------------------------------------------------ serve-twin process
def test_collect_over_the_network_equals_the_in_process_twin(
    reference: tuple[Path, pd.DataFrame, pd.DataFrame], tmp_path: Path
) -> None:
    pipeline, hardware, truth = reference
    ours = _copy_pipeline(pipeline, tmp_path)
    port = _free_port_pair()
    with serve_twin(ours, port, "--speed", "0"):
        ref, summary = run_collect(_network_configs(ours, port), 1)
    folder = Path(ref.path) / summary["policy_id"]
    got, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    got_truth, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
    assert meta.complete and meta.gaps == []
    pd.testing.assert_frame_equal(got, hardware)
    pd.testing.assert_frame_equal(got_truth, truth)


WIRE_FAULTS = {
    "delayed 200 ms": ("--delay-s", "0.2"),
    "5 % lost": ("--loss", "0.05"),
    "out of order": ("--reorder", "0.1"),
    "link down 2 s": ("--drop-at-s", "1.0", "--drop-for-s", "2.0"),
}


@pytest.mark.parametrize("fault", WIRE_FAULTS)
def test_collect_survives_a_bad_link(
    fault: str, reference: tuple[Path, pd.DataFrame, pd.DataFrame], tmp_path: Path
) -> None:
    """Each fault: the run completes, every sample that came is kept as the in-process twin
    recorded it (nothing interpolated), and what was lost is marked as gaps with their durations."""
    pipeline, hardware, _ = reference
    ours = _copy_pipeline(pipeline, tmp_path)
    port = _free_port_pair()
    with serve_twin(ours, port, "--speed", "1", *WIRE_FAULTS[fault]):
        ref, summary = run_collect(_network_configs(ours, port), 1)
    assert read_manifest(ref)["complete"]
    got, meta = read_trajectory(Path(ref.path) / summary["policy_id"] / HARDWARE_FILE, expect_source="hardware")
    assert meta.complete
    kept = hardware.set_index("t").loc[got["t"]].reset_index()
    pd.testing.assert_frame_equal(got, kept)  # the samples kept are the twin's own, in order
    lost = len(hardware) - len(got)
    if fault in ("delayed 200 ms", "out of order"):
        assert lost == 0 and meta.gaps == []
    elif fault == "5 % lost":
        # samples are a third of the messages (with truth and heartbeats); 5 % of ~200 samples
        assert 1 <= lost <= 30 and meta.gaps and all(g.t_end_s - g.t_start_s < 0.5 for g in meta.gaps)
    else:
        (gap,) = meta.gaps
        # the outage itself (2 s, or less robot time if the twin fell behind real time) and at most 1 s more
        assert 1.0 <= gap.t_end_s - gap.t_start_s <= 3.0
        assert lost >= 40  # ~2 s of 50 Hz samples


def test_a_killed_robot_keeps_what_came_and_the_next_run_resumes(tmp_path: Path) -> None:
    ours = write_test_pipeline(tmp_path, n_targets=6, record_frames=False)
    port = _free_port_pair()
    configs = _network_configs(ours, port, link_timeout_s=2.0, command_timeout_s=0.5, command_tries=2)
    stage_dir = Path(configs.pipeline.runs_dir) / "test" / "iter_1" / "collect"
    with serve_twin(ours, port, "--speed", "1") as process:
        robot = NetworkRobot(configs.robot, configs.pipeline.network)
        threading.Timer(2.0, process.kill).start()
        with pytest.raises(HardwareError, match="no telemetry for 2 s .* are kept"):
            run_collect(configs, 1, robot=robot)
        robot.close()
    assert complete_stage_ref(stage_dir) is None
    (folder,) = [p for p in stage_dir.iterdir() if p.is_dir() and p.name != "plots"]
    partial, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    assert not meta.complete and "no telemetry" in meta.model_extra["incomplete_reason"]
    assert 1.0 <= partial["t"].max() <= 3.0
    with serve_twin(ours, port, "--speed", "0"):
        ref, summary = run_collect(configs, 1)
    assert read_manifest(ref)["complete"] and summary["resumed_from_segment"] == int(partial["segment"].max())
    assert summary["targets_reached"] == summary["n_targets"]


def test_a_robot_of_another_protocol_version_is_refused(tmp_path: Path) -> None:
    pipeline = write_test_pipeline(tmp_path, n_targets=2, record_frames=False)
    port = _free_port_pair()
    with serve_twin(pipeline, port, "--protocol-version", "2"):
        configs = _network_configs(pipeline, port)
        with pytest.raises(VersionMismatch, match="speaks protocol version 2, not version 1"):
            NetworkRobot(configs.robot, configs.pipeline.network)


def test_no_robot_is_a_clear_error_on_the_command_line(tmp_path: Path) -> None:
    pipeline = write_test_pipeline(tmp_path, n_targets=2, record_frames=False)
    port = _free_port_pair()
    result = subprocess.run(
        [
            *(str(R2S2R), "collect", "-c", str(pipeline), "--set", "hardware_backend=network"),
            *("--set", f"network.port={port}", "--set", "network.connect_timeout_s=1"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert f"robot at tcp://127.0.0.1:{port} did not answer 'hello'" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def test_a_network_robot_needs_no_twin_config(tmp_path: Path) -> None:
    pipeline = write_test_pipeline(tmp_path, n_targets=2)
    data = yaml.safe_load(pipeline.read_text())
    data.update(hardware_backend="network", hardware_config=None)
    pipeline.write_text(yaml.safe_dump(data))
    configs = load_all(pipeline)
    assert configs.twin is None and configs.pipeline.network.port == 5555
    with pytest.raises(ConfigError, match="no hardware_config: there is no twin's truth"):
        truth_errors(configs, {"friction": 0.5})
    with pytest.raises(ConfigError, match="hardware_backend 'twin' needs hardware_config"):
        load_all(pipeline, {"hardware_backend": "twin"})
    with pytest.raises(ConfigError, match="concurrent_runs needs a robot per run"):
        load_all(pipeline, {"redeploy.concurrent_runs": True})


def test_a_truth_whose_sample_was_lost_takes_the_next_samples_target(tmp_path: Path) -> None:
    """The first sample lost on the wire: the truth of that tick still goes in, with the target of
    the first sample that came (the run holds one target per segment)."""
    identity = RecordingIdentity("c", 1, "p", "hash", 50.0, (0, 1, 2), 3.0)
    recording = Recording(tmp_path, identity, None, checkpoint_every_s=1.0)
    truth = GroundTruthPacket(0.0, 0, np.zeros((6, 3)), np.zeros((3, 3)), np.tile([1.0, 0, 0, 0], (3, 1)))
    recording.add(GapPacket(0.0, 0.02, 1))
    recording.add(truth)
    target = np.full(6, 0.25)
    quats = {r: np.array([1.0, 0, 0, 0]) for r in range(3)}
    recording.add(SensorPacket(0.02, 0, target, np.zeros(6), np.full(9, 0.2), quats, np.zeros(6)))
    recording.add(dataclasses.replace(truth, t_s=0.02))
    recording.close(complete=True)
    rows, meta = read_trajectory(tmp_path / GROUNDTRUTH_FILE, expect_source="groundtruth")
    assert rows["t"].tolist() == [0.0, 0.02] and (rows[TARGET_COLS].to_numpy() == 0.25).all()
    assert [(g.t_start_s, g.t_end_s, g.missing) for g in meta.gaps] == [(0.0, 0.02, 1)]


def test_a_malformed_message_from_the_robot_fails_the_run_naming_the_field(default_configs: LoadedConfigs) -> None:
    """A robot (here a bare peer on the loopback) that answers the protocol but sends a sample
    without its cable lengths: the run stops with the field named, after what came before it."""
    port = _free_port_pair()
    context = zmq.Context()
    router, publisher = context.socket(zmq.ROUTER), context.socket(zmq.PUB)
    router.bind(f"tcp://127.0.0.1:{port}")
    publisher.bind(f"tcp://127.0.0.1:{port + 1}")
    good = Sample(
        run=2, seq=0, t_s=0.0, segment=0, reached=False, target=[1.0] * 6, control=[0.0] * 6,
        cable_m=[0.2] * 9, imu={0: [1, 0, 0, 0]}, motor_rad=[0.0] * 6,
    )  # fmt: skip
    bad = {**good.model_dump(), "seq": 1, "t_s": 0.02}
    del bad["cable_m"]
    stop = threading.Event()

    def robot() -> None:
        cables = [list(p) for p in cable_pairs(default_configs.robot)]
        while not stop.is_set():
            publisher.send(encode(Heartbeat(t_s=0.0, state="idle", run=-1, sent=0)))
            if not router.poll(100):
                continue
            sender, data = router.recv_multipart()
            command = msgpack.unpackb(data, strict_map_key=False)
            if command["type"] == "hello":
                reply = Welcome(id=command["id"], robot="bare", cables=cables, control_rate_hz=50.0, imu_rods=[0],
                                telemetry_port=port + 1)  # fmt: skip
            else:
                reply = Ack(id=command["id"])
            router.send_multipart([sender, encode(reply)])
            if command["type"] == "run_targets":
                publisher.send(encode(good.model_copy(update={"run": command["id"]})))
                publisher.send(msgpack.packb({**bad, "run": command["id"]}))

    thread = threading.Thread(target=robot, daemon=True)
    thread.start()
    network = default_configs.pipeline.network.model_copy(update={"port": port, "connect_timeout_s": 10.0})
    client = NetworkRobot(default_configs.robot, network)
    received = []
    try:
        with pytest.raises(
            ProtocolError, match=f"robot at tcp://127.0.0.1:{port}: message 'sample': field 'sample.cable_m'"
        ):
            for packet in client.execute(random_policy(default_configs.robot, 1, seed=0), 1.0, record_frames=False):
                received.append(packet)
    finally:
        client.close()
        stop.set()
        thread.join(timeout=10)
        context.destroy(linger=0)
    assert [p.t_s for p in received] == [0.0]  # what came before the bad message was handed on
