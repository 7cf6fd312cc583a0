"""Seed 000's toy problems: the detach rules give useful contact gradients."""

from __future__ import annotations

import torch

from pipeline.physics.toys import billiards, box_pull, drone_takeoff

FAST = {"steps": 125, "push_steps": 5, "dt": 0.04}
BOX = {"steps": 50, "dt": 0.04}


def _descend(loss_fn, start: float, lr: float, iterations: int) -> list[tuple[float, float, float]]:
    """Adam on one scalar parameter; returns (value, loss, gradient) per iteration."""
    p = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr)
    history = []
    for _ in range(iterations):
        opt.zero_grad()
        loss = loss_fn(p)
        loss.backward()
        history.append((p.item(), loss.item(), p.grad.item()))
        opt.step()
    return history


def test_drone_takeoff_thrust_grows_while_clamped_only_with_detach() -> None:
    history = _descend(lambda f: drone_takeoff(f, detach=True, steps=100, dt=0.05), start=5.0, lr=0.2, iterations=80)
    clamped = [h for h in history if h[0] < 9.81]  # thrust below weight: still on the ground
    assert len(clamped) > 10
    assert all(h[2] < 0 for h in clamped)  # gradient says: more thrust
    assert all(h[1] == history[0][1] for h in clamped)  # loss flat while clamped ...
    assert [h[0] for h in clamped] == sorted(h[0] for h in clamped)  # ... yet F keeps growing
    assert history[-1][1] < 0.01 * history[0][1]
    naive = _descend(lambda f: drone_takeoff(f, detach=False, steps=100, dt=0.05), start=5.0, lr=0.1, iterations=20)
    assert all(h[2] == 0.0 for h in naive)
    assert naive[-1][0] == 5.0


def test_box_pull_identifies_friction_only_with_detach() -> None:
    target = box_pull(torch.tensor(0.2, dtype=torch.float64), detach=False, target_m=0.0, **BOX).sqrt().item()
    history = _descend(lambda mu: box_pull(mu, detach=True, target_m=target, **BOX), start=1.0, lr=0.05, iterations=100)
    assert history[0][2] > 0  # mu too high: the box sticks, yet the gradient says decrease mu
    assert abs(history[-1][0] - 0.2) < 0.01
    assert history[-1][1] < 1e-3 * history[0][1]
    naive = _descend(lambda mu: box_pull(mu, detach=False, target_m=target, **BOX), start=1.0, lr=0.05, iterations=10)
    assert all(h[2] == 0.0 for h in naive) and naive[-1][1] == naive[0][1]


def test_billiards_detach_only_the_actuated_ball() -> None:
    target = billiards(torch.tensor(2.0, dtype=torch.float64), False, False, target_b_m=0.0, **FAST).sqrt().item()
    only_a = _descend(lambda f: billiards(f, True, False, target, **FAST), start=1.0, lr=0.05, iterations=100)
    assert only_a[0][2] < 0
    assert abs(only_a[-1][0] - 2.0) < 0.02
    both = _descend(lambda f: billiards(f, True, True, target, **FAST), start=1.0, lr=0.05, iterations=10)
    assert all(h[2] == 0.0 for h in both) and both[-1][0] == 1.0
