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
learn      :data:`CONTACT_MODEL_FILE`, :data:`TRAINING_FILE`, :data:`LEARN_FILE`
           (:mod:`storage.contact_model`)
actions    :data:`ACTIONS_FILE` (:mod:`storage.action_table`)
evaluate   :data:`GAP_FILE`, :data:`SUMMARY_FILE`
=========  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import yaml

from pipeline.config import LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.errors import DataError
from pipeline.learned.engine import LearnedEngine
from pipeline.physics.model import RobotModel
from pipeline.sysid.data import Recording
from pipeline.sysid.heldout import SysidData, split_recordings
from storage.contact_model import load_contact_model
from storage.layout import Ref
from storage.recording import HARDWARE_FILE, recording_folders
from storage.tracked import TRACKED_FILE
from storage.trajectory import (
    CABLE_COLS,
    CONTROL_COLS,
    MOTOR_COLS,
    ROD_QUAT_COLS,
    TARGET_COLS,
    caps_array,
    read_trajectory,
)

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
CONTACT_MODEL_FILE = "contact_model.safetensors"
"""learn: the fine-tuned contact network (:func:`storage.contact_model.load_contact_model`)."""
TRAINING_FILE = "training.parquet"
"""learn: the losses per epoch."""
LEARN_FILE = "learn.json"
"""learn: what the model was trained on, and the stage's figures."""
GAITS_FILE = "gaits.json"
"""gaits: the gaits found, the published gaits' figures and the search figures."""
POLICIES_FILE = "policies.json"
"""gaits: the expanded long policies the redeploy stage runs, by name."""
ACTIONS_FILE = "actions.parquet"
"""actions: the action table, one row per action, face and rolling direction."""
GAIT_TABLE_FILE = "gaits.parquet"
"""gaits: one row per gait, found and published."""
RUNS_FILE = "runs.json"
"""redeploy: the run list."""
REPEATABILITY_FILE = "repeatability.json"
"""redeploy: the robot's repeatability across starts, per policy."""
REPORT_FILE = "report.md"
"""sysid: the report (Markdown): per identified parameter its interval, held-out sensitivity and verdict."""
REPORT_HTML_FILE = "report.html"
"""sysid: the report as a standalone HTML page."""
GAP_FILE = "gap.parquet"
"""evaluate: the sim-to-real gap per run and engine."""
REPLAYS_FILE = "replays.parquet"
"""evaluate: the engines' replays of the redeploy runs: per ``run`` and ``engine``, the end caps
(``cap<i>_<x|y|z>``, m) at each control tick ``t`` (s, on the run's clock from its first tracked
frame)."""
SUMMARY_FILE = "summary.md"
"""evaluate: the iteration at a glance (Markdown)."""


def tracked_file(track_ref: Ref, recording: str) -> Path:
    """The tracked trajectory of recording ``recording`` in the track stage ``track_ref``."""
    return Path(track_ref.path) / recording / TRACKED_FILE


def _with_overlay(robot: RobotConfig, path: Path) -> RobotConfig:
    if not path.is_file():
        raise DataError(f"{path}: missing; the stage output is incomplete")
    return robot_with_overlay(robot, yaml.safe_load(path.read_text()), path)


def attach_iteration(configs: LoadedConfigs, iteration: int) -> int:
    """The iteration whose attachment overlay ``iteration`` uses: its own (iteration 1, or
    ``attach.every_iteration``) or iteration 1's."""
    return iteration if iteration == 1 or configs.pipeline.attach.every_iteration else 1


def attached_robot(configs: LoadedConfigs, attach_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's overlay (the inferred attachment points)."""
    return _with_overlay(configs.robot, Path(attach_ref.path) / ATTACH_OVERLAY_FILE)


def identified_robot(configs: LoadedConfigs, attach_ref: Ref, sysid_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's and the sysid stage's overlays."""
    return _with_overlay(attached_robot(configs, attach_ref), Path(sysid_ref.path) / SYSID_OVERLAY_FILE)


def read_found_gaits(gaits_ref: Ref) -> dict[str, np.ndarray]:
    """The gaits the search found (``gaits.json``), by objective: targets (n, 6) from face 0."""
    found = json.loads((Path(gaits_ref.path) / GAITS_FILE).read_text())["found"]
    return {name: np.asarray(gait["targets"], float) for name, gait in found.items()}


def read_policies(gaits_ref: Ref) -> dict[str, dict]:
    """The gaits stage's expanded policies (``policies.json``), by name."""
    return json.loads((Path(gaits_ref.path) / POLICIES_FILE).read_text())


def load_recordings(collect_ref: Ref, track_ref: Ref, segment_timeout_s: float) -> dict[str, Recording]:
    """Every recording of the collect stage with its tracked end caps, by policy id. A recording
    that a fault cut short (marked incomplete) is used up to its last finished segment. Each
    keeps the segment timeout it was recorded with (redeploy runs have their own); one whose
    metadata does not say (an import) gets ``segment_timeout_s`` (s). Of samples or frames with the
    same stamp the first is read; a recording without cable readings has NaN lengths."""
    recordings = {}
    for folder in recording_folders(collect_ref):
        sensors, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
        tracked, _ = read_trajectory(tracked_file(track_ref, folder.name), expect_source="tracked")
        # of samples (or frames) with the same stamp, which imported recordings may have, the first is read
        sensors = sensors[np.r_[True, np.diff(sensors["t"].to_numpy()) > 0]]
        tracked = tracked[np.r_[True, np.diff(tracked["t"].to_numpy()) > 0]]
        if meta.cables_recorded:
            sensors = sensors[np.isfinite(sensors[CABLE_COLS].to_numpy()).all(axis=1)]
        if not meta.complete:  # cut short by a fault: its last segment never ended
            sensors = sensors[sensors["segment"] < sensors["segment"].max()]
            if len(sensors) < 2:
                continue
        cables = sensors[CABLE_COLS].to_numpy() if meta.cables_recorded else np.full((len(sensors), 9), np.nan)
        motors = sensors[MOTOR_COLS].to_numpy() if set(MOTOR_COLS) <= set(sensors.columns) else None
        quats = tracked[ROD_QUAT_COLS].to_numpy() if set(ROD_QUAT_COLS) <= set(tracked.columns) else None
        recordings[folder.name] = Recording(
            name=folder.name,
            t_s=sensors["t"].to_numpy(),
            segment=sensors["segment"].to_numpy(),
            targets=sensors[TARGET_COLS].to_numpy(),
            control=sensors[CONTROL_COLS].to_numpy() if meta.control_recorded else None,
            cables_m=cables,
            caps_t_s=tracked["t"].to_numpy(),
            caps_m=caps_array(tracked),
            segment_timeout_s=meta.segment_timeout_s or segment_timeout_s,
            motor_rad=motors if motors is not None and np.isfinite(motors).all() else None,
            rod_quat=quats.reshape(-1, 3, 4) if quats is not None and np.isfinite(quats).all() else None,
            gaps_s=tuple((gap.t_start_s, gap.t_end_s) for gap in meta.gaps),
        )
    return recordings


def load_iteration_recordings(
    collect_ref: Ref, track_ref: Ref, earlier: dict[int, tuple[Ref, Ref]], segment_timeout_s: float
) -> dict[str, Recording]:
    """The recordings of an iteration (:func:`load_recordings`) and of the earlier iterations in
    ``earlier`` (iteration -> collect and track refs), those named ``k<iteration>-<policy id>``."""
    recordings = load_recordings(collect_ref, track_ref, segment_timeout_s)
    for k, (earlier_collect, earlier_track) in sorted(earlier.items()):
        for name, recording in load_recordings(earlier_collect, earlier_track, segment_timeout_s).items():
            recordings[f"k{k}-{name}"] = dataclasses.replace(recording, name=f"k{k}-{name}")
    return recordings


def earlier_from_json(earlier_refs: dict | None) -> dict[int, tuple[Ref, Ref]]:
    """Earlier iterations' collect and track refs as a task receives them (JSON, iteration keys
    maybe strings) -> iteration -> (collect ref, track ref)."""
    return {int(k): (Ref.from_json(c), Ref.from_json(t)) for k, (c, t) in (earlier_refs or {}).items()}


def identification_data(
    configs: LoadedConfigs,
    robot: RobotConfig,
    collect_ref: Ref,
    track_ref: Ref,
    earlier: dict[int, tuple[Ref, Ref]] | None = None,
) -> SysidData:
    """The recordings of an iteration and of the ``earlier`` ones (:func:`load_iteration_recordings`)
    split into gaits for ``robot``, the last ``sysid.data.holdout_fraction`` of each held out."""
    timeout_s = configs.pipeline.collect.segment_timeout_s
    recordings = load_iteration_recordings(collect_ref, track_ref, earlier or {}, timeout_s)
    return split_recordings(configs, robot, recordings, str(collect_ref.path))


def learned_engine(learn_ref: Ref, robot: RobotConfig) -> LearnedEngine:
    """The hybrid engine of ``robot`` with the learn stage's contact network."""
    model = RobotModel.from_robot(robot)
    network, config, _ = load_contact_model(Path(learn_ref.path) / CONTACT_MODEL_FILE, model)
    return LearnedEngine.of(model, network, config)
