"""Geometry of the 3-bar robot shared by the twin, the engine and perception.

Conventions (docs/design.md, *Conventions*): end caps 0..5, rod ``i`` joins caps ``topology.rods[i]``;
each rod's body frame has its z axis from its first cap to its second cap and its
origin at the rod centre. Positions are in metres.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig

N_CAPS = 6
N_RODS = 3
N_ACTUATED = 6
REST_TARGET = np.ones(N_ACTUATED)
"""The rest shape: every actuated cable at its longest target (1)."""
_LEFT = np.array([1, 2, 0, 4, 5, 3])
_RIGHT = np.array([2, 0, 1, 5, 3, 4])


def shift_left(targets: np.ndarray) -> np.ndarray:
    """The face map of targets: rolling onto the next face shifts each side's three actuated
    cables left, ``[a0..a5] -> [a1, a2, a0, a4, a5, a3]`` on the last axis of ``targets`` (..., 6)."""
    return np.asarray(targets)[..., _LEFT]


def shift_right(targets: np.ndarray) -> np.ndarray:
    """``[a0..a5] -> [a2, a0, a1, a5, a3, a4]``, the inverse of :func:`shift_left`."""
    return np.asarray(targets)[..., _RIGHT]


N_PASSIVE = 3
N_CABLES = N_ACTUATED + N_PASSIVE


@dataclass(frozen=True)
class CableEnd:
    """One end of a cable: the rod it is fixed to and the point in that rod's frame (m)."""

    rod: int
    cap: int
    local_m: tuple[float, float, float]


@dataclass(frozen=True)
class Cable:
    """A cable between two attachment points; ``actuated`` cables have a motor."""

    index: int
    actuated: bool
    a: CableEnd
    b: CableEnd


def target_to_length(robot: RobotConfig, target: np.ndarray) -> np.ndarray:
    """Map normalised targets in [0, 1] to actuated cable lengths (m)."""
    return robot.actuated_cable.min_length_m + robot.actuated_cable.range_m * np.asarray(target, float)


def length_to_target(robot: RobotConfig, length_m: np.ndarray) -> np.ndarray:
    """Inverse of :func:`target_to_length` (not clipped)."""
    return (np.asarray(length_m, float) - robot.actuated_cable.min_length_m) / robot.actuated_cable.range_m


def cable_pairs(robot: RobotConfig) -> list[tuple[int, int]]:
    """Cap pairs of all nine cables: actuated 0..5, then passive 6..8."""
    return [tuple(p) for p in robot.topology.actuated] + [tuple(p) for p in robot.topology.passive]


def rod_of_cap(robot: RobotConfig) -> dict[int, int]:
    """Map each end cap to its rod index."""
    return {cap: i for i, rod in enumerate(robot.topology.rods) for cap in rod}


def reference_prism(robot: RobotConfig) -> np.ndarray:
    """End-cap centres (6, 3) of the unloaded prism with all actuated cables at target 1.

    A 3-strut tensegrity prism is in self-stress when the two triangles are
    twisted so that each rod spans 150 deg and each passive tendon 30 deg
    (Kenner's twist pi/2 - pi/n). The triangle side is the full actuated cable
    length plus the end-cap diameter (cables attach on the cap surfaces). The
    odd-cap triangle lies at z = 0, the even one above it; the result is centred
    on its centroid.
    """
    side = robot.actuated_cable.min_length_m + robot.actuated_cable.range_m + 2 * robot.end_cap.radius_m
    radius = side / np.sqrt(3.0)
    twist = np.deg2rad(150.0)
    chord = 2 * radius * np.sin(twist / 2)
    if chord >= robot.rod.length_m:
        raise ValueError("rod too short for the triangle size implied by the actuated cable range")
    height = np.sqrt(robot.rod.length_m**2 - chord**2)
    caps = np.zeros((N_CAPS, 3))
    for i, (even, odd) in enumerate(sorted(robot.topology.rods, key=lambda r: min(r))):
        even, odd = (even, odd) if even % 2 == 0 else (odd, even)
        angle = 2 * np.pi * i / 3
        caps[odd] = [radius * np.cos(angle), radius * np.sin(angle), 0.0]
        caps[even] = [radius * np.cos(angle + twist), radius * np.sin(angle + twist), height]
    return caps - caps.mean(axis=0)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cross product on the last axis (faster than np.cross for many small arrays)."""
    return np.stack(
        [
            a[..., 1] * b[..., 2] - a[..., 2] * b[..., 1],
            a[..., 2] * b[..., 0] - a[..., 0] * b[..., 2],
            a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0],
        ],
        axis=-1,
    )


def _rod_axes(
    robot: RobotConfig, caps: np.ndarray, roll_rad: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rod centres and frame axes x, y, z, each (..., 3, 3); see :func:`rod_frames`."""
    caps = np.asarray(caps, float)
    rods = np.asarray(robot.topology.rods)
    first, second = caps[..., rods[:, 0], :], caps[..., rods[:, 1], :]
    z = second - first
    z = z / np.linalg.norm(z, axis=-1, keepdims=True)
    centres = 0.5 * (first + second)
    out = centres - caps.mean(axis=-2, keepdims=True)
    x = out - np.sum(out * z, axis=-1, keepdims=True) * z
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    if (norm < 1e-9).any():
        fallback = np.where(np.abs(z[..., :1]) < 0.9, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
        x = np.where(norm < 1e-9, _cross(z, fallback), x)
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
    x = x / norm
    y = _cross(z, x)
    if roll_rad is not None:
        c, s = np.cos(roll_rad)[..., None], np.sin(roll_rad)[..., None]
        x, y = c * x + s * y, c * y - s * x
    return centres, x, y, z


def rod_frames(
    robot: RobotConfig, caps: np.ndarray, roll_rad: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rod centres (..., 3, 3) and rotation matrices (..., 3, 3, 3) from end-cap centres (..., 6, 3).

    Each rod frame has z along the rod (first cap -> second cap) and, by
    convention, x pointing away from the robot's centroid, perpendicular to the
    rod. ``roll_rad`` (..., 3), optional: each frame is then turned by that angle
    about its z axis (a rod's actual roll relative to the convention).
    """
    centres, x, y, z = _rod_axes(robot, caps, roll_rad)
    return centres, np.stack([x, y, z], axis=-1)


def rod_rolls(robot: RobotConfig, caps: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Each rod's roll (..., 3) rad about its axis: the angle ``roll_rad`` for which
    :func:`rod_frames` of end caps ``caps`` (..., 6, 3) gives the rod orientations ``rotations``
    (..., 3, 3, 3), columns the body axes (their x axes projected on the plane normal to the rod)."""
    _, x, y, _ = _rod_axes(robot, caps, None)
    body_x = np.asarray(rotations, float)[..., 0]
    return np.arctan2(np.sum(body_x * y, axis=-1), np.sum(body_x * x, axis=-1))


@functools.lru_cache(maxsize=64)
def _cable_end_arrays(cables: tuple[Cable, ...]) -> tuple[np.ndarray, ...]:
    """Rod indices (2, 9) and body-frame points (2, 9, 3) of both ends of every cable."""
    rods = np.array([[c.a.rod for c in cables], [c.b.rod for c in cables]])
    local = np.array([[c.a.local_m for c in cables], [c.b.local_m for c in cables]])
    return rods, local


def cable_lengths_from_caps(
    robot: RobotConfig, cables: list[Cable], caps: np.ndarray, roll_rad: np.ndarray | None = None
) -> np.ndarray:
    """Distances (..., 9) between each cable's attachment points for end-cap centres (..., 6, 3),
    with rod frames from :func:`rod_frames` (optional rolls ``roll_rad`` (..., 3))."""
    centres, x, y, z = _rod_axes(robot, caps, roll_rad)
    rods, local = _cable_end_arrays(tuple(cables))
    ends = [
        centres[..., r, :] + x[..., r, :] * p[:, :1] + y[..., r, :] * p[:, 1:2] + z[..., r, :] * p[:, 2:]
        for r, p in zip(rods, local, strict=True)
    ]
    return np.linalg.norm(ends[1] - ends[0], axis=-1)


def attachment_ring(robot: RobotConfig, rod: int, cap: int, phase_rad: float) -> np.ndarray:
    """The three attachment points (3, 3) of ``cap`` in its rod's frame (m).

    They lie on the cap sphere's great circle perpendicular to the rod, at angles
    ``phase_rad + k * 2*pi/3``.
    """
    a, _ = robot.topology.rods[rod]
    z = -robot.rod.length_m / 2 if cap == a else robot.rod.length_m / 2
    r = robot.end_cap.radius_m
    angles = phase_rad + 2 * np.pi * np.arange(3) / 3
    return np.column_stack([r * np.cos(angles), r * np.sin(angles), np.full(3, z)])


def build_cables(robot: RobotConfig, phases_rad: tuple[float, float, float]) -> list[Cable]:
    """Assign every cable end to one of its cap's three attachment points.

    For each cap, the assignment of its three cables to its three points is the
    permutation with the shortest total cable length in the reference prism, so
    cables never wrap around their own end cap.
    """
    caps = reference_prism(robot)
    centres, rotations = rod_frames(robot, caps)
    rod_of = rod_of_cap(robot)
    pairs = cable_pairs(robot)
    cables_at: dict[int, list[tuple[int, int]]] = {c: [] for c in range(N_CAPS)}
    for j, (a, b) in enumerate(pairs):
        cables_at[a].append((j, b))
        cables_at[b].append((j, a))
    chosen: dict[tuple[int, int], np.ndarray] = {}
    for cap, ends in cables_at.items():
        rod = rod_of[cap]
        ring = attachment_ring(robot, rod, cap, phases_rad[rod])
        world = centres[rod] + ring @ rotations[rod].T
        best = min(
            itertools.permutations(range(3), len(ends)),
            key=lambda perm: sum(
                np.linalg.norm(world[k] - caps[other]) for k, (_, other) in zip(perm, ends, strict=True)
            ),
        )
        for k, (j, _) in zip(best, ends, strict=True):
            chosen[(j, cap)] = ring[k]
    cables = []
    for j, (a, b) in enumerate(pairs):
        ends = [CableEnd(rod=rod_of[c], cap=c, local_m=tuple(float(v) for v in chosen[(j, c)])) for c in (a, b)]
        cables.append(Cable(index=j, actuated=j < N_ACTUATED, a=ends[0], b=ends[1]))
    return cables


def rotation_to_quat(rotation: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) of a 3x3 rotation matrix, w >= 0."""
    m = rotation
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.asarray(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def resting_on_face(robot: RobotConfig, caps: np.ndarray, face: tuple[int, int, int] = (0, 2, 5)) -> np.ndarray:
    """Rotate and translate cap centres (6, 3) so ``face`` lies on the ground.

    The plane through the three caps becomes horizontal with the other caps
    above it, and the caps touch z = 0 with their sphere surfaces.
    """
    p = caps[list(face)]
    normal = np.cross(p[1] - p[0], p[2] - p[0])
    normal /= np.linalg.norm(normal)
    if np.dot(caps.mean(axis=0) - p.mean(axis=0), normal) < 0:
        normal = -normal
    axis = np.cross(normal, [0.0, 0.0, 1.0])
    s, c = np.linalg.norm(axis), float(np.dot(normal, [0.0, 0.0, 1.0]))
    if s < 1e-12:
        rotation = np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    else:
        k = axis / s
        kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
        rotation = np.eye(3) + s * kx + (1 - c) * kx @ kx
    out = (caps - p.mean(axis=0)) @ rotation.T
    out[:, 2] += robot.end_cap.radius_m - out[list(face), 2].mean()
    return out


def quat_to_rotation(quat: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) from unit quaternions (..., 4) in (w, x, y, z) order."""
    q = np.asarray(quat, float)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = np.moveaxis(q, -1, 0)
    rows = [
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ]
    return np.stack([np.stack(r, axis=-1) for r in rows], axis=-2)


def cable_lengths_from_poses(cables: list[Cable], rod_pos_m: np.ndarray, rod_quat: np.ndarray) -> np.ndarray:
    """Distances (..., 9) between each cable's attachment points given rod poses.

    ``rod_pos_m`` (..., 3, 3) rod centres, ``rod_quat`` (..., 3, 4) orientations (w, x, y, z).
    """
    rotations = quat_to_rotation(rod_quat)
    lengths = []
    for cable in cables:
        ends = [
            rod_pos_m[..., end.rod, :] + np.einsum("...ij,j->...i", rotations[..., end.rod, :, :], end.local_m)
            for end in (cable.a, cable.b)
        ]
        lengths.append(np.linalg.norm(ends[0] - ends[1], axis=-1))
    return np.stack(lengths, axis=-1)


def principal_axis(caps_m: np.ndarray) -> np.ndarray:
    """Unit vector (..., 3) from the centroid of caps 1, 3, 5 to that of caps 0, 2, 4 (Tribar paper)."""
    caps = np.asarray(caps_m)
    axis = caps[..., [0, 2, 4], :].mean(axis=-2) - caps[..., [1, 3, 5], :].mean(axis=-2)
    return axis / np.linalg.norm(axis, axis=-1, keepdims=True)


def wrapped_rad(angle_rad: float | np.ndarray) -> float | np.ndarray:
    """``angle_rad`` (rad) wrapped to [-pi, pi)."""
    return (angle_rad + np.pi) % (2 * np.pi) - np.pi


def heading_rad(caps_m: np.ndarray) -> np.ndarray:
    """Heading (...,) in rad: the principal axis projected on the ground, rotated +90 deg about z."""
    axis = principal_axis(caps_m)
    return np.arctan2(axis[..., 1], axis[..., 0]) + np.pi / 2
