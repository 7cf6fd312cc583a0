"""Identification from a trajectory in the R2S2R code's published format, against the twin's truth.

Records the default collect policy on the twin, writes it in the published format
(:func:`storage.published.export_published`: end caps at 25 Hz, targets, commands, no cable
readings, no frames), imports it (``r2s2r import-r2s2r``) into a campaign of its own, and runs
track (the end caps as given), attach (the config's attachment points: no cable readings) and
sysid on it. Prints one JSON object (last line of stdout): the identified values with the twin's
truth and their errors, the held-out key-frame error with the robot config's values and the
identified ones, and the wall time.

Usage: ``python -m benchmarks.published_import [--every 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

from pipeline.config import load_all
from pipeline.truth import truth_errors
from storage.published import export_published
from tasks.attach import run_attach
from tasks.collect import run_collect
from tasks.import_recording import run_import_published
from tasks.sysid import run_sysid, sysid_data
from tasks.track import run_track


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--every", type=int, default=2, help="write every n-th control tick (2: 25 Hz)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="r2s2r-published-") as tmp:
        runs = Path(tmp) / "runs"
        source = load_all(args.config, {"runs_dir": str(runs), "campaign": "twin", "collect.record_frames": False})
        ref, summary = run_collect(source, 1)
        path = Path(tmp) / "processed_data.json"
        frames = export_published(Path(ref.path) / summary["policy_id"], source.robot, path, every=args.every)
        configs = load_all(args.config, {"runs_dir": str(runs), "campaign": "published"})
        started = time.perf_counter()
        collect_ref, _ = run_import_published(configs, 1, path)
        track_ref, _ = run_track(configs, 1, collect_ref)
        attach_ref, _ = run_attach(configs, 1, track_ref, collect_ref)
        data = sysid_data(configs, collect_ref, track_ref, attach_ref)
        _, figures, result = run_sysid(configs, 1, data)
        wall_s = time.perf_counter() - started
    truth = truth_errors(configs, result.values)
    out = {
        "frames": frames,
        "frame_rate_hz": source.robot.pid.control_rate_hz / args.every,
        "identified": {name: round(value, 4) for name, value in result.values.items()},
        "truth": {k.removeprefix("truth."): round(v, 4) for k, v in truth.items() if k.startswith("truth.")},
        "error_pct": {k.removeprefix("truth_error_pct."): round(v, 1) for k, v in truth.items() if "_pct." in k},
        "heldout_key_frame_error_mm": {
            "robot_config": round(figures["holdout.before.key_frame_error_mm"], 1),
            "identified": round(figures["holdout.after.key_frame_error_mm"], 1),
        },
        "heldout_gaits": len(data.held),
        "wall_s": round(wall_s, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
