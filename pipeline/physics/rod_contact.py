"""Contact between rods: closest points of their collision capsules and a speculative, inelastic impulse.

Each rod collides as three capsules along its axis (:func:`rod_shapes`): its bar (the rod radius,
end cap to end cap) and, at each end, one of the end cap's radius that holds the end-cap sphere
and the motor cylinder. Without contact between them, rods pass through each other and the gait
search finds gaits that use it (a turn that folds the prism through its bars, a roll that pushes
two rods' end caps and motors into each other), which jam on the twin, whose rods collide as the
hardware's do (`tests/test_rod_contact.py` replays two such gaits; docs/physics.md). A
contact is speculative (as the ground's is): it acts once a pair's gap would close within the step
at its current approach speed, so a fast rod cannot tunnel through a thin one between two steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config import RobotConfig

ROD_PAIRS = ((0, 1), (0, 2), (1, 2))
"""The pairs of rods that can touch."""
ROD_CONTACT_SWEEPS = 4
"""Most passes over the pairs per step (Jacobi): rods touching others at several points share
their corrections."""
ROD_CONTACT_MARGIN_M = 0.02
"""Pairs of capsules farther apart than this (m, beyond touching) at a step's start skip the
contact and separation computations for the step: no rod closes 2 cm in one step of a few
milliseconds. On random cable commands, 10 % of the pairs were nearer."""
_EPS = 1e-12


@dataclass(frozen=True)
class RodShapes:
    """The rods' collision capsules (the same on every rod) and the pairs that can touch.

    ``z0_m``, ``z1_m`` (S,): each capsule's segment ends on the rod's axis (body z, m);
    ``radius_m`` (S,); per pair of capsules of two different rods, ``first``/``second`` (P,)
    the rods, ``first_shape``/``second_shape`` (P,) the capsules and ``reach_m`` (P,) the sum of
    their radii (their axes' distance at touching).
    """

    z0_m: torch.Tensor
    z1_m: torch.Tensor
    radius_m: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor
    first_shape: torch.Tensor
    second_shape: torch.Tensor
    reach_m: torch.Tensor


def rod_shapes(robot: RobotConfig, dtype: torch.dtype, device: torch.device | str) -> RodShapes:
    """``robot``'s rods as three capsules each: the bar (rod radius, end cap to end cap), and at each
    end one of the larger of the end-cap and motor radii, from the end-cap centre to where its
    rounded end meets the motor cylinder's inner face."""
    half = robot.rod.length_m / 2
    fat = max(robot.end_cap.radius_m, robot.motor.radius_m)
    inner = min(robot.motor.offset_m - robot.motor.length_m / 2 + fat, half)
    z0, z1, radius = [-half, -half, inner], [half, -inner, half], [robot.rod.radius_m, fat, fat]
    n = len(radius)
    pairs = [(i, j, a, b) for i, j in ROD_PAIRS for a in range(n) for b in range(n)]
    first, second, first_shape, second_shape = (torch.tensor(c, device=device) for c in zip(*pairs, strict=True))
    t = torch.tensor(radius, dtype=dtype, device=device)
    return RodShapes(
        z0_m=torch.tensor(z0, dtype=dtype, device=device),
        z1_m=torch.tensor(z1, dtype=dtype, device=device),
        radius_m=t,
        first=first,
        second=second,
        first_shape=first_shape,
        second_shape=second_shape,
        reach_m=t[first_shape] + t[second_shape],
    )


def closest_points(
    a: torch.Tensor, u: torch.Tensor, b: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The closest points of segments ``a + s u`` and ``b + t v`` (s, t in [0, 1]); all (..., 3) m.

    Returns the points on the first and on the second segment, each (..., 3). Parallel
    segments take the point of the first nearest the second's start (one of the closest pairs).
    """
    r = a - b
    uu, vv = (u * u).sum(-1), (v * v).sum(-1)
    uv, ur, vr = (u * v).sum(-1), (u * r).sum(-1), (v * r).sum(-1)
    denominator = uu * vv - uv * uv
    parallel = denominator <= 1e-12 * uu * vv
    s = torch.where(parallel, -ur / uu, (uv * vr - ur * vv) / torch.where(parallel, 1.0, denominator)).clamp(0.0, 1.0)
    t = (uv * s + vr) / vv
    s = torch.where(t < 0, (-ur / uu).clamp(0.0, 1.0), torch.where(t > 1, ((uv - ur) / uu).clamp(0.0, 1.0), s))
    t = t.clamp(0.0, 1.0)
    return a + s[..., None] * u, b + t[..., None] * v


def approach_impulse(gap: torch.Tensor, v_n: torch.Tensor, inv_mass: torch.Tensor, dt: float) -> torch.Tensor:
    """Normal impulse magnitude (>= 0, N s) per pair: the least that keeps a pair with ``gap``
    (m; negative: overlapping), normal approach speed ``v_n`` (m/s, negative approaching) and
    effective inverse mass ``inv_mass`` (1/kg) from closing more than its gap within ``dt`` (s)
    (an overlapping pair from closing further; the position step separates it)."""
    return ((-gap.clamp(min=0.0) / dt - v_n) / inv_mass).clamp(min=0.0)


def unit(vectors: torch.Tensor) -> torch.Tensor:
    """``vectors`` (..., 3) scaled to unit length (zero where they are zero)."""
    return vectors / vectors.norm(dim=-1, keepdim=True).clamp(min=_EPS)
