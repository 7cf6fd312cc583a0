"""Sim-to-sim accuracy and cost of the learned contact (the hybrid graph-network paper's Table 1).

Ground truth: the MuJoCo twin's end caps at every control tick, running random policies and the
published gaits (``--random`` policies of ``--targets`` targets, ``--cycles`` cycles of each gait),
split 50/25/25 by trajectory into training, validation and test. On the test trajectories each
engine replays the recorded commands open loop from the second tick's state, and is scored as
the paper scores (:func:`pipeline.metrics.rollout_errors`): ``e_pos_pct`` (centre-of-mass distance
in % of the rod length), ``e_rot_deg`` (rod axes), ``e_pen_pct`` / ``e_pen_mm`` (sinking beyond
the truth's), each averaged over the rollout; and the short-horizon figure the training optimises,
the mean node distance after 8 ticks over every window of the test trajectories; and how much the
start states built from the data matter (:func:`start_state_errors`). Engines:

- ``analytic_config``: the analytic engine with the robot config's values (5 ms step);
- ``analytic_twin``: the analytic engine with the twin's own values where the engine has them;
- ``learned``: the hybrid engine (analytic cables, motors and gravity with the twin's values,
  learned contact) trained on the training trajectories with the ``learn`` config's model,
  pre-training curriculum and settings (``--epochs`` overrides the curriculum's epochs; an epoch
  draws ``--windows-per-epoch`` windows);
- ``learned_compiled``, ``learned_compiled_bfloat16``: the same network, its rollouts compiled
  (``learn.model.compile_rollouts``), the second with the network in bfloat16
  (``learn.model.inference_dtype``).

Also the training's wall time, and each engine's throughput in simulated robot-seconds per
wall-second at 1 and ``--batch`` environments (no gradients), measured in the same run.

    python -m benchmarks.learned_contact [--random 68] [--epochs 8,4,2,1] [--windows-per-epoch 12000]
        [--quick] [--set key.path=value]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time

import numpy as np
import torch

from flows.cli import parse_overrides
from pipeline.config import LoadedConfigs, load_all
from pipeline.hardware.twin import MujocoTwin
from pipeline.learned.data import StatesAlong, Trajectory, states_along, windows
from pipeline.learned.engine import LearnedEngine
from pipeline.learned.graph import RobotGraph
from pipeline.learned.simulated import mujoco_trajectory
from pipeline.learned.training import final_node_error_m, train
from pipeline.metrics import rollout_errors
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import run_commands
from pipeline.policies import gait_policy, random_policy
from pipeline.published_gaits import PUBLISHED_GAITS
from pipeline.truth import twin_true_model, twin_true_params
from storage.contact_model import build_network

WINDOW_TICKS = 8
"""The short horizon (control ticks, 0.16 s at 50 Hz) of the window figure."""


def throughput(engine: Engine, params: Params, along: StatesAlong, batch: int, ticks: int, tick_s: float) -> float:
    """Simulated robot-seconds per wall-second of ``engine`` at ``batch`` environments replaying
    ``ticks`` of ``along``'s commands from its second state."""
    start = along.states.index(torch.tensor([1])).repeat(batch)
    commands = along.applied[None, 1 : 1 + ticks].expand(batch, -1, -1)
    with torch.no_grad():
        run_commands(engine, params.expand(batch), start, commands[:, :2], tick_s)  # warm-up
        began = time.perf_counter()
        run_commands(engine, params.expand(batch), start, commands, tick_s)
        wall = time.perf_counter() - began
    return batch * ticks * tick_s / wall


def start_state_errors(
    trajectories: list[Trajectory], test: np.ndarray, graph: RobotGraph, configs: LoadedConfigs
) -> dict[str, dict[str, float]]:
    """How much the start states matter: the analytic engine with the twin's own values, from the
    states along the test trajectories built with the rod frames' convention and the motor model,
    with the winch angles, and with the true rolls as well; the mean node error (mm) after 1 and
    ``WINDOW_TICKS`` ticks."""
    robot, twin = configs.robot, configs.twin
    engine, params = Engine(twin_true_model(robot, twin), dt=0.005), twin_true_params(robot, twin)
    tick_s = 1.0 / robot.pid.control_rate_hz
    variants = {
        "convention_motor_model": {"rolls_rad": None, "motor_rad": None},
        "winch_angles": {"rolls_rad": None},
        "winch_angles_true_rolls": {},
    }
    out = {}
    for name, changes in variants.items():
        along = [
            states_along(engine, params, graph, dataclasses.replace(trajectories[i], **changes), twin.control_latency_s)
            for i in test
        ]
        out[name] = {
            f"{k}_ticks_node_error_mm": 1000 * final_node_error_m(engine, params, windows(along, k), graph, tick_s)
            for k in (1, WINDOW_TICKS)
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--random", type=int, default=68, help="random policies (each one trajectory)")
    parser.add_argument("--targets", type=int, default=20, help="targets per random policy")
    parser.add_argument("--cycles", type=int, default=3, help="cycles of each published gait")
    parser.add_argument("--epochs", help="epochs of each curriculum length, comma-separated")
    parser.add_argument(
        "--windows-per-epoch", type=int, default=12000, help="training windows drawn per epoch (0: every window)"
    )
    parser.add_argument("--batch", type=int, default=1024, help="environments of the batched throughput")
    parser.add_argument("--quick", action="store_true", help="a few short trajectories and epochs (a smoke test)")
    parser.add_argument("--set", action="append", help="override a config value: key.path=value (YAML), as the CLI")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    configs = load_all(args.config, parse_overrides(args.set))
    robot, learn = configs.robot, configs.pipeline.learn
    curriculum = learn.pretrain.curriculum
    if args.quick:
        args.random, args.targets, args.cycles, args.batch = 4, 6, 1, 64
        curriculum = curriculum.updated({"lengths": [1, 2], "epochs": [2, 1], "learning_rates": [1e-3, 5e-4]})
    else:
        curriculum = curriculum.updated({"windows_per_epoch": args.windows_per_epoch or None})
        if args.epochs:
            curriculum = curriculum.updated({"epochs": [int(e) for e in args.epochs.split(",")]})
    tick_s = 1.0 / robot.pid.control_rate_hz

    began = time.perf_counter()
    twin = MujocoTwin(robot, configs.twin)
    policies = [random_policy(robot, args.targets, 100 + k) for k in range(args.random)]
    policies += [gait_policy(robot, name, args.cycles) for name in PUBLISHED_GAITS]
    trajectories = [mujoco_trajectory(twin, p, configs.pipeline.redeploy.segment_timeout_s) for p in policies]
    data_s = time.perf_counter() - began
    order = np.random.default_rng(0).permutation(len(trajectories))
    n_val = n_test = max(1, len(order) // 4)
    test, validation, training = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]

    true_model, true_params = twin_true_model(robot, configs.twin), twin_true_params(robot, configs.twin)
    latency = configs.twin.control_latency_s
    network = build_network(true_model, learn.model, learn.seed)
    learned = LearnedEngine.of(true_model, network, learn.model)
    along = [states_along(learned, true_params, network.graph, t, latency) for t in trajectories]
    result = train(
        learned,
        true_params,
        [along[i] for i in training],
        [along[i] for i in validation],
        tick_s,
        learn,
        curriculum,
    )

    fast = {
        "learned_compiled": {"compile_rollouts": True},
        "learned_compiled_bfloat16": {"compile_rollouts": True, "inference_dtype": "bfloat16"},
    }
    engines = {
        "analytic_config": (Engine(RobotModel.from_robot(robot), dt=0.005), Params.from_robot(robot)),
        "analytic_twin": (Engine(true_model, dt=0.005), true_params),
        "learned": (learned, true_params),
        **{
            name: (LearnedEngine.of(true_model, network, learn.model.updated(changes)), true_params)
            for name, changes in fast.items()
        },
    }
    figures: dict[str, object] = {"start_states": start_state_errors(trajectories, test, network.graph, configs)}
    short = windows([along[i] for i in test], WINDOW_TICKS)
    for name, (engine, params) in engines.items():
        errors = []
        for i in test:
            with torch.no_grad():
                caps = run_commands(
                    engine, params, along[i].states.index(torch.tensor([1])), along[i].applied[None, 1:-1], tick_s
                )
            errors.append(rollout_errors(robot, caps[0].numpy(), trajectories[i].caps_m[1:]))
        figures[name] = {key: float(np.mean([e[key] for e in errors])) for key in errors[0]}
        figures[name][f"window_{WINDOW_TICKS}_ticks_node_error_mm"] = 1000 * final_node_error_m(
            engine, params, short, network.graph, tick_s
        )
        ticks = 50
        figures[name]["robot_s_per_s_batch1"] = throughput(engine, params, along[test[0]], 1, ticks, tick_s)
        figures[name][f"robot_s_per_s_batch{args.batch}"] = throughput(
            engine, params, along[test[0]], args.batch, 10, tick_s
        )
    print(
        json.dumps(
            {
                "trajectories": {"train": len(training), "validation": len(validation), "test": len(test)},
                "robot_seconds": sum(len(t) for t in trajectories) * tick_s,
                "twin_data_wall_s": data_s,
                "training_wall_s": result.history[-1].wall_s,
                "best_epoch": result.best.epoch,
                "validation_loss": result.best.validation_loss,
                "model": learn.model.model_dump(),
                "epochs": list(curriculum.epochs),
                "engines": figures,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
