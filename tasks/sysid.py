"""The ``sysid`` stage: identify the engine's parameters from tracked trajectories (DESIGN §1.4).

:func:`run_sysid` reads every recording of the collect stage (sensor stream:
targets, commands, cable lengths) with its tracked end caps (track stage), builds
the engine on the robot config with the attachment overlay (attach stage), splits
the recordings into gaits, holds out the last ``sysid.holdout_fraction`` of each,
identifies ``sysid.parameters`` with the configured loss (KFL by default) and
replays the engine before (the robot config's values) and after on the held-out
gaits. It writes ``identified.yaml`` (a robot-config overlay with the identified
values), ``identified.xml`` (a self-contained MuJoCo model of the identified robot,
:mod:`pipeline.physics.mjcf_export`), ``history.parquet`` (loss, values and gradients per
step), ``validation.json`` and plots. It never reads the twin's hidden configuration;
the Prefect task scores the identified values against it and replays the twin's own
values on the held-out gaits (:func:`truth_holdout`), for evaluation only, when the
hardware is the twin.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml
from prefect import task
from prefect.context import TaskRunContext
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.config import LoadedConfigs, RobotConfig, SysidConfig, robot_with_overlay
from pipeline.errors import DataError
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.mjcf_export import identified_mjcf
from pipeline.physics.params import robot_overlay
from pipeline.physics.truth import twin_true_params
from pipeline.plots import replay_paths, sysid_history
from pipeline.sysid.data import Gait, Recording, split_gaits
from pipeline.sysid.identify import identify_staged, planned_steps
from pipeline.sysid.latency import LatencyChoice, best_latency
from pipeline.sysid.losses import make_loss
from pipeline.sysid.result import Identification, Step
from pipeline.sysid.validate import Replay, replay, split_holdout
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.recording import HARDWARE_FILE
from storage.tables import write_table
from storage.tracking import client_for
from storage.trajectory import CABLE_COLS, CONTROL_COLS, TARGET_COLS, caps_array, read_trajectory
from tasks.attach import OVERLAY_FILE as ATTACH_OVERLAY
from tasks.caching import stage_cache_key
from tasks.track import TRACKED_FILE, recording_folders

STAGE = "sysid"
STAGE_VERSION = "6"
OVERLAY_FILE = "identified.yaml"
MJCF_FILE = "identified.xml"
HISTORY_FILE = "history.parquet"


def load_recordings(collect_ref: Ref, track_ref: Ref, segment_timeout_s: float) -> dict[str, Recording]:
    """Every recording of the collect stage with its tracked end caps, by policy id. A recording
    that a fault cut short (marked incomplete) is used up to its last finished segment. Each
    keeps the segment timeout it was recorded with (redeploy runs have their own); one whose
    metadata does not say (an import) gets ``segment_timeout_s``."""
    recordings = {}
    for folder in recording_folders(collect_ref):
        sensors, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
        tracked, _ = read_trajectory(Path(track_ref.path) / folder.name / TRACKED_FILE, expect_source="tracked")
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


def sysid_robot(configs: LoadedConfigs, attach_ref: Ref) -> RobotConfig:
    """The robot config with the attach stage's overlay."""
    path = Path(attach_ref.path) / ATTACH_OVERLAY
    return robot_with_overlay(configs.robot, yaml.safe_load(path.read_text()), path)


@dataclasses.dataclass(frozen=True)
class SysidData:
    """What the stage identifies from: the robot config with the attachment overlay, the
    recordings by name, and their gaits split into fitted and held out."""

    robot: RobotConfig
    recordings: dict[str, Recording]
    gaits: list[Gait]
    fit: list[Gait]
    held: list[Gait]

    def held_out(self) -> dict[str, list[Gait]]:
        """The held-out gaits by recording name, in recording order."""
        return {
            name: [g for g in self.held if g.recording == name]
            for name in dict.fromkeys(g.recording for g in self.held)
        }


def sysid_data(
    configs: LoadedConfigs,
    collect_ref: Ref,
    track_ref: Ref,
    attach_ref: Ref,
    earlier: dict[int, tuple[Ref, Ref]] | None = None,
) -> SysidData:
    """Read the recordings (with ``earlier``: earlier iterations' collect and track refs, named
    ``k<iteration>-<policy id>``), split them into gaits and hold out the last
    ``sysid.holdout_fraction`` of each."""
    timeout_s = configs.pipeline.collect.segment_timeout_s
    robot = sysid_robot(configs, attach_ref)
    recordings = load_recordings(collect_ref, track_ref, timeout_s)
    for k, (earlier_collect, earlier_track) in sorted((earlier or {}).items()):
        for name, recording in load_recordings(earlier_collect, earlier_track, timeout_s).items():
            recordings[f"k{k}-{name}"] = dataclasses.replace(recording, name=f"k{k}-{name}")
    return split_recordings(configs, robot, recordings, str(collect_ref.path))


def split_recordings(
    configs: LoadedConfigs, robot: RobotConfig, recordings: dict[str, Recording], source: str
) -> SysidData:
    """``recordings`` split into gaits (only the monotonic ones with ``sysid.monotonic_only``),
    the last ``sysid.holdout_fraction`` of each held out; ``source`` names the data in the error
    raised when no gait is left to identify from."""
    config = configs.pipeline.sysid
    timeout_s = configs.pipeline.collect.segment_timeout_s
    gaits = [g for r in recordings.values() for g in split_gaits(r, robot, timeout_s)]
    if config.monotonic_only:
        gaits = [g for g in gaits if g.monotonic]
    fit, held = split_holdout(gaits, config.holdout_fraction)
    if not fit:
        raise DataError(f"{source}: no gait to identify from")
    return SysidData(robot, recordings, gaits, fit, held)


def replay_held_out(configs: LoadedConfigs, data: SysidData, robot: RobotConfig, params: Params) -> dict[str, Replay]:
    """Replay ``params`` (one environment) in the engine of ``robot`` on each recording's held-out gaits."""
    config = configs.pipeline.sysid
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=configs.pipeline.engine.compiled)
    timeout_s = configs.pipeline.collect.segment_timeout_s
    replays = {}
    for name, own in data.held_out().items():
        recording = data.recordings[name]
        replays[name] = replay(engine, params, robot, recording, own, config, recording.timeout_or(timeout_s))
    return replays


def latency_robot(
    robot: RobotConfig,
    recordings: dict[str, Recording],
    fit: list[Gait],
    config: SysidConfig,
    timeout_s: float,
    compiled: bool = False,
) -> tuple[RobotConfig, LatencyChoice | None]:
    """``robot`` with the control latency of ``config.latency_grid_s`` that scores lowest on the
    ``fit`` gaits at its best motor speed (:func:`~pipeline.sysid.latency.best_latency`), and the
    choice (``robot`` as it is, and None, without a grid). ``timeout_s``: the segment timeout of
    recordings that do not say; ``compiled``: the engines' ``compiled`` setting."""
    if not config.latency_grid_s:
        return robot, None
    start = Params.from_robot(robot)

    def build(latency_s: float):
        candidate = with_latency(robot, latency_s)
        engine = Engine(RobotModel.from_robot(candidate), dt=config.dt_s, compiled=compiled)
        return make_loss(engine, candidate, recordings, fit, start, config, timeout_s)

    choice = best_latency(build, start, config.latency_grid_s, config.latency_speed_factors, config)
    return with_latency(robot, choice.latency_s), choice


def run_sysid(
    configs: LoadedConfigs, iteration: int, data: SysidData, show_progress: bool = True
) -> tuple[Ref, dict[str, object], Identification]:
    """Identify from ``data``, validate and write the stage output. Returns the ref, the summary
    and the result."""
    config = configs.pipeline.sysid
    timeout_s = configs.pipeline.collect.segment_timeout_s
    robot, recordings, gaits, fit, held = data.robot, data.recordings, data.gaits, data.fit, data.held
    start = Params.from_robot(robot)
    configured = robot
    compiled = configs.pipeline.engine.compiled
    robot, latency = latency_robot(robot, recordings, fit, config, timeout_s, compiled)
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=compiled)
    loss = make_loss(engine, robot, recordings, fit, start, config, timeout_s)
    with Progress(
        TextColumn(f"sysid ({config.loss})"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps  loss {task.fields[loss]:.3g}"),
        TimeElapsedColumn(),
        disable=not show_progress,
    ) as bar:
        job = bar.add_task("sysid", total=planned_steps(config), loss=math.nan)
        result = identify_staged(loss, start, config, progress=lambda s: bar.update(job, advance=1, loss=s.loss))

    before = replay_held_out(configs, data, configured, start)
    after = replay_held_out(configs, data, robot, result.params)
    replays = {name: {"before": before[name], "after": after[name]} for name in before}

    stage_dir = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    overlay = robot_overlay(result.values)
    if config.latency_grid_s:
        overlay["pid"] = {"latency_s": robot.pid.latency_s}
    identified = robot_with_overlay(robot, overlay, stage_dir / OVERLAY_FILE)
    atomic_write_bytes(stage_dir / OVERLAY_FILE, yaml.safe_dump(overlay, sort_keys=False).encode())
    write_identified_mjcf(stage_dir / MJCF_FILE, identified, config.dt_s)
    write_table(stage_dir / HISTORY_FILE, history_table(result.history), {"loss": config.loss, "stage": STAGE})
    validation = {name: {label: r.metrics("") for label, r in pair.items()} for name, pair in replays.items()}
    atomic_write_json(stage_dir / "validation.json", validation)
    _write_plots(stage_dir, result, replays)
    summary = _summary(config.loss, start, result, gaits, fit, held, replays)
    summary["latency_s"] = robot.pid.latency_s
    summary["recordings"] = len(recordings)
    if latency is not None:
        summary.update({f"latency_loss.{1000 * k:.0f}ms": v for k, v in latency.scores.items()})
        summary.update({f"latency_motor_speed.{1000 * k:.0f}ms": v for k, v in latency.motor_speeds.items()})
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary, result


def write_identified_mjcf(path: Path, robot: RobotConfig, timestep_s: float) -> None:
    """Write the MuJoCo model (MJCF) of ``robot`` with physics step ``timestep_s`` (s) to ``path``, atomically."""
    atomic_write_bytes(path, identified_mjcf(robot, timestep_s=timestep_s).encode())


def with_latency(robot: RobotConfig, latency_s: float) -> RobotConfig:
    """``robot`` with its control latency set to ``latency_s`` (s)."""
    return robot.model_copy(update={"pid": robot.pid.model_copy(update={"latency_s": latency_s})})


def history_table(history: list[Step]) -> pa.Table:
    """One row per optimiser step: loss, prior, kept fraction, lr, wall time, values and gradients."""
    columns: dict[str, list] = {
        "iteration": [s.iteration for s in history],
        "method": [s.method for s in history],
        "loss": [s.loss for s in history],
        "unfiltered_loss": [s.unfiltered_loss for s in history],
        "prior": [s.prior for s in history],
        "kept_fraction": [s.kept_fraction for s in history],
        "lr": [s.lr for s in history],
        "wall_s": [s.wall_s for s in history],
    }
    for name in history[0].values:
        columns[f"value_{name}"] = [s.values[name] for s in history]
        columns[f"gradient_{name}"] = [s.gradient[name] for s in history]
    return pa.table(columns)


def _write_plots(stage_dir: Path, result: Identification, replays: dict[str, dict[str, Replay]]) -> None:
    steps = np.array([s.iteration for s in result.history])
    values = {n: np.array([s.values[n] for s in result.history]) for n in result.values}
    loss = np.array([s.loss for s in result.history])
    atomic_write_bytes(stage_dir / "plots" / "parameters.png", sysid_history(steps, values, loss, "sysid"))
    for name, pair in replays.items():
        engines = {f"engine {label}": r.engine_caps_m for label, r in pair.items()}
        image = replay_paths(pair["after"].data_caps_m, engines, f"held-out replay: {name}")
        atomic_write_bytes(stage_dir / "plots" / f"replay_{name}.png", image)


def _summary(
    loss: str,
    start: Params,
    result: Identification,
    gaits: list,
    fit: list,
    held: list,
    replays: dict[str, dict[str, Replay]],
) -> dict[str, object]:
    summary: dict[str, object] = {
        "loss": loss,
        "iterations": result.iterations,
        "converged": result.converged,
        "wall_s": result.wall_s,
        "gaits": len(gaits),
        "gaits_fit": len(fit),
        "gaits_held_out": len(held),
        "final_loss": result.history[-1].loss,
    }
    for name, value in result.values.items():
        summary[f"value.{name}"] = value
        summary[f"start.{name}"] = float(getattr(start, name)[0])
    for name, (low, high) in result.profile.items():
        summary[f"profile_low.{name}"] = low
        summary[f"profile_high.{name}"] = high
    for label in ("before", "after"):
        summary.update(mean_replay_metrics({name: r[label] for name, r in replays.items()}, f"holdout.{label}."))
    if replays:
        summary["holdout.key_frame_error_reduction_pct"] = reduction_pct(
            summary["holdout.before.key_frame_error_mm"], summary["holdout.after.key_frame_error_mm"]
        )
    return summary


def mean_replay_metrics(replays: dict[str, Replay], prefix: str) -> dict[str, float]:
    """Each figure of :meth:`Replay.metrics` averaged over the recordings, keys starting with ``prefix``."""
    figures = [r.metrics(prefix) for r in replays.values()]
    return {key: float(np.mean([f[key] for f in figures])) for key in (figures[0] if figures else [])}


NUDGED = ("motor_speed", "friction")
"""The parameters that :func:`smoothed_held_out_error` nudges."""


def smoothed_held_out_error(
    configs: LoadedConfigs, data: SysidData, robot: RobotConfig, params: Params, rel: float
) -> tuple[float, list[float]]:
    """The mean held-out key-frame error (mm) of ``params`` (one environment) in the engine of
    ``robot``, averaged with the four means of :data:`NUDGED` in turn times ``1 - rel`` and
    ``1 + rel``; and those four means. The mean over a dozen held-out key frames is carried by
    the few where one execution tips a rod over an edge and the other does not, which a change
    far below what identification can resolve decides; the average is the figure that such
    changes do not decide."""

    def mean_mm(values: Params) -> float:
        return mean_replay_metrics(replay_held_out(configs, data, robot, values), "")["key_frame_error_mm"]

    nudged = [
        mean_mm(params.replace(**{name: getattr(params, name) * factor}))
        for name in NUDGED
        for factor in (1 - rel, 1 + rel)
    ]
    return float(np.mean([mean_mm(params), *nudged])), nudged


def reduction_pct(before: float, after: float) -> float:
    """How much lower ``after`` is than ``before``, in % of ``before`` (0 when ``before`` is 0)."""
    return 100.0 * (1.0 - after / before) if before > 0 else 0.0


def truth_holdout(configs: LoadedConfigs, data: SysidData, before_mm: float) -> dict[str, float]:
    """Evaluation only (the twin): the held-out replay of the twin's own values in the engine,
    with its true attachment points and control latency, as ``holdout.truth.*`` figures, and
    ``holdout.truth.key_frame_error_reduction_pct`` against ``before_mm`` (the start values'
    mean key-frame error, mm). What the engine does with the twin's truth: the reference for
    the identified values, since the twin differs in what the engine cannot express (per-motor
    speeds, soft contact, sensor biases)."""
    replays = replay_held_out(configs, data, *truth_engine(configs, data.robot))
    out = mean_replay_metrics(replays, "holdout.truth.")
    if replays:
        out["holdout.truth.key_frame_error_reduction_pct"] = reduction_pct(
            before_mm, out["holdout.truth.key_frame_error_mm"]
        )
    return out


def truth_engine(configs: LoadedConfigs, robot: RobotConfig) -> tuple[RobotConfig, Params]:
    """Evaluation only (the twin): ``robot`` with the twin's true attachment points and control
    latency, and the twin's own values in the engine's parameters (one environment)."""
    twin = configs.twin
    attachment = robot.attachment.model_copy(update={"phase_rad": twin.attachment_phase_rad})
    true_robot = with_latency(robot.model_copy(update={"attachment": attachment}), twin.control_latency_s)
    return true_robot, twin_true_params(true_robot, twin)


def truth_errors(configs: LoadedConfigs, values: dict[str, float]) -> dict[str, float]:
    """Evaluation only (the twin): each identified value's error against the twin's hidden truth,
    absolute (SI) and relative (%), where the engine parameter has a twin counterpart."""
    truth = twin_true_params(configs.robot, configs.twin)
    out = {}
    for name, value in values.items():
        true = float(getattr(truth, name)[0])
        out[f"truth_error.{name}"] = value - true
        if true != 0:
            out[f"truth_error_pct.{name}"] = 100.0 * (value - true) / abs(true)
        out[f"truth.{name}"] = true
    return out


def cache_key(context: TaskRunContext | None, parameters: dict) -> str:
    """The Prefect cache key of this stage for the task parameters ``parameters``."""
    inputs = {k: parameters[f"{k}_ref"] for k in ("collect", "track", "attach")}
    for k, (collect_ref, track_ref) in sorted((parameters.get("earlier_refs") or {}).items()):
        inputs.update({f"collect_{k}": collect_ref, f"track_{k}": track_ref})
    return stage_cache_key(STAGE, STAGE_VERSION, parameters["configs"], parameters["iteration"], inputs)


@task(name=STAGE, cache_key_fn=cache_key, persist_result=True, result_serializer="json")
def sysid(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    collect_ref: dict[str, str],
    track_ref: dict[str, str],
    attach_ref: dict[str, str],
    earlier_refs: dict[int, tuple[dict[str, str], dict[str, str]]] | None = None,
) -> dict[str, str]:
    """Prefect task: run :func:`run_sysid` (with ``earlier_refs``: earlier iterations' collect and
    track refs); log values, loss curves, held-out figures, plots and (on the twin) errors against
    the hidden truth and the truth's own held-out replay to MLflow; return the ref as JSON."""
    earlier = {int(k): (Ref.from_json(c), Ref.from_json(t)) for k, (c, t) in (earlier_refs or {}).items()}
    refs = (Ref.from_json(collect_ref), Ref.from_json(track_ref), Ref.from_json(attach_ref))
    data = sysid_data(configs, *refs, earlier=earlier)
    ref, summary, result = run_sysid(configs, iteration, data)
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    params = {f"{STAGE}.identified.{n}": f"{v:.6g}" for n, v in result.values.items()}
    existing = client.get_run(mlflow_run_id).data.params
    for key, value in params.items():
        if key not in existing:
            client.log_param(mlflow_run_id, key, value)
    for step in result.history:
        client.log_metric(mlflow_run_id, f"{STAGE}.loss", step.loss, step=step.iteration)
        for name, value in step.values.items():
            client.log_metric(mlflow_run_id, f"{STAGE}.step.{name}", value, step=step.iteration)
    for key, value in summary.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            client.log_metric(mlflow_run_id, f"{STAGE}.{key}", float(value), step=iteration)
    if configs.pipeline.hardware_backend == "twin":
        evaluation = truth_errors(configs, result.values)
        evaluation.update(truth_holdout(configs, data, float(summary["holdout.before.key_frame_error_mm"])))
        for key, value in evaluation.items():
            client.log_metric(mlflow_run_id, f"{STAGE}.{key}", value, step=iteration)
    for path in sorted((Path(ref.path) / "plots").glob("*.png")):
        client.log_artifact(mlflow_run_id, str(path), artifact_path=STAGE)
    for name in (OVERLAY_FILE, MJCF_FILE, HISTORY_FILE, "validation.json"):
        client.log_artifact(mlflow_run_id, str(Path(ref.path) / name), artifact_path=STAGE)
    return ref.to_json()
