"""Gait-wise multiple shooting (:mod:`pipeline.sysid.shooting`) alone on engine data.

Engine data as in ``benchmarks.sysid`` (motor speed 0.7, friction 0.5, restitution 0.3; a
random policy, end caps at 10 Hz with 2 mm noise, cable lengths at 50 Hz with 1 mm). Every gait
is one window with its start state free, joined to the next by continuity; the ``--parameters``
are refined from ``--start`` (default: the robot config's values) by
:class:`~pipeline.sysid.shooting.GaitShooting` with ``--weights`` and ``--restarts`` (default: the
config's) and ``--iterations`` steps per weight and round. The sysid stage runs the same after its
search when ``sysid.gait_shooting_iterations`` is set; from the robot config's values it shows what
shooting recovers alone. Prints one JSON line per iteration and one JSON object (last line): the
answer, its errors in %, the data's cost against the residual count, the remaining continuity
defects per part (in the coordinates' scales) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import torch

from benchmarks.sysid import CABLE_NOISE_M, CAPS_NOISE_M, ENGINE_TRUTH, TIMEOUT_S
from pipeline.config import load_all
from pipeline.physics import Engine, Params, RobotModel
from pipeline.policies import random_policy
from pipeline.sysid.data import split_gaits
from pipeline.sysid.losses import KeyFrameLoss
from pipeline.sysid.parameters import ParameterSpace
from pipeline.sysid.result import Step
from pipeline.sysid.shooting import GaitShooting
from pipeline.sysid.synthetic import engine_recording

NAMES = tuple(ENGINE_TRUTH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=140, help="random targets (~0.43 s each; 140: 60 s)")
    parser.add_argument("--seed", type=int, default=2, help="random-policy seed")
    parser.add_argument("--weights", type=float, nargs="+", help="continuity weights (default: the config's)")
    parser.add_argument("--iterations", type=int, default=12, help="Levenberg-Marquardt steps per weight and round")
    parser.add_argument("--restarts", type=int, help="rounds after the first (default: the config's)")
    parser.add_argument("--parameters", nargs="+", choices=NAMES, help="refined (default: the config's)")
    parser.add_argument("--start", type=float, nargs=3, metavar=NAMES, help="start values (default: the robot config)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 targets, 3 steps per weight and round")
    args = parser.parse_args()
    if args.quick:
        args.targets, args.iterations = 20, 3
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot = configs.robot
    update: dict[str, object] = {"gait_shooting_iterations": args.iterations}
    if args.weights:
        update["gait_shooting_weights"] = tuple(args.weights)
    if args.restarts is not None:
        update["gait_shooting_restarts"] = args.restarts
    config = configs.pipeline.sysid.model_copy(update=update)
    names = tuple(args.parameters or config.gait_shooting_parameters)
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=configs.pipeline.engine.compiled)
    data = engine_recording(
        engine,
        Params.from_robot(robot, **ENGINE_TRUTH),
        robot,
        random_policy(robot, args.targets, seed=args.seed).targets,
        segment_timeout_s=TIMEOUT_S,
        caps_noise_m=CAPS_NOISE_M,
        cable_noise_m=CABLE_NOISE_M,
    )
    began = time.perf_counter()
    start = Params.from_robot(robot, **(dict(zip(NAMES, args.start, strict=True)) if args.start else {}))
    loss = KeyFrameLoss(engine, robot, {data.name: data}, split_gaits(data, robot, TIMEOUT_S), start, config)
    space = ParameterSpace.configured(names, start, config)

    def show(step: Step) -> None:
        line = {"iteration": step.iteration, "cost": step.loss, "data_cost": step.unfiltered_loss, "damping": step.lr}
        print(json.dumps(line | {"values": step.values, "wall_s": time.perf_counter() - began}), flush=True)

    fit = GaitShooting(loss, space, config).solve(show)
    values = {n: float(getattr(fit.identification.params, n)[0]) for n in NAMES}
    report = {
        "trajectory_s": float(data.t_s[-1]),
        "seed": args.seed,
        "gaits": len(loss.observed.gaits),
        "parameters": names,
        "start": {n: float(getattr(start, n)[0]) for n in NAMES},
        "identified": values,
        "error_pct": {n: 100 * (values[n] - ENGINE_TRUTH[n]) / ENGINE_TRUTH[n] for n in NAMES},
        "steps": fit.identification.iterations,
        "converged": fit.identification.converged,
        "data_cost": fit.data_cost,
        "residual_count": fit.residual_count,
        "defect_rms": fit.defect_rms,
        "wall_s": time.perf_counter() - began,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
