"""The same gaits on the twin and in the engine given the twin's own values, with and without
control latency: how far the engine's rolling and turning are from the twin's when no parameter
is wrong, the structural part of the sim-to-real gap that sysid cannot identify away.

For each control latency (the twin's hidden one, and 0 in both models), each policy runs once on
the twin from its rest pose (ground truth, not tracked) and once in the engine with
:func:`~pipeline.truth.twin_true_params` and the twin's true attachment points, started
from the twin's rest end caps and settled, all policies as one engine batch. Policies: the
published gaits (Tribar paper), one cycle each, and any ``policy.json`` given with ``--policy`` (a
redeploy run's folder holds one).

Prints one JSON object (last line): per latency and policy the twin's and the engine's forward
motion (m, along the start heading) and heading change (deg), and the engine's error in each;
the mean absolute errors over all of them; the wall time of the twin (the anchor) and of the
engine.

Usage: ``python -m benchmarks.gait_transfer [--policy runs/<campaign>/iter_1/redeploy/<run>/policy.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

from pipeline.config import LoadedConfigs, load_all
from pipeline.gaits.outcome import simulate_targets
from pipeline.hardware.base import GroundTruthPacket
from pipeline.hardware.twin import MujocoTwin
from pipeline.metrics import motion_in_start_frame
from pipeline.physics import Engine
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.policies import Policy, gait_policy
from pipeline.published_gaits import PUBLISHED_GAITS
from pipeline.truth import twin_true_model, twin_true_params

SEGMENT_TIMEOUT_S = 3.0
"""Per target, on both sides (the redeploy stage's default)."""


def twin_motion(configs: LoadedConfigs, latency_s: float, policies: dict[str, Policy]) -> tuple[dict, np.ndarray]:
    """Each policy on the twin (its control latency set to ``latency_s``) from its rest pose:
    {name: (forward m, lateral m, heading change deg)} and the rest end caps (6, 3)."""
    twin = MujocoTwin(configs.robot, configs.twin.model_copy(update={"control_latency_s": latency_s}))
    out = {}
    try:
        for name, policy in policies.items():
            twin.reset(seed=configs.twin.seed)
            packets = twin.execute(policy, SEGMENT_TIMEOUT_S, record_frames=False)
            caps = np.array([p.caps_m for p in packets if isinstance(p, GroundTruthPacket)])
            out[name] = motion_in_start_frame(caps)
        return out, caps[0]
    finally:
        twin.close()


def engine_motion(
    configs: LoadedConfigs, latency_s: float, policies: dict[str, Policy], start_caps_m: np.ndarray, dt_s: float
) -> dict[str, tuple[float, float, float]]:
    """Each policy in the engine with the twin's values and control latency ``latency_s``, from
    ``start_caps_m`` (6, 3) settled: {name: (forward m, lateral m, heading change deg)}."""
    robot = configs.robot.model_copy(update={"pid": configs.robot.pid.model_copy(update={"latency_s": latency_s})})
    engine = Engine(twin_true_model(robot, configs.twin), dt=dt_s)
    out = {}
    for length in sorted({len(p.targets) for p in policies.values()}):
        names = [n for n, p in policies.items() if len(p.targets) == length]
        params = twin_true_params(robot, configs.twin, batch=len(names))
        caps = np.repeat(start_caps_m[None], len(names), 0)
        state = settle(engine, params, state_from_caps(engine, params, caps), robot.pid, np.ones(6), duration_s=1.0)
        targets = np.stack([policies[n].targets for n in names])
        outcome = simulate_targets(engine, params, robot, state, targets, SEGMENT_TIMEOUT_S)
        finished = outcome.trace.finished.numpy()
        for row, name in enumerate(names):
            end = int(finished[row].argmax()) if finished[row].any() else finished.shape[1] - 1
            out[name] = motion_in_start_frame(outcome.trace.caps_m[row, : end + 1].numpy())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--policy", type=Path, nargs="*", default=[], help="policy.json files to add")
    parser.add_argument("--dt", type=float, default=0.001, help="engine time step (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    configs = load_all(args.config)
    policies = {name: gait_policy(configs.robot, name, 1) for name in PUBLISHED_GAITS}
    for path in args.policy:
        recorded = json.loads(path.read_text())
        key = path.parent.name  # a redeploy run's folder; a repeated name gets its position
        key = key if key not in policies else f"{key}-{len(policies)}"
        policies[key] = Policy(name=recorded["name"], targets=np.asarray(recorded["targets"], float))
    result: dict[str, object] = {"engine_dt_s": args.dt, "twin_wall_s": 0.0, "engine_wall_s": 0.0}
    for latency_s in (configs.twin.control_latency_s, 0.0):
        start = time.perf_counter()
        twin, rest_caps = twin_motion(configs, latency_s, policies)
        middle = time.perf_counter()
        engine = engine_motion(configs, latency_s, policies, rest_caps, args.dt)
        result["twin_wall_s"] += middle - start
        result["engine_wall_s"] += time.perf_counter() - middle
        for name in policies:
            key = f"latency_{latency_s:g}s.{name}"
            result[f"{key}.twin_forward_m"] = twin[name][0]
            result[f"{key}.engine_forward_m"] = engine[name][0]
            result[f"{key}.forward_error_m"] = engine[name][0] - twin[name][0]
            result[f"{key}.twin_turn_deg"] = twin[name][2]
            result[f"{key}.engine_turn_deg"] = engine[name][2]
            result[f"{key}.turn_error_deg"] = engine[name][2] - twin[name][2]
    for figure in ("forward_error_m", "turn_error_deg"):
        errors = [abs(v) for k, v in result.items() if k.endswith(f".{figure}")]
        result[f"mean_abs_{figure}"] = float(np.mean(errors))
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
