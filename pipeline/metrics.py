"""Motion and error figures of end-cap trajectories: a run's motion in its start frame, and an
estimated trajectory's errors against ground truth (evaluation only)."""

from __future__ import annotations

import math

import numpy as np

from pipeline.config import RobotConfig
from pipeline.gaits.outcome import heading_change_rad
from pipeline.robot_model import heading_rad


def motion_in_start_frame(caps_m: np.ndarray) -> tuple[float, float, float]:
    """Final centroid displacement (forward along the start heading, lateral; m) and heading
    change (deg, ccw positive, unwrapped) of end caps ``caps_m`` (T, 6, 3)."""
    heading = float(heading_rad(caps_m[0]))
    forward = np.array([math.cos(heading), math.sin(heading)])
    lateral = np.array([-forward[1], forward[0]])
    displacement = caps_m[-1].mean(0)[:2] - caps_m[0].mean(0)[:2]
    return float(displacement @ forward), float(displacement @ lateral), math.degrees(heading_change_rad(caps_m))


def truth_at(t: np.ndarray, truth_t: np.ndarray, truth_caps: np.ndarray) -> np.ndarray:
    """Ground-truth end caps (N, 6, 3) at times ``t`` (N,): for each, the truth sample
    (of ``truth_caps`` (M, 6, 3) at increasing ``truth_t`` (M,)) nearest in time. The
    twin samples the truth at every control tick and stamps sensor samples with a
    little jitter around the tick, so the nearest sample is the one that was sensed."""
    if len(truth_t) == 1:
        return np.repeat(truth_caps, len(t), axis=0)
    right = np.clip(np.searchsorted(truth_t, t), 1, len(truth_t) - 1)
    left = right - 1
    nearest = np.where(np.abs(truth_t[left] - t) <= np.abs(truth_t[right] - t), left, right)
    return truth_caps[nearest]


def rod_axis_error_deg(robot: RobotConfig, caps: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Angle (N, 3) in degrees between each estimated rod axis and the true one; caps (N, 6, 3)."""
    rods = np.asarray(robot.topology.rods)
    est = caps[:, rods[:, 1]] - caps[:, rods[:, 0]]
    ref = truth[:, rods[:, 1]] - truth[:, rods[:, 0]]
    cos = np.sum(est * ref, axis=-1) / (np.linalg.norm(est, axis=-1) * np.linalg.norm(ref, axis=-1))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def identity_swaps(robot: RobotConfig, caps: np.ndarray, truth: np.ndarray) -> int:
    """Samples in which some rod's two end caps are closer to each other's true positions
    than to their own (the rod's identity is flipped); caps, truth (N, 6, 3)."""
    rods = np.asarray(robot.topology.rods)
    a, b = rods[:, 0], rods[:, 1]
    own = np.linalg.norm(caps[:, a] - truth[:, a], axis=-1) + np.linalg.norm(caps[:, b] - truth[:, b], axis=-1)
    swapped = np.linalg.norm(caps[:, a] - truth[:, b], axis=-1) + np.linalg.norm(caps[:, b] - truth[:, a], axis=-1)
    return int((swapped < own).any(axis=1).sum())


def pose_errors(robot: RobotConfig, caps: np.ndarray, truth: np.ndarray, centred: bool = False) -> dict[str, float]:
    """End-cap error (mm), rod-axis error (deg) and identity swaps of estimates ``caps``
    (N, 6, 3) against ``truth`` (N, 6, 3).

    ``centred``: for estimators that do not observe translation, compare about each
    sample's centroid, and add the shape-only error (``shape_error_*``: after also
    rotating each estimate onto its truth, Kabsch).
    """
    caps, truth = np.asarray(caps, float), np.asarray(truth, float)
    if caps.shape != truth.shape or caps.shape[1:] != (6, 3) or len(caps) == 0:
        raise ValueError(f"caps and truth must both be (N >= 1, 6, 3), got {caps.shape} and {truth.shape}")
    extra: dict[str, float] = {}
    if centred:
        caps = caps - caps.mean(axis=1, keepdims=True)
        truth = truth - truth.mean(axis=1, keepdims=True)
        u, _, vt = np.linalg.svd(np.einsum("nki,nkj->nij", truth, caps))
        u[:, :, -1] *= np.sign(np.linalg.det(u @ vt))[:, None]
        shape = np.linalg.norm(np.einsum("nij,nkj->nki", u @ vt, caps) - truth, axis=-1) * 1e3
        extra = {"shape_error_mean_mm": float(shape.mean()), "shape_error_max_mm": float(shape.max())}
    cap_error = np.linalg.norm(caps - truth, axis=-1) * 1e3
    axis_error = rod_axis_error_deg(robot, caps, truth)
    return {
        **extra,
        "cap_error_mean_mm": float(cap_error.mean()),
        "cap_error_p95_mm": float(np.percentile(cap_error, 95)),
        "cap_error_max_mm": float(cap_error.max()),
        "rod_axis_error_mean_deg": float(axis_error.mean()),
        "rod_axis_error_max_deg": float(axis_error.max()),
        "identity_swaps": identity_swaps(robot, caps, truth),
        "samples": len(caps),
    }


def rollout_errors(robot: RobotConfig, caps: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """A simulated rollout's errors against the truth, averaged over its ticks (the hybrid
    graph-network paper's figures), for end caps ``caps`` and ``truth`` (T, 6, 3):
    ``e_pos_pct`` the centre-of-mass distance in % of the rod length, ``e_rot_deg`` the angle
    between predicted and true rod axes, ``e_pen_pct`` / ``e_pen_mm`` how far the lowest end cap
    sinks into the ground beyond the truth's, in % of the rod length and mm."""
    length = robot.rod.length_m
    e_pos = np.linalg.norm(caps.mean(1) - truth.mean(1), axis=-1).mean() / length
    radius = robot.end_cap.radius_m
    lowest_pred = np.minimum((caps[..., 2] - radius).min(-1), 0.0)
    lowest_true = np.minimum((truth[..., 2] - radius).min(-1), 0.0)
    sink = np.maximum(lowest_true - lowest_pred, 0.0).mean()
    return {
        "e_pos_pct": float(100 * e_pos),
        "e_rot_deg": float(rod_axis_error_deg(robot, caps, truth).mean()),
        "e_pen_pct": float(100 * sink / length),
        "e_pen_mm": float(1000 * sink),
    }
