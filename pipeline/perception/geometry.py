"""Depth back-projection, the ground plane (RANSAC, Open3D) and end-cap centres.

Camera frame: OpenCV (x right, y down, z forward), metres. World frame: z up,
ground at z = 0 (docs/design.md, *Conventions*).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo

_OPEN3D_RANDOM = threading.Lock()
"""Held from seeding Open3D's one global random generator to the end of the RANSAC that draws
from it, which runs on one thread: drawn from several (Open3D's TBB pool), the samples' order,
and so the plane, varied with scheduling, and runs tracked side by side (the redeploy stage)
gave different tracks from the same frames."""


def back_project(camera: CameraInfo, u: np.ndarray, v: np.ndarray, depth_raw: np.ndarray) -> np.ndarray:
    """Camera-frame points (N, 3) in metres of pixels ``u`` (columns), ``v`` (rows)
    with raw depth values ``depth_raw`` (N,) in units of ``camera.depth_scale_m``."""
    z = depth_raw.astype(np.float64) * camera.depth_scale_m
    x = (u - camera.cx) / camera.fx * z
    y = (v - camera.cy) / camera.fy * z
    return np.column_stack([x, y, z])


def transform(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a 4 x 4 rigid transform to points (N, 3)."""
    return points @ matrix[:3, :3].T + matrix[:3, 3]


@dataclass(frozen=True)
class GroundFit:
    """The ground found by RANSAC: ``camera_to_world`` (4, 4) corrected so the plane
    is z = 0 with its normal up; ``tilt_correction_deg``: angle between the plane
    normal under the nominal extrinsics and the world z axis; ``height_correction_m``;
    ``inlier_ratio`` and ``rms_m`` of the inliers' distances to the plane."""

    camera_to_world: np.ndarray
    tilt_correction_deg: float
    height_correction_m: float
    inlier_ratio: float
    rms_m: float


def fit_ground(
    camera: CameraInfo,
    depth: np.ndarray,
    exclude: np.ndarray,
    threshold_m: float,
    iterations: int,
    seed: int,
    stride: int = 4,
) -> GroundFit:
    """Find the ground in a depth image (H, W) uint16 and correct the camera's
    extrinsics so that it is the world's z = 0 plane.

    ``exclude`` (H, W) bool marks pixels that are not ground (the robot). The
    plane is fitted by Open3D's RANSAC to every ``stride``-th valid pixel. The
    correction is the smallest rotation (about the camera centre) that makes the
    plane's normal the world's z axis, then a vertical shift: heading and the
    position in x, y stay those of the nominal extrinsics.
    """
    rows, cols = np.mgrid[0 : depth.shape[0] : stride, 0 : depth.shape[1] : stride]
    raw = depth[rows, cols]
    keep = (raw > 0) & ~exclude[rows, cols]
    if keep.sum() < 100:
        raise DataError(f"ground fit: only {int(keep.sum())} valid depth pixels outside the robot (need 100)")
    points = back_project(camera, cols[keep].astype(float), rows[keep].astype(float), raw[keep])
    import open3d as o3d  # here, not at the top: 0.4 s that commands which never fit a ground plane skip

    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points))
    with _OPEN3D_RANDOM:
        threads = o3d.utility.get_max_threads()
        o3d.utility.set_max_threads(1)
        try:
            o3d.utility.random.seed(seed)
            plane, inliers = cloud.segment_plane(threshold_m, 3, iterations)
        finally:
            o3d.utility.set_max_threads(threads)
    normal_cam, offset = np.asarray(plane[:3]), float(plane[3])
    scale = np.linalg.norm(normal_cam)
    normal_cam, offset = normal_cam / scale, offset / scale
    nominal = np.asarray(camera.camera_to_world, float)
    normal = nominal[:3, :3] @ normal_cam
    if normal[2] < 0:
        normal, normal_cam, offset = -normal, -normal_cam, -offset
    rotation, _ = Rotation.align_vectors([[0.0, 0.0, 1.0]], [normal])  # the smallest rotation: normal -> z
    tilt = np.arccos(np.clip(normal[2], -1.0, 1.0))
    corrected = nominal.copy()
    corrected[:3, :3] = rotation.as_matrix() @ nominal[:3, :3]
    # The camera centre is at height `offset` above the plane (signed distance of the origin).
    corrected[2, 3] = offset
    distances = points[inliers] @ normal_cam + offset
    return GroundFit(
        camera_to_world=corrected,
        tilt_correction_deg=float(np.degrees(tilt)),
        height_correction_m=float(offset - nominal[2, 3]),
        inlier_ratio=len(inliers) / len(points),
        rms_m=float(np.sqrt(np.mean(distances**2))),
    )


def sphere_centre(points: np.ndarray, radius_m: float, viewpoint: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre (3,) of a sphere of known radius seen from ``viewpoint`` (3,) through
    its visible surface points (N, 3), and the rms (m) of the fit.

    The start is the points' centroid moved 2r/3 away from the viewpoint (the mean
    depth of a hemisphere sampled uniformly in the image); a least-squares fit of
    ``|p - c| - r`` refines it.
    """
    centroid = points.mean(axis=0)
    ray = centroid - viewpoint
    start = centroid + (2.0 * radius_m / 3.0) * ray / np.linalg.norm(ray)

    def jacobian(c: np.ndarray) -> np.ndarray:
        offsets = c - points
        return offsets / np.linalg.norm(offsets, axis=1, keepdims=True)

    fit = least_squares(lambda c: np.linalg.norm(points - c, axis=1) - radius_m, start, jac=jacobian, method="lm")
    return fit.x, float(np.sqrt(np.mean(fit.fun**2)))
