"""Twin speed and the published rolling gait on the twin.

Prints one JSON object (last line of stdout):

* ``rtf_no_render`` / ``rtf_render``: simulated seconds per wall second of the twin
  running a random policy, without and with RGB-D frames (camera as configured);
* ``anchor_mujoco_rtf``: the same MuJoCo model stepped bare (``mj_step``, no
  Python cable forces, PID or sensors): the upper bound the twin's Python layer costs
  us against;
* ``render_ms_per_frame``: wall time of one RGB + depth render;
* ``rolling_*``: the published rolling gait (Tribar paper) from rest: forward/backward rolls
  (face changes that last 0.5 s), centroid distance per roll (m) and per full 6-target cycle, and segment timeouts.

Usage: ``python -m benchmarks.twin [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import numpy as np

from pipeline.config import load_all
from pipeline.gaits.symmetry import bottom_face, count_rolls
from pipeline.hardware.base import FramePacket, GroundTruthPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import gait_policy, random_policy


def _timed_run(twin: MujocoTwin, policy, frames: bool) -> tuple[float, float, list]:
    twin.reset()
    start = time.perf_counter()
    packets = list(twin.execute(policy, segment_timeout_s=8.0, record_frames=frames))
    wall = time.perf_counter() - start
    truth = [p for p in packets if isinstance(p, GroundTruthPacket)]
    return truth[-1].t_s, wall, packets


def _bare_mujoco_rtf(twin: MujocoTwin, sim_s: float) -> float:
    model, data = twin.model, twin.data
    twin.reset()
    steps = round(sim_s / model.opt.timestep)
    start = time.perf_counter()
    for _ in range(steps):
        mujoco.mj_step(model, data)
    return sim_s / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small version (under a minute)")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    configs = load_all(args.config)
    twin = MujocoTwin(configs.robot, configs.twin)
    n_targets = 4 if args.quick else 12
    policy = random_policy(configs.robot, n_targets=n_targets, seed=0)
    sim_plain, wall_plain, _ = _timed_run(twin, policy, frames=False)
    sim_render, wall_render, packets = _timed_run(twin, policy, frames=True)
    n_frames = sum(isinstance(p, FramePacket) for p in packets)
    render_start = time.perf_counter()
    for _ in range(5):
        twin.render(0.0)
    render_ms = (time.perf_counter() - render_start) / 5 * 1000
    anchor = _bare_mujoco_rtf(twin, 2.0 if args.quick else 10.0)

    cycles = 1 if args.quick else 2
    rolling = gait_policy(configs.robot, "rolling", cycles=cycles)
    twin.reset()
    faces, segments, centroids = [], [], []
    for packet in twin.execute(rolling, segment_timeout_s=8.0, record_frames=False):
        if isinstance(packet, GroundTruthPacket):
            faces.append(bottom_face(packet.caps_m))
            segments.append(packet.segment)
            centroids.append(packet.caps_m.mean(axis=0))
    centroids = np.array(centroids)
    forward, backward = count_rolls(np.array(faces), min_dwell=round(0.5 * configs.robot.pid.control_rate_hz))
    distance = float(np.linalg.norm(centroids[-1, :2] - centroids[0, :2]))
    twin.close()
    result = {
        "rtf_no_render": sim_plain / wall_plain,
        "rtf_render": sim_render / wall_render,
        "anchor_mujoco_rtf": anchor,
        "render_ms_per_frame": render_ms,
        "camera_px": f"{configs.twin.camera.width_px}x{configs.twin.camera.height_px}",
        "camera_rate_hz": configs.twin.camera.rate_hz,
        "frames_rendered": n_frames,
        "random_policy_sim_s": sim_plain,
        "rolling_cycles": cycles,
        "rolling_rolls_expected": 3 * cycles,
        "rolling_forward_rolls": forward,
        "rolling_backward_rolls": backward,
        "rolling_distance_m": distance,
        "rolling_distance_per_roll_m": distance / (3 * cycles),
        "rolling_distance_per_cycle_m": distance / cycles,
        "rolling_sim_s": float(len(segments) / configs.robot.pid.control_rate_hz),
        "rolling_start_face": faces[0],
        "rolling_end_face": faces[-1],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
