"""Engine parameters that mirror the twin's hidden configuration (evaluation only).

The pipeline's own stages never call this: it exists so tests and benchmarks can
put the engine on the twin's true parameters where the two models share them,
and so evaluation can score identified parameters against the truth.
"""

from __future__ import annotations

import torch

from pipeline.config import RobotConfig, TwinConfig
from pipeline.physics.model import RobotModel
from pipeline.physics.params import Params


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
        restitution=0.0,
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
