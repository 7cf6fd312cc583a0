"""Pose tracking (RGB-D + cables), the ground plane, attachment points, and the track/attach stages."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pipeline.attachment import infer_attachment
from pipeline.config import LoadedConfigs, robot_with_overlay
from pipeline.hardware.base import CameraInfo
from pipeline.hardware.twin import MujocoTwin
from pipeline.metrics import pose_errors, truth_at
from pipeline.perception.geometry import fit_ground, transform
from pipeline.perception.segmentation import find_blobs
from pipeline.perception.tracker import CapTracker
from pipeline.robot_model import build_cables
from storage.frames import Frame, camera_from_meta, iter_frames
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.trajectory import CABLE_COLS, caps_array, read_trajectory
from tasks.collect import run_collect

TRACK_TOLERANCE_MM = 5.0  # the target for the mean end-cap error at 640 x 480
AXIS_TOLERANCE_DEG = 2.0


def _collect(configs: LoadedConfigs, root: Path, campaign: str, policy: str, cycles: int) -> Path:
    pipeline = configs.pipeline.model_copy(
        update={
            "runs_dir": root / "runs",
            "campaign": campaign,
            "collect": configs.pipeline.collect.model_copy(update={"policy": policy, "gait_cycles": cycles}),
        }
    )
    ref, _ = run_collect(configs.model_copy(update={"pipeline": pipeline}), 1)
    return next(Path(ref.path).glob(f"*/{HARDWARE_FILE}")).parent


@pytest.fixture(scope="module")
def cw_recording(tmp_path_factory, default_configs) -> Path:
    """About 17 s of the published cw gait (a roll onto a new face every four targets) on
    the twin with the full 640 x 480 camera at 10 Hz and sensor noise on."""
    return _collect(default_configs, tmp_path_factory.mktemp("cw"), "cw", "cw", cycles=2)


def _tracker(configs: LoadedConfigs, folder: Path) -> CapTracker:
    robot = configs.robot
    camera = camera_from_meta(folder / FRAMES_FILE)
    return CapTracker(robot, camera, configs.pipeline.track, build_cables(robot, robot.attachment.phase_rad))


def _truth(folder: Path, t: np.ndarray) -> np.ndarray:
    truth, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
    return truth_at(t, truth["t"].to_numpy(), caps_array(truth))


@pytest.fixture(scope="module")
def cw_tracked(cw_recording, default_configs):
    sensors, _ = read_trajectory(cw_recording / HARDWARE_FILE, expect_source="hardware")
    tracked, stats = _tracker(default_configs, cw_recording).track(iter_frames(cw_recording / FRAMES_FILE), sensors)
    return tracked, stats


def test_tracking_accuracy_and_identities_through_rolls(cw_recording, cw_tracked, default_configs) -> None:
    tracked, stats = cw_tracked
    caps = caps_array(tracked)
    truth = _truth(cw_recording, tracked["t"].to_numpy())
    errors = pose_errors(default_configs.robot, caps, truth)
    assert stats.frames_tracked == stats.frames_in > 150
    assert errors["cap_error_mean_mm"] < TRACK_TOLERANCE_MM
    assert errors["rod_axis_error_mean_deg"] < AXIS_TOLERANCE_DEG
    assert errors["identity_swaps"] == 0
    # rolls happened: the bottom face changed, so identities were really at stake
    lowest = np.argsort(truth[:, :, 2], axis=1)[:, :3]
    assert len({tuple(sorted(row)) for row in lowest}) >= 2
    conf = tracked[[f"cap{i}_conf" for i in range(6)]].to_numpy()
    assert ((conf >= 0) & (conf <= 1)).all()
    # confidence means something: the worst-tracked 5 % of caps have lower confidence than the
    # better-tracked half
    per_cap = np.linalg.norm(caps - truth, axis=-1)
    worst, better = per_cap > np.quantile(per_cap, 0.95), per_cap < np.median(per_cap)
    assert conf[worst].mean() < conf[better].mean()


def _hide_cap(frame: Frame, camera: CameraInfo, centre_world: np.ndarray, radius_m: float) -> Frame:
    """The frame with one end cap painted over in the floor's grey and without depth."""
    world_to_camera = np.linalg.inv(camera.camera_to_world)
    x, y, z = transform(world_to_camera, centre_world[None])[0]
    u, v = camera.fx * x / z + camera.cx, camera.fy * y / z + camera.cy
    reach = camera.fx * radius_m / z + 3
    rows, cols = np.mgrid[0 : camera.height_px, 0 : camera.width_px]
    disc = (cols - u) ** 2 + (rows - v) ** 2 <= reach**2
    rgb, depth = frame.rgb.copy(), frame.depth.copy()
    rgb[disc] = (110, 110, 110)
    depth[disc] = 0
    return Frame(t_s=frame.t_s, rgb=rgb, depth=depth)


def test_a_cap_hidden_for_one_second_is_tracked_through(cw_recording, cw_tracked, default_configs) -> None:
    configs = default_configs
    tracker = _tracker(configs, cw_recording)
    sensors, _ = read_trajectory(cw_recording / HARDWARE_FILE, expect_source="hardware")
    frames = list(iter_frames(cw_recording / FRAMES_FILE))
    t = np.array([f.t_s for f in frames])
    truth = _truth(cw_recording, t)
    hidden_cap, start = 3, 6.0
    hidden = (t >= start) & (t < start + 1.0)
    edited = [
        _hide_cap(f, tracker.camera, truth[k, hidden_cap], configs.robot.end_cap.radius_m) if hidden[k] else f
        for k, f in enumerate(frames)
    ]
    green_blobs = [sum(b.rod == 1 for b in find_blobs(edited[k].rgb, 8)) for k in np.flatnonzero(hidden)]
    assert max(green_blobs) <= 1  # cap 3 (green) is really gone from those frames
    tracked, _ = tracker.track(edited, sensors)
    caps = caps_array(tracked)
    error_mm = np.linalg.norm(caps - truth, axis=-1) * 1e3
    conf = tracked[[f"cap{i}_conf" for i in range(6)]].to_numpy()
    assert hidden.sum() == 10
    assert error_mm[hidden, hidden_cap].mean() < 15.0  # carried by the cables and the motion prior
    assert conf[hidden, hidden_cap].max() <= 0.5  # ...and flagged as not seen
    assert pose_errors(configs.robot, caps, truth)["identity_swaps"] == 0
    after = (t >= start + 1.5) & (t < start + 3.0)
    baseline, _ = cw_tracked
    assert error_mm[after].mean() < 2 * np.linalg.norm(caps_array(baseline)[after] - truth[after], axis=-1).mean() * 1e3


def test_ground_plane_recovered_with_a_tilted_camera(default_configs) -> None:
    configs = default_configs
    tilted = configs.twin.camera.model_copy(update={"position_m": (0.9, -1.3, 1.1), "look_at_m": (0.0, 0.0, 0.0)})
    twin = MujocoTwin(configs.robot, configs.twin.model_copy(update={"camera": tilted}))
    try:
        twin.reset(seed=3)
        frame = twin.render(0.0)
        truth_caps = twin.ground_truth(0.0, 0).caps_m
        camera = twin.camera
    finally:
        twin.close()
    # a calibration that is off by 4 degrees of tilt and 3 cm of height
    error = np.eye(4)
    angle = np.deg2rad(4.0)
    error[1:3, 1:3] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    wrong = camera.camera_to_world @ error
    wrong[2, 3] += 0.03
    believed = dataclasses.replace(camera, camera_to_world=wrong)
    blobs = find_blobs(frame.rgb, 8)
    robot_region = np.zeros(frame.depth.shape, bool)
    for blob in blobs:
        robot_region[max(blob.v.min() - 60, 0) : blob.v.max() + 60, max(blob.u.min() - 60, 0) : blob.u.max() + 60] = 1
    ground = fit_ground(believed, frame.depth, robot_region, 0.006, 1000, seed=0)
    corrected = ground.camera_to_world
    normal_error = np.degrees(np.arccos(np.clip(corrected[:3, 2] @ camera.camera_to_world[:3, 2], -1, 1)))
    assert ground.tilt_correction_deg == pytest.approx(4.0, abs=0.5)
    assert normal_error < 0.5  # the optical axis points as it really does, up to heading
    assert corrected[2, 3] == pytest.approx(camera.camera_to_world[2, 3], abs=0.003)
    tracker = CapTracker(configs.robot, believed, configs.pipeline.track, build_cables(configs.robot, (0, 0, 0)))
    heights = [s.centre[2] for s in tracker._sightings(blobs, frame.depth, corrected)]
    lowest = np.sort(truth_caps[:, 2])[: len(heights)]
    assert len(heights) >= 4
    assert min(heights) == pytest.approx(lowest[0], abs=0.004)  # a cap on the ground sits at its radius

    # seeded fits in parallel threads (the redeploy stage tracks its runs side by side) are each their seed's
    def few_iterations(seed: int) -> np.ndarray:
        return fit_ground(believed, frame.depth, robot_region, 0.006, 10, seed=seed).camera_to_world

    alone = {seed: few_iterations(seed) for seed in range(8)}
    assert len({fit.tobytes() for fit in alone.values()}) > 4  # with 10 iterations, the seed decides the plane
    seeds = list(range(8)) * 8
    with ThreadPoolExecutor(8) as pool:
        for seed, fit in zip(seeds, pool.map(few_iterations, seeds), strict=True):
            np.testing.assert_array_equal(fit, alone[seed])


def test_attachment_points_reproduce_the_twin_sites(cw_recording, cw_tracked, default_configs) -> None:
    robot = default_configs.robot
    tracked, _ = cw_tracked
    sensors, _ = read_trajectory(cw_recording / HARDWARE_FILE, expect_source="hardware")
    rest_caps = caps_array(tracked)[tracked["t"].to_numpy() <= 0.1].mean(axis=0)
    rest_cables = sensors[CABLE_COLS].to_numpy()[sensors["t"].to_numpy() <= 0.1].mean(axis=0)
    estimate = infer_attachment(robot, rest_caps, rest_cables)
    distance = np.linalg.norm(estimate.points_m - rest_caps[:, None], axis=-1)
    np.testing.assert_allclose(distance, robot.end_cap.radius_m, atol=1e-9)
    twin = MujocoTwin(robot, default_configs.twin)
    twin.reset()
    errors = estimate.site_errors_m(twin.attachment_sites())
    twin.close()
    assert len(errors) == 18
    assert errors.max() < 0.004  # tracking (~1-2 mm) plus phase (~1 mm at the cap radius)
    nominal = infer_attachment(robot, rest_caps, rest_cables + 0.01)  # readings that cannot be met
    assert np.sqrt(np.mean(nominal.cable_residual_m**2)) > np.sqrt(np.mean(estimate.cable_residual_m**2))
    overlay = robot_with_overlay(robot, estimate.overlay(), Path("attachment.yaml"))
    assert overlay.attachment.phase_rad == pytest.approx(estimate.phase_rad)


def test_bad_frames_and_missing_sensor_values_are_skipped_and_counted(cw_recording, default_configs) -> None:
    tracker = _tracker(default_configs, cw_recording)
    sensors, _ = read_trajectory(cw_recording / HARDWARE_FILE, expect_source="hardware")
    sensors.loc[10:40, "cable_3"] = np.nan
    frames = list(iter_frames(cw_recording / FRAMES_FILE))[:40]
    small = Frame(t_s=frames[5].t_s, rgb=frames[5].rgb[:100], depth=frames[5].depth[:100])
    eight_bit = Frame(t_s=frames[6].t_s, rgb=frames[6].rgb, depth=frames[6].depth.astype(np.uint8))
    stream = [*frames[:5], small, eight_bit, None, *frames[8:]]
    tracked, stats = tracker.track(stream, sensors)
    assert stats.frames_in == 40
    assert stats.skipped == {"wrong_size_or_dtype": 2, "undecodable": 1}
    assert len(tracked) == 37
    assert np.isfinite(caps_array(tracked)).all()
    truth = _truth(cw_recording, tracked["t"].to_numpy())
    assert pose_errors(default_configs.robot, caps_array(tracked), truth)["cap_error_mean_mm"] < TRACK_TOLERANCE_MM


def test_frames_without_the_robot_raise_nothing_tracked(cw_recording, default_configs) -> None:
    """Frames that show no end cap (the robot out of the camera's view; here the colour images
    blanked, the depth, which shows the ground, kept) raise :class:`NothingTracked`, the error by
    which ``r2s2r follow`` knows the robot left the view; the same frames as recorded track."""
    from pipeline.perception.tracker import NothingTracked

    tracker = _tracker(default_configs, cw_recording)
    sensors, _ = read_trajectory(cw_recording / HARDWARE_FILE, expect_source="hardware")
    frames = list(iter_frames(cw_recording / FRAMES_FILE))[:3]
    assert len(tracker.track(frames, sensors)[0]) == 3
    blank = [Frame(t_s=f.t_s, rgb=np.zeros_like(f.rgb), depth=f.depth) for f in frames]
    with pytest.raises(NothingTracked, match="no frame could be tracked"):
        tracker.track(blank, sensors)


@pytest.mark.slow
def test_no_identity_swaps_over_sixty_seconds_of_rolling(tmp_path, default_configs) -> None:
    """60 s of the cw gait: 21 rolls onto a new face, the camera at 640 x 480, noise on."""
    folder = _collect(default_configs, tmp_path, "cw60", "cw", cycles=7)
    sensors, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    tracked, stats = _tracker(default_configs, folder).track(iter_frames(folder / FRAMES_FILE), sensors)
    errors = pose_errors(default_configs.robot, caps_array(tracked), _truth(folder, tracked["t"].to_numpy()))
    assert stats.frames_tracked == stats.frames_in
    assert tracked["t"].iloc[-1] > 55.0
    assert errors["identity_swaps"] == 0
    assert errors["cap_error_mean_mm"] < TRACK_TOLERANCE_MM
    assert errors["rod_axis_error_mean_deg"] < AXIS_TOLERANCE_DEG
