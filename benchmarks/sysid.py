"""Sysid figures: wall time, steps, per-parameter error on engine and twin data, held-out gap.

Two datasets, each a random policy identified with the stage's defaults (KFL: motor
speed warmed up by Adam lr 0.1, then motor speed + friction + restitution by CMA-ES on
the robust KFL, then gait-wise multiple shooting of the three; ``configs/pipeline/default.yaml``):

* **engine data**: the engine itself with known parameters (motor speed 0.7,
  friction 0.5, restitution 0.3), end caps at 10 Hz with 2 mm Gaussian noise, cable
  readings with 1 mm: the error of each identified value;
* **twin data**: the MuJoCo twin (hidden parameters, soft contact, sensor bias,
  latency, per-motor speed spread), its ground-truth end caps at the camera rate with
  2 mm noise standing in for the tracker (``benchmarks.tracking`` measures the
  tracker): the error against the twin's truth where the engine has a counterpart,
  and the held-out key-frame error before (robot-config values) and after. As in the
  stage, the control latency is chosen from ``sysid.latency.grid_s`` first
  (:func:`tasks.sysid.latency_robot`); the engine has the twin's true attachment points
  (the attach stage's estimate is ``benchmarks.tracking``'s), so the figures are of sysid alone.

Anchor, same twin data: MuJoCo's own ``mujoco.sysid`` (``benchmarks.sysid_mujoco``).
Prints one JSON object (last line). ``--quick``: short trajectories, few steps;
``--coverage N``: also identify on N twin recordings (seeds 1..N) and count, per parameter, on how
many the sysid report's interval (:func:`pipeline.sysid.report.intervals`) holds the twin's
truth, with the intervals' median half-width (% of the value);
``--gait-shooting STEPS``: the steps per round of gait-wise multiple shooting after the search
(``pipeline.sysid.shooting``; 0: off).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import pandas as pd
import torch

from benchmarks.sysid_mujoco import mujoco_sysid_anchor, twin_recording
from pipeline.config import LoadedConfigs, RobotConfig, SysidConfig, load_all
from pipeline.physics import Engine, Params, RobotModel
from pipeline.policies import random_policy
from pipeline.sysid.data import Recording, split_gaits
from pipeline.sysid.identify import identify_staged
from pipeline.sysid.latency import latency_robot
from pipeline.sysid.losses import make_loss
from pipeline.sysid.report import intervals
from pipeline.sysid.synthetic import engine_recording
from pipeline.sysid.validate import replay, split_holdout
from pipeline.truth import twin_true_params
from storage.trajectory import CABLE_COLS, CAP_COLS, CONTROL_COLS, TARGET_COLS

ENGINE_TRUTH = {"motor_speed": 0.7, "friction": 0.5, "restitution": 0.3}
CAPS_NOISE_M = 0.002
CABLE_NOISE_M = 0.001
TIMEOUT_S = 8.0


def twin_data(configs: LoadedConfigs, n_targets: int, seed: int) -> tuple[Recording, pd.DataFrame, pd.DataFrame]:
    """A random policy on the twin: the recording (ground-truth caps at the camera rate with
    tracking-level noise) and the hardware and (noisy) caps frames the MuJoCo anchor reads."""
    sensors, caps = twin_recording(configs.robot, configs.twin, n_targets, seed, TIMEOUT_S)
    noisy = caps[CAP_COLS].to_numpy() + np.random.default_rng(seed).normal(0.0, CAPS_NOISE_M, (len(caps), 18))
    caps[CAP_COLS] = noisy
    recording = Recording(
        name=f"twin-{seed}",
        t_s=sensors["t"].to_numpy(),
        segment=sensors["segment"].to_numpy(),
        targets=sensors[TARGET_COLS].to_numpy(),
        control=sensors[CONTROL_COLS].to_numpy(),
        cables_m=sensors[CABLE_COLS].to_numpy(),
        caps_t_s=caps["t"].to_numpy(),
        caps_m=noisy.reshape(-1, 6, 3),
    )
    return recording, sensors, caps


def run(
    robot: RobotConfig, recording: Recording, config: SysidConfig, holdout: float, latency: bool, compiled: bool
) -> dict[str, object]:
    """Identify on ``recording`` (minus the held-out tail; with ``latency``, after choosing the
    control latency as the stage does) and replay the held-out gaits; ``compiled``: the engines'
    setting (the config's ``engine.compiled``)."""
    gaits = split_gaits(recording, robot, TIMEOUT_S)
    fit, held = split_holdout(gaits, holdout)
    start = Params.from_robot(robot)
    began = time.perf_counter()
    configured = robot
    choice = None
    if latency:
        robot, choice = latency_robot(robot, {recording.name: recording}, fit, config, TIMEOUT_S, compiled)
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=compiled)
    loss = make_loss(engine, robot, {recording.name: recording}, fit, start, config, TIMEOUT_S)
    result = identify_staged(loss, start, config)
    wall_s = time.perf_counter() - began
    out: dict[str, object] = {
        "trajectory_s": float(recording.t_s[-1] - recording.t_s[0]),
        "gaits_fit": len(fit),
        "gaits_held_out": len(held),
        "wall_s": wall_s,
        "steps": result.iterations,
        "steps_by_method": dict(collections.Counter(step.method for step in result.history)),
        "converged": result.converged,
        "identified": result.values,
        "latency_s": robot.pid.latency_s,
        "latency_scores": {f"{1000 * k:.0f}ms": v for k, v in choice.scores.items()} if choice else {},
        "profile": result.profile,
        "standard_error": result.standard_error,
        "interval": intervals(result),
    }
    if held:
        before_engine = Engine(RobotModel.from_robot(configured), dt=config.dt_s, compiled=compiled)
        before = replay(before_engine, start, configured, recording, held, config, TIMEOUT_S)
        after = replay(engine, result.params, robot, recording, held, config, TIMEOUT_S)
        out["holdout_before"] = before.metrics("")
        out["holdout_after"] = after.metrics("")
        out["holdout_key_frame_error_reduction_pct"] = 100 * (1 - after.key_frame_error_m / before.key_frame_error_m)
    return out


def coverage(
    configs: LoadedConfigs, robot: RobotConfig, config: SysidConfig, seeds: int, n_targets: int, compiled: bool
) -> dict[str, object]:
    """Identify on ``seeds`` twin recordings (seeds 1..N, ``n_targets`` random targets each) and
    count, per identified parameter, the recordings whose interval holds the twin's truth;
    with each interval's half-width (largest reach from the value, % of the value)."""
    truth = twin_true_params(robot, configs.twin)
    inside: dict[str, int] = collections.Counter()
    widths: dict[str, list[float]] = collections.defaultdict(list)
    runs = []
    for seed in range(1, seeds + 1):
        recording, _, _ = twin_data(configs, n_targets, seed)
        result = run(robot, recording, config, config.data.holdout_fraction, latency=True, compiled=compiled)
        for name, (low, high) in result["interval"].items():
            value, true = result["identified"][name], float(getattr(truth, name)[0])
            inside[name] += int(low <= true <= high)
            widths[name].append(100 * max(value - low, high - value) / abs(value))
        runs.append({"seed": seed, "identified": result["identified"], "interval": result["interval"]})
    return {
        "recordings": seeds,
        "truth_inside": dict(inside),
        "median_half_width_pct": {name: float(np.median(w)) for name, w in widths.items()},
        "runs": runs,
    }


def errors(identified: dict[str, float], truth: dict[str, float]) -> dict[str, float]:
    return {f"{n}_error_pct": 100 * (identified[n] - truth[n]) / truth[n] for n in identified if truth.get(n)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short trajectories and few steps (under a minute)")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=100, help="random targets per trajectory (~0.5 s each)")
    parser.add_argument("--no-anchor", action="store_true", help="skip the mujoco.sysid anchor")
    parser.add_argument("--coverage", type=int, metavar="N", default=0, help="intervals' coverage on N recordings")
    parser.add_argument(
        "--gait-shooting", type=int, metavar="STEPS", help="sysid.gait_shooting.iterations (default: the config's)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot = configs.robot
    n_targets = 6 if args.quick else args.targets
    config = configs.pipeline.sysid
    if args.gait_shooting is not None:
        config = config.updated({"gait_shooting.iterations": args.gait_shooting})
    if args.quick:
        config = config.updated(
            {
                "gradient.iterations": 3,
                "gradient.warmup_iterations": 2,
                "gradient.min_iterations": 1,
                "gradient.average_last": 1,
                "latency.grid_s": (0.0, 0.06),
                "search.generations": 2,
                "search.population": 4,
            }
        )

    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    synthetic = engine_recording(
        engine,
        Params.from_robot(robot, **ENGINE_TRUTH),
        robot,
        random_policy(robot, n_targets, seed=2).targets,
        caps_noise_m=CAPS_NOISE_M,
        cable_noise_m=CABLE_NOISE_M,
    )
    compiled = configs.pipeline.engine.compiled
    engine_result = run(robot, synthetic, config, holdout=0.0, latency=False, compiled=compiled)
    engine_result["truth"] = ENGINE_TRUTH
    engine_result.update(errors(engine_result["identified"], ENGINE_TRUTH))

    recording, sensors, caps = twin_data(configs, n_targets, seed=0)
    attachment = robot.attachment.model_copy(update={"phase_rad": configs.twin.attachment_phase_rad})
    twin_robot = robot.model_copy(update={"attachment": attachment})
    twin_result = run(twin_robot, recording, config, config.data.holdout_fraction, latency=True, compiled=compiled)
    truth = twin_true_params(robot, configs.twin)
    twin_truth = {n: float(getattr(truth, n)[0]) for n in config.parameters}
    twin_result["truth"] = twin_truth
    twin_result.update(errors(twin_result["identified"], twin_truth))

    figures: dict[str, object] = {"engine_data": engine_result, "twin_data": twin_result}
    if args.coverage:
        figures["coverage"] = coverage(configs, twin_robot, config, args.coverage, n_targets, compiled)
    if not args.no_anchor:
        anchor = mujoco_sysid_anchor(
            robot,
            configs.twin,
            sensors,
            caps,
            max_seconds=15.0 if args.quick else 300.0,
            parameters=("friction", "motor_speed"),
        )
        figures["anchor_mujoco_sysid"] = anchor
    print(json.dumps(figures, default=float))


if __name__ == "__main__":
    main()
