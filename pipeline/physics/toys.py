"""The toy problems of the R2S2R paper's appendix, built on :mod:`pipeline.physics.contact`.

Each function simulates a small 1-D system and returns the loss as a scalar
tensor, so a caller can differentiate it with respect to the parameter it cares
about and run gradient descent. ``detach`` switches the contact-gradient rule.
All in SI units; time step ``dt`` in s.
"""

from __future__ import annotations

import torch

from pipeline.physics.contact import friction_impulse, normal_impulse, time_of_impact

GRAVITY = 9.81


def drone_takeoff(
    thrust_n: torch.Tensor,
    detach: bool,
    steps: int = 500,
    dt: float = 0.01,
    mass_kg: float = 1.0,
    target_height_m: float = 10.0,
    restitution: float = 0.0,
) -> torch.Tensor:
    """Drone on the ground with constant thrust ``F``; loss = (height at the end - target)^2.

    Ground contact (Alg. 1 with time of impact, Alg. 3): when the free step would
    end below ground, the normal impulse stops (or bounces) the drone at the time
    of impact and the position is placed where the remaining time takes it.
    With ``detach`` the impulse and the position correction carry no state
    gradient, so d loss / d F is non-zero even while the drone is clamped.
    """
    zero = thrust_n * 0.0
    x, v = zero, zero
    e = torch.as_tensor(restitution, dtype=thrust_n.dtype)
    for _ in range(steps):
        v_free = v + (thrust_n / mass_kg - GRAVITY) * dt
        x_free = x + v_free * dt
        active = x_free < 0
        j = normal_impulse(v_free, torch.as_tensor(1.0 / mass_kg, dtype=x.dtype), e, active, detach)
        v = v_free + j / mass_kg
        toi = time_of_impact(x, v_free, dt)
        x_toi = torch.where(active, x + v_free * toi * dt + v * (1 - toi) * dt, x_free)
        x = x_free + ((x_toi - x_free).detach() if detach else (x_toi - x_free))
    return (x - target_height_m) ** 2


def box_pull(
    friction: torch.Tensor,
    detach: bool,
    target_m: float,
    pull_n: float = 5.0,
    steps: int = 200,
    dt: float = 0.01,
    mass_kg: float = 1.0,
) -> torch.Tensor:
    """Box on the ground pulled by a known force; loss = (position at the end - target)^2.

    The normal impulse balances gravity each step; Coulomb friction (Alg. 2)
    either stops the box (sticking) or slows it by ``mu j_n``. With ``detach``
    the sticking case passes the straight-through gradient to ``mu``.
    """
    zero = friction * 0.0
    x, v = zero, zero
    inv_mass = torch.as_tensor(1.0 / mass_kg, dtype=friction.dtype)
    for _ in range(steps):
        v_free = v + pull_n / mass_kg * dt
        v_n = torch.full_like(zero, -GRAVITY * dt)
        j_n = normal_impulse(v_n, inv_mass, torch.zeros_like(zero), torch.ones_like(zero, dtype=torch.bool), detach)
        v_t = torch.stack([v_free, zero, zero], dim=-1)
        dv = friction_impulse(v_t, inv_mass, friction, j_n, detach)[..., 0] / mass_kg
        v = v_free + dv
        x = x + v * dt
    return (x - target_m) ** 2


def billiards(
    push_n: torch.Tensor,
    detach_a: bool,
    detach_b: bool,
    target_b_m: float,
    steps: int = 500,
    push_steps: int = 20,
    dt: float = 0.01,
    mass_kg: float = 0.17,
    radius_m: float = 0.03,
    gap_m: float = 0.5,
    restitution: float = 0.9,
) -> torch.Tensor:
    """Ball A pushed by ``F`` for ``push_steps`` steps hits ball B on a line;
    loss = (B's final position - target)^2.

    The ball-ball impulse is computed with full gradients; each ball's response is
    detached or not by ``detach_a`` / ``detach_b`` (R2S2R paper: detach only the
    actuated ball A, otherwise F gets no gradient).
    """
    zero = push_n * 0.0
    xa, va = zero, zero
    xb, vb = zero + gap_m + 2 * radius_m, zero
    e = torch.as_tensor(restitution, dtype=push_n.dtype)
    w = torch.as_tensor(2.0 / mass_kg, dtype=push_n.dtype)
    for step in range(steps):
        force = push_n if step < push_steps else zero
        va = va + force / mass_kg * dt
        gap = xb - xa - 2 * radius_m
        v_rel = vb - va
        active = gap + v_rel * dt < 0
        j = normal_impulse(v_rel, w, e, active, detach=False)
        dva, dvb = -j / mass_kg, j / mass_kg
        va = va + (dva.detach() if detach_a else dva)
        vb = vb + (dvb.detach() if detach_b else dvb)
        xa, xb = xa + va * dt, xb + vb * dt
    return (xb - target_b_m) ** 2
