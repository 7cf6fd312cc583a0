"""The ``actions`` stage: the action table that trajectory following plans with (seed 002).

:func:`run_actions` simulates the Tribar paper's 51 actions (:func:`pipeline.follow.actions.paper_actions`)
and every gait the gaits stage found (``gait_<objective>``) in the iteration's identified engine
(with ``engine.contact: learned``, the hybrid engine with the learn stage's contact network),
from each bottom face, forward and in reverse, over a small ensemble of motor speeds and
frictions and from a few starts near rest (``follow.table``), and writes the table (``actions.parquet``,
:mod:`storage.action_table`) with its summary: how many actions roll the robot, and the farthest
and the most turning ones.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from prefect import task

from pipeline.config import LoadedConfigs, RobotConfig
from pipeline.follow.actions import iteration_actions
from pipeline.follow.motion import FORWARD, ActionTable
from pipeline.follow.table import TabulatedActions, planning_table, tabulate
from pipeline.gaits.ensemble import ensemble_params
from pipeline.physics.engine import Engine
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from storage.action_table import write_action_table
from storage.catalog import ACTIONS_FILE, identified_robot, learned_engine, read_found_gaits
from storage.layout import Ref, RunLayout, write_manifest
from storage.tracking import StageContext

STAGE = "actions"


def table_engine(configs: LoadedConfigs, robot: RobotConfig, learn_ref: Ref | None) -> Engine:
    """The engine the table is simulated in: the identified analytic engine at the gait search's
    step (``engine.contact: analytic``), or the hybrid engine with the learn stage's contact
    network (``learned``; ``learn_ref`` required)."""
    if configs.pipeline.engine.contact == "analytic":
        model = RobotModel.from_robot(robot)
        return Engine(model, dt=configs.pipeline.gaits.search.dt_s, compiled=configs.pipeline.engine.compiled)
    if learn_ref is None:
        raise ValueError("engine.contact is 'learned' but the actions stage was given no learn stage output")
    return learned_engine(learn_ref, robot)


def run_actions(
    configs: LoadedConfigs,
    iteration: int,
    attach_ref: Ref,
    sysid_ref: Ref,
    gaits_ref: Ref,
    learn_ref: Ref | None = None,
) -> tuple[Ref, dict[str, object]]:
    """Tabulate the actions in the identified engine (:func:`table_engine`) and write the stage
    output; its ref and summary."""
    robot = identified_robot(configs, attach_ref, sysid_ref)
    engine = table_engine(configs, robot, learn_ref)
    c = configs.pipeline.follow.table
    ensemble = ensemble_params(Params.from_robot(robot), c.ensemble_motor_speed, c.ensemble_friction)
    actions = iteration_actions(robot, read_found_gaits(gaits_ref), c.paper_actions)
    tabulated = tabulate(
        engine, ensemble, robot, actions, configs.pipeline.redeploy.segment_timeout_s, c.starts, c.start_sigma_m
    )
    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    members = ensemble.batch_size + c.starts
    contact = configs.pipeline.engine.contact
    write_action_table(stage_dir / ACTIONS_FILE, tabulated, {"stage": STAGE, "ensemble": members, "contact": contact})
    planning = planning_table(tabulated, configs.pipeline.follow.planner)
    summary = _summary(tabulated, members, planning, contact)
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary


def _summary(tabulated: TabulatedActions, members: int, planning: ActionTable, contact: str) -> dict[str, object]:
    """Counts, the share of entries the planner may use, and the extremes of the actions rolling
    forward from face 0."""
    table = tabulated.table
    forward = table.forward_m[:, 0, FORWARD]
    rotation = np.degrees(table.rotation_rad[:, 0, FORWARD])
    rolls = table.next_face[:, 0, FORWARD] != 0
    farthest, turning = int(np.argmax(forward)), int(np.argmax(np.abs(rotation)))
    return {
        "actions": len(table.names),
        "learned_contact": contact == "learned",
        "ensemble": members,
        "rolling_actions": int(rolls.sum()),
        "succeeded_share": float(tabulated.succeeded.mean()),
        "usable_share": float(planning.usable.mean()),
        "farthest_action": table.names[farthest],
        "farthest_forward_m": float(forward[farthest]),
        "most_turning_action": table.names[turning],
        "most_turning_deg": float(rotation[turning]),
        "mean_forward_std_m": float(tabulated.forward_std_m.mean()),
        "mean_rotation_std_deg": math.degrees(float(tabulated.rotation_std_rad.mean())),
    }


@task(name=STAGE)
def actions(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    gaits_ref: dict[str, str],
    learn_ref: dict[str, str] | None = None,
) -> dict[str, str]:
    """Prefect task: run :func:`run_actions` (with the learn stage's output where
    ``engine.contact`` is ``learned``), log the summary and the table to MLflow."""
    learned = None if learn_ref is None else Ref.from_json(learn_ref)
    ref, summary = run_actions(
        configs, iteration, Ref.from_json(attach_ref), Ref.from_json(sysid_ref), Ref.from_json(gaits_ref), learned
    )
    tags = {k: v for k, v in summary.items() if isinstance(v, str)}
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, [Path(ref.path) / ACTIONS_FILE], tags=tags)
    return ref.to_json()
