"""Quaternion helpers on torch tensors; quaternions are (w, x, y, z), shape (..., 4)."""

from __future__ import annotations

import torch


def quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices (..., 3, 3) of unit quaternions (..., 4)."""
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(*q.shape[:-1], 3, 3)


def quat_integrate(q: torch.Tensor, omega: torch.Tensor, dt: float) -> torch.Tensor:
    """Advance orientation ``q`` (..., 4) by world angular velocity ``omega`` (..., 3) over ``dt``,
    q' = normalise(q + dt/2 * (0, omega) * q)."""
    w, x, y, z = q.unbind(-1)
    ox, oy, oz = omega.unbind(-1)
    dq = torch.stack(
        [-ox * x - oy * y - oz * z, ox * w + oy * z - oz * y, oy * w + oz * x - ox * z, oz * w + ox * y - oy * x],
        dim=-1,
    )
    q = q + 0.5 * dt * dq
    return q / q.norm(dim=-1, keepdim=True)


def matrix_to_quat(m: torch.Tensor) -> torch.Tensor:
    """Unit quaternions (..., 4), w >= 0, of rotation matrices (..., 3, 3) (no gradient needed)."""
    trace = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    candidates = torch.stack(
        [
            torch.stack(
                [1 + trace, m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]], -1
            ),
            torch.stack(
                [
                    m[..., 2, 1] - m[..., 1, 2],
                    1 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2],
                    m[..., 0, 1] + m[..., 1, 0],
                    m[..., 0, 2] + m[..., 2, 0],
                ],
                -1,
            ),
            torch.stack(
                [
                    m[..., 0, 2] - m[..., 2, 0],
                    m[..., 0, 1] + m[..., 1, 0],
                    1 + m[..., 1, 1] - m[..., 0, 0] - m[..., 2, 2],
                    m[..., 1, 2] + m[..., 2, 1],
                ],
                -1,
            ),
            torch.stack(
                [
                    m[..., 1, 0] - m[..., 0, 1],
                    m[..., 0, 2] + m[..., 2, 0],
                    m[..., 1, 2] + m[..., 2, 1],
                    1 + m[..., 2, 2] - m[..., 0, 0] - m[..., 1, 1],
                ],
                -1,
            ),
        ],
        dim=-2,
    )
    best = candidates.norm(dim=-1).argmax(dim=-1, keepdim=True)
    q = torch.gather(candidates, -2, best[..., None].expand(*best.shape, 4)).squeeze(-2)
    q = q / q.norm(dim=-1, keepdim=True)
    return torch.where(q[..., :1] < 0, -q, q)
