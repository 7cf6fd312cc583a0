"""Evaluation against the twin's hidden configuration (evaluation only).

No stage computes with the twin's truth: the functions here exist so that evaluation can
score identified values against it (:func:`truth_errors`), replay the twin's own values on the
held-out gaits as the reference for identification (:func:`truth_holdout`), and so that tests
and benchmarks can put the engine on the twin's values where the two models share them
(:func:`twin_true_params`, :func:`twin_true_model`, :func:`truth_engine`).
"""

from __future__ import annotations

import torch

from pipeline.config import LoadedConfigs, RobotConfig, TwinConfig
from pipeline.errors import ConfigError
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params
from pipeline.sysid.heldout import SysidData, mean_replay_metrics, reduction_pct, replay_held_out
from pipeline.sysid.latency import with_latency


def twin_true_params(
    robot: RobotConfig, twin: TwinConfig, batch: int = 1, dtype: torch.dtype = torch.float64
) -> Params:
    """Engine parameters equal to the twin's (mean motor speed over the six motors;
    the twin's soft-contact stiffness, torsional/rolling friction and sensor errors
    have no engine counterpart)."""
    c = twin.cables
    mean_scale = sum(twin.motor.speed_scale) / len(twin.motor.speed_scale)
    return Params.from_robot(
        robot,
        batch=batch,
        dtype=dtype,
        friction=twin.ground.friction_sliding,
        restitution=twin.ground.restitution(),
        motor_time_constant=twin.motor.time_constant_s,
        motor_speed=robot.motor.speed * twin.motor.omega_max_rad_s * mean_scale / robot.motor.omega_max_rad_s,
        actuated_stiffness=c.actuated_stiffness_n_per_m,
        actuated_damping=c.actuated_damping_n_s_per_m,
        passive_stiffness=c.passive_stiffness_n_per_m,
        passive_cubic_stiffness=c.passive_cubic_stiffness_n_per_m3,
        passive_damping=c.passive_damping_n_s_per_m,
        passive_rest_length=c.passive_rest_length_m,
    )


def twin_true_model(robot: RobotConfig, twin: TwinConfig, dtype: torch.dtype = torch.float64) -> RobotModel:
    """The engine's robot model with the twin's true attachment points."""
    return RobotModel.from_robot(robot, phases_rad=twin.attachment_phase_rad, dtype=dtype)


def _twin(configs: LoadedConfigs) -> TwinConfig:
    if configs.twin is None:
        raise ConfigError(f"{configs.pipeline_path}: no hardware_config: there is no twin's truth to evaluate against")
    return configs.twin


def truth_engine(configs: LoadedConfigs, robot: RobotConfig) -> tuple[RobotConfig, Params]:
    """``robot`` with the twin's true attachment points and control latency, and the twin's own
    values in the engine's parameters (one environment)."""
    twin = _twin(configs)
    attachment = robot.attachment.model_copy(update={"phase_rad": twin.attachment_phase_rad})
    true_robot = with_latency(robot.model_copy(update={"attachment": attachment}), twin.control_latency_s)
    return true_robot, twin_true_params(true_robot, twin)


def true_values(configs: LoadedConfigs) -> dict[str, float]:
    """The twin's hidden values of the engine's parameters (SI; :func:`twin_true_params`), by name:
    for evaluation only."""
    return {name: float(value[0]) for name, value in twin_true_params(configs.robot, _twin(configs)).as_dict().items()}


def truth_errors(configs: LoadedConfigs, values: dict[str, float]) -> dict[str, float]:
    """Each identified value's error against the twin's hidden truth, absolute (SI) and relative
    (%), where the engine parameter has a twin counterpart; keys ``truth_error.<name>``,
    ``truth_error_pct.<name>`` and ``truth.<name>``."""
    truth = true_values(configs)
    out = {}
    for name, value in values.items():
        true = truth[name]
        out[f"truth_error.{name}"] = value - true
        if true != 0:
            out[f"truth_error_pct.{name}"] = 100.0 * (value - true) / abs(true)
        out[f"truth.{name}"] = true
    return out


def truth_holdout(configs: LoadedConfigs, data: SysidData, before_mm: float) -> dict[str, float]:
    """The held-out replay of the twin's own values in the engine, with its true attachment
    points and control latency, as ``holdout.truth.*`` figures, and
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
