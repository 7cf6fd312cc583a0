"""The ``sysid`` stage: identify the engine's parameters from tracked trajectories.

:func:`sysid_data` reads every recording of the collect stage (sensor stream: targets,
commands, cable lengths) with its tracked end caps (track stage), builds the robot with the
attachment overlay (attach stage) and splits the recordings into gaits, holding out the last
``sysid.data.holdout_fraction`` of each (:mod:`pipeline.sysid.heldout`). :func:`run_sysid`
identifies ``sysid.parameters`` with the configured loss (KFL by default) and replays the engine
before (the robot config's values) and after on the held-out gaits. It writes
``identified.yaml`` (a robot-config overlay with the identified values), ``identified.xml``
(a self-contained MuJoCo model of the identified robot, :mod:`pipeline.physics.mjcf_export`),
``history.parquet`` (loss, values and gradients per step), ``validation.json`` and plots. It
never reads the twin's hidden configuration; the Prefect task scores the identified values
against it and replays the twin's own values on the held-out gaits (:mod:`pipeline.truth`),
for evaluation only, when the hardware is the twin.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml
from prefect import task

from pipeline.config import LoadedConfigs, RobotConfig, robot_with_overlay
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.mjcf_export import identified_mjcf
from pipeline.physics.params import robot_overlay
from pipeline.plots import replay_paths, sysid_history
from pipeline.progress import progress
from pipeline.sysid.heldout import SysidData, mean_replay_metrics, reduction_pct, replay_held_out
from pipeline.sysid.identify import identify_staged, planned_steps
from pipeline.sysid.latency import latency_robot
from pipeline.sysid.losses import make_loss
from pipeline.sysid.parameters import search_bounds
from pipeline.sysid.report import SENSITIVITY_STEP, ParameterRow, intervals, report_html, report_markdown
from pipeline.sysid.result import Identification, Step
from pipeline.sysid.validate import Replay
from pipeline.truth import true_values, truth_errors, truth_holdout
from storage.catalog import (
    HISTORY_FILE,
    MJCF_FILE,
    REPORT_FILE,
    REPORT_HTML_FILE,
    SYSID_OVERLAY_FILE,
    VALIDATION_FILE,
    attached_robot,
    earlier_from_json,
    identification_data,
)
from storage.files import atomic_write_bytes, atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.tables import write_table
from storage.tracking import StageContext

STAGE = "sysid"
MODEL_NAME = "identified-robot"
"""The MLflow model the stage logs: the identified robot's MJCF model and its robot-config overlay."""


def sysid_data(
    configs: LoadedConfigs,
    collect_ref: Ref,
    track_ref: Ref,
    attach_ref: Ref,
    earlier: dict[int, tuple[Ref, Ref]] | None = None,
) -> SysidData:
    """Read the recordings (with ``earlier``: earlier iterations' collect and track refs, named
    ``k<iteration>-<policy id>``), split them into gaits and hold out the last
    ``sysid.data.holdout_fraction`` of each."""
    return identification_data(configs, attached_robot(configs, attach_ref), collect_ref, track_ref, earlier)


def run_sysid(
    configs: LoadedConfigs, iteration: int, data: SysidData, truth: dict[str, float] | None = None
) -> tuple[Ref, dict[str, object], Identification]:
    """Identify from ``data``, validate and write the stage output with its report
    (:mod:`pipeline.sysid.report`; ``truth``: the twin's values by name, for the report's
    evaluation columns). Returns the ref, the summary and the result."""
    config = configs.pipeline.sysid
    timeout_s = configs.pipeline.collect.segment_timeout_s
    robot, recordings, gaits, fit, held = data.robot, data.recordings, data.gaits, data.fit, data.held
    start = Params.from_robot(robot)
    configured = robot
    compiled = configs.pipeline.engine.compiled
    robot, latency = latency_robot(robot, recordings, fit, config, timeout_s, compiled)
    engine = Engine(RobotModel.from_robot(robot), dt=config.dt_s, compiled=compiled)
    loss = make_loss(engine, robot, recordings, fit, start, config, timeout_s)
    with progress(
        f"sysid ({config.loss.kind})", planned_steps(config), "steps", "loss {loss:.3g}", loss=math.nan
    ) as row:
        result = identify_staged(loss, start, config, progress=lambda s: row.advance(loss=s.loss))

    before = replay_held_out(configs, data, configured, start)
    after = replay_held_out(configs, data, robot, result.params)
    replays = {name: {"before": before[name], "after": after[name]} for name in before}

    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    overlay = robot_overlay(result.values)
    if config.latency.grid_s:
        overlay["pid"] = {"latency_s": robot.pid.latency_s}
    identified = robot_with_overlay(robot, overlay, stage_dir / SYSID_OVERLAY_FILE)
    atomic_write_bytes(stage_dir / SYSID_OVERLAY_FILE, yaml.safe_dump(overlay, sort_keys=False).encode())
    write_identified_mjcf(stage_dir / MJCF_FILE, identified, config.dt_s)
    write_table(stage_dir / HISTORY_FILE, history_table(result.history), {"loss": config.loss.kind, "stage": STAGE})
    validation = {name: {label: r.metrics("") for label, r in pair.items()} for name, pair in replays.items()}
    atomic_write_json(stage_dir / VALIDATION_FILE, validation)
    plots = _write_plots(stage_dir, result, replays)
    summary = _summary(config.loss.kind, start, result, gaits, fit, held, replays)
    rows = _report_rows(configs, data, robot, start, result, summary, truth)
    heldout = (
        (summary["holdout.before.key_frame_error_mm"], summary["holdout.after.key_frame_error_mm"]) if replays else None
    )
    title = f"{configs.pipeline.campaign} iteration {iteration}: identification"
    text = report_markdown(title, rows, heldout, plots)
    atomic_write_bytes(stage_dir / REPORT_FILE, text.encode())
    atomic_write_bytes(stage_dir / REPORT_HTML_FILE, report_html(text, title).encode())
    for row in rows:
        if row.heldout_change_mm is not None:
            summary[f"heldout_change_down_mm.{row.name}"], summary[f"heldout_change_up_mm.{row.name}"] = (
                row.heldout_change_mm
            )
    summary["latency_s"] = robot.pid.latency_s
    summary["recordings"] = len(recordings)
    if latency is not None:
        summary.update({f"latency_loss.{1000 * k:.0f}ms": v for k, v in latency.scores.items()})
        summary.update({f"latency_motor_speed.{1000 * k:.0f}ms": v for k, v in latency.motor_speeds.items()})
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary, result


def write_identified_mjcf(path: Path, robot: RobotConfig, timestep_s: float) -> None:
    """Write the MuJoCo model (MJCF) of ``robot`` with physics step ``timestep_s`` (s) to ``path``, atomically."""
    atomic_write_bytes(path, identified_mjcf(robot, timestep_s=timestep_s).encode())


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


def _report_rows(
    configs: LoadedConfigs,
    data: SysidData,
    robot: RobotConfig,
    start: Params,
    result: Identification,
    summary: dict[str, object],
    truth: dict[str, float] | None,
) -> list[ParameterRow]:
    """The report's row of each identified value: its start, search bounds, profile interval and
    held-out sensitivity (the held-out gaits replayed with the value 10 % below and above), and
    ``truth``'s value where given."""
    rows = []
    interval = intervals(result)
    for name, value in result.values.items():
        change = None
        if "holdout.after.key_frame_error_mm" in summary:
            errors = []
            for factor in (1 - SENSITIVITY_STEP, 1 + SENSITIVITY_STEP):
                moved = result.params.replace(**{name: getattr(result.params, name) * factor})
                replays = replay_held_out(configs, data, robot, moved)
                errors.append(mean_replay_metrics(replays, "")["key_frame_error_mm"])
            after = float(summary["holdout.after.key_frame_error_mm"])
            change = (errors[0] - after, errors[1] - after)
        rows.append(
            ParameterRow(
                name=name,
                start=float(getattr(start, name)[0]),
                bounds=search_bounds(name),
                value=value,
                interval=interval.get(name),
                heldout_change_mm=change,
                truth=None if truth is None else truth.get(name),
            )
        )
    return rows


def _write_plots(stage_dir: Path, result: Identification, replays: dict[str, dict[str, Replay]]) -> list[str]:
    """The parameters' history and each held-out replay as plots; the replays' paths (relative to ``stage_dir``)."""
    steps = np.array([s.iteration for s in result.history])
    values = {n: np.array([s.values[n] for s in result.history]) for n in result.values}
    loss = np.array([s.loss for s in result.history])
    atomic_write_bytes(stage_dir / "plots" / "parameters.png", sysid_history(steps, values, loss, "sysid"))
    for name, pair in replays.items():
        engines = {f"engine {label}": r.engine_caps_m for label, r in pair.items()}
        image = replay_paths(pair["after"].data_caps_m, engines, f"held-out replay: {name}")
        atomic_write_bytes(stage_dir / "plots" / f"replay_{name}.png", image)
    return [f"plots/replay_{name}.png" for name in replays]


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
    for name, error in result.standard_error.items():
        summary[f"standard_error.{name}"] = error
    for label in ("before", "after"):
        summary.update(mean_replay_metrics({name: r[label] for name, r in replays.items()}, f"holdout.{label}."))
    if replays:
        summary["holdout.key_frame_error_reduction_pct"] = reduction_pct(
            summary["holdout.before.key_frame_error_mm"], summary["holdout.after.key_frame_error_mm"]
        )
    return summary


@task(name=STAGE)
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
    track refs); log values, loss curves, held-out figures, plots and (on the twin, in process or served) errors against
    the hidden truth and the truth's own held-out replay to MLflow; return the ref as JSON."""
    refs = (Ref.from_json(collect_ref), Ref.from_json(track_ref), Ref.from_json(attach_ref))
    data = sysid_data(configs, *refs, earlier=earlier_from_json(earlier_refs))
    truth = true_values(configs) if configs.twin is not None else None  # the report's evaluation columns
    ref, summary, result = run_sysid(configs, iteration, data, truth)
    figures = dict(summary)
    if configs.twin is not None:  # the hardware is the twin (in process or served): score against its truth
        figures.update(truth_errors(configs, result.values))
        figures.update(truth_holdout(configs, data, float(summary["holdout.before.key_frame_error_mm"])))
    stage_dir = Path(ref.path)
    names = (SYSID_OVERLAY_FILE, MJCF_FILE, HISTORY_FILE, VALIDATION_FILE, REPORT_FILE, REPORT_HTML_FILE)
    files = [stage_dir / name for name in names]
    params = {f"identified.{n}": f"{v:.6g}" for n, v in result.values.items()}
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log_series("loss", [(step.iteration, step.loss) for step in result.history])
        for name in result.values:
            context.log_series(f"step.{name}", [(step.iteration, step.values[name]) for step in result.history])
        context.log(figures, [*sorted((stage_dir / "plots").glob("*.png")), *files], params=params)
        context.log_model(MODEL_NAME, [stage_dir / MJCF_FILE, stage_dir / SYSID_OVERLAY_FILE], params)
    return ref.to_json()
