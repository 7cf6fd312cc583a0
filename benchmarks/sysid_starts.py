"""What the chunk-start reconstruction costs the Key Frame Loss, on engine data at the truth.

Engine data as in ``benchmarks.sysid`` (motor speed 0.7, friction 0.5, restitution
0.3; end caps at 10 Hz with ``--noise`` Gaussian noise, cables with half that). The
KFL's chunks are started these ways:

* **observed**: as the stage does, from the tracked caps and sensed cables, settled
  with zero velocity (:func:`~pipeline.sysid.windows.window_starts`);
* **fitted**: the observed starts of the lead-in chunks fitted, with the true
  parameters, to the data of their lead-ins and carried through them, so the chunks
  start where their lead-ins end
  (:meth:`~pipeline.sysid.losses.KeyFrameLoss.with_fitted_starts`), as the stage's
  refits and the held-out replay do; and the same fitted with friction
  ``--biased-friction`` (the fit's dependence on the parameters it is run with);
* **exact**: the engine's own states where the fitted chunks start
  (:func:`~pipeline.sysid.synthetic.exact_states`), as a perfect state estimator
  would give them.

All three score the same gaits (the lead-ins are never scored).

For each: the key-frame error at the true parameters (mean and median over the scored
key frames, mm; the floor that no parameter can remove) and the robust KFL (the
search's loss) at the truth and with each parameter 10 % below and above it. A
parameter is identifiable from these key frames only where its +/-10 % rise clearly
exceeds the loss's roughness. Prints one JSON object (last line).
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
from pipeline.config import load_all
from pipeline.physics import Engine, Params, RobotModel
from pipeline.policies import random_policy
from pipeline.sysid.data import split_gaits
from pipeline.sysid.evolution import robust_defects
from pipeline.sysid.losses import KeyFrameLoss
from pipeline.sysid.synthetic import engine_recording, exact_states

STEP = 0.1
"""Relative change of each parameter around the truth."""


def figures(loss: KeyFrameLoss, robot, scale: float) -> dict[str, object]:
    """Key-frame error (mm) at the truth and the robust loss at the truth and +/- ``STEP``."""
    truth = Params.from_robot(robot, **ENGINE_TRUTH)
    with torch.no_grad():
        value = loss(truth.expand(loss.units))
    errors_mm = 1000 * value.cap_errors_m[value.scored].mean(-1)
    candidates = [truth] + [
        Params.from_robot(robot, **{**ENGINE_TRUTH, name: ENGINE_TRUTH[name] * factor})
        for name in ENGINE_TRUTH
        for factor in (1 - STEP, 1 + STEP)
    ]
    robust = robust_defects(loss.population(Params.concat(candidates)).defects[:, loss.scored], scale).mean(-1)
    out: dict[str, object] = {
        "key_frame_error_mean_mm": float(errors_mm.mean()),
        "key_frame_error_median_mm": float(np.median(errors_mm)),
        "robust_loss_at_truth": float(robust[0]),
    }
    for k, name in enumerate(ENGINE_TRUTH):
        out[f"robust_loss_{name}_minus_10pct"] = float(robust[1 + 2 * k])
        out[f"robust_loss_{name}_plus_10pct"] = float(robust[2 + 2 * k])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--targets", type=int, default=70, help="random targets (~0.43 s each)")
    parser.add_argument("--noise", type=float, default=0.002, help="end-cap tracking noise (m)")
    parser.add_argument("--biased-friction", type=float, default=0.4, help="friction of the biased start fit")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 targets")
    args = parser.parse_args()
    if args.quick:
        args.targets = 20
    torch.set_num_threads(2)
    configs = load_all(args.config)
    robot, config = configs.robot, configs.pipeline.sysid
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s)
    truth = Params.from_robot(robot, **ENGINE_TRUTH)
    targets = random_policy(robot, args.targets, seed=2).targets
    noise = {"caps_noise_m": args.noise, "cable_noise_m": args.noise / 2}
    data = engine_recording(engine, truth, robot, targets, segment_timeout_s=TIMEOUT_S, **noise)
    began = time.perf_counter()
    gaits = split_gaits(data, robot, TIMEOUT_S)
    observed = KeyFrameLoss(engine, robot, {data.name: data}, gaits, truth, config)
    fit_began = time.perf_counter()
    fitted = observed.with_fitted_starts(truth)
    fit_s = time.perf_counter() - fit_began
    biased = observed.with_fitted_starts(Params.from_robot(robot, **{**ENGINE_TRUTH, "friction": args.biased_friction}))
    segments = [chunk[0].index for chunk in fitted.chunks]
    exact = fitted.with_start_states(exact_states(engine, truth, robot, targets, segments, TIMEOUT_S))
    moved = torch.as_tensor([chunk[0] is not gaits[0] for chunk in fitted.chunks])

    def column(loss: KeyFrameLoss) -> dict[str, object]:
        """Median errors of the carried chunk starts' caps (mm) and rod velocities (m/s) against
        the exact states, then :func:`figures`."""
        caps_mm = 1000 * (loss.starts.caps_m - exact.starts.caps_m)[moved].norm(dim=-1)
        speed = (loss.starts.state.vel - exact.starts.state.vel)[moved].norm(dim=-1)
        return {
            "start_cap_error_median_mm": float(caps_mm.median()),
            "start_vel_error_median_m_s": float(speed.median()),
            **figures(loss, robot, config.robust_scale),
        }

    report = {
        "trajectory_s": float(data.t_s[-1]),
        "noise_m": args.noise,
        "chunks": len(observed.chunks),
        "scored_key_frames": int(observed.scored.sum()),
        "start_speed_median_m_s": float(np.median(exact.starts.state.vel.norm(dim=-1).amax(-1).numpy())),
        "start_fit_wall_s": fit_s,
        "observed": figures(observed, robot, config.robust_scale),
        "fitted": column(fitted),
        f"fitted_at_friction_{args.biased_friction}": column(biased),
        "exact": figures(exact, robot, config.robust_scale),
    }
    report["wall_s"] = time.perf_counter() - began
    print(json.dumps(report))


if __name__ == "__main__":
    main()
