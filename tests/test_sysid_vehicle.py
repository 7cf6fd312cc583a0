"""Seed 000's vehicle problem (appendix, Fig. 23): only KFL and MS4 identify v = 1 m/s.

All methods start from the same ``V0`` and run Adam (lr 0.1) for ``ITERATIONS`` steps.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch

from pipeline.sysid.vehicle import (
    WAYPOINTS_M,
    Trajectory,
    all_step_loss,
    ground_truth,
    identify,
    key_frame_loss,
    key_frames,
    multiple_shooting_loss,
    rollout,
)

V0 = 0.5
ITERATIONS = 150
TRUTH = ground_truth()


def _loss_fn(method: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``"KFL"``, ``"all-step"`` or ``"MS<n>"`` (n windows) against ``TRUTH``, as a function of the speed."""
    if method == "KFL":
        return partial(key_frame_loss, truth=TRUTH)
    if method == "all-step":
        return partial(all_step_loss, truth=TRUTH)
    return partial(multiple_shooting_loss, truth=TRUTH, n_windows=int(method.removeprefix("MS")))


def _speed(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64, requires_grad=True)


def _final_speeds(method: str) -> list[float]:
    """The speeds (m/s) of the last 20 iterations from ``V0``."""
    return [v for v, _, _ in identify(_loss_fn(method), V0, lr=0.1, iterations=ITERATIONS)[-20:]]


def test_ground_truth_visits_b_a_b_and_gradients_are_fixed_event() -> None:
    assert TRUTH.positions_m[[0, 50, 100, 150, 200, 250, 300]].tolist() == [0, 50, 100, 50, 0, 50, 100]
    assert TRUTH.segments[[0, 99, 100, 199, 200, 299, 300]].tolist() == [0, 0, 1, 1, 2, 2, 3]
    v = _speed(1.5)
    run = rollout(v, 0.0, 0, 100)  # B reached at step 67 (x = 100.5), then 33 steps back toward A
    run.positions_m[-1].backward()
    assert run.positions_m[-1].item() == pytest.approx(100.5 - 33 * 1.5)
    assert v.grad.item() == 67 - 33  # switch time held fixed: dt * (forward steps - backward steps)
    assert rollout(_speed(2.0), 0.0, 0, 200).positions_m[-1].item() == 100.0  # stays at the last waypoint


@pytest.mark.parametrize("method", ["KFL", "MS4"])
def test_kfl_and_ms4_identify_the_speed(method: str) -> None:
    assert all(abs(v - 1.0) < 0.02 for v in _final_speeds(method))


@pytest.mark.parametrize("method", [f"MS{n}" for n in range(5, 10)])
def test_ms_with_five_to_nine_windows_also_converges(method: str) -> None:
    assert all(abs(v - 1.0) < 0.02 for v in _final_speeds(method))


def test_all_step_loss_slides_into_the_ramp_fit() -> None:
    """All-step ends at v ~ 0.26 m/s.

    Below 1 m/s the engine turns at B late; after t = 100 s the truth is heading back to A while
    the engine is still above it, and those samples' fixed-event gradient (engine position grows
    with v) says "slow down", outweighing the first gait's "speed up". Below 1/3 m/s the engine never
    reaches B within 300 s, so the loss is the least-squares fit of a ramp ``v t`` to the
    triangle wave: a true local minimum at ``sum(t x) / sum(t^2)``.
    """
    t = torch.arange(TRUTH.steps + 1, dtype=torch.float64)
    ramp_fit = float((t * TRUTH.positions_m).sum() / (t * t).sum())
    assert all(v == pytest.approx(ramp_fit, abs=0.005) for v in _final_speeds("all-step"))
    assert abs(ramp_fit - 1.0) > 0.7


def test_ms2_collapses_to_standstill() -> None:
    """MS2 ends at v ~ 0 m/s.

    Window 1 (0-150 s) ends after the truth's turn at B. For 2/3 < v < 1 the engine turns late and
    is still above the returning truth, yet with the switch time held fixed more speed means more
    forward steps than backward ones (``100/v > 50``), so the gradient says "slow down". Once it is
    too slow to turn, both windows miss by the same amount and their gradients (+150 and -150 steps)
    cancel at v = 0.
    """
    assert all(abs(v) < 0.05 for v in _final_speeds("MS2"))


def test_ms3_runs_away_upward() -> None:
    """MS3 ends near v ~ 3 m/s.

    Its windows end exactly at the waypoints. From below it is pulled up correctly, but Adam's
    overshoot past 1.01 m/s makes the engine turn a step early: it ends short of the waypoint on the
    way back, and the fixed-event derivative (forward minus backward steps, positive) says "speed up".
    It climbs until the engine drives the whole B-A-B tour inside the first window (v ~ 3), where
    the windows' gradients cancel.
    """
    assert all(v > 2.5 for v in _final_speeds("MS3"))


@pytest.mark.parametrize("v", [0.3, 0.8, 0.99, 1.01, 1.25, 3.0])
def test_kfl_gradient_points_toward_the_true_speed(v: float) -> None:
    speed = _speed(v)
    key_frame_loss(speed, TRUTH).backward()
    assert np.sign(speed.grad.item()) == np.sign(v - 1.0)


def _piecewise_truth(steps_per_gait: tuple[int, ...]) -> Trajectory:
    """A demonstration visiting ``WAYPOINTS_M`` from A, each gait at constant speed for its steps (dt = 1 s)."""
    positions, segments, here = [0.0], [0], 0.0
    for segment, (target, steps) in enumerate(zip(WAYPOINTS_M, steps_per_gait, strict=True)):
        positions += [here + (target - here) * k / steps for k in range(1, steps + 1)]
        segments += [segment] * (steps - 1) + [segment + 1]
        here = target
    return Trajectory(torch.tensor(positions, dtype=torch.float64), np.array(segments), 1.0, WAYPOINTS_M)


def test_mask_filter_drops_the_gait_that_disagrees_with_the_total() -> None:
    """Data gaits 160, 80, 160 s (total 400 s) against the engine at 1 m/s (100 s each, total 300 s).

    The engine is too fast overall, so only gaits where it is also faster (0 and 2, pushing it to
    slow down) are kept; gait 1, where it is slower and would push it to speed up, is dropped.
    """
    truth = _piecewise_truth((160, 80, 160))
    speed = _speed(1.0)
    frames = key_frames(speed, truth)
    assert frames.engine_durations_s.tolist() == [100, 100, 100]
    assert frames.data_durations_s.tolist() == [160, 80, 160]
    assert frames.kept.tolist() == [True, False, True]
    assert frames.defects_m.tolist() == pytest.approx([100 - 62.5, 20.0, 100 - 62.5])
    (dropped_grad,) = torch.autograd.grad(frames.defects_m[1] ** 2, speed, retain_graph=True)
    assert dropped_grad.item() < 0  # gait 1 alone says: speed up
    key_frame_loss(speed, truth).backward()
    assert speed.grad.item() == pytest.approx(2 * 37.5 * 100)  # mean over gaits 0 and 2 only: slow down
