"""Tracking accuracy and speed on the twin: RGB-D + cables, camera only, and on-board.

Records the published cw gait on the twin (full 640 x 480 camera at 10 Hz, sensor
noise and bias on; 7 cycles, about 60 s, or 1 cycle with ``--quick``), then:

* ``fused``: the tracker (RGB-D sightings + cable sensors + motion prior);
* ``camera_only`` (anchor, same run): the same tracker with the cable sensors
  switched off (their std set to 1 km), which shows what the cables add;
* ``onboard``: state estimation from the nine cables and two IMUs (shape and
  orientation; translation is not observable, so its errors are about the centroid);
* ``attachment``: inferred attachment points against the twin's sites at rest.

Errors are against the twin's ground truth; frames (or samples) per second are
wall-clock on this machine, decoding included. The published tracker's figures
(under 1 cm and 3 deg against motion capture, offline) are printed beside ours.
Prints one JSON object (last line).

Usage: ``python -m benchmarks.tracking [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np

from pipeline.attachment import infer_attachment
from pipeline.config import load_all
from pipeline.hardware.twin import MujocoTwin
from pipeline.metrics import pose_errors, truth_at
from pipeline.perception.tracker import CapTracker
from pipeline.robot_model import build_cables
from pipeline.state_estimation import estimate_trajectory
from storage.frames import camera_from_meta, iter_frames
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.trajectory import CABLE_COLS, caps_array, read_trajectory
from tasks.collect import run_collect


def _record(configs, root: Path, cycles: int) -> Path:
    pipeline = configs.pipeline.model_copy(
        update={
            "runs_dir": root,
            "campaign": "bench",
            "collect": configs.pipeline.collect.model_copy(update={"policy": "cw", "gait_cycles": cycles}),
        }
    )
    ref, _ = run_collect(configs.model_copy(update={"pipeline": pipeline}), 1)
    return next(Path(ref.path).glob(f"*/{HARDWARE_FILE}")).parent


def _track(configs, folder: Path, sensors, cable_sigma_m: float) -> tuple[object, object]:
    robot = configs.robot
    config = configs.pipeline.track.model_copy(update={"cable_sigma_m": cable_sigma_m})
    tracker = CapTracker(robot, camera_from_meta(folder / FRAMES_FILE), config, build_cables(robot, (0.0, 0.0, 0.0)))
    return tracker.track(iter_frames(folder / FRAMES_FILE), sensors)


def _site_errors_mm(configs, caps: np.ndarray, cables: np.ndarray) -> dict[str, float]:
    estimate = infer_attachment(configs.robot, caps, cables)
    twin = MujocoTwin(configs.robot, configs.twin)
    twin.reset()
    errors = estimate.site_errors_m(twin.attachment_sites()) * 1e3
    twin.close()
    return {"site_error_mean_mm": float(errors.mean()), "site_error_max_mm": float(errors.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one gait cycle (about 9 s of robot time)")
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    args = parser.parse_args()
    configs = load_all(args.config)
    robot = configs.robot
    with tempfile.TemporaryDirectory() as root:
        folder = _record(configs, Path(root), 1 if args.quick else 7)
        sensors, _ = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
        truth_df, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
        truth_t, truth_caps = truth_df["t"].to_numpy(), caps_array(truth_df)
        results: dict[str, object] = {"recording_s": float(truth_t[-1]), "camera_px": [640, 480]}
        for name, sigma in (("fused", configs.pipeline.track.cable_sigma_m), ("camera_only", 1000.0)):
            tracked, stats = _track(configs, folder, sensors, sigma)
            caps = caps_array(tracked)
            results[name] = {
                **pose_errors(robot, caps, truth_at(tracked["t"].to_numpy(), truth_t, truth_caps)),
                "frames_per_s": stats.frames_per_s,
                "frames_skipped": sum(stats.skipped.values()),
                "ground_tilt_correction_deg": stats.ground.tilt_correction_deg,
            }
            if name == "fused":
                rest = tracked["t"].to_numpy() <= 0.1
                rest_cables = sensors[CABLE_COLS].to_numpy()[sensors["t"].to_numpy() <= 0.1].mean(axis=0)
                results["attachment"] = _site_errors_mm(configs, caps[rest].mean(axis=0), rest_cables)
        start = time.perf_counter()
        onboard = estimate_trajectory(sensors, robot).frame
        wall_s = time.perf_counter() - start
        caps = caps_array(onboard)
        results["onboard"] = {
            **pose_errors(robot, caps, truth_at(onboard["t"].to_numpy(), truth_t, truth_caps), centred=True),
            "samples_per_s": len(onboard) / wall_s,
        }
    results["published_anchor"] = {"cap_error_mm_below": 10.0, "rod_axis_error_deg_below": 3.0, "speed": "offline"}
    results["targets"] = {"cap_error_mean_mm": 5.0, "rod_axis_error_deg": 2.0, "frames_per_s": 20.0}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
