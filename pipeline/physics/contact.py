"""Impulse-based contact responses with the "detach" gradient rules of the R2S2R paper.

A contact response is a passive velocity change. For an *actuated* body (one
that forces act on, like a robot rod or a drone) the response is detached from
the graph: its state-dependent part carries no gradient, so the gradient of the
next state with respect to the actuation is that of free motion (Alg. 1), while
the contact parameters keep their own gradient paths:

* normal (Alg. 1): ``j = -(1 + e) v_n / w`` with ``v_n`` and ``w`` detached, so
  ``d j / d e = -v_n / w`` survives even when the body is clamped to the ground;
* friction (Alg. 2): ``j_t = min(|v_t| / w_t, mu j_n)``; when sticking, the
  straight-through term ``mu j_n - (mu j_n).detach()`` (zero in value) gives mu the
  gradient of sliding friction.

A *passive* body (moved only by contacts, like the second billiard ball) keeps
full gradients: detaching it would cut the only path from the actuation to it.
"""

from __future__ import annotations

import torch


def _maybe_detach(x: torch.Tensor, detach: bool) -> torch.Tensor:
    return x.detach() if detach else x


def normal_impulse(
    v_n: torch.Tensor,
    inv_mass: torch.Tensor,
    restitution: torch.Tensor,
    active: torch.Tensor,
    detach: bool,
    bounce_speed: float = 0.0,
) -> torch.Tensor:
    """Normal impulse magnitude (>= 0) per contact.

    ``v_n`` (...) approach velocity along the contact normal (negative =
    approaching, m/s); ``inv_mass`` (...) the effective inverse mass along the
    normal (1/kg); ``restitution`` (...) e in [0, 1]; ``active`` (...) bool contact
    mask. Approach speeds below ``bounce_speed`` get no bounce (resting contact).
    """
    vn = _maybe_detach(v_n, detach)
    w = _maybe_detach(inv_mass, detach)
    approaching = active & (vn < 0)
    e = restitution * (vn < -bounce_speed)
    return torch.where(approaching, -(1 + e) * vn / w, torch.zeros_like(vn))


def friction_impulse(
    v_t: torch.Tensor,
    inv_mass: torch.Tensor,
    friction: torch.Tensor,
    j_n: torch.Tensor,
    detach: bool,
    eps: float = 1e-12,
) -> torch.Tensor:
    """Coulomb friction impulse vector (..., 3) opposing the tangential velocity ``v_t`` (..., 3).

    ``inv_mass`` (...) effective inverse mass along the slip direction; ``friction``
    (...) mu; ``j_n`` (...) the normal impulse. Sticking contacts stop slipping
    exactly; with ``detach`` they still pass a gradient to mu (straight-through).
    """
    vt = _maybe_detach(v_t, detach)
    w = _maybe_detach(inv_mass, detach)
    speed = torch.sqrt((vt * vt).sum(-1) + eps)
    direction = vt / speed[..., None]
    stick = speed / w
    slide = friction * j_n
    sticking = stick < slide
    magnitude = torch.where(sticking, stick, slide)
    straight_through = slide - slide.detach()
    if detach:
        magnitude = magnitude + torch.where(sticking, straight_through, 0.0)
    return -magnitude[..., None] * direction * (speed > 1e-9)[..., None]


def time_of_impact(height: torch.Tensor, v_n: torch.Tensor, dt: float) -> torch.Tensor:
    """Fraction of the step (0..1) after which a point at ``height`` (m, >= 0) moving
    with normal velocity ``v_n`` (m/s) reaches the surface; 1 if it does not."""
    reach = torch.where(v_n < 0, height.clamp(min=0) / (-v_n).clamp(min=1e-12), torch.full_like(height, dt))
    return (reach / dt).clamp(0.0, 1.0)
