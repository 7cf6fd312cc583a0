"""Engine windows started from observations, as the Key Frame Loss and multiple shooting use them.

A window starts from a recorded instant: the tracked end caps, fused with the
nine sensed cable lengths there (:class:`~pipeline.perception.fusion.PoseFusion`:
the cables fix the shape, the caps the placement), give the rods' poses
(:func:`~pipeline.physics.rollout.state_from_caps`); a rod whose lowest
contact sphere is within ``GROUND_SNAP_M`` of the ground is moved vertically onto it
(tracking noise would otherwise start it sunk in or hovering); the engine's PID,
with a tight tolerance, brings the six actuated cables to the lengths the sensors
read at that instant while the robot settles (no gradient: the observation is
detached). Velocities start at zero. Every window is one environment of a batch,
so all windows of all trajectories run at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import PIDConfig, RobotConfig
from pipeline.perception.fusion import Evidence, PoseFusion, RodPoses
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import Trace, run_policy, settle, state_from_caps
from pipeline.physics.rotations import quat_to_matrix
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.robot_model import N_ACTUATED, build_cables, cable_lengths_from_caps, length_to_target
from pipeline.sysid.data import Recording

GROUND_SNAP_M = 0.008
"""A rod whose lowest contact sphere is this close to the ground (m, either side) is put on it."""
CAPS_SIGMA_M = 0.005
"""Std of a tracked end cap when fusing a start pose (m)."""
CABLE_SIGMA_M = 0.002
"""Std of a sensed cable length when fusing a start pose (m)."""
ROLL_SIGMA_RAD = 0.3
"""Std of a rod's roll about the model convention when fusing a start pose (rad)."""
SETTLE_TOLERANCE = 0.01
"""Normalised tolerance of the PID that sets a window's cable lengths to the observed ones (1 mm)."""


@dataclass(frozen=True)
class WindowStarts:
    """Start states of a batch of windows: ``state`` (B envs), the engine's end caps there
    ``caps_m`` (B, 6, 3), the data's ``data_caps_m`` (B, 6, 3) and start times ``t_s`` (B,)
    on each window's recording clock."""

    state: State
    caps_m: torch.Tensor
    data_caps_m: np.ndarray
    t_s: np.ndarray


def window_starts(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    starts: list[tuple[Recording, float]],
    settle_s: float,
) -> WindowStarts:
    """Settled engine states at ``starts`` (recording, time s); ``params`` of one environment."""
    batch = len(starts)
    dtype = engine.model.dtype
    params = params.replace(**{k: v.detach() for k, v in params.as_dict().items()}).expand(batch)
    cables = build_cables(robot, robot.attachment.phase_rad)
    fusion = PoseFusion(robot, cables, CABLE_SIGMA_M, ROLL_SIGMA_RAD)
    data_caps = np.stack([rec.caps_at(np.array([t]))[0] for rec, t in starts])
    fused = np.stack(
        [fused_caps(robot, fusion, caps, rec.cables_at(t)) for caps, (rec, t) in zip(data_caps, starts, strict=True)]
    )
    positions = np.stack([rec.positions_at(robot, t) for rec, t in starts])
    # a recording without cable readings (end caps only): hold the lengths its end caps imply
    implied = length_to_target(robot, cable_lengths_from_caps(robot, cables, fused)[:, :N_ACTUATED])
    hold = torch.tensor(np.where(np.isfinite(positions), positions, implied), dtype=dtype)
    tight = robot.pid.model_copy(update={"tolerance": SETTLE_TOLERANCE})
    state = snap_to_ground(engine, state_from_caps(engine, params, fused))
    state = state.replace(rest_length=equilibrium_rest_lengths(engine, params, state))
    state = settle(engine, params, state, tight, hold, duration_s=settle_s)
    return WindowStarts(
        state=state,
        caps_m=engine.cap_positions(state).detach(),
        data_caps_m=data_caps,
        t_s=np.array([t for _, t in starts], float),
    )


def fused_caps(robot: RobotConfig, fusion: PoseFusion, caps_m: np.ndarray, cables_m: np.ndarray) -> np.ndarray:
    """End caps (6, 3) of the rod poses that best fit tracked ``caps_m`` (6, 3) and sensed
    ``cables_m`` (9,) (no motion prior)."""
    evidence = Evidence(
        sighted=caps_m,
        sighting_sigma_m=np.full(6, CAPS_SIGMA_M),
        cables_m=cables_m,
        prior_caps=caps_m,
        prior_rolls=np.zeros(3),
        motion_sigma_m=1.0,
    )
    return fusion.solve(RodPoses.from_caps(robot, caps_m), evidence).poses.caps(robot)


def snap_to_ground(engine: Engine, state: State) -> State:
    """``state`` with every rod whose lowest contact sphere is within ``GROUND_SNAP_M`` of the
    ground translated vertically so that sphere touches it."""
    model = engine.model
    with torch.no_grad():
        points, _ = engine._points(state, quat_to_matrix(state.quat))
        flat = points.reshape(state.batch_size, -1, 3)
        gap = flat[:, model.contact_index, 2] - model.contact_radius
        lowest = torch.where(model.contact_incidence.bool().T[None], gap[:, None, :], torch.inf).amin(-1)
        shift = torch.where(lowest.abs() < GROUND_SNAP_M, -lowest, torch.zeros_like(lowest))
    return state.replace(pos=state.pos + torch.stack([torch.zeros_like(shift), torch.zeros_like(shift), shift], -1))


def run_windows(
    engine: Engine,
    params: Params,
    starts: WindowStarts,
    targets: torch.Tensor,
    pid: PIDConfig,
    timeout_s: np.ndarray,
    latency_s: float,
    hold_s: float = 0.0,
    max_time_s: float | None = None,
    detach_between_segments: bool = False,
) -> tuple[Trace, np.ndarray]:
    """Run every window's targets ((B, S, 6)) from its start until its last target is reached and
    held ``hold_s``, or ``timeout_s`` ((B,) or (B, S)) per segment passed (at most ``max_time_s``).

    Returns the trace (differentiable in ``params``) and, per window, the time (s) at which it
    finished (its last target reached, or timed out).
    """
    batch = starts.state.batch_size
    dtype = engine.model.dtype
    timeout = torch.tensor(np.asarray(timeout_s, float), dtype=dtype)
    _, trace = run_policy(
        engine,
        params.expand(batch),
        starts.state,
        targets.to(dtype),
        pid,
        segment_timeout_s=timeout,
        final_hold_s=hold_s,
        latency_s=latency_s,
        max_time_s=max_time_s,
        detach_between_segments=detach_between_segments,
    )
    finished = trace.finished.detach().numpy()
    first = np.where(finished.any(1), finished.argmax(1), finished.shape[1] - 1)
    return trace, trace.t_s.numpy()[first] - hold_s
