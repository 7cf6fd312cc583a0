"""The ``evaluate`` stage: the sim-to-real gap of the iteration's redeploy runs, and the
iteration's summary.

:func:`run_evaluate` replays every redeploy run from its tracked start in the analytic engine
with the robot config's parameters ("before" sysid) and with the identified ones ("after"), in
the hybrid engine with the learn stage's contact network ("learned"), and on the twin, as the
reference, in the analytic engine with the twin's own values ("truth",
:func:`pipeline.truth.truth_engine`: what the analytic model's structure allows), one batch per
policy. The redeploy runs were never fitted, so this is the held-out gap. Per run and engine: final
centre-of-mass error (m and % of rod length) and heading error (deg), sim vs real, and whether
either execution folded the prism flat (``gap.parquet``), and a top view of the paths
(``plots/<run>.png``). ``summary.md`` is the iteration at a glance: the gap per policy, the
identified values (and, on the twin, their errors against the hidden truth), the gaits found;
the stage task also publishes it as a Prefect markdown artifact that names the iteration's
MLflow run, so the two UIs link up.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
from prefect import task
from prefect.artifacts import create_markdown_artifact

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.gaits.outcome import folded_flat, simulate_targets
from pipeline.metrics import motion_in_start_frame
from pipeline.physics import Engine, Params, RobotModel
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.plots import replay_paths
from pipeline.progress import progress
from pipeline.robot_model import heading_rad, wrapped_rad
from pipeline.truth import truth_engine, truth_errors
from storage.catalog import GAP_FILE, REPLAYS_FILE, SUMMARY_FILE, attached_robot, identified_robot, learned_engine
from storage.files import atomic_write_bytes
from storage.layout import Ref, RunLayout, read_manifest, write_manifest
from storage.redeploy_runs import Run, recorded_runs
from storage.tables import write_table
from storage.tracking import StageContext, tracking_uri
from storage.trajectory import CAP_COLS

STAGE = "evaluate"
ENGINES = ("before", "after", "learned", "truth")
"""The engines each run is replayed in: the analytic engine with the robot config's parameters and
with the identified ones, the hybrid engine with the learn stage's contact and the identified
parameters, and (on the twin only) the analytic engine with the twin's own values."""


def _wrap_deg(angle_rad: float) -> float:
    return math.degrees(wrapped_rad(angle_rad))


def replay_runs(
    engine: Engine, robot: RobotConfig, one: Params, runs: list[Run], starts_m: np.ndarray, timeout_s: float
) -> list[np.ndarray]:
    """``engine`` with the parameters ``one`` (one environment) and ``robot``'s PID running each
    run's policy from its tracked start caps ``starts_m`` (R, 6, 3), one batch per policy; each
    run's end caps (T, 6, 3)."""
    out: list[np.ndarray | None] = [None] * len(runs)
    for key in dict.fromkeys(r.policy_key for r in runs):
        rows = [i for i, r in enumerate(runs) if r.policy_key == key]
        params = one.expand(len(rows))
        state = settle(
            engine, params, state_from_caps(engine, params, starts_m[rows]), robot.pid, np.ones(6), duration_s=1.0
        )
        outcome = simulate_targets(engine, params, robot, state, runs[rows[0]].policy.targets, timeout_s)
        finished = outcome.trace.finished.numpy()
        for j, i in enumerate(rows):
            end = int(finished[j].argmax()) if finished[j].any() else finished.shape[1] - 1
            out[i] = outcome.trace.caps_m[j, : end + 1].numpy()
    return out


def replays_table(runs: list[Run], starts_s: list[float], sims: dict[str, list[np.ndarray]], tick_s: float) -> pa.Table:
    """The engines' replays ``sims`` (engine: per run its end caps (T, 6, 3), m) as the rows of
    :data:`~storage.catalog.REPLAYS_FILE`, each run's times from its first tracked frame's time
    ``starts_s`` (s), ``tick_s`` apart."""
    columns: dict[str, list] = {"run": [], "engine": [], "t": [], **{c: [] for c in CAP_COLS}}
    for i, run in enumerate(runs):
        for engine, caps in sims.items():
            flat = caps[i].reshape(len(caps[i]), -1)
            columns["run"] += [run.name] * len(flat)
            columns["engine"] += [engine] * len(flat)
            columns["t"] += list(starts_s[i] + tick_s * np.arange(len(flat)))
            for k, column in enumerate(CAP_COLS):
                columns[column] += flat[:, k].tolist()
    return pa.table(columns)


def gap_rows(runs: list[Run], real: list[np.ndarray], sims: dict[str, list[np.ndarray]], rod_m: float) -> list[dict]:
    """One row per run and engine: final CoM error (m, % of ``rod_m``), heading error (deg), the
    forward motion and rotation in the start frame and whether the prism folded flat
    (:func:`~pipeline.gaits.outcome.folded_flat`), sim and real."""
    rows = []
    for i, run in enumerate(runs):
        real_motion = motion_in_start_frame(real[i])
        for label, replays in sims.items():
            sim = replays[i]
            sim_motion = motion_in_start_frame(sim)
            com_error = float(np.linalg.norm(sim[-1].mean(0)[:2] - real[i][-1].mean(0)[:2]))
            rows.append(
                {
                    "policy": run.policy_key,
                    "start": run.start_index,
                    "engine": label,
                    "com_error_m": com_error,
                    "com_error_pct_rod": 100.0 * com_error / rod_m,
                    "heading_error_deg": abs(_wrap_deg(float(heading_rad(sim[-1]) - heading_rad(real[i][-1])))),
                    "sim_forward_m": sim_motion[0],
                    "real_forward_m": real_motion[0],
                    "sim_rotation_deg": sim_motion[2],
                    "real_rotation_deg": real_motion[2],
                    "sim_collapsed": bool(folded_flat(sim, rod_m)),
                    "real_collapsed": bool(folded_flat(real[i], rod_m)),
                }
            )
    return rows


def gap_summary(rows: list[dict]) -> dict[str, float]:
    """Mean gap figures per policy and engine, and over all runs per engine; the median final CoM
    error (``com_error_median_m``: a run's gap is nearly all or nothing, a roll taken or not, so
    one run can decide a mean over six); how many of those runs the engine folded flat
    (``sim_collapsed_runs``)."""
    summary: dict[str, float] = {}
    groups = [
        (f"{policy}.", [r for r in rows if r["policy"] == policy])
        for policy in dict.fromkeys(r["policy"] for r in rows)
    ]
    present = [label for label in ENGINES if any(r["engine"] == label for r in rows)]
    for prefix, group in [*groups, ("", rows)]:
        for label in present:
            own = [r for r in group if r["engine"] == label]
            for key in ("com_error_m", "com_error_pct_rod", "heading_error_deg"):
                summary[f"gap.{label}.{prefix}{key}"] = float(np.mean([r[key] for r in own]))
            summary[f"gap.{label}.{prefix}com_error_median_m"] = float(np.median([r["com_error_m"] for r in own]))
            summary[f"gap.{label}.{prefix}sim_collapsed_runs"] = float(sum(r["sim_collapsed"] for r in own))
    return summary


def run_evaluate(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    sysid_ref: Ref,
    learn_ref: Ref,
    gaits_ref: Ref,
    redeploy_ref: Ref,
    mlflow: str = "",
) -> tuple[Ref, dict[str, float]]:
    """Replay the redeploy runs before and after sysid, in the learned engine and (on the twin) with
    the twin's own values; write the gap table, plots and summary (with ``mlflow``, a line naming
    the MLflow run, under its title). Returns the ref and the summary (gap figures)."""
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    runs = recorded_runs(redeploy_ref)
    tracked = [run.tracked() for run in runs]
    real = [caps for _, caps in tracked]
    attached, identified = attached_robot(configs, attach_ref), identified_robot(configs, attach_ref, sysid_ref)
    dt_s = configs.pipeline.gaits.search.dt_s
    compiled = configs.pipeline.engine.compiled
    engines = {
        "before": (Engine(RobotModel.from_robot(attached), dt=dt_s, compiled=compiled), attached),
        "after": (Engine(RobotModel.from_robot(identified), dt=dt_s, compiled=compiled), identified),
        "learned": (learned_engine(learn_ref, identified), identified),
    }
    params = {label: Params.from_robot(robot) for label, (_, robot) in engines.items()}
    if configs.twin is not None:
        true_robot, params["truth"] = truth_engine(configs, identified)
        engines["truth"] = (Engine(RobotModel.from_robot(true_robot), dt=dt_s, compiled=compiled), true_robot)
    starts = np.stack([caps[0] for caps in real])
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    with progress("evaluate replays", len(engines), "engines", "{engine}", engine="") as row:
        sims = {}
        for label, (engine, robot) in engines.items():
            row.update(engine=f"{label}: {len(runs)} runs")
            sims[label] = replay_runs(engine, robot, params[label], runs, starts, timeout_s)
            row.advance()
    rows = gap_rows(runs, real, sims, configs.robot.rod.length_m)
    write_table(stage_dir / GAP_FILE, pa.Table.from_pylist(rows), {"stage": STAGE})
    tick_s = 1.0 / configs.robot.pid.control_rate_hz
    write_table(
        stage_dir / REPLAYS_FILE, replays_table(runs, [float(t[0]) for t, _ in tracked], sims, tick_s), {"stage": STAGE}
    )
    for i, run in enumerate(runs):
        engine_caps = {f"engine {label}": replays[i] for label, replays in sims.items()}
        image = replay_paths(real[i], engine_caps, f"{run.name}: sim vs real")
        atomic_write_bytes(stage_dir / "plots" / f"{run.name}.png", image)
    summary = gap_summary(rows)
    markdown = summary_markdown(configs, iteration, summary, {"sysid": sysid_ref, "gaits": gaits_ref}, mlflow)
    atomic_write_bytes(stage_dir / SUMMARY_FILE, markdown.encode())
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def summary_markdown(
    configs: LoadedConfigs, iteration: int, gap: dict[str, float], refs: dict[str, Ref], mlflow: str = ""
) -> str:
    """The iteration at a glance (Markdown): the gap per policy before/after sysid and learned, the
    identified values with their errors against the twin's truth where known, the gaits found,
    and ``mlflow`` (a line naming the MLflow run)."""
    policies = sorted({k.split(".")[2] for k in gap if k.count(".") == 3})
    present = [label for label in ENGINES if f"gap.{label}.com_error_m" in gap]
    order = " → ".join(present)
    lines = [f"# {configs.pipeline.campaign}, iteration {iteration}", ""]
    if mlflow:
        lines += [mlflow, ""]
    lines += [
        "## Sim-to-real gap (held-out redeploy runs)",
        "",
        f"| runs | CoM error {order} (m) | heading error {order} (deg) | median CoM error (m) |",
        "|---|---|---|---|",
    ]
    for prefix in [*(f"{p}." for p in policies), ""]:
        com = " → ".join(f"{gap[f'gap.{label}.{prefix}com_error_m']:.3f}" for label in present)
        heading = " → ".join(f"{gap[f'gap.{label}.{prefix}heading_error_deg']:.1f}" for label in present)
        median = " → ".join(f"{gap[f'gap.{label}.{prefix}com_error_median_m']:.3f}" for label in present)
        lines.append(f"| {prefix[:-1] or 'all'} | {com} | {heading} | {median} |")
    sysid = read_manifest(refs["sysid"], verify_files=False)["summary"]
    lines += [
        "",
        "## Identified parameters",
        "",
        "| parameter | start | identified | profile range | twin's truth | error (%) |",
        "|---|---|---|---|---|---|",
    ]
    values = {k.removeprefix("value."): v for k, v in sysid.items() if k.startswith("value.")}
    truth = truth_errors(configs, values) if configs.twin is not None else {}
    for name, value in values.items():
        start = sysid.get(f"start.{name}", float("nan"))
        true = f"{truth[f'truth.{name}']:.4g}" if f"truth.{name}" in truth else ""
        error = f"{truth[f'truth_error_pct.{name}']:+.1f}" if f"truth_error_pct.{name}" in truth else ""
        low, high = sysid.get(f"profile_low.{name}"), sysid.get(f"profile_high.{name}")
        span = f"{low:.4g} to {high:.4g}" if low is not None and high is not None else ""
        lines.append(f"| {name} | {start:.4g} | {value:.4g} | {span} | {true} | {error} |")
    gaits = read_manifest(refs["gaits"], verify_files=False)["summary"]
    found = {k: v for k, v in gaits.items() if k.endswith((".forward_m", ".rotation_deg"))}
    if found:
        lines += ["", "## Gaits found (one cycle, identified engine)", ""]
        lines += [f"- {key}: {value:.3f}" for key, value in sorted(found.items())]
    return "\n".join(lines) + "\n"


@task(name=STAGE)
def evaluate(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    learn_ref: dict[str, str],
    gaits_ref: dict[str, str],
    redeploy_ref: dict[str, str],
) -> dict[str, str]:
    """Prefect task: run :func:`run_evaluate`; log the gap figures, table, plots and summary to
    MLflow, and publish the summary as a Prefect markdown artifact naming the MLflow run."""
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        experiment = context.client.get_run(mlflow_run_id).info.experiment_id
        uri = tracking_uri(context.layout)
        link = f"MLflow run `{mlflow_run_id}` (experiment {experiment}, tracking URI `{uri}`)"
        refs = [Ref.from_json(r) for r in (attach_ref, sysid_ref, learn_ref, gaits_ref, redeploy_ref)]
        ref, summary = run_evaluate(configs, iteration, *refs, mlflow=link)
        files = [Path(ref.path) / name for name in (GAP_FILE, SUMMARY_FILE)]
        context.log(summary, [*files, *sorted((Path(ref.path) / "plots").glob("*.png"))])
    markdown = (Path(ref.path) / SUMMARY_FILE).read_text()
    create_markdown_artifact(
        markdown, key=artifact_key(configs.pipeline.campaign, iteration), description="R2S2R iteration summary"
    )
    return ref.to_json()


def artifact_key(campaign: str, iteration: int) -> str:
    """The Prefect artifact key of an iteration's summary (lower-case letters, digits, dashes)."""
    slug = "".join(c if c.isalnum() else "-" for c in campaign.lower())
    return f"r2s2r-{slug}-iter-{iteration}"
