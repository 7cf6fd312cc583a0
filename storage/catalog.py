"""The stage-output catalog: the files each stage writes and the readers of them.

Each stage writes its output under ``runs/<campaign>/iter_<k>/<stage>/`` (:mod:`storage.layout`);
the names below are its files, and the functions rebuild what a later stage, a benchmark or a
test needs from them. Stage tasks import this module, never each other.

=========  ==========================================================================
stage      files
=========  ==========================================================================
collect    ``<policy>/{hardware,groundtruth,frames}.parquet``, ``<policy>/policy.json``
           (:mod:`storage.recording`)
track      ``<policy>/tracked.parquet`` (:mod:`storage.tracked`)
attach     :data:`ATTACH_OVERLAY_FILE`, :data:`ATTACHMENT_FILE`
sysid      :data:`SYSID_OVERLAY_FILE`, :data:`MJCF_FILE`, :data:`HISTORY_FILE`,
           :data:`VALIDATION_FILE`
gaits      :data:`GAITS_FILE`, :data:`POLICIES_FILE`, :data:`GAIT_TABLE_FILE`
redeploy   ``<policy>-start<k>/`` (collect's recording layout plus ``tracked.parquet``),
           :data:`RUNS_FILE`, :data:`REPEATABILITY_FILE` (:mod:`storage.redeploy_runs`)
evaluate   :data:`GAP_FILE`, :data:`SUMMARY_FILE`
=========  ==========================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from pipeline.config import LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.errors import DataError
from pipeline.sysid.data import Recording
from storage.layout import Ref
from storage.recording import HARDWARE_FILE, recording_folders
from storage.tracked import TRACKED_FILE
from storage.trajectory import CABLE_COLS, CONTROL_COLS, TARGET_COLS, caps_array, read_trajectory

ATTACH_OVERLAY_FILE = "attachment.yaml"
"""attach: the robot-config overlay with the inferred attachment points."""
ATTACHMENT_FILE = "attachment.json"
"""attach: the points, the rest caps and the cable residuals."""
SYSID_OVERLAY_FILE = "identified.yaml"
"""sysid: the robot-config overlay with the identified values."""
MJCF_FILE = "identified.xml"
"""sysid: a self-contained MuJoCo model (MJCF) of the identified robot."""
HISTORY_FILE = "history.parquet"
"""sysid: loss, values and gradients per optimiser step."""
VALIDATION_FILE = "validation.json"
"""sysid: the held-out replay figures before and after, per recording."""
GAITS_FILE = "gaits.json"
"""gaits: the gaits found, the published gaits' figures and the search figures."""
POLICIES_FILE = "policies.json"
"""gaits: the expanded long policies the redeploy stage runs, by name."""
GAIT_TABLE_FILE = "gaits.parquet"
"""gaits: one row per gait, found and published."""
RUNS_FILE = "runs.json"
"""redeploy: the run list."""
REPEATABILITY_FILE = "repeatability.json"
"""redeploy: the robot's repeatability across starts, per policy."""
GAP_FILE = "gap.parquet"
"""evaluate: the sim-to-real gap per run and engine."""
SUMMARY_FILE = "summary.md"
"""evaluate: the iteration at a glance (Markdown)."""


def tracked_file(track_ref: Ref, recording: str) -> Path:
    """The tracked trajectory of recording ``recording`` in the track stage ``track_ref``."""
    return Path(track_ref.path) / recording / TRACKED_FILE


def _with_overlay(robot: RobotConfig, path: Path) -> RobotConfig:
    if not path.is_file():
        raise DataError(f"{path}: missing; the stage output is incomplete")
    return robot_with_overlay(robot, yaml.safe_load(path.read_text()), path)


def attached_robot(configs: LoadedConfigs, attach_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's overlay (the inferred attachment points)."""
    return _with_overlay(configs.robot, Path(attach_ref.path) / ATTACH_OVERLAY_FILE)


def identified_robot(configs: LoadedConfigs, attach_ref: Ref, sysid_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's and the sysid stage's overlays."""
    return _with_overlay(attached_robot(configs, attach_ref), Path(sysid_ref.path) / SYSID_OVERLAY_FILE)


def read_policies(gaits_ref: Ref) -> dict[str, dict]:
    """The gaits stage's expanded policies (``policies.json``), by name."""
    return json.loads((Path(gaits_ref.path) / POLICIES_FILE).read_text())


def load_recordings(collect_ref: Ref, track_ref: Ref, segment_timeout_s: float) -> dict[str, Recording]:
    """Every recording of the collect stage with its tracked end caps, by policy id. A recording
    that a fault cut short (marked incomplete) is used up to its last finished segment. Each
    keeps the segment timeout it was recorded with (redeploy runs have their own); one whose
    metadata does not say (an import) gets ``segment_timeout_s`` (s)."""
    recordings = {}
    for folder in recording_folders(collect_ref):
        sensors, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
        tracked, _ = read_trajectory(tracked_file(track_ref, folder.name), expect_source="tracked")
        sensors = sensors[np.isfinite(sensors[CABLE_COLS].to_numpy()).all(axis=1)]
        if not meta.complete:  # cut short by a fault: its last segment never ended
            sensors = sensors[sensors["segment"] < sensors["segment"].max()]
            if len(sensors) < 2:
                continue
        recordings[folder.name] = Recording(
            name=folder.name,
            t_s=sensors["t"].to_numpy(),
            segment=sensors["segment"].to_numpy(),
            targets=sensors[TARGET_COLS].to_numpy(),
            control=sensors[CONTROL_COLS].to_numpy() if meta.control_recorded else None,
            cables_m=sensors[CABLE_COLS].to_numpy(),
            caps_t_s=tracked["t"].to_numpy(),
            caps_m=caps_array(tracked),
            segment_timeout_s=meta.segment_timeout_s or segment_timeout_s,
        )
    return recordings
