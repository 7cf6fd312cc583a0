"""Simulated trajectories to train the learned contact on, recorded at the control ticks as a
robot records them: policies run with the firmware PID in the analytic engine
(:func:`engine_trajectories`) or on a MuJoCo robot (:func:`mujoco_trajectory`: the twin, or
:func:`robot_config_twin`, a MuJoCo model of the robot config's own values)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.config import RobotConfig, TwinConfig
from pipeline.config.twin import (
    CameraConfig,
    GroundConfig,
    TwinCableConfig,
    TwinMotorConfig,
    TwinPhysicsConfig,
    TwinSensorConfig,
)
from pipeline.hardware.base import GroundTruthPacket, SensorPacket, StartPose
from pipeline.learned.data import Trajectory
from pipeline.physics.engine import Engine
from pipeline.physics.params import Params
from pipeline.physics.rollout import rest_start, run_policy
from pipeline.physics.rotations import quat_to_matrix
from pipeline.policies import Policy
from pipeline.robot_model import N_CABLES, rod_rolls

if TYPE_CHECKING:
    from pipeline.hardware.twin import MujocoTwin

MUJOCO_TORSIONAL_FRICTION = 0.005
"""MuJoCo's default torsional friction coefficient (m): the robot config has none."""
MUJOCO_ROLLING_FRICTION = 0.0001
"""MuJoCo's default rolling friction coefficient (m): the robot config has none."""
MUJOCO_CONTACT_TIME_CONSTANT_S = 0.02
"""MuJoCo's default ``solref`` time constant (s)."""
ROBOT_CONFIG_TWIN_TIMESTEP_S = 0.001
"""Physics step of :func:`robot_config_twin` (s)."""


def engine_trajectories(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    policies: list[Policy],
    segment_timeout_s: float,
    final_hold_s: float = 1.0,
) -> list[Trajectory]:
    """Each of ``policies`` run in ``engine`` from rest on face 0 (one batch, each environment on its
    own schedule, commands delayed by ``robot.pid.latency_s``), as a :class:`Trajectory` of end
    caps, rods' rolls and commands until its policy finished; named ``engine:<policy id>``."""
    longest = max(len(p) for p in policies)
    targets = np.stack([np.vstack([p.targets, np.repeat(p.targets[-1:], longest - len(p), 0)]) for p in policies])
    start = rest_start(engine, params, robot).repeat(len(policies))
    with torch.no_grad():
        _, trace = run_policy(
            engine,
            params.expand(len(policies)),
            start,
            torch.as_tensor(targets, dtype=start.pos.dtype),
            robot.pid,
            segment_timeout_s,
            final_hold_s=final_hold_s,
            latency_s=robot.pid.latency_s,
            record_orientations=True,
        )
    tick_s = 1.0 / robot.pid.control_rate_hz
    out = []
    for b, policy in enumerate(policies):
        done = trace.finished[b].nonzero()
        end = int(done[0]) + 1 if len(done) else len(trace.t_s)
        caps = trace.caps_m[b, :end].numpy()
        out.append(
            Trajectory(
                name=f"engine:{policy.policy_id}",
                caps_m=caps,
                control=trace.control[b, :end].numpy(),
                tick_s=tick_s,
                rolls_rad=rod_rolls(robot, caps, quat_to_matrix(trace.quat[b, :end]).numpy()),
            )
        )
    return out


def robot_config_twin(robot: RobotConfig, seed: int) -> TwinConfig:
    """A MuJoCo model of ``robot`` built as the twin is built, with the robot config's own values
    where the twin has hidden ones: sliding friction, restitution (as the contact's damping ratio,
    :func:`~pipeline.physics.mjcf_export.restitution_damping_ratio`), motor speed and lag, cables,
    attachment points, control latency. What the config does not say is MuJoCo's default: the
    torsional and rolling friction (:data:`MUJOCO_TORSIONAL_FRICTION`,
    :data:`MUJOCO_ROLLING_FRICTION`) and the contact's time constant. Sensors are exact and the
    camera, which nothing renders here, looks at the origin from 1.5 m."""
    from pipeline.physics.mjcf_export import restitution_damping_ratio

    return TwinConfig(
        physics=TwinPhysicsConfig(timestep_s=ROBOT_CONFIG_TWIN_TIMESTEP_S, gravity_m_s2=9.81),
        ground=GroundConfig(
            friction_sliding=robot.ground.friction,
            friction_torsional=MUJOCO_TORSIONAL_FRICTION,
            friction_rolling=MUJOCO_ROLLING_FRICTION,
            contact_time_constant_s=MUJOCO_CONTACT_TIME_CONSTANT_S,
            contact_damping_ratio=restitution_damping_ratio(robot.ground.restitution),
        ),
        motor=TwinMotorConfig(
            omega_max_rad_s=robot.motor.omega_max_rad_s,
            speed_scale=(1.0,) * 6,
            time_constant_s=robot.motor.time_constant_s,
        ),
        cables=TwinCableConfig(
            actuated_stiffness_n_per_m=robot.actuated_cable.stiffness_n_per_m,
            actuated_damping_n_s_per_m=robot.actuated_cable.damping_n_s_per_m,
            passive_stiffness_n_per_m=robot.passive_cable.stiffness_n_per_m,
            passive_cubic_stiffness_n_per_m3=robot.passive_cable.cubic_stiffness_n_per_m3,
            passive_damping_n_s_per_m=robot.passive_cable.damping_n_s_per_m,
            passive_rest_length_m=robot.passive_cable.rest_length_m,
        ),
        attachment_phase_rad=robot.attachment.phase_rad,
        control_latency_s=robot.pid.latency_s,
        sensors=TwinSensorConfig(
            cable_noise_std_m=0.0, cable_bias_m=(0.0,) * N_CABLES, imu_noise_std_rad=0.0, sample_jitter_s=0.0
        ),
        camera=CameraConfig(
            width_px=64,
            height_px=48,
            fovy_deg=60.0,
            position_m=(1.5, 0.0, 0.0),
            look_at_m=(0.0, 0.0, 0.0),
            rate_hz=1.0,
            depth_scale_m=0.001,
            depth_noise_std_m=0.0,
            max_depth_m=10.0,
        ),
        settle_s=4.0,
        seed=seed,
    )


def mujoco_trajectory(
    robot: MujocoTwin, policy: Policy, segment_timeout_s: float, start: StartPose | None = None
) -> Trajectory:
    """``policy`` run on the MuJoCo ``robot`` from ``start`` (default: its rest pose), as its true
    end caps and rods' rolls, the commands and the winch angles at every control tick (no camera
    frames); named ``mujoco:<policy id>``."""
    robot.reset(start)
    caps, quats, commands, angles = [], [], [], []
    for packet in robot.execute(policy, segment_timeout_s, record_frames=False):
        if isinstance(packet, SensorPacket):
            commands.append(packet.control)
            angles.append(packet.motor_rad)
        elif isinstance(packet, GroundTruthPacket):
            caps.append(packet.caps_m)
            quats.append(packet.rod_quat)
    caps_m = np.stack(caps)
    return Trajectory(
        name=f"mujoco:{policy.policy_id}",
        caps_m=caps_m,
        control=np.stack(commands),
        tick_s=1.0 / robot.robot.pid.control_rate_hz,
        rolls_rad=rod_rolls(robot.robot, caps_m, quat_to_matrix(torch.as_tensor(np.stack(quats))).numpy()),
        motor_rad=np.stack(angles),
    )
