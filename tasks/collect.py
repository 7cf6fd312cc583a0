"""The ``collect`` stage: run a policy on the hardware and record it.

:func:`run_collect` does the work (usable without Prefect); :func:`collect` is the Prefect
task. A complete collection is never recorded again unless asked (``fresh``), so a second
invocation never runs the hardware again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from prefect import task

from pipeline.config import ROBOT_FIELD, LoadedConfigs
from pipeline.errors import DataError
from pipeline.hardware import robot_for
from pipeline.hardware.base import Robot
from pipeline.plots import top_view_paths
from pipeline.policies import Policy, collect_policy
from storage.files import atomic_write_bytes
from storage.layout import Ref, RunLayout, complete_stage_ref, read_manifest, set_aside, write_manifest
from storage.recording import (
    FRAMES_FILE,
    GROUNDTRUTH_FILE,
    HARDWARE_FILE,
    POLICY_FILE,
    open_recording,
    record_run,
    recording_folders,
    recover_recording,
    write_first_frame_plot,
    write_policy_json,
)
from storage.tracking import StageContext
from storage.trajectory import caps_array, read_trajectory

STAGE = "collect"
KEY_FIELDS = (
    "collect.policy",
    "collect.gait_cycles",
    "collect.random",
    "collect.segment_timeout_s",
    "collect.record_frames",
    "collect.later_iterations",
    "hardware_backend",
    ROBOT_FIELD,
)
"""The config fields a collection depends on: all of ``collect`` but how often it is flushed to
disk, the kind of hardware it runs on and the robot config. Not the hardware's own config file
(``hardware_config``): that is the robot itself, which, like a real one, may change without
making its recordings stale (record anew with ``--recollect``)."""
CONFIG_KEY = "config_sha256"
"""Summary key: the sha256 of :data:`KEY_FIELDS` the collection was recorded under."""
SOURCE_KEY = "redeploy_manifest_sha256"
"""Summary key (iteration k > 1): the sha256 of the redeploy stage manifest whose runs were copied."""
log = logging.getLogger(__name__)


def run_collect(
    configs: LoadedConfigs,
    iteration: int,
    robot: Robot | None = None,
    fresh: bool = False,
) -> tuple[Ref, dict[str, float]]:
    """Execute the configured policy and write the stage output.

    Writes ``<stage>/<policy_id>/{hardware,groundtruth,frames}.parquet``, ``policy.json``,
    ``plots/*.png`` and the manifest. Iteration k > 1 collects iteration k - 1's redeploy runs
    instead (copied, one folder each), and with ``collect.later_iterations:
    redeploy_and_random`` a fresh random policy as well. If the stage already holds a complete
    collection recorded under this config (:data:`KEY_FIELDS`) it is returned untouched (the
    hardware is not run), unless ``fresh``: then, as when it was recorded under another config,
    that collection is kept aside (``set-aside/iter_<k>/collect.replaced-<time>``) and a new one
    recorded. In iteration k > 1 a collection of other redeploy runs than iteration k - 1's
    complete ones now (the gaits, so the redeploy, changed since) is kept aside too and the runs
    copied again; a random recording of the iteration's own is carried over, not run again. An
    interrupted recording of iteration 1's policy is resumed: it is kept as it is (marked
    incomplete, its flushed parts merged), and the rest of the policy, from the segment it
    stopped in, is recorded as a second recording (``<policy>-from<segment>``) from wherever the
    robot now stands; the summary counts both. If the hardware fails or the run is interrupted,
    what was recorded is kept, marked incomplete, and the exception propagates.
    Returns the stage ref and a summary of numeric statistics.
    """
    layout = RunLayout.of(configs)
    stage_dir = layout.stage_dir(iteration, STAGE)
    existing = complete_stage_ref(stage_dir)
    earlier = read_manifest(existing)["summary"] if existing is not None and not fresh else {}
    reconfigured = existing is not None and not fresh and recorded_under_other_config(configs, earlier)
    if reconfigured:
        log.warning("collect: %s was recorded under another collect config; recording anew", stage_dir)
        fresh, earlier = True, {}
    stale = existing is not None and not fresh and iteration > 1 and not _holds_current_runs(layout, iteration, earlier)
    if existing is not None and not fresh and not stale:
        log.info("collect: reusing complete recording at %s", stage_dir)
        return existing, earlier
    if stale:
        log.warning(
            "collect: %s holds other redeploy runs of iteration %d than those now there; collecting them again",
            stage_dir,
            iteration - 1,
        )
    policy = collect_policy(configs.robot, configs.pipeline.collect, seed_offset=iteration - 1)
    stopped = stopped_segment(stage_dir, policy) if existing is None and iteration == 1 else None
    kept = None
    if stage_dir.exists() and stopped is None:
        kept = set_aside(layout, stage_dir, "incomplete" if existing is None else "replaced")
    summary: dict[str, object] = {}
    if iteration > 1:
        summary = _copy_redeploy_runs(layout, iteration, stage_dir)
    if stale and earlier.get("policy_id") == policy.policy_id and (kept / policy.policy_id).is_dir():
        # only the redeploy runs changed: this iteration's own random recording is kept, not run again
        shutil.copytree(kept / policy.policy_id, stage_dir / policy.policy_id)
        if (kept / "plots").is_dir():
            shutil.copytree(kept / "plots", stage_dir / "plots", dirs_exist_ok=True)
        summary.update({k: v for k, v in earlier.items() if k not in summary})
    elif stopped is not None:  # resume: the rest of the policy, from the segment the fault cut short
        log.warning("collect: resuming %s from segment %d (the partial recording is kept)", policy.policy_id, stopped)
        rest = Policy(name=f"{policy.name}-from{stopped}", targets=policy.targets[stopped:])
        if (stage_dir / rest.policy_id).exists():  # an earlier resume that failed too: keep it beside
            set_aside(layout, stage_dir / rest.policy_id, "incomplete")
        with robot_for(configs, robot) as hardware:
            _record_policy(configs, iteration, stage_dir, rest, hardware)
        summary.update(_summarise([stage_dir / policy.policy_id, stage_dir / rest.policy_id], policy))
        summary.update({"resumed_policy_id": rest.policy_id, "resumed_from_segment": stopped})
    elif iteration == 1 or configs.pipeline.collect.later_iterations == "redeploy_and_random":
        with robot_for(configs, robot) as hardware:
            _record_policy(configs, iteration, stage_dir, policy, hardware)
        summary.update(_summarise([stage_dir / policy.policy_id], policy))
    summary[CONFIG_KEY] = config_sha256(configs)
    ref = write_manifest(stage_dir, STAGE, complete=True, summary=summary)
    return ref, summary


def config_sha256(configs: LoadedConfigs) -> str:
    """The sha256 of the config fields a collection depends on (:data:`KEY_FIELDS`)."""
    return hashlib.sha256(json.dumps(configs.fields(KEY_FIELDS), sort_keys=True).encode()).hexdigest()


def recorded_under_other_config(configs: LoadedConfigs, summary: dict) -> bool:
    """Whether the collection with manifest ``summary`` was recorded under other :data:`KEY_FIELDS`
    than ``configs``'. An imported recording, which names none, is taken as it is."""
    recorded = summary.get(CONFIG_KEY)
    return recorded is not None and recorded != config_sha256(configs)


def stopped_segment(stage_dir: Path, policy: Policy) -> int | None:
    """The policy segment in which an earlier, interrupted recording of ``policy`` in ``stage_dir``
    stopped (recovering the parts a killed process left); None if there is no such recording."""
    folder = stage_dir / policy.policy_id
    if not folder.is_dir():
        return None
    if not (folder / HARDWARE_FILE).is_file():
        recover_recording(folder)
    if not (folder / HARDWARE_FILE).is_file():
        return None
    data, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    return None if meta.complete or data.empty else int(data["segment"].max())


def _record_policy(configs: LoadedConfigs, iteration: int, stage_dir: Path, policy: Policy, robot: Robot) -> None:
    """Run ``policy`` on ``robot`` into ``stage_dir/<policy_id>/`` with plots. On a failure the
    stage's manifest says incomplete (with the error) and the exception propagates."""
    c = configs.pipeline.collect
    folder = stage_dir / policy.policy_id
    folder.mkdir(parents=True)
    write_policy_json(folder, policy.name, policy.policy_id, policy.targets)
    recording = open_recording(configs, iteration, policy.policy_id, folder, robot, c.segment_timeout_s)
    try:
        record_run(robot, policy, recording, c.record_frames)
    except BaseException as exc:
        write_manifest(
            stage_dir,
            STAGE,
            complete=False,
            summary={
                "policy_id": policy.policy_id,
                "duration_s": recording.last_t_s,
                "error": f"{type(exc).__name__}: {exc}",
            },
        )
        raise
    if (folder / GROUNDTRUTH_FILE).is_file():
        truth, _ = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
        atomic_write_bytes(
            stage_dir / "plots" / "top_view.png",
            top_view_paths(caps_array(truth), f"end-cap paths: {policy.policy_id}"),
        )
    write_first_frame_plot(stage_dir, folder)


def _copy_redeploy_runs(layout: RunLayout, iteration: int, stage_dir: Path) -> dict[str, object]:
    """Iteration ``iteration``'s recordings from the previous iteration's redeploy runs: each run's
    hardware stream, ground truth, frames and policy copied into ``stage_dir/<run>/`` (written
    to a temporary folder first, so a failure leaves no half stage)."""
    source_dir = layout.stage_dir(iteration - 1, "redeploy")
    previous = complete_stage_ref(source_dir)
    if previous is None:
        raise DataError(
            f"{source_dir}: iteration {iteration} collects iteration {iteration - 1}'s redeploy runs, and that "
            f"stage is not complete; run iteration {iteration - 1} first"
        )
    runs = recording_folders(previous)
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{STAGE}-", dir=stage_dir.parent))
    try:
        for run in runs:
            (work / run.name).mkdir()
            for name in (HARDWARE_FILE, GROUNDTRUTH_FILE, FRAMES_FILE, POLICY_FILE):
                if (run / name).is_file():
                    shutil.copy2(run / name, work / run.name / name)
        work.rename(stage_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    durations = [float(np.ptp(read_trajectory(r / HARDWARE_FILE, expect_source="hardware")[0]["t"])) for r in runs]
    return {"redeploy_runs": len(runs), "redeploy_duration_s": float(sum(durations)), SOURCE_KEY: previous.sha256}


def needs_hardware(configs: LoadedConfigs, iteration: int) -> bool:
    """Whether :func:`run_collect` (not ``fresh``) would run the robot for ``iteration``: iteration 1
    without a complete collection under this config (:data:`KEY_FIELDS`), or a later one that
    records a random policy of its own (``redeploy_and_random``) and has none to carry over.
    Copying iteration k - 1's redeploy runs, again when the collection holds other ones, needs no
    robot."""
    layout = RunLayout.of(configs)
    stage_dir = layout.stage_dir(iteration, STAGE)
    existing = complete_stage_ref(stage_dir)
    random = configs.pipeline.collect.later_iterations == "redeploy_and_random"
    if existing is None:
        return iteration == 1 or random
    earlier = read_manifest(existing, verify_files=False)["summary"]
    if recorded_under_other_config(configs, earlier):
        return iteration == 1 or random
    if iteration == 1:
        return False
    if _holds_current_runs(layout, iteration, earlier):
        return False
    policy = collect_policy(configs.robot, configs.pipeline.collect, seed_offset=iteration - 1)
    carried = earlier.get("policy_id") == policy.policy_id and (stage_dir / policy.policy_id).is_dir()
    return random and not carried


def _holds_current_runs(layout: RunLayout, iteration: int, summary: dict) -> bool:
    """Whether a collection of ``iteration`` with manifest ``summary`` copied the redeploy runs of
    iteration ``iteration - 1`` now on disk."""
    return summary.get(SOURCE_KEY) == previous_redeploy_sha(layout, iteration)


def _summarise(folders: list[Path], policy: Policy) -> dict[str, object]:
    """Figures of ``policy``'s whole recording, read from its files: ``folders`` holds it in
    order (one folder, or a recording cut short followed by the resumed rest). Samples, frames,
    duration and path length add up over the folders; the displacement adds each folder's net
    motion (a resumed run starts wherever the robot then stands); targets reached counts the
    segments finished before each cut and those of the last folder. Times are the ground truth's
    where the hardware has one (a simulator: its exact ticks), else the sensors' stamps; the
    centroid's figures need ground truth and are left out without it."""
    hardware = [read_trajectory(f / HARDWARE_FILE, expect_source="hardware")[0] for f in folders]
    with_truth = all((f / GROUNDTRUTH_FILE).is_file() for f in folders)
    truths = (
        [read_trajectory(f / GROUNDTRUTH_FILE, expect_source="groundtruth")[0] for f in folders] if with_truth else []
    )
    timed = truths or hardware
    duration = sum(float(np.ptp(t["t"])) for t in timed)
    frames = [f / FRAMES_FILE for f in folders if (f / FRAMES_FILE).is_file()]
    summary: dict[str, object] = {
        "policy_id": policy.policy_id,
        "n_targets": len(policy),
        "targets_reached": sum(int(t["segment"].max()) for t in timed[:-1]) + int(timed[-1]["segment"].max()) + 1,
        "duration_s": duration,
        "n_sensor_samples": sum(len(h) for h in hardware),
        "n_frames": sum(pq.read_metadata(f).num_rows for f in frames),
        "sample_rate_hz": float(sum(len(t) - 1 for t in timed) / max(duration, 1e-9)),
    }
    if truths:
        centroids = [caps_array(truth).mean(axis=1)[:, :2] for truth in truths]
        summary["centroid_displacement_m"] = float(np.linalg.norm(sum(c[-1] - c[0] for c in centroids)))
        summary["centroid_path_length_m"] = float(
            sum(np.linalg.norm(np.diff(c, axis=0), axis=1).sum() for c in centroids)
        )
    return summary


def previous_redeploy_sha(layout: RunLayout, iteration: int) -> str | None:
    """The manifest sha256 of iteration ``iteration - 1``'s complete redeploy stage, whose runs
    iteration ``iteration`` collects (None: none, or ``iteration`` is 1)."""
    if iteration == 1:
        return None
    previous = complete_stage_ref(layout.stage_dir(iteration - 1, "redeploy"))
    return None if previous is None else previous.sha256


@task(name=STAGE)
def collect(configs: LoadedConfigs, iteration: int, mlflow_run_id: str, fresh: bool = False) -> dict[str, str]:
    """Prefect task: run :func:`run_collect` (``fresh``: record anew even over a complete
    collection), log it to MLflow, return the ref as JSON."""
    ref, summary = run_collect(configs, iteration, fresh=fresh)
    tags = {"policy_id": str(summary["policy_id"])} if "policy_id" in summary else None
    plots = sorted((Path(ref.path) / "plots").glob("*.png"))
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, plots, tags=tags)
    return ref.to_json()
