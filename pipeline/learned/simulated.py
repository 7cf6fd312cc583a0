"""Simulated trajectories to pre-train the learned contact on: policies run in an engine (the
analytic one with the identified parameters) with the firmware PID, recorded at the control ticks
as a robot records them."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.learned.data import Trajectory
from pipeline.physics.engine import Engine
from pipeline.physics.params import Params
from pipeline.physics.rollout import rest_start, run_policy
from pipeline.physics.rotations import quat_to_matrix
from pipeline.policies import Policy
from pipeline.robot_model import rod_rolls


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
