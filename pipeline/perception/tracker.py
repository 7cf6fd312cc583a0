"""Offline pose tracking of the end caps from RGB-D frames and cable sensors.

Per frame: segment the coloured caps (:mod:`.segmentation`), back-project their
pixels with depth, fit each visible cap's sphere centre in the world frame
(:mod:`.geometry`; the world is anchored on the ground plane that RANSAC finds in
the first frame), give each sighting its identity by matching it to the motion
prediction (two caps share a colour: they are the two ends of one rod), then
fuse sightings, the cable sensors interpolated to the frame's time and the
prediction (:mod:`.fusion`). Caps the camera does not see are carried by the
cables and the prior.

Confidence (``cap{i}_conf``, in [0, 1]): a sighted cap gets
``0.5 + 0.5 * exp(-(e / 2 sigma)^2)`` with ``e`` its distance to the fused
estimate and ``sigma`` the camera std; an unseen cap gets
``0.5 * exp(-(rms / 2 sigma_c)^2) * 0.9^k``, with ``rms`` the cable residual,
``sigma_c`` the cable std and ``k`` the frames since it was last seen.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import cv2
import numpy as np
import pandas as pd
from scipy.spatial.transform import Rotation

from pipeline.config import RobotConfig, TrackConfig
from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo
from pipeline.perception.fusion import Evidence, PoseFusion, RodPoses, Solution
from pipeline.perception.geometry import GroundFit, back_project, fit_ground, sphere_centre, transform
from pipeline.perception.segmentation import Blob, find_blobs
from pipeline.robot_model import Cable, reference_prism, resting_on_face, rod_frames, rotation_to_quat

_MIN_CAP_POINTS = 4
_MIN_SIGHTINGS_TO_START = 3
_OUTLIER_M = 0.02
_ROBOT_MARGIN_PX = 40
_HYPOTHESIS_EVALUATIONS = 40


class NothingTracked(DataError):
    """No frame showed the robot: not one with at least three end caps."""


@dataclass
class TrackStats:
    """Counters of one tracking run: frames in and tracked, frames skipped by reason,
    sightings used and rejected, the ground fit and the wall time (s)."""

    frames_in: int = 0
    frames_tracked: int = 0
    skipped: Counter = field(default_factory=Counter)
    sightings: int = 0
    sightings_rejected: int = 0
    ground: GroundFit | None = None
    wall_s: float = 0.0

    @property
    def frames_per_s(self) -> float:
        return self.frames_tracked / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass(frozen=True)
class Sighting:
    rod: int
    centre: np.ndarray
    n_points: int


class SensorStream:
    """Cable lengths, segment and targets of a hardware trajectory (DataFrame with
    ``t``, ``segment``, ``target_0..5``, ``cable_0..8``) at arbitrary times:
    lengths linearly interpolated, segment and targets from the last sample."""

    def __init__(self, sensors: pd.DataFrame) -> None:
        self.t = sensors["t"].to_numpy(float)
        self.cables = sensors[[f"cable_{i}" for i in range(9)]].to_numpy(float)
        self.segment = sensors["segment"].to_numpy()
        self.targets = sensors[[f"target_{i}" for i in range(6)]].to_numpy(float)

    def cables_at(self, t: float) -> np.ndarray:
        """Lengths (9,) m at time ``t`` (s); NaN for a cable whose neighbouring samples are NaN."""
        return np.array([np.interp(t, self.t, self.cables[:, i]) for i in range(9)])

    def command_at(self, t: float) -> tuple[int, np.ndarray]:
        k = max(int(np.searchsorted(self.t, t, side="right")) - 1, 0)
        return int(self.segment[k]), self.targets[k]


class CapTracker:
    """Tracks one recording. ``cables``: attachment model used to read the cable sensors."""

    def __init__(self, robot: RobotConfig, camera: CameraInfo, config: TrackConfig, cables: list[Cable]) -> None:
        self.robot = robot
        self.camera = camera
        self.config = config
        self.fusion = PoseFusion(robot, cables, config.cable_sigma_m, config.roll_sigma_rad)
        self._template = resting_on_face(robot, reference_prism(robot))

    # ------------------------------------------------------------- sightings
    def _sightings(self, blobs: list[Blob], depth: np.ndarray, camera_to_world: np.ndarray) -> list[Sighting]:
        radius = self.robot.end_cap.radius_m
        viewpoint = camera_to_world[:3, 3]
        out = []
        for blob in blobs:
            raw = depth[blob.v, blob.u]
            valid = raw > 0
            if valid.sum() < _MIN_CAP_POINTS:
                continue
            median = np.median(raw[valid])
            valid &= np.abs(raw.astype(float) - median) < 1.5 * radius / self.camera.depth_scale_m
            if valid.sum() < _MIN_CAP_POINTS:
                continue
            points = back_project(self.camera, blob.u[valid].astype(float), blob.v[valid].astype(float), raw[valid])
            centre, _ = sphere_centre(transform(camera_to_world, points), radius, viewpoint)
            out.append(Sighting(rod=blob.rod, centre=centre, n_points=int(valid.sum())))
        return out

    def _assign(self, sightings: list[Sighting], predicted: np.ndarray) -> np.ndarray:
        """Sighted centres (6, 3), NaN where unseen: each rod's sightings go to the
        permutation of its caps closest to the prediction."""
        sighted = np.full((6, 3), np.nan)
        for rod, caps in enumerate(self.robot.topology.rods):
            mine = [s.centre for s in sightings if s.rod == rod]
            if not mine:
                continue
            options = itertools.permutations(caps, len(mine))
            best = min(
                options, key=lambda cs: sum(np.linalg.norm(p - predicted[c]) for p, c in zip(mine, cs, strict=True))
            )
            for centre, cap in zip(mine, best, strict=True):
                if len(mine) == 2 or np.linalg.norm(centre - predicted[cap]) < self.config.gate_m:
                    sighted[cap] = centre
        return sighted

    # ----------------------------------------------------------------- fusion
    def _fuse(
        self,
        start: RodPoses,
        sighted: np.ndarray,
        cables_m: np.ndarray,
        prior: np.ndarray,
        prior_rolls: np.ndarray,
        motion_sigma: float,
    ) -> tuple[Solution, np.ndarray]:
        """Fuse; while the worst sighting is an outlier (farther than ``_OUTLIER_M``
        from the fused estimate) drop it and fuse again. Returns the solution and the
        sightings kept."""
        sigma = np.full(6, self.config.camera_sigma_m)
        while True:
            solution = self.fusion.solve(start, Evidence(sighted, sigma, cables_m, prior, prior_rolls, motion_sigma))
            residual = np.nan_to_num(solution.sighting_residual_m)
            worst = int(np.argmax(residual))
            if residual[worst] <= _OUTLIER_M:
                return solution, sighted
            sighted = sighted.copy()
            sighted[worst] = np.nan
            start = solution.poses

    def _initial(self, sightings: list[Sighting], cables_m: np.ndarray) -> tuple[Solution, np.ndarray]:
        """First lock: for each of the 8 identity choices (which end of each rod a
        sighting is), align the rest-shape template to the sightings and fuse; keep
        the choice that explains sightings and cables best, then reject outliers."""
        sigma = np.full(6, self.config.camera_sigma_m)
        motion_sigma = 10 * self.config.motion_sigma_m
        best: tuple[float, RodPoses, np.ndarray, np.ndarray] | None = None
        for flips in itertools.product((False, True), repeat=3):
            sighted = np.full((6, 3), np.nan)
            for rod, (a, b) in enumerate(self.robot.topology.rods):
                caps = (b, a) if flips[rod] else (a, b)
                for centre, cap in zip([s.centre for s in sightings if s.rod == rod], caps, strict=False):
                    sighted[cap] = centre
            seen = np.isfinite(sighted).all(axis=1)
            moved = self._template - self._template[seen].mean(axis=0)
            rotation, _ = Rotation.align_vectors(sighted[seen] - sighted[seen].mean(axis=0), moved[seen])
            guess = rotation.apply(moved) + sighted[seen].mean(axis=0)
            evidence = Evidence(sighted, sigma, cables_m, guess, np.zeros(3), motion_sigma)
            solution = self.fusion.solve(RodPoses.from_caps(self.robot, guess), evidence, _HYPOTHESIS_EVALUATIONS)
            if best is None or solution.cost < best[0]:
                best = (solution.cost, solution.poses, sighted, guess)
        assert best is not None
        _, poses, sighted, guess = best
        return self._fuse(poses, sighted, cables_m, guess, np.zeros(3), motion_sigma)

    # ------------------------------------------------------------------ track
    def track(self, frames: Iterable, sensors: pd.DataFrame) -> tuple[pd.DataFrame, TrackStats]:
        """Track ``frames`` (objects with ``t_s``, ``rgb``, ``depth``, in time order;
        ``None`` items are frames the reader could not decode) against the hardware
        trajectory ``sensors``. Returns one row per tracked frame: ``t``, ``segment``,
        ``target_0..5``, ``cap{i}_x/_y/_z``, ``cap{i}_conf``, rod centres and
        quaternions; and the run's :class:`TrackStats`."""
        stats = TrackStats()
        stream = SensorStream(sensors)
        size = (self.camera.height_px, self.camera.width_px)
        rows: list[dict[str, float]] = []
        camera_to_world: np.ndarray | None = None
        previous: tuple[float, np.ndarray, np.ndarray] | None = None  # t, caps, rolls
        velocity = np.zeros((6, 3))
        unseen_for = np.zeros(6, int)
        start_time = time.perf_counter()
        for frame in frames:
            stats.frames_in += 1
            if frame is None:
                stats.skipped["undecodable"] += 1
                continue
            if frame.rgb.shape[:2] != size or frame.depth.shape != size or frame.depth.dtype != np.uint16:
                stats.skipped["wrong_size_or_dtype"] += 1
                continue
            blobs = find_blobs(frame.rgb, self.config.min_blob_px)
            if camera_to_world is None:
                stats.ground = fit_ground(
                    self.camera,
                    frame.depth,
                    _robot_region(blobs, size),
                    self.config.ground_ransac_threshold_m,
                    self.config.ground_ransac_iterations,
                    self.config.seed,
                )
                camera_to_world = stats.ground.camera_to_world
            sightings = self._sightings(blobs, frame.depth, camera_to_world)
            cables_m = stream.cables_at(frame.t_s)
            if previous is None:
                if len(sightings) < _MIN_SIGHTINGS_TO_START:
                    stats.skipped["too_few_caps_to_start"] += 1
                    continue
                solution, kept = self._initial(sightings, cables_m)
            else:
                t_prev, caps_prev, rolls_prev = previous
                predicted = caps_prev + velocity * (frame.t_s - t_prev)
                sighted = self._assign(sightings, predicted)
                start = RodPoses.from_caps(self.robot, predicted, rolls_prev)
                solution, kept = self._fuse(start, sighted, cables_m, predicted, rolls_prev, self.config.motion_sigma_m)
            seen = np.isfinite(kept).all(axis=1)
            stats.sightings += int(seen.sum())
            stats.sightings_rejected += len(sightings) - int(seen.sum())
            caps = solution.poses.caps(self.robot)
            if previous is not None and frame.t_s > previous[0]:
                velocity = 0.5 * (caps - previous[1]) / (frame.t_s - previous[0])
            previous = (frame.t_s, caps, solution.poses.rolls)
            unseen_for = np.where(seen, 0, unseen_for + 1)
            rows.append(self._row(frame.t_s, stream, solution, caps, seen, unseen_for))
            stats.frames_tracked += 1
        stats.wall_s = time.perf_counter() - start_time
        if not rows:
            raise NothingTracked("tracking: no frame could be tracked (no frame showed at least 3 end caps)")
        return pd.DataFrame(rows), stats

    def _row(
        self,
        t: float,
        stream: SensorStream,
        solution: Solution,
        caps: np.ndarray,
        seen: np.ndarray,
        unseen_for: np.ndarray,
    ) -> dict[str, float]:
        segment, targets = stream.command_at(t)
        sigma, sigma_c = self.config.camera_sigma_m, self.config.cable_sigma_m
        sighted_conf = 0.5 + 0.5 * np.exp(-((np.nan_to_num(solution.sighting_residual_m) / (2 * sigma)) ** 2))
        residual = solution.cable_residual_m[np.isfinite(solution.cable_residual_m)]
        rms = float(np.sqrt(np.mean(residual**2))) if residual.size else np.inf
        unseen_conf = 0.5 * np.exp(-((rms / (2 * sigma_c)) ** 2)) * 0.9**unseen_for
        conf = np.where(seen, sighted_conf, unseen_conf)
        centres, rotations = rod_frames(self.robot, caps, solution.poses.rolls)
        row: dict[str, float] = {"t": float(t), "segment": segment}
        row.update({f"target_{i}": float(v) for i, v in enumerate(targets)})
        for i in range(6):
            row.update({f"cap{i}_{a}": float(caps[i, k]) for k, a in enumerate("xyz")})
            row[f"cap{i}_conf"] = float(conf[i])
        for r in range(3):
            row.update({f"rod{r}_{a}": float(centres[r, k]) for k, a in enumerate("xyz")})
            row.update({f"rod{r}_q{a}": float(q) for a, q in zip("wxyz", rotation_to_quat(rotations[r]), strict=True)})
        return row


def _robot_region(blobs: list[Blob], size: tuple[int, int]) -> np.ndarray:
    """Pixels (H, W) bool near the sighted caps: not ground, excluded from the ground fit."""
    mask = np.zeros(size, np.uint8)
    for blob in blobs:
        mask[blob.v, blob.u] = 1
    if blobs:
        us = np.concatenate([b.u for b in blobs])
        vs = np.concatenate([b.v for b in blobs])
        cv2.rectangle(mask, (int(us.min()), int(vs.min())), (int(us.max()), int(vs.max())), 1, thickness=-1)
        kernel = cv2.getStructuringElement(cv2.MORPH_RECT, (2 * _ROBOT_MARGIN_PX + 1, 2 * _ROBOT_MARGIN_PX + 1))
        mask = cv2.dilate(mask, kernel)
    return mask.astype(bool)
