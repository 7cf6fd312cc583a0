"""Engine throughput: env-steps per second, forward and forward+backward, by batch size.

For each batch size B the engine steps B robots (CPU, float64 unless ``--dtype
float32``; contact active: the robots rest on the ground with motors running)
for a fixed number of steps:

* ``forward``: under ``torch.no_grad``;
* ``forward_backward``: with gradients on the parameters, then one backward pass
  of a loss on the end-cap positions; ``backward_ratio`` = its time / forward time (the eager
  step's; ``compiled_...`` the compiled kernel's).

With ``--compile`` the engine's compiled kernel (``Engine(compiled=True)``, CPU float64;
:mod:`pipeline.physics.kernel`) is also run, forward and forward+backward (the kernel's adjoint,
:mod:`pipeline.physics.adjoint`); ``compile_s`` is its first step's time (numba loading its cache,
or compiling, about 11 s, where the cache is cold).

With ``--drift``, how far float32 rollouts (eager: the kernel is float64) end from float64 ones
(compiled, 64 robots, random motor commands, 5 s at the stages' 5 ms step): the end caps'
distance after each second.

The anchor, measured in the same run: MuJoCo stepping the twin's model of the same robot single-threaded
(``mj_step``), in steps per second. Both are measured a step per call and a control tick per call
(``compiled_tick_...``: :meth:`Engine.steps` with a tick's steps, as the rollouts call it; MuJoCo's
``mj_step`` with ``nstep``), so that neither side's cost of a call from Python is counted against
the other's. Prints one JSON object (last line).

Usage: ``python -m benchmarks.engine [--quick] [--compile] [--drift] [--dtype float32] [--batches 1,64,1024,4096]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import torch

from pipeline.config import load_all
from pipeline.hardware.twin import MujocoTwin
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import state_from_caps
from pipeline.robot_model import reference_prism, resting_on_face


def _setup(engine: Engine, robot, batch: int):
    dtype = engine.model.dtype
    params = Params.from_robot(robot, batch=batch, dtype=dtype)
    state = state_from_caps(engine, params, resting_on_face(robot, reference_prism(robot)))
    control = torch.linspace(-1.0, 1.0, 6, dtype=dtype).expand(batch, 6).contiguous()
    return params, state, control


def _forward(step, params, state, control, steps: int) -> float:
    with torch.no_grad():
        for _ in range(2):  # warm-up; a compiled step may specialise again on its own outputs
            state = step(params, state, control)
        start = time.perf_counter()
        for _ in range(steps):
            state = step(params, state, control)
    return time.perf_counter() - start


def _forward_backward(step, engine: Engine, params, state, control, steps: int) -> float:
    def run(n: int) -> None:
        speed = params.motor_speed.clone().requires_grad_(True)
        friction = params.friction.clone().requires_grad_(True)
        p = params.replace(motor_speed=speed, friction=friction)
        end = state
        for _ in range(n):
            end = step(p, end, control)
        loss = (engine.cap_positions(end) * torch.linspace(0.5, 1.5, 3, dtype=engine.model.dtype)).sum()
        loss.backward()

    run(2)  # warm-up: the compiled backward loads (or compiles) its kernel on its first call
    start = time.perf_counter()
    run(steps)
    return time.perf_counter() - start


def _float32_drift(robot, batch: int = 64, dt: float = 0.005, steps: int = 1000) -> dict[str, float]:
    """How far float32 rollouts end from float64 ones: ``batch`` robots from rest under random
    motor commands held 0.1 s each, ``steps`` compiled steps of ``dt`` (s) in each dtype. Returns
    the end caps' distance (mm; median and largest over robots and caps) after each second, and
    how far the robots moved (m, median)."""
    engines = {
        d: Engine(RobotModel.from_robot(robot, dtype=d), dt=dt, compiled=True) for d in (torch.float64, torch.float32)
    }
    generator = torch.Generator().manual_seed(0)
    controls = torch.rand(steps // 20 + 1, batch, 6, generator=generator, dtype=torch.float64) * 2 - 1
    caps = {}
    for dtype, engine in engines.items():
        params, state, _ = _setup(engine, robot, batch)
        trace = []
        with torch.no_grad():
            for step in range(steps):
                state = engine.step(params, state, controls[step // 20].to(dtype))
                if (step + 1) % round(1.0 / dt) == 0:
                    trace.append(engine.cap_positions(state).double())
        caps[dtype] = torch.stack(trace)
        start = engine.cap_positions(_setup(engine, robot, batch)[1]).double()
    gaps = (caps[torch.float32] - caps[torch.float64]).norm(dim=-1).flatten(1) * 1000
    moved = (caps[torch.float64][-1] - start).norm(dim=-1).amax(-1)
    return {
        "batch": batch,
        "dt_s": dt,
        "median_mm_by_second": [round(float(g.median()), 4) for g in gaps],
        "max_mm_by_second": [round(float(g.max()), 4) for g in gaps],
        "median_moved_m": float(moved.median()),
    }


def _mujoco_steps_per_s(configs, seconds: float, per_call_s: float = 0.0) -> float:
    """MuJoCo's steps per second on the twin's model, single-threaded: one ``mj_step`` call per step,
    or with ``per_call_s`` one call per that much simulated time (``nstep``: a control tick's steps
    in one call, as :meth:`Engine.steps` takes them)."""
    twin = MujocoTwin(configs.robot, configs.twin)
    twin.reset()
    per_call = max(1, round(per_call_s / twin.model.opt.timestep))
    calls = max(1, round(seconds / twin.model.opt.timestep / per_call))
    start = time.perf_counter()
    for _ in range(calls):
        mujoco.mj_step(twin.model, twin.data, per_call)
    return calls * per_call / (time.perf_counter() - start)


def _ratios(results: dict[str, dict], key: str, anchor: float) -> dict[str, float]:
    """Each batch's figure ``key`` over ``anchor``, where the batch has it."""
    return {name: entry[key] / anchor for name, entry in results.items() if key in entry}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and batches (under a minute)")
    parser.add_argument("--compile", action="store_true", help="also measure the compiled kernel's steps")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--drift", action="store_true", help="also measure float32 rollouts' drift from float64")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    configs = load_all(args.config)
    robot = configs.robot
    engine = Engine(RobotModel.from_robot(robot, dtype=getattr(torch, args.dtype)), dt=0.001)
    batches = (
        [int(b) for b in args.batches.split(",")]
        if args.batches
        else ([1, 64, 1024] if args.quick else [1, 64, 1024, 4096])
    )
    budget = 2e4 if args.quick else 2e5  # env-steps per measurement, roughly
    tick_s = 1.0 / robot.pid.control_rate_hz
    tick_steps = round(tick_s / engine.dt)
    results = {}
    for batch in batches:
        steps = int(max(5, min(300, budget // batch)))
        params, state, control = _setup(engine, robot, batch)
        forward = _forward(engine.step, params, state, control, steps)
        both = _forward_backward(engine.step, engine, params, state, control, steps)
        entry = {
            "steps": steps,
            "forward_env_steps_per_s": batch * steps / forward,
            "forward_backward_env_steps_per_s": batch * steps / both,
            "backward_ratio": both / forward,
        }
        if args.compile:
            fast = Engine(engine.model, dt=engine.dt, compiled=True)
            start = time.perf_counter()
            with torch.no_grad():
                fast.step(params, state, control)
            entry["compile_s"] = time.perf_counter() - start
            compiled_forward = _forward(fast.step, params, state, control, steps)
            compiled_both = _forward_backward(fast.step, fast, params, state, control, steps)
            entry["compiled_forward_env_steps_per_s"] = batch * steps / compiled_forward
            entry["compiled_forward_backward_env_steps_per_s"] = batch * steps / compiled_both
            entry["compiled_backward_ratio"] = compiled_both / compiled_forward
            calls = max(10, steps // tick_steps)
            compiled_tick = _forward(partial(fast.steps, n=tick_steps), params, state, control, calls)
            entry["compiled_tick_forward_env_steps_per_s"] = batch * calls * tick_steps / compiled_tick
        results[f"batch_{batch}"] = entry
    drift = _float32_drift(robot) if args.drift else None
    anchor = _mujoco_steps_per_s(configs, 2.0 if args.quick else 10.0)
    tick_anchor = _mujoco_steps_per_s(configs, 2.0 if args.quick else 10.0, tick_s)
    print(
        json.dumps(
            {
                "dtype": args.dtype,
                "device": "cpu",
                "threads": torch.get_num_threads(),
                "dt_s": engine.dt,
                "engine": results,
                "float32_drift": drift,
                "anchor_mujoco_steps_per_s": anchor,
                "compiled_over_mujoco": _ratios(results, "compiled_forward_env_steps_per_s", anchor),
                "tick_steps": tick_steps,
                "anchor_mujoco_tick_steps_per_s": tick_anchor,
                "compiled_tick_over_mujoco_tick": _ratios(
                    results, "compiled_tick_forward_env_steps_per_s", tick_anchor
                ),
                "targets": {
                    "compiled_batch_1_steps_per_s": 5000,
                    "compiled_batch_4096_env_steps_per_s": 1_000_000,
                    "compiled_batch_4096_over_mujoco": 25.0,
                    "forward_backward_batch_1024_env_steps_per_s": 200_000,
                    "backward_ratio_max": 3.0,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
