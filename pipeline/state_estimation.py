"""On-board state estimation from the nine cable sensors and the rod IMUs (Tribar paper).

The robot's state is its shape plus its orientation in the world. Seed 002 estimates
it in two steps, and so does this module:

1. **Shape** (:class:`ShapeEstimator`): the six end-cap centres that best explain
   the nine sensed cable lengths, with every rod exactly ``rod.length_m`` long. Each
   rod is parameterised as a centre plus a unit axis, its caps at
   ``centre -/+ axis * L/2``, so the rod constraint holds by construction. The
   sensors measure distances between attachment points on the end-cap surfaces, so
   the model is :func:`pipeline.robot_model.cable_lengths_from_caps` with the
   configured attachments and one roll angle per rod as extra unknowns, pulled
   toward the previous frame's rolls. The result lives in an arbitrary frame centred
   on the caps' centroid.
2. **Orientation** (:func:`estimate_orientation`): the rotation that best aligns
   the estimated directions of the IMU rods with the directions the IMUs measure
   (an IMU quaternion is its rod body's orientation, whose z axis runs from the
   rod's first cap to its second).

:class:`StateEstimator` adds a step beyond the Tribar paper (``refine=True``, the default):
one least-squares fit of shape and orientation together to the cable lengths *and*
the IMU orientations, started from the previous frame (or from the two steps above
at the first frame and after a restart). Cables alone fix the shape poorly: a
tensegrity in equilibrium has an infinitesimal mechanism (12 length constraints on
12 degrees of freedom, with a self-stress), so near rest the map from shape to the
nine lengths folds and shapes millimetres apart share nearly the same lengths; the
rolls, which move the attachment points, are not determined by the cables at all.
The IMUs observe both: the angles between rods, and (``imu_roll=True``) each rod's
roll, since the IMU quaternion is the rod body frame in which the attachment phases
are given.

Translation is not observable from these sensors (the Tribar paper does not estimate it).
World positions therefore follow a convention (:func:`place_on_ground`): the caps'
centroid is at x = y = 0 and the lowest end cap touches the ground (its centre at
z = ``end_cap.radius_m``). Compare them with ground truth only through
translation-free metrics (:func:`state_errors`).

All lengths are in metres unless a name says otherwise (``_mm``); angles in rad
unless ``_deg``. Quaternions are (w, x, y, z).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from pipeline.config import RobotConfig
from pipeline.robot_model import (
    N_CABLES,
    N_CAPS,
    N_RODS,
    Cable,
    build_cables,
    cable_lengths_from_caps,
    quat_to_rotation,
    reference_prism,
    resting_on_face,
    rod_frames,
)

CABLE_COLUMNS = [f"cable_{j}" for j in range(N_CABLES)]
CAP_COLUMNS = [f"cap{i}_{a}" for i in range(N_CAPS) for a in "xyz"]
CONF_COLUMNS = [f"cap{i}_conf" for i in range(N_CAPS)]
COPIED_COLUMNS = ["t", "segment", *[f"target_{k}" for k in range(6)]]

_N_PARAMS = 6 * N_RODS
_FD_STEP = 1e-6


def handedness(robot: RobotConfig, caps_m: np.ndarray) -> np.ndarray:
    """Signed twist (...,) in m^3 of the prism with end-cap centres ``caps_m`` (..., 6, 3).

    For each rod, the cross product of its odd cap's offset from the odd caps'
    centroid with the rod vector (odd cap -> even cap), projected on the principal
    axis (odd centroid -> even centroid), summed over the rods. Its sign is the
    prism's chirality, which a mirror image reverses and no motion of the robot can.
    """
    caps = np.asarray(caps_m, float)
    odd = [a if a % 2 else b for a, b in robot.topology.rods]
    even = [b if a % 2 else a for a, b in robot.topology.rods]
    odd_centre = caps[..., odd, :].mean(axis=-2, keepdims=True)
    axis = caps[..., even, :].mean(axis=-2) - odd_centre[..., 0, :]
    twist = np.cross(caps[..., odd, :] - odd_centre, caps[..., even, :] - caps[..., odd, :])
    return np.einsum("...ki,...i->...", twist, axis)


def rod_directions(robot: RobotConfig, caps_m: np.ndarray) -> np.ndarray:
    """Unit vectors (..., 3, 3) along each rod, first cap -> second cap, from caps (..., 6, 3)."""
    caps = np.asarray(caps_m, float)
    rods = np.asarray(robot.topology.rods)
    d = caps[..., rods[:, 1], :] - caps[..., rods[:, 0], :]
    return d / np.linalg.norm(d, axis=-1, keepdims=True)


def _angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angles (...,) in rad between unit vectors a and b (..., 3)."""
    return np.arccos(np.clip(np.sum(a * b, axis=-1), -1.0, 1.0))


@dataclass(frozen=True)
class ImuEvidence:
    """IMU readings of one frame for the joint fit: ``rods`` (k sorted rod indices),
    ``rotations`` (k, 3, 3) their measured orientations, ``weight_m_per_rad`` (residual
    metres per radian of orientation error) and ``use_roll`` (also fit each rod's roll
    to its IMU, not only its direction)."""

    rods: list[int]
    rotations: np.ndarray
    weight_m_per_rad: float
    use_roll: bool

    @classmethod
    def from_quats(cls, imu_quat: Mapping[int, np.ndarray], weight_m_per_rad: float, use_roll: bool) -> ImuEvidence:
        """From a map rod -> IMU quaternion (4,)."""
        rods = sorted(imu_quat)
        return cls(rods, quat_to_rotation(np.array([imu_quat[r] for r in rods])), weight_m_per_rad, use_roll)

    @property
    def directions(self) -> np.ndarray:
        """Measured rod directions (k, 3): each IMU's z axis ``R_imu @ [0, 0, 1]``."""
        return self.rotations[:, :, 2]


@dataclass(frozen=True)
class ShapeEstimate:
    """One frame's fit: ``caps_m`` (6, 3) end-cap centres with their centroid at the origin,
    ``roll_rad`` (3,) rod rolls about their axes relative to the
    :func:`~pipeline.robot_model.rod_frames` convention, ``residual_m`` (9,) modelled minus
    sensed cable lengths."""

    caps_m: np.ndarray
    roll_rad: np.ndarray
    residual_m: np.ndarray

    @property
    def rms_residual_m(self) -> float:
        """Root-mean-square cable residual (m)."""
        return float(np.sqrt(np.mean(self.residual_m**2)))


class _RodFit:
    """Least-squares fit of rod poses and rolls to cable lengths (and optionally IMUs).

    Parameters (18), relative to the starting point: rod-centre offsets (3 x 3),
    axis tilts in the tangent plane of the starting axes (3 x 2), roll offsets (3).
    Residuals, in metres: cable model minus measurement (9); each rod's roll weight
    times its roll's distance from its prior (3); the caps' centroid (3, fixes
    translation); then either a linearised rotation away from the starting caps (3,
    fixes the otherwise arbitrary orientation) or, with IMU evidence, its weight
    times each IMU rod's modelled minus measured z axis (3 per rod) and, with
    ``use_roll``, x axis (3 per rod).
    """

    def __init__(self, robot: RobotConfig, cables: list[Cable]) -> None:
        self.robot = robot
        self.cables = cables
        rods = np.asarray(robot.topology.rods)
        self.first, self.second = rods[:, 0], rods[:, 1]

    def _caps(self, x: np.ndarray, centres0: np.ndarray, axes0: np.ndarray, tangents0: np.ndarray) -> np.ndarray:
        """End-cap centres (..., 6, 3) from parameters ``x`` (..., 18)."""
        lead = x.shape[:-1]
        centres = centres0 + x[..., :9].reshape(*lead, N_RODS, 3)
        axes = axes0 + np.sum(x[..., 9:15].reshape(*lead, N_RODS, 2, 1) * tangents0, axis=-2)
        half = (0.5 * self.robot.rod.length_m) * axes / np.linalg.norm(axes, axis=-1, keepdims=True)
        caps = np.empty((*lead, N_CAPS, 3))
        caps[..., self.first, :] = centres - half
        caps[..., self.second, :] = centres + half
        return caps

    def solve(
        self,
        cable_m: np.ndarray,
        caps0: np.ndarray,
        roll0: np.ndarray,
        roll_prior: np.ndarray,
        roll_weight: np.ndarray,
        imu: ImuEvidence | None = None,
    ) -> ShapeEstimate:
        """Fit starting from caps ``caps0`` (6, 3) and rolls ``roll0`` (3,); ``roll_weight``
        (3,) in m per rad."""
        centres0 = 0.5 * (caps0[self.first] + caps0[self.second])
        axes0 = caps0[self.second] - caps0[self.first]
        axes0 = axes0 / np.linalg.norm(axes0, axis=-1, keepdims=True)
        helper = np.where(np.abs(axes0[:, :1]) < 0.9, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
        e1 = np.cross(axes0, helper)
        e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
        tangents0 = np.stack([e1, np.cross(axes0, e1)], axis=-2)
        reference = caps0 - caps0.mean(axis=0)
        rotation_scale = self.robot.rod.length_m / np.sum(reference**2)

        def residuals(x: np.ndarray) -> np.ndarray:
            caps = self._caps(x, centres0, axes0, tangents0)
            roll = roll0 + x[..., 15:]
            lead = x.shape[:-1]
            parts = [
                cable_lengths_from_caps(self.robot, self.cables, caps, roll) - cable_m,
                roll_weight * (roll - roll_prior),
                caps.mean(axis=-2),
            ]
            if imu is None:
                parts.append(rotation_scale * np.sum(np.cross(reference, caps), axis=-2))
            else:
                first, second = self.first[imu.rods], self.second[imu.rods]
                direction = (caps[..., second, :] - caps[..., first, :]) / self.robot.rod.length_m
                parts.append(imu.weight_m_per_rad * (direction - imu.rotations[:, :, 2]).reshape(*lead, -1))
                if imu.use_roll:
                    x_axes = rod_frames(self.robot, caps, roll)[1][..., :, 0][..., imu.rods, :]
                    parts.append(imu.weight_m_per_rad * (x_axes - imu.rotations[:, :, 0]).reshape(*lead, -1))
            return np.concatenate(parts, axis=-1)

        steps = _FD_STEP * np.eye(_N_PARAMS)

        def jacobian(x: np.ndarray) -> np.ndarray:
            r = residuals(np.concatenate([x + steps, x - steps]))
            return (r[:_N_PARAMS] - r[_N_PARAMS:]).T / (2 * _FD_STEP)

        fit = least_squares(residuals, np.zeros(_N_PARAMS), jac=jacobian, method="lm", xtol=1e-6, ftol=1e-5)
        caps = self._caps(fit.x, centres0, axes0, tangents0)
        roll = roll0 + fit.x[15:]
        residual = cable_lengths_from_caps(self.robot, self.cables, caps, roll) - cable_m
        return ShapeEstimate(caps_m=caps - caps.mean(axis=0), roll_rad=roll, residual_m=residual)


def _check_cables(cable_m: np.ndarray) -> np.ndarray:
    cable_m = np.asarray(cable_m, float)
    if cable_m.shape != (N_CABLES,) or not np.all(np.isfinite(cable_m)) or np.any(cable_m <= 0):
        raise ValueError(f"cable_m must be {N_CABLES} finite positive lengths (m), got {cable_m!r}")
    return cable_m


class ShapeEstimator:
    """Seed 002's shape step, frame by frame, warm-started from the previous frame.

    ``cables``: the cable model (default: ``build_cables`` at the configured
    attachment phases). ``roll_weight_m_per_rad`` weighs the roll prior against the
    cable residuals: with cable errors of sigma metres and roll changes of s rad per
    frame, sigma / s. A fit with the opposite chirality to the reference prism (a
    mirror image, which matches the cap-centre distances equally well) is redone from
    its own mirror image. A warm-started fit that is still mirrored, or whose RMS
    cable residual exceeds ``restart_rms_m``, is redone from the reference prism and
    the better kept (:meth:`better`).
    """

    def __init__(
        self,
        robot: RobotConfig,
        cables: list[Cable] | None = None,
        roll_weight_m_per_rad: float = 0.02,
        restart_rms_m: float = 0.005,
    ) -> None:
        self.robot = robot
        self.cables = cables if cables is not None else build_cables(robot, robot.attachment.phase_rad)
        self.roll_weight = roll_weight_m_per_rad
        self.restart_rms_m = restart_rms_m
        self._fit = _RodFit(robot, self.cables)
        start = resting_on_face(robot, reference_prism(robot))
        self.start_caps_m = start - start.mean(axis=0)
        self.chirality = float(np.sign(handedness(robot, self.start_caps_m)))
        self.previous: ShapeEstimate | None = None

    def reset(self) -> None:
        """Forget the previous frame: the next one starts from the reference prism."""
        self.previous = None

    def fit(
        self,
        cable_m: np.ndarray,
        caps0: np.ndarray,
        roll0: np.ndarray,
        roll_prior: np.ndarray,
        imu: ImuEvidence | None = None,
    ) -> ShapeEstimate:
        """One fit to cable lengths ``cable_m`` (9,) from caps ``caps0`` (6, 3) and rolls
        ``roll0`` (3,), rolls pulled toward ``roll_prior`` (3,); redone from the mirror
        image if it comes out mirrored. Does not touch :attr:`previous`. With ``imu``
        rolls measured by an IMU are not pulled toward the prior."""
        weight = np.full(N_RODS, self.roll_weight)
        if imu is not None and imu.use_roll:
            weight[imu.rods] = 0.0
        estimate = self._fit.solve(cable_m, caps0, roll0, roll_prior, weight, imu)
        if not self.right_handed(estimate):
            mirror = estimate.caps_m * np.array([1.0, 1.0, -1.0])
            estimate = self._fit.solve(cable_m, mirror, -estimate.roll_rad, roll_prior, weight, imu)
        return estimate

    def right_handed(self, estimate: ShapeEstimate) -> bool:
        """Whether ``estimate`` has the reference prism's chirality."""
        return bool(np.sign(handedness(self.robot, estimate.caps_m)) == self.chirality)

    def acceptable(self, estimate: ShapeEstimate) -> bool:
        """Right-handed and within ``restart_rms_m`` of the sensed lengths."""
        return self.right_handed(estimate) and estimate.rms_residual_m <= self.restart_rms_m

    def better(self, a: ShapeEstimate, b: ShapeEstimate) -> ShapeEstimate:
        """The acceptable one of two fits, else the one closer to the sensed lengths."""
        return min((a, b), key=lambda e: (not self.acceptable(e), e.rms_residual_m))

    def estimate(self, cable_m: np.ndarray) -> ShapeEstimate:
        """Shape for one frame of sensed cable lengths ``cable_m`` (9,) in m; it becomes
        the next frame's starting point."""
        cable_m = _check_cables(cable_m)
        zeros = np.zeros(N_RODS)
        if self.previous is None:
            estimate = self.fit(cable_m, self.start_caps_m, zeros, zeros)
        else:
            prior = self.previous.roll_rad
            estimate = self.fit(cable_m, self.previous.caps_m, prior, prior)
            if not self.acceptable(estimate):
                estimate = self.better(estimate, self.fit(cable_m, self.start_caps_m, zeros, prior))
        self.previous = estimate
        return estimate


def estimate_orientation(
    robot: RobotConfig, caps_m: np.ndarray, imu_quat: Mapping[int, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Seed 002's orientation step: the rotation (3, 3) taking the shape ``caps_m``
    (6, 3) into the world, and the angle (k,) in rad left between each IMU rod's
    rotated direction and its measured one.

    ``imu_quat`` maps rod index -> IMU quaternion of that rod, for at least two rods.
    """
    if len(imu_quat) < 2:
        raise ValueError(f"orientation needs IMUs on at least two rods, got rods {sorted(imu_quat)}")
    imu = ImuEvidence.from_quats(imu_quat, 1.0, use_roll=False)
    estimated = rod_directions(robot, caps_m)[imu.rods]
    rotation, _ = Rotation.align_vectors(imu.directions, estimated)
    matrix = rotation.as_matrix()
    return matrix, _angles(estimated @ matrix.T, imu.directions)


def place_on_ground(robot: RobotConfig, caps_m: np.ndarray) -> np.ndarray:
    """Translate world-oriented caps (6, 3) so their centroid is at x = y = 0 and the
    lowest cap centre is at z = ``end_cap.radius_m`` (the translation convention)."""
    caps = np.asarray(caps_m, float)
    centroid = caps.mean(axis=0)
    return caps - np.array([centroid[0], centroid[1], caps[:, 2].min() - robot.end_cap.radius_m])


@dataclass(frozen=True)
class StateEstimate:
    """One frame's state: ``caps_m`` (6, 3) end-cap centres in world orientation,
    translated by :func:`place_on_ground`; ``roll_rad`` (3,); ``cable_residual_m`` (9,)
    modelled minus sensed lengths; ``imu_residual_rad`` (k,) angle between each IMU
    rod's estimated and measured direction; ``confidence`` in (0, 1]."""

    caps_m: np.ndarray
    roll_rad: np.ndarray
    cable_residual_m: np.ndarray
    imu_residual_rad: np.ndarray
    confidence: float


class StateEstimator:
    """Shape and orientation from cable lengths and IMUs, frame by frame.

    ``refine=False`` runs the Tribar paper's two steps on every frame (:class:`ShapeEstimator`
    warm-started from the previous frame, then :func:`estimate_orientation`).
    ``refine=True`` fits shape and orientation jointly to cables and IMUs, started
    from the previous frame's result; the two steps give the start at the first frame
    and whenever that fit is not acceptable (mirrored, or RMS cable residual above
    ``restart_rms_m``; the better fit is kept).

    ``imu_roll``: the joint fit also matches each IMU rod's roll (and no longer pulls
    that rod's roll toward the previous frame's). This assumes the IMU quaternion is
    the rod body frame in which ``robot.attachment.phase_rad`` places the attachment
    points, as on the twin; an error in those phases biases the shape (about 1 mm for
    0.1 rad), still less than leaving the rolls to the cables. Turn it off for a robot
    whose IMU mounting is not calibrated against the attachments.

    Weights: cable residuals count 1 / ``cable_sigma_m``, IMU axis residuals
    1 / ``imu_sigma_rad``, roll changes between frames 1 / ``roll_sigma_rad``.
    ``confidence = exp(-(rms cable residual / cable_sigma_m)^2 / 2 - mean((IMU direction
    residual / imu_sigma_rad)^2) / 2)`` is a consistency score, not an error bar: it
    falls when the sensors disagree with each other or with the rigid-rod model (a
    faulty cable reading), but within normal noise it barely tracks the actual error.
    """

    def __init__(
        self,
        robot: RobotConfig,
        cables: list[Cable] | None = None,
        cable_sigma_m: float = 0.002,
        imu_sigma_rad: float = 0.02,
        roll_sigma_rad: float = 0.1,
        refine: bool = True,
        imu_roll: bool = True,
        restart_rms_m: float = 0.005,
    ) -> None:
        self.robot = robot
        self.shape = ShapeEstimator(robot, cables, cable_sigma_m / roll_sigma_rad, restart_rms_m)
        self.cable_sigma_m = cable_sigma_m
        self.imu_sigma_rad = imu_sigma_rad
        self.refine = refine
        self.imu_roll = imu_roll
        self.previous: ShapeEstimate | None = None

    def reset(self) -> None:
        """Forget the previous frame."""
        self.shape.reset()
        self.previous = None

    def _two_step(self, cable_m: np.ndarray, imu_quat: Mapping[int, np.ndarray]) -> ShapeEstimate:
        shape = self.shape.estimate(cable_m)
        rotation, _ = estimate_orientation(self.robot, shape.caps_m, imu_quat)
        return ShapeEstimate(shape.caps_m @ rotation.T, shape.roll_rad, shape.residual_m)

    def _joint(self, cable_m: np.ndarray, imu_quat: Mapping[int, np.ndarray]) -> ShapeEstimate:
        imu = ImuEvidence.from_quats(imu_quat, self.cable_sigma_m / self.imu_sigma_rad, self.imu_roll)
        if self.previous is None:
            self.shape.reset()
            start = self._two_step(cable_m, imu_quat)
            return self.shape.fit(cable_m, start.caps_m, start.roll_rad, start.roll_rad, imu)
        prior = self.previous.roll_rad
        estimate = self.shape.fit(cable_m, self.previous.caps_m, prior, prior, imu)
        if not self.shape.acceptable(estimate):
            self.shape.reset()
            start = self._two_step(cable_m, imu_quat)
            estimate = self.shape.better(estimate, self.shape.fit(cable_m, start.caps_m, start.roll_rad, prior, imu))
        return estimate

    def estimate(self, cable_m: np.ndarray, imu_quat: Mapping[int, np.ndarray]) -> StateEstimate:
        """State for one frame: sensed cable lengths ``cable_m`` (9,) in m and IMU
        quaternions ``imu_quat`` (rod -> (4,)) for at least two rods."""
        cable_m = _check_cables(cable_m)
        if len(imu_quat) < 2:
            raise ValueError(f"state estimation needs IMUs on at least two rods, got rods {sorted(imu_quat)}")
        if self.refine:
            shape = self._joint(cable_m, imu_quat)
            self.previous = shape
        else:
            shape = self._two_step(cable_m, imu_quat)
        imu = ImuEvidence.from_quats(imu_quat, 1.0, use_roll=False)
        imu_residual = _angles(rod_directions(self.robot, shape.caps_m)[imu.rods], imu.directions)
        confidence = np.exp(
            -0.5 * (shape.rms_residual_m / self.cable_sigma_m) ** 2
            - 0.5 * np.mean((imu_residual / self.imu_sigma_rad) ** 2)
        )
        return StateEstimate(
            caps_m=place_on_ground(self.robot, shape.caps_m),
            roll_rad=shape.roll_rad,
            cable_residual_m=shape.residual_m,
            imu_residual_rad=imu_residual,
            confidence=float(confidence),
        )


class TrajectoryEstimate(NamedTuple):
    """Result of :func:`estimate_trajectory`: the estimated ``frame`` and the number of
    input rows skipped for missing or invalid sensor values."""

    frame: pd.DataFrame
    n_skipped: int


def estimate_trajectory(
    hardware: pd.DataFrame, robot: RobotConfig, estimator: StateEstimator | None = None
) -> TrajectoryEstimate:
    """Estimate end-cap positions for every row of a ``hardware`` trajectory frame.

    ``hardware`` needs ``cable_0..8`` (m) and ``imu{r}_qw/qx/qy/qz`` for at least two
    of ``robot.sensors.imu_rods``; ``t``, ``segment`` and ``target_0..5`` are copied
    when present. A row is skipped (and counted) when a cable value is missing,
    non-finite or not positive, or fewer than two of its IMU quaternions are finite
    and non-zero; the next row continues from the last estimate. ``estimator``
    (optional) carries settings and state; a new :class:`StateEstimator` otherwise.

    The returned frame has ``cap{i}_x/_y/_z`` (m, world orientation, translated by
    the convention of :func:`place_on_ground`) and ``cap{i}_conf`` (the row's
    :attr:`StateEstimate.confidence`, the same for all caps).
    """
    missing = [c for c in CABLE_COLUMNS if c not in hardware.columns]
    if missing:
        raise ValueError(f"hardware trajectory lacks cable columns {missing}")
    imu_rods = [r for r in robot.sensors.imu_rods if all(f"imu{r}_q{a}" in hardware.columns for a in "wxyz")]
    if len(imu_rods) < 2:
        raise ValueError(
            f"hardware trajectory needs imu<r>_qw/qx/qy/qz columns for at least two of the IMU rods "
            f"{list(robot.sensors.imu_rods)}; found them for rods {imu_rods}"
        )
    estimator = estimator if estimator is not None else StateEstimator(robot)
    cables = hardware[CABLE_COLUMNS].to_numpy(dtype=float, na_value=np.nan)
    quats = {r: hardware[[f"imu{r}_q{a}" for a in "wxyz"]].to_numpy(dtype=float, na_value=np.nan) for r in imu_rods}
    kept: list[int] = []
    estimates: list[StateEstimate] = []
    for row, cable in enumerate(cables):
        if not np.all(np.isfinite(cable)) or np.any(cable <= 0):
            continue
        imu = {r: q[row] for r, q in quats.items() if np.all(np.isfinite(q[row])) and np.linalg.norm(q[row]) > 1e-9}
        if len(imu) < 2:
            continue
        estimates.append(estimator.estimate(cable, imu))
        kept.append(row)
    frame = hardware.iloc[kept][[c for c in COPIED_COLUMNS if c in hardware.columns]].reset_index(drop=True)
    caps = np.array([e.caps_m.ravel() for e in estimates]).reshape(len(kept), N_CAPS * 3)
    conf = np.array([e.confidence for e in estimates]).reshape(len(kept), 1)
    frame[CAP_COLUMNS] = caps
    frame[CONF_COLUMNS] = np.repeat(conf, N_CAPS, axis=1)
    return TrajectoryEstimate(frame=frame, n_skipped=len(hardware) - len(kept))
