"""Contact between rods: closest points of their bars and a speculative, inelastic impulse.

The engine's rods are capsules of the rod radius between their end-cap centres. Without
contact between them, rods pass through each other: the gait search then finds motions
that fold the prism through itself (a turning gait of the main job did, and on the twin,
whose rods collide as the hardware's do, the robot jammed flat and timed out every later
target). A contact is speculative (as the ground's is): it acts once the pair's gap would
close within the step at its current approach speed, so a fast rod cannot tunnel through a
thin one between two steps.
"""

from __future__ import annotations

import torch

PAIR_ROD = (torch.tensor([0, 0, 1]), torch.tensor([1, 2, 2]))
"""Each rod pair's first and second rod."""
ROD_CONTACT_SWEEPS = 4
"""Most passes over the three pairs per step (Jacobi): rods touching two others at once share
their corrections."""
ROD_CONTACT_MARGIN_M = 0.02
"""Bars farther apart than this (m, beyond touching) in every pair of every environment skip the
contact computation for the step: no rod closes 2 cm in one step of a few milliseconds."""
_EPS = 1e-12


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
