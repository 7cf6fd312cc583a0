"""The ``learn`` stage: the graph-network ground contact of the hybrid engine.

:func:`pretrained_network` trains the network on simulated rollouts with the robot config's values
(random policies and the published gaits, :mod:`pipeline.learned.simulated`), in the analytic
engine or on a MuJoCo model of the robot config: the model never sees the twin except through
tracking. The pre-trained file is cached under ``runs/pretrained/`` by the robot config and the
``learn`` section, and every campaign in the runs folder reuses it. :func:`run_learn` fine-tunes
it on the tracked recordings of this iteration and the earlier ones (the same data as sysid), with
the identified robot driving the analytic forces, validating on the gaits sysid holds out, and
keeps the epoch with the lowest validation loss. It writes ``contact_model.safetensors``
(:mod:`storage.contact_model`), ``training.parquet`` (the loss per epoch) and ``learn.json`` (what
the data were, the figures), and replays the held-out gaits in the learned engine as sysid does in
the analytic one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from prefect import task

from pipeline.config import LoadedConfigs, config_hash
from pipeline.learned.data import Trajectory, recording_trajectory, states_along
from pipeline.learned.engine import LearnedEngine
from pipeline.learned.network import ContactNetwork
from pipeline.learned.simulated import engine_trajectories, mujoco_trajectory, robot_config_twin
from pipeline.learned.training import Epoch, TrainingResult, train
from pipeline.physics import Engine, Params, RobotModel
from pipeline.policies import gait_policy, random_policy
from pipeline.progress import progress
from pipeline.published_gaits import PUBLISHED_GAITS
from pipeline.sysid.heldout import SysidData, mean_replay_metrics, replay_held_out
from storage.catalog import (
    CONTACT_MODEL_FILE,
    LEARN_FILE,
    TRAINING_FILE,
    earlier_from_json,
    identification_data,
    identified_robot,
)
from storage.contact_model import build_network, load_contact_model, save_contact_model
from storage.files import atomic_write_json
from storage.layout import Ref, RunLayout, write_manifest
from storage.tables import write_table
from storage.tracking import StageContext

STAGE = "learn"
MODEL_NAME = "learned-contact"
"""The MLflow model the stage logs: the contact network's safetensors file."""
PRETRAIN_VERSION = "4"
"""Part of the pre-training cache key: changes when the pre-training's code does."""


def pretrain_path(configs: LoadedConfigs) -> Path:
    """Where the pre-trained network of this robot config and ``learn`` section is cached."""
    learn = configs.pipeline.learn
    payload = json.dumps(
        {
            "robot": config_hash(configs.robot),
            "learn": learn.model_dump(mode="json", exclude={"fine_tune"}),
            "version": PRETRAIN_VERSION,
        },
        sort_keys=True,
    )
    key = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return RunLayout.of(configs).runs_dir / "pretrained" / f"contact-{key}.safetensors"


PRETRAINED_ON = {
    "analytic": "the analytic engine's rollouts with the robot config's values",
    "mujoco": "rollouts of a MuJoCo model of the robot config (MuJoCo's default torsional and rolling friction)",
}
"""What the pre-training data were, by ``learn.pretrain.source``: logged with the model."""


def pretraining_data(configs: LoadedConfigs) -> list[Trajectory]:
    """The random policies and published gaits of ``learn.pretrain`` (seeds counted from
    ``learn.seed``) run with the robot config's values in the analytic engine, or on a MuJoCo model
    of the robot config (``learn.pretrain.source``)."""
    robot = configs.robot
    pretrain = configs.pipeline.learn.pretrain
    seed = configs.pipeline.learn.seed
    timeout_s = configs.pipeline.redeploy.segment_timeout_s
    policies = [random_policy(robot, pretrain.targets, seed + k) for k in range(pretrain.random_policies)]
    policies += [gait_policy(robot, name, pretrain.gait_cycles) for name in PUBLISHED_GAITS]
    if pretrain.source == "mujoco":
        from pipeline.hardware.twin import MujocoTwin

        mujoco_robot = MujocoTwin(robot, robot_config_twin(robot, seed))
        return [mujoco_trajectory(mujoco_robot, policy, timeout_s) for policy in policies]
    engine = Engine(RobotModel.from_robot(robot), dt=pretrain.engine_dt_s, compiled=configs.pipeline.engine.compiled)
    return engine_trajectories(engine, Params.from_robot(robot), robot, policies, timeout_s)


def pretrained_network(
    configs: LoadedConfigs, progress: Callable[[Epoch], None] | None = None
) -> tuple[ContactNetwork, dict[str, object]]:
    """The pre-trained network (from the cache, else trained and cached) and what it was trained on."""
    path = pretrain_path(configs)
    model = RobotModel.from_robot(configs.robot)
    if path.is_file():
        network, _, metadata = load_contact_model(path, model)
        return network, metadata
    learn = configs.pipeline.learn
    trajectories = pretraining_data(configs)
    params = Params.from_robot(configs.robot)
    network = build_network(model, learn.model, learn.seed)
    engine = LearnedEngine.of(model, network, learn.model)
    along = [states_along(engine, params, network.graph, t, configs.robot.pid.latency_s) for t in trajectories]
    held = max(1, round(learn.validation_fraction * len(along)))
    tick_s = 1.0 / configs.robot.pid.control_rate_hz
    result = train(engine, params, along[held:], along[:held], tick_s, learn, learn.pretrain.curriculum, True, progress)
    metadata: dict[str, object] = {
        "pretrained_on": PRETRAINED_ON[learn.pretrain.source],
        "pretrain_trajectories": len(trajectories),
        "pretrain_ticks": sum(len(t) for t in trajectories),
        "pretrain_seconds": sum(len(t) for t in trajectories) * tick_s,
        "pretrain_validation_loss": result.best.validation_loss,
        "pretrain_wall_s": result.history[-1].wall_s,
    }
    save_contact_model(path, network, learn.model, configs.robot, metadata)
    return network, metadata


def learn_data(
    configs: LoadedConfigs,
    collect_ref: Ref,
    track_ref: Ref,
    attach_ref: Ref,
    sysid_ref: Ref,
    earlier: dict[int, tuple[Ref, Ref]] | None = None,
) -> SysidData:
    """The recordings sysid identified from (this iteration's and ``earlier``'s) with the
    identified robot, and sysid's split into fitted and held-out gaits."""
    robot = identified_robot(configs, attach_ref, sysid_ref)
    return identification_data(configs, robot, collect_ref, track_ref, earlier)


def run_learn(configs: LoadedConfigs, iteration: int, data: SysidData) -> tuple[Ref, dict[str, object], TrainingResult]:
    """Pre-train (or reuse), fine-tune on ``data`` and write the stage output. Returns the ref, the
    summary and the fine-tuning's result."""
    learn = configs.pipeline.learn
    robot = data.robot
    tick_s = 1.0 / robot.pid.control_rate_hz
    epochs = sum(learn.pretrain.curriculum.epochs)
    with progress("learn pre-training", epochs, "epochs", "validation {loss:.3g}", loss=float("nan")) as row:

        def advance(epoch: Epoch) -> None:
            validated = not math.isnan(epoch.validation_loss)
            row.advance(**({"loss": epoch.validation_loss} if validated else {}))

        network, pretrained = pretrained_network(configs, advance)
        row.update(completed=0, total=sum(learn.fine_tune.epochs), description="learn fine-tuning")
        model = RobotModel.from_robot(robot)
        params = Params.from_robot(robot)
        engine = LearnedEngine.of(model, network, learn.model)
        held = data.held_out()
        fit_parts, validation_parts = [], []
        for name, recording in data.recordings.items():
            along = states_along(
                engine,
                params,
                network.graph,
                recording_trajectory(recording, robot, tick_s),
                robot.pid.latency_s,
                learn.smoothing_ticks,
            )
            cut = len(along)
            if held.get(name):
                cut = max(3, min(len(along) - 3, round((held[name][0].start_s - recording.t_s[0]) / tick_s)))
            fit_parts.append(along.part(0, cut))
            validation_parts.append(along.part(cut, len(along)))
        result = train(engine, params, fit_parts, validation_parts, tick_s, learn, learn.fine_tune, False, advance)

    stage_dir = RunLayout.of(configs).stage_dir(iteration, STAGE)
    stage_dir.mkdir(parents=True, exist_ok=True)
    metadata = {
        **pretrained,
        "fine_tuned_on": sorted(data.recordings),
        "fine_tune_validation_loss": result.best.validation_loss,
        "robot": robot.name,
    }
    save_contact_model(stage_dir / CONTACT_MODEL_FILE, network, learn.model, robot, metadata)
    write_table(stage_dir / TRAINING_FILE, training_table(result), {"stage": STAGE})
    replays = replay_held_out(configs, data, robot, params, engine) if held else {}
    summary: dict[str, object] = {
        "recordings": len(data.recordings),
        "fine_tune_ticks": sum(len(p) for p in fit_parts),
        "validation_ticks": sum(len(p) for p in validation_parts),
        "best_epoch": result.best.epoch,
        "validation_loss": result.best.validation_loss,
        "fine_tune_wall_s": result.history[-1].wall_s,
        **{k: v for k, v in pretrained.items() if isinstance(v, int | float)},
        **mean_replay_metrics(replays, "holdout.learned."),
    }
    atomic_write_json(stage_dir / LEARN_FILE, {"summary": summary, "metadata": metadata})
    return write_manifest(stage_dir, STAGE, complete=True, summary=summary), summary, result


def training_table(result: TrainingResult) -> pa.Table:
    """One row per epoch: curriculum phase and length, losses, optimiser steps, wall time."""
    rows = result.history
    return pa.table(
        {
            "epoch": [e.epoch for e in rows],
            "phase": [e.phase for e in rows],
            "length": [e.length for e in rows],
            "train_loss": [e.train_loss for e in rows],
            "validation_loss": [e.validation_loss for e in rows],
            "steps": [e.steps for e in rows],
            "skipped": [e.skipped for e in rows],
            "wall_s": [e.wall_s for e in rows],
        }
    )


@task(name=STAGE)
def learn(
    configs: LoadedConfigs,
    iteration: int,
    mlflow_run_id: str,
    collect_ref: dict[str, str],
    track_ref: dict[str, str],
    attach_ref: dict[str, str],
    sysid_ref: dict[str, str],
    earlier_refs: dict[int, tuple[dict[str, str], dict[str, str]]] | None = None,
) -> dict[str, str]:
    """Prefect task: run :func:`run_learn`, log the figures, the loss curve and the model to
    MLflow, return the ref as JSON."""
    data = learn_data(
        configs,
        Ref.from_json(collect_ref),
        Ref.from_json(track_ref),
        Ref.from_json(attach_ref),
        Ref.from_json(sysid_ref),
        earlier_from_json(earlier_refs),
    )
    ref, summary, result = run_learn(configs, iteration, data)
    stage_dir = Path(ref.path)
    with StageContext(configs, iteration, STAGE, mlflow_run_id) as context:
        context.log(summary, [stage_dir / LEARN_FILE, stage_dir / TRAINING_FILE])
        finite = [(e.epoch, e.validation_loss) for e in result.history if math.isfinite(e.validation_loss)]
        context.log_series("fine_tune_validation_loss", finite)
        context.log_series("fine_tune_train_loss", [(e.epoch, e.train_loss) for e in result.history])
        files = [stage_dir / CONTACT_MODEL_FILE]
        context.log_model(MODEL_NAME, files, {"dt_s": str(configs.pipeline.learn.model.dt_s)})
    return ref.to_json()
