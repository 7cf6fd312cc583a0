"""What a run over the robot protocol keeps and loses under each fault on the wire.

Serves the twin with ``r2s2r serve-twin`` in a process of its own (real time, ``--speed 1``), with
one fault option at a time, runs the same random policy on it through the network backend, and
compares what arrived with the same policy on the in-process twin. Prints one JSON object (last
line of stdout) and, before it, the Markdown table of ``docs/robot-protocol.md``:

* ``samples``: sensor samples the run should have (the in-process twin's), ``kept``: those that
  arrived, each equal to the twin's; ``lost``: the rest;
* ``gaps``: gaps marked, ``longest_gap_s``: the longest (robot time), ``beyond_outage_s``: how much
  of it lies beyond the outage put on the wire (a link down ``--drop-for-s``);
* ``outcome``: ``complete``, or the error the run failed with.

Usage: ``python -m benchmarks.wire_faults [--targets N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import HardwareError
from pipeline.hardware.base import GapPacket, SensorPacket
from pipeline.hardware.network import NetworkRobot
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import random_policy

DROP_S = 2.0
FAULTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "link down 2 s": ("--drop-at-s", "2.0", "--drop-for-s", str(DROP_S)),
    "every message delayed 200 ms": ("--delay-s", "0.2"),
    "5 % of messages lost": ("--loss", "0.05"),
    "10 % of messages out of order": ("--reorder", "0.1"),
    "robot process killed at 3 s": (),
    "robot speaks protocol version 2": ("--protocol-version", "2"),
}
R2S2R = Path(sys.executable).parent / "r2s2r"


def _free_port() -> int:
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def _run(configs: LoadedConfigs, config: str, fault: str, policy, reference: dict[float, np.ndarray]) -> dict:
    port = _free_port()
    server = subprocess.Popen(
        [str(R2S2R), "serve-twin", "-c", config, "--port", str(port), "--speed", "1", *FAULTS[fault]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    network = configs.pipeline.network.model_copy(update={"port": port, "connect_timeout_s": 60.0})
    samples: list[SensorPacket] = []
    gaps: list[GapPacket] = []
    outcome = "complete"
    robot = None
    try:
        robot = NetworkRobot(configs.robot, network)
        robot.reset()
        if fault.startswith("robot process killed"):
            threading.Timer(3.0, server.kill).start()
        for packet in robot.execute(policy, configs.pipeline.collect.segment_timeout_s, record_frames=False):
            if isinstance(packet, SensorPacket):
                samples.append(packet)
            elif isinstance(packet, GapPacket):
                gaps.append(packet)
    except HardwareError as exc:
        outcome = str(exc)
    finally:
        if robot is not None:
            robot.close()
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=20)
    equal = all(np.array_equal(reference.get(p.t_s), p.cable_m) for p in samples)
    longest = max((g.duration_s for g in gaps), default=0.0)
    return {
        "fault": fault,
        "samples": len(reference),
        "kept": len(samples),
        "kept_equal_to_twin": equal,
        "lost": len(reference) - len(samples),
        "gaps": len(gaps),
        "longest_gap_s": round(longest, 3),
        "beyond_outage_s": round(max(0.0, longest - DROP_S), 3) if fault.startswith("link down") else None,
        "last_sample_s": round(samples[-1].t_s, 2) if samples else None,
        "outcome": outcome,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=10, help="random policy length (about 1.4 s a target)")
    args = parser.parse_args()
    configs = load_all(args.config)
    policy = random_policy(configs.robot, args.targets, seed=3)
    twin = MujocoTwin(configs.robot, configs.twin)
    segment_timeout_s = configs.pipeline.collect.segment_timeout_s
    packets = twin.execute(policy, segment_timeout_s, record_frames=False)
    reference = {p.t_s: p.cable_m for p in packets if isinstance(p, SensorPacket)}
    twin.close()
    rows = []
    for fault in FAULTS:
        started = time.perf_counter()
        row = _run(configs, args.config, fault, policy, reference)
        row["wall_s"] = round(time.perf_counter() - started, 1)
        rows.append(row)
    print("| fault | samples kept / sent | lost | gaps marked (longest, s) | beyond the outage (s) | outcome |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        beyond = "" if r["beyond_outage_s"] is None else f"{r['beyond_outage_s']:.2f}"
        gaps = f"{r['gaps']} ({r['longest_gap_s']:.2f})" if r["gaps"] else "0"
        print(f"| {r['fault']} | {r['kept']} / {r['samples']} | {r['lost']} | {gaps} | {beyond} | {r['outcome']} |")
    print(json.dumps({"targets": args.targets, "faults": rows}))


if __name__ == "__main__":
    main()
