"""How tightly the data pin the engine parameters, locally: the linearised Cramer-Rao bound.

Engine data as in ``benchmarks.sysid`` (motor speed 0.7, friction 0.5, restitution 0.3;
a random policy, end caps at 10 Hz, cable lengths at 50 Hz), without noise. The KFL's
chunks are started from the engine's exact states (:func:`~pipeline.sysid.synthetic.exact_states`)
and compared with the data over each whole chunk, as the start fit does
(:class:`~pipeline.sysid.start_fit.StartResiduals`: caps in 2 mm, cables in 1 mm, the
tracking and sensor noise of ``test_recovery_from_a_noisy_random_policy_on_engine_data``).

For each relative parameter step ``h`` the Jacobians are finite differences: forward in
the 48 start coordinates (the start fit's step), central in each parameter (+-h). The
information matrix is summed over the chunks with the starts known (J_p'J_p) and with them
free (each chunk's Schur complement J_p'J_p - J_p'J_z (J_z'J_z)^-1 J_z'J_p, as when every
chunk's start is fitted too); the bound is the square root of its inverse's diagonal, in
% of each true value: the smallest standard deviation any unbiased estimator using these
data could reach, if the residuals were linear in the parameters over +-h. Where the bound
shrinks with ``h`` the residuals are rough at that scale (contact events that move with
the parameters): the data then pin the parameters locally, but a search has to find a
needle-shaped minimum. Prints one JSON object (last line).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import torch

from benchmarks.sysid import CABLE_NOISE_M, CAPS_NOISE_M, ENGINE_TRUTH, TIMEOUT_S
from pipeline.config import load_all
from pipeline.physics import Engine, Params, RobotModel
from pipeline.policies import random_policy
from pipeline.sysid.data import split_gaits
from pipeline.sysid.losses import KeyFrameLoss
from pipeline.sysid.start_fit import COORDINATES, DIFFERENCE_STEP, LeadIn, StartResiduals
from pipeline.sysid.synthetic import engine_recording, exact_states

CHUNKS_PER_BATCH = 8
"""Chunks whose finite differences run as one engine batch (bounds the memory)."""


def jacobians(
    residuals: StartResiduals, truth: Params, chunks: list[int], step: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Residuals at the exact starts (C, R), their Jacobians in the start coordinates
    (C, R, COORDINATES) and in the parameters, per relative unit (C, R, P), for ``chunks``."""
    names = list(ENGINE_TRUTH)
    per_chunk = 1 + COORDINATES + 2 * len(names)
    rows = torch.as_tensor(chunks).repeat_interleave(per_chunk)
    z = torch.zeros(len(rows), COORDINATES, dtype=torch.float64)
    values = {n: v.repeat(len(rows)).clone() for n, v in truth.as_dict().items()}
    for c in range(len(chunks)):
        first = c * per_chunk
        z[first + 1 : first + 1 + COORDINATES] = DIFFERENCE_STEP * torch.eye(COORDINATES, dtype=torch.float64)
        for j, name in enumerate(names):
            values[name][first + 1 + COORDINATES + 2 * j] *= 1 + step
            values[name][first + 2 + COORDINATES + 2 * j] *= 1 - step
    out = residuals(z, rows, Params(**values)).reshape(len(chunks), per_chunk, -1).numpy()
    base = out[:, 0]
    by_start = (out[:, 1 : 1 + COORDINATES] - base[:, None]) / DIFFERENCE_STEP
    plus, minus = out[:, 1 + COORDINATES :: 2], out[:, 2 + COORDINATES :: 2]
    by_params = (plus - minus) / (2 * step)
    return base, by_start.transpose(0, 2, 1), by_params.transpose(0, 2, 1)


def bound_pct(information: np.ndarray) -> dict[str, float]:
    """Square root of the inverse information's diagonal, in % of each true value."""
    std = np.sqrt(np.diag(np.linalg.inv(information)))
    return {name: float(100 * s) for name, s in zip(ENGINE_TRUTH, std, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=140, help="random targets (~0.43 s each; 140: 60 s)")
    parser.add_argument("--seed", type=int, default=2, help="random-policy seed")
    parser.add_argument("--steps", type=float, nargs="+", default=[0.002, 0.01, 0.03], help="relative parameter steps")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 targets, one step of 1 %%")
    args = parser.parse_args()
    if args.quick:
        args.targets, args.steps = 20, [0.01]
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot, config = configs.robot, configs.pipeline.sysid
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    truth = Params.from_robot(robot, **ENGINE_TRUTH)
    targets = random_policy(robot, args.targets, seed=args.seed).targets
    data = engine_recording(engine, truth, robot, targets, segment_timeout_s=TIMEOUT_S)
    began = time.perf_counter()
    loss = KeyFrameLoss(engine, robot, {data.name: data}, split_gaits(data, robot, TIMEOUT_S), truth, config)
    exact = exact_states(engine, truth, robot, targets, [chunk[0].index for chunk in loss.chunks], TIMEOUT_S)
    starts = loss.with_start_states(exact).starts
    leads = [LeadIn(data, chunk[0].start_s, sum(g.duration_s for g in chunk)) for chunk in loss.chunks]
    residuals = StartResiduals(engine, robot, starts, leads, loss.targets, loss.timeout, CAPS_NOISE_M, CABLE_NOISE_M)
    report: dict[str, object] = {
        "trajectory_s": float(data.t_s[-1]),
        "seed": args.seed,
        "chunks": len(loss.chunks),
        "residuals": residuals.count,
    }
    names = list(ENGINE_TRUTH)
    for step in args.steps:
        known = np.zeros((len(names), len(names)))
        free = np.zeros_like(known)
        exact_cost = 0.0
        for first in range(0, len(loss.chunks), CHUNKS_PER_BATCH):
            chunks = list(range(first, min(first + CHUNKS_PER_BATCH, len(loss.chunks))))
            base, by_start, by_params = jacobians(residuals, truth, chunks, step)
            exact_cost += float((base**2).sum())
            for jz, jp in zip(by_start, by_params, strict=True):
                cross = jp.T @ jz
                known += jp.T @ jp
                free += jp.T @ jp - cross @ np.linalg.pinv(jz.T @ jz, rcond=1e-10) @ cross.T
        report[f"step_{step}"] = {
            "crb_pct_starts_known": bound_pct(known),
            "crb_pct_starts_free": bound_pct(free),
        }
        report["exact_start_cost"] = exact_cost
    report["wall_s"] = time.perf_counter() - began
    print(json.dumps(report))


if __name__ == "__main__":
    main()
