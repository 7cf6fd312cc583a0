"""Would rest periods between targets let the Key Frame Loss see friction? Engine data, gait by gait.

The KFL's chunk starts carry velocities that the data do not fix (``benchmarks.sysid_starts``).
Here every target of a random policy is followed by ``--rest`` seconds with the motors stopped,
so each gait starts from a robot at rest (engine data: motor speed 0.7, friction 0.5,
restitution 0.3; end caps at 10 Hz with ``--noise`` Gaussian noise, cables with half that).
Each gait is run alone, target then rest, from one of these starts:

* **exact**: the engine's own state where the gait began;
* **exact, zero velocity**: the same with the contact's resting jitter (about g * dt) removed;
* **exact pose, static rest lengths**: the exact pose with the actuated rest lengths that hold it
  in static equilibrium (:func:`~pipeline.physics.statics.equilibrium_rest_lengths`: with ground
  friction the pose alone does not fix them);
* **observed**: as the stage starts a window from the tracked caps and sensed cables
  (:func:`~pipeline.sysid.windows.window_starts`).

For each start and each parameter set of a grid around the truth (friction, motor speed): the
mean squared end-cap defect of the gaits' displacements (mm², per cap and axis), the median
key-frame error (mm) and the gaits' mean squared horizontal cap displacement (mm²) beside the
data's (noise removed), a statistic that averages over gaits rather than following each one.
Prints one JSON object (last line).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

from benchmarks.sysid import ENGINE_TRUTH, TIMEOUT_S
from pipeline.config import RobotConfig, load_all
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.engine import State
from pipeline.physics.rollout import run_policy
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.policies import random_policy
from pipeline.sysid.data import Recording
from pipeline.sysid.synthetic import recording_start
from pipeline.sysid.windows import window_starts

GRID = {"friction": (0.4, 0.45, 0.48, 0.52, 0.55, 0.6), "motor_speed": (0.68, 0.69, 0.71, 0.72)}
"""Parameter values scored besides the truth (one parameter changed at a time)."""


class RestingPolicy:
    """Runs targets one at a time, each followed by ``rest_s`` with the motors stopped."""

    def __init__(self, engine: Engine, robot: RobotConfig, targets: np.ndarray, rest_s: float) -> None:
        self.engine, self.robot, self.rest_s = engine, robot, rest_s
        self.targets = torch.as_tensor(np.asarray(targets, float)[:, None, :], dtype=engine.model.dtype)
        self.tick_s = 1.0 / robot.pid.control_rate_hz

    def gait(self, params: Params, state: State, rows: torch.Tensor) -> tuple[State, torch.Tensor, torch.Tensor]:
        """Run targets ``rows`` (B,) from ``state`` (B envs), then rest; returns the final state,
        the caps (B, T, 6, 3) and the cable lengths (B, T, 9) at every control tick (m)."""
        with torch.no_grad():
            state, trace = run_policy(
                self.engine,
                params,
                state,
                self.targets[rows],
                self.robot.pid,
                TIMEOUT_S,
                final_hold_s=0.0,
                latency_s=self.robot.pid.latency_s,
            )
            caps, cables = list(trace.caps_m.unbind(1)), list(trace.cables_m.unbind(1))
            still = torch.zeros(state.batch_size, 6, dtype=state.pos.dtype)
            for _ in range(round(self.rest_s / self.tick_s)):
                for _ in range(round(self.tick_s / self.engine.dt)):
                    state = self.engine.step(params, state, still)
                caps.append(self.engine.cap_positions(state))
                cables.append(self.engine.cable_lengths(state))
        return state, torch.stack(caps, 1), torch.stack(cables, 1)


def record(
    policy: RestingPolicy, truth: Params, noise_m: float, seed: int
) -> tuple[Recording, State, np.ndarray, np.ndarray]:
    """The resting policy's recording, the exact state at each gait's start (S envs), and the
    gaits' start and end times (S,) each, s."""
    engine = policy.engine
    rng = np.random.default_rng(seed)
    state = recording_start(engine, truth, policy.robot)
    starts, caps, cables, segments = [], [], [], []
    for row in range(len(policy.targets)):
        starts.append(state)
        state, gait_caps, gait_cables = policy.gait(truth, state, torch.tensor([row]))
        caps.append(gait_caps[0].numpy())
        cables.append(gait_cables[0].numpy())
        segments.append(np.full(len(caps[-1]), row))
    bounds = np.cumsum([0] + [len(c) for c in caps])
    every = round(policy.robot.pid.control_rate_hz / 10.0)
    t = policy.tick_s * np.arange(bounds[-1])
    caps, cables = np.concatenate(caps), np.concatenate(cables)
    recording = Recording(
        name="resting",
        t_s=t,
        segment=np.concatenate(segments),
        targets=policy.targets[np.concatenate(segments), 0].numpy(),
        control=None,
        cables_m=cables + rng.normal(0.0, noise_m / 2, cables.shape),
        caps_t_s=t[::every],
        caps_m=caps[::every] + rng.normal(0.0, noise_m, caps[::every].shape),
    )
    return recording, State.concat(starts), t[bounds[:-1]], t[bounds[1:] - 1]


def profile(policy: RestingPolicy, starts: State, data_disp: np.ndarray) -> dict:
    """Defect, median error and displacement statistic of every grid point, the gaits run from
    ``starts`` (S envs) and compared with the data's end-cap displacements ``data_disp`` (S, 6, 3)."""
    robot, engine = policy.robot, policy.engine
    n = starts.batch_size
    labels = ["truth"] + [f"{name}_{value}" for name, values in GRID.items() for value in values]
    candidates = [Params.from_robot(robot, **ENGINE_TRUTH)] + [
        Params.from_robot(robot, **{**ENGINE_TRUTH, name: value}) for name, values in GRID.items() for value in values
    ]
    count = len(candidates)
    params = Params.concat([c.expand(n) for c in candidates])
    batch = starts.index(torch.arange(n).repeat(count))
    final, _, _ = policy.gait(params, batch, torch.arange(n).repeat(count))
    engine_disp = (engine.cap_positions(final) - engine.cap_positions(batch)).numpy().reshape(count, n, 6, 3)
    defect = 1e6 * ((engine_disp - data_disp) ** 2).mean((-1, -2, -3))
    error_mm = 1000 * np.median(np.linalg.norm(engine_disp - data_disp, axis=-1), axis=(-1, -2))
    spread = 1e6 * (engine_disp[..., :2] ** 2).sum(-1).mean((-1, -2))
    return {
        label: {"defect_mm2": float(d), "error_median_mm": float(e), "horizontal_mm2": float(s)}
        for label, d, e, s in zip(labels, defect, error_mm, spread, strict=True)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=50, help="random targets (about 1 s each with the rest)")
    parser.add_argument("--rest", type=float, default=0.6, help="motors stopped after each target (s)")
    parser.add_argument("--noise", type=float, default=0.002, help="end-cap tracking noise (m)")
    parser.add_argument("--seed", type=int, default=2, help="random policy seed")
    parser.add_argument("--quick", action="store_true", help="smoke run: 12 targets")
    args = parser.parse_args()
    if args.quick:
        args.targets = 12
    torch.set_num_threads(2)
    began = time.perf_counter()
    configs = load_all(args.config)
    robot, config = configs.robot, configs.pipeline.sysid
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    truth = Params.from_robot(robot, **ENGINE_TRUTH)
    policy = RestingPolicy(engine, robot, random_policy(robot, args.targets, seed=args.seed).targets, args.rest)
    data, exact, starts_s, ends_s = record(policy, truth, args.noise, args.seed)
    n = exact.batch_size
    observed = window_starts(engine, truth, robot, [(data, t) for t in starts_s], config.settle_s).state
    still = exact.replace(
        vel=torch.zeros_like(exact.vel),
        omega=torch.zeros_like(exact.omega),
        motor_omega=torch.zeros_like(exact.motor_omega),
    )
    static = exact.replace(rest_length=equilibrium_rest_lengths(engine, truth.expand(n), exact))
    data_disp = data.caps_at(ends_s) - data.caps_at(starts_s)
    report: dict[str, object] = {
        "trajectory_s": float(data.t_s[-1]),
        "gaits": n,
        "rest_s": args.rest,
        "noise_m": args.noise,
        "data_horizontal_mm2": float(1e6 * ((data_disp[..., :2] ** 2).sum(-1).mean() - 4 * args.noise**2)),
        "static_rest_length_error_median_mm": float(1000 * (static.rest_length - exact.rest_length).abs().median()),
        "observed_cap_error_median_mm": float(
            1000 * (engine.cap_positions(observed) - engine.cap_positions(exact)).norm(dim=-1).median()
        ),
    }
    for label, starts in (
        ("exact", exact),
        ("exact_zero_velocity", still),
        ("exact_pose_static_rest", static),
        ("observed", observed),
    ):
        report[label] = profile(policy, starts, data_disp)
    report["wall_s"] = time.perf_counter() - began
    print(json.dumps(report))


if __name__ == "__main__":
    main()
