"""Gait-wise multiple shooting (Bock): every gait's start state fitted with the parameters, joined by continuity.

Engine data as in ``benchmarks.sysid`` (motor speed 0.7, friction 0.5, restitution 0.3; a
random policy, end caps at 10 Hz with 2 mm noise, cable lengths at 50 Hz with 1 mm). Every
gait is one window, started from the observation (:func:`~pipeline.sysid.windows.window_starts`,
as the stage starts its chunks) moved by its own perturbation ``z_k`` (the start fit's 48
coordinates, :func:`~pipeline.sysid.start_fit.perturbed`), and run over the data's duration of
the gait (its target, then the next one's if the engine is faster). The unknowns are all the
``z_k`` and the three parameters (in steps of 0.01); the residuals are each window's tracked caps
and sensed cables in their noise (:class:`~pipeline.sysid.start_fit.StartResiduals`), the
continuity defects between a window's end state and the next window's start in the same 48
coordinates (:func:`~pipeline.sysid.start_fit.difference`) times a weight ``w``, and a weak prior
(0.1) on each ``z_k``. Levenberg-Marquardt with forward-difference Jacobians (every window, every
coordinate and parameter one environment of an engine batch) solves the block-tridiagonal normal
equations (``scipy.sparse``) for all unknowns at once. The weight grows through ``--weights``
(short windows first, then joined), ``--iterations`` steps each. A single-shooting fit has the
whole trajectory's contact events in one rollout; here each window spans one gait, and
continuity carries the information from gait to gait. Prints one JSON line per iteration and one
JSON object (last line): the answer, its errors in %, costs against the residual count, the
remaining continuity defects per part (in the coordinates' scales) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch

from benchmarks.sysid import CABLE_NOISE_M, CAPS_NOISE_M, ENGINE_TRUTH, TIMEOUT_S
from pipeline.config import load_all
from pipeline.physics import BOUNDS, Engine, Params, RobotModel
from pipeline.physics.engine import State
from pipeline.policies import random_policy
from pipeline.sysid.data import split_gaits
from pipeline.sysid.start_fit import (
    COORDINATES,
    DIFFERENCE_STEP,
    PRIOR_WEIGHT,
    LeadIn,
    StartResiduals,
    difference,
    perturbed,
)
from pipeline.sysid.synthetic import engine_recording
from pipeline.sysid.windows import window_starts

NAMES = tuple(ENGINE_TRUTH)
PARAMETER_UNIT = 0.01
"""One parameter coordinate: this much of the parameter (absolute, for motor speed, friction, restitution)."""
PARAMETER_STEP = 0.5
"""Forward-difference step of a parameter coordinate."""
GAITS_PER_BATCH = 24
"""Gaits whose finite differences run as one engine batch (bounds the memory)."""
PARTS = {
    "pos": (0, 9),
    "rotation": (9, 18),
    "vel": (18, 27),
    "omega": (27, 36),
    "rest_length": (36, 42),
    "motor_omega": (42, 48),
}
"""The continuity coordinates of each part of a state (their scales: ``start_fit.SCALES``)."""


class Shooting:
    """The multiple-shooting problem of one recording: ``residuals`` (one window per gait, in
    gait order) and the start values ``start`` of the parameters."""

    def __init__(self, residuals: StartResiduals, start: dict[str, float]) -> None:
        self.residuals, self.start = residuals, np.array([start[n] for n in NAMES])
        self.gaits = residuals.starts.state.batch_size
        self.order = np.argsort(residuals.observed.last_tick.numpy(), kind="stable")

    def values(self, theta: np.ndarray) -> np.ndarray:
        """Parameter values (3,) of coordinates ``theta`` (3,), kept inside the engine's bounds."""
        raw = self.start + PARAMETER_UNIT * theta
        return np.array([np.clip(v, *BOUNDS[n]) for v, n in zip(raw, NAMES, strict=True)])

    def run(self, z: torch.Tensor, rows: np.ndarray, values: np.ndarray) -> tuple[torch.Tensor, State]:
        """Residuals (N, R) and end states of windows ``rows`` (N,) moved by ``z`` (N, 48) with
        parameter ``values`` (N, 3), as one engine batch."""
        params = Params.from_robot(self.residuals.robot, batch=len(rows))
        params = params.replace(**{n: torch.tensor(values[:, j]) for j, n in enumerate(NAMES)})
        return self.residuals.run(z, torch.as_tensor(rows), params)

    def evaluate(self, z: torch.Tensor, theta: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Every window's data residuals (K, R) and the continuity defects (K-1, 48)."""
        values = np.repeat(self.values(theta)[None], self.gaits, 0)
        data = torch.zeros(self.gaits, 0, dtype=torch.float64)
        ends: list[State | None] = [None] * self.gaits
        size = GAITS_PER_BATCH * (COORDINATES + 4)
        for first in range(0, self.gaits, size):
            rows = self.order[first : first + size]
            res, end = self.run(z[rows], rows, values[rows])
            if data.shape[1] == 0:
                data = torch.zeros(self.gaits, res.shape[1], dtype=torch.float64)
            data[rows] = res
            for j, row in enumerate(rows):
                ends[row] = end.index(slice(j, j + 1))
        return data, self.defects(State.concat(ends), z)

    def defects(self, ends: State, z: torch.Tensor) -> torch.Tensor:
        """Continuity defects (K-1, 48): window k's end state minus window k+1's start."""
        starts = perturbed(self.residuals.starts.state, z)
        return difference(ends.index(slice(0, self.gaits - 1)), starts.index(slice(1, self.gaits)))

    def jacobians(self, z: torch.Tensor, theta: np.ndarray) -> dict[str, torch.Tensor]:
        """Forward-difference Jacobians: data (K, R, 48) and (K, R, 3); continuity defect k in
        window k's start (K-1, 48, 48), window k+1's start (K-1, 48, 48) and the parameters
        (K-1, 48, 3); and the residuals and defects where they are taken."""
        per = 1 + COORDINATES + len(NAMES)
        steps = DIFFERENCE_STEP * torch.eye(COORDINATES, dtype=torch.float64)
        values = np.repeat(self.values(theta)[None], per, 0)
        for j in range(len(NAMES)):
            moved = theta.copy()
            moved[j] += PARAMETER_STEP
            values[1 + COORDINATES + j] = self.values(moved)
        by_start: list[torch.Tensor | None] = [None] * self.gaits
        by_params: list[torch.Tensor | None] = [None] * self.gaits
        base: list[torch.Tensor | None] = [None] * self.gaits
        ends: list[State | None] = [None] * self.gaits
        for first in range(0, self.gaits, GAITS_PER_BATCH):
            rows = self.order[first : first + GAITS_PER_BATCH]
            zz = z[np.repeat(rows, per)].clone().reshape(len(rows), per, COORDINATES)
            zz[:, 1 : 1 + COORDINATES] += steps
            res, end = self.run(zz.reshape(-1, COORDINATES), np.repeat(rows, per), np.tile(values, (len(rows), 1)))
            res = res.reshape(len(rows), per, -1)
            for j, row in enumerate(rows):
                base[row] = res[j, 0]
                by_start[row] = ((res[j, 1 : 1 + COORDINATES] - res[j, :1]) / DIFFERENCE_STEP).T
                by_params[row] = ((res[j, 1 + COORDINATES :] - res[j, :1]) / PARAMETER_STEP).T
                ends[row] = end.index(slice(j * per, (j + 1) * per))
        starts = perturbed(self.residuals.starts.state, z)
        defects, cont_start, cont_next, cont_params = [], [], [], []
        for k in range(self.gaits - 1):
            following = starts.index(torch.full((per,), k + 1))
            moved = difference(ends[k], following)
            defects.append(moved[0])
            cont_start.append(((moved[1 : 1 + COORDINATES] - moved[:1]) / DIFFERENCE_STEP).T)
            cont_params.append(((moved[1 + COORDINATES :] - moved[:1]) / PARAMETER_STEP).T)
            shifted = perturbed(self.residuals.starts.state.index(torch.full((COORDINATES,), k + 1)), z[k + 1] + steps)
            at_end = ends[k].index(torch.zeros(COORDINATES, dtype=torch.long))
            cont_next.append(((difference(at_end, shifted) - moved[:1]) / DIFFERENCE_STEP).T)
        return {
            "data": torch.stack(base),
            "data_start": torch.stack(by_start),
            "data_params": torch.stack(by_params),
            "defects": torch.stack(defects),
            "cont_start": torch.stack(cont_start),
            "cont_next": torch.stack(cont_next),
            "cont_params": torch.stack(cont_params),
        }


def cost(data: torch.Tensor, defects: torch.Tensor, z: torch.Tensor, weight: float) -> float:
    """Data, weighted continuity and prior squares, summed."""
    return float((data**2).sum() + ((weight * defects) ** 2).sum() + ((PRIOR_WEIGHT * z) ** 2).sum())


def step(j: dict[str, torch.Tensor], z: torch.Tensor, weight: float, damping: float) -> tuple[torch.Tensor, np.ndarray]:
    """The Levenberg-Marquardt step (starts (K, 48), parameters (3,)) of the block-tridiagonal
    normal equations with Marquardt's diagonal scaling."""
    gaits, n = j["data"].shape[0], COORDINATES
    size = gaits * n + len(NAMES)
    last = gaits * n
    blocks: list[tuple[int, int, np.ndarray]] = []
    gradient = np.zeros(size)
    for k in range(gaits):
        jz, jp, r = j["data_start"][k].numpy(), j["data_params"][k].numpy(), j["data"][k].numpy()
        blocks += [(k * n, k * n, jz.T @ jz + PRIOR_WEIGHT**2 * np.eye(n)), (k * n, last, jz.T @ jp)]
        blocks += [(last, k * n, jp.T @ jz), (last, last, jp.T @ jp)]
        gradient[k * n : (k + 1) * n] += jz.T @ r + PRIOR_WEIGHT**2 * z[k].numpy()
        gradient[last:] += jp.T @ r
    for k in range(gaits - 1):
        a, b = weight * j["cont_start"][k].numpy(), weight * j["cont_next"][k].numpy()
        p, r = weight * j["cont_params"][k].numpy(), weight * j["defects"][k].numpy()
        here, there = k * n, (k + 1) * n
        blocks += [(here, here, a.T @ a), (there, there, b.T @ b), (here, there, a.T @ b), (there, here, b.T @ a)]
        blocks += [(here, last, a.T @ p), (last, here, p.T @ a), (there, last, b.T @ p), (last, there, p.T @ b)]
        blocks.append((last, last, p.T @ p))
        gradient[here : here + n] += a.T @ r
        gradient[there : there + n] += b.T @ r
        gradient[last:] += p.T @ r
    rows, cols, vals = [], [], []
    for i, k, block in blocks:
        ii, kk = np.meshgrid(np.arange(block.shape[0]) + i, np.arange(block.shape[1]) + k, indexing="ij")
        rows.append(ii.ravel())
        cols.append(kk.ravel())
        vals.append(block.ravel())
    normal = scipy.sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), (size, size))
    normal = normal.tocsc()
    scaled = normal + damping * scipy.sparse.diags(normal.diagonal() + 1e-6)
    delta = scipy.sparse.linalg.spsolve(scaled.tocsc(), -gradient)
    return torch.tensor(delta[:last].reshape(gaits, n)), delta[last:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=140, help="random targets (~0.43 s each; 140: 60 s)")
    parser.add_argument("--seed", type=int, default=2, help="random-policy seed")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.3, 3.0, 10.0], help="continuity weights")
    parser.add_argument("--iterations", type=int, default=15, help="Levenberg-Marquardt steps per weight")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 targets, 3 steps at weights 0.3 and 3")
    args = parser.parse_args()
    if args.quick:
        args.targets, args.iterations, args.weights = 20, 3, [0.3, 3.0]
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot, config = configs.robot, configs.pipeline.sysid
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    targets = random_policy(robot, args.targets, seed=args.seed).targets
    data = engine_recording(
        engine,
        Params.from_robot(robot, **ENGINE_TRUTH),
        robot,
        targets,
        segment_timeout_s=TIMEOUT_S,
        caps_noise_m=CAPS_NOISE_M,
        cable_noise_m=CABLE_NOISE_M,
    )
    began = time.perf_counter()
    gaits = split_gaits(data, robot, TIMEOUT_S)
    start = {n: float(getattr(Params.from_robot(robot), n)[0]) for n in NAMES}
    starts = window_starts(engine, Params.from_robot(robot), robot, [(data, g.start_s) for g in gaits], config.settle_s)
    policy = np.stack([targets[[g.index, min(g.index + 1, len(targets) - 1)]] for g in gaits])
    residuals = StartResiduals(
        engine,
        robot,
        starts,
        [LeadIn(data, g.start_s, g.duration_s) for g in gaits],
        torch.tensor(policy),
        np.full((len(gaits), 2), TIMEOUT_S),
        CAPS_NOISE_M,
        CABLE_NOISE_M,
    )
    problem = Shooting(residuals, start)
    z = torch.zeros(len(gaits), COORDINATES, dtype=torch.float64)
    theta = np.zeros(len(NAMES))
    data_res, defects = problem.evaluate(z, theta)
    for weight in args.weights:
        current = cost(data_res, defects, z, weight)
        damping = 1e-2
        for iteration in range(args.iterations):
            jacobians = problem.jacobians(z, theta)
            for _ in range(6):
                dz, dtheta = step(jacobians, z, weight, damping)
                trial_data, trial_defects = problem.evaluate(z + dz, theta + dtheta)
                trial = cost(trial_data, trial_defects, z + dz, weight)
                if trial < current:
                    z, theta, current, data_res, defects = z + dz, theta + dtheta, trial, trial_data, trial_defects
                    damping /= 3
                    break
                damping *= 4
            values = dict(zip(NAMES, problem.values(theta).tolist(), strict=True))
            line = {"weight": weight, "iteration": iteration, "cost": current, "data_cost": float((data_res**2).sum())}
            print(json.dumps(line | {"values": values, "wall_s": time.perf_counter() - began}), flush=True)
    values = dict(zip(NAMES, problem.values(theta).tolist(), strict=True))
    report = {
        "trajectory_s": float(data.t_s[-1]),
        "seed": args.seed,
        "gaits": len(gaits),
        "start": start,
        "identified": values,
        "error_pct": {n: 100 * (values[n] - ENGINE_TRUTH[n]) / ENGINE_TRUTH[n] for n in NAMES},
        "data_cost": float((data_res**2).sum()),
        "residual_count": residuals.count,
        "defect_rms": {part: float(defects[:, a:b].pow(2).mean().sqrt()) for part, (a, b) in PARTS.items()},
        "wall_s": time.perf_counter() - began,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
