"""Policy rollouts with the firmware PID inside the engine, and initial states.

:func:`run_policy` executes a policy exactly as the robot does (the same PID,
dead band, tolerance and segment logic as :class:`~pipeline.hardware.twin.MujocoTwin`),
batched: every environment advances through its targets on its own schedule.
:func:`state_from_caps` and :func:`settle` turn a trajectory's first frame
(end-cap positions only) into an engine state at rest on the ground (R2S2R paper).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import PIDConfig, RobotConfig
from pipeline.control import pid_update
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rotations import matrix_to_quat
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.robot_model import N_ACTUATED, reference_prism, resting_on_face, rod_frames


@dataclass(frozen=True)
class Trace:
    """What a rollout recorded at every control tick.

    ``t_s`` (T,) s; ``caps_m`` (B, T, 6, 3) end-cap centres; ``cables_m`` (B, T, 9) cable
    lengths; ``segment`` (B, T) index of the target being executed; ``control`` (B, T, 6)
    motor commands; ``finished`` (B, T) whether the environment had completed its policy;
    ``quat`` (B, T, 3, 4) the rods' orientations (w, x, y, z), where the run was asked to
    record them (else None).
    """

    t_s: torch.Tensor
    caps_m: torch.Tensor
    cables_m: torch.Tensor
    segment: torch.Tensor
    control: torch.Tensor
    finished: torch.Tensor
    quat: torch.Tensor | None = None

    def caps_at(self, times_s: torch.Tensor) -> torch.Tensor:
        """End caps (B, N, 6, 3) at the ticks nearest to ``times_s`` (N,)."""
        index = torch.bucketize(times_s.to(self.t_s.dtype), self.t_s).clamp(max=len(self.t_s) - 1)
        return self.caps_m[:, index]


def run_policy(
    engine: Engine,
    params: Params,
    state: State,
    targets: torch.Tensor,
    pid: PIDConfig,
    segment_timeout_s: float | torch.Tensor,
    final_hold_s: float = 1.0,
    latency_s: float = 0.0,
    max_time_s: float | torch.Tensor | None = None,
    detach_between_segments: bool = False,
    record_orientations: bool = False,
) -> tuple[State, Trace]:
    """Run ``targets`` ((S, 6) shared or (B, S, 6) per environment) from ``state``.

    Each control tick reads the actuated cable lengths, advances an environment to
    its next target when all six are within ``pid.tolerance`` (or the segment timed
    out after ``segment_timeout_s``: one value, (B,) per environment or (B, S) per
    environment and segment), runs the PID, and holds the command for the physics
    steps of the tick; commands reach the motors ``latency_s`` later. After the last
    target is reached an environment is held for ``final_hold_s`` and then stops
    commanding; ``max_time_s`` (s: one value, or (B,) per environment) ends an environment's
    run on the first tick at or after it. Returns each environment's state on the tick its
    run ended (a batch runs until all have, and the others' idle physics after that is not
    part of their run) and the :class:`Trace` (differentiable in
    ``params`` and ``state``). With ``detach_between_segments`` an environment's state
    is detached when it moves on to its next target (after that tick is recorded, so
    the recorded end of a segment keeps its gradient), and each segment's gradient
    starts there (the Key Frame Loss's windows). ``params`` may hold (B, S) tensors:
    one value per environment and segment, so each segment's gradient can be read
    separately. With ``record_orientations`` the trace also holds the rods' orientations.
    """
    robot = engine.model.robot
    batch = state.batch_size
    dtype, device = state.pos.dtype, state.pos.device
    targets = torch.as_tensor(targets, dtype=dtype, device=device)
    if targets.dim() == 2:
        targets = targets.expand(batch, *targets.shape)
    n_segments = targets.shape[1]
    rows = torch.arange(batch, device=device)
    per_segment = params.motor_speed.dim() == 2
    if per_segment and params.motor_speed.shape != (batch, n_segments):
        raise ValueError(
            f"per-segment parameters must be ({batch}, {n_segments}), got {tuple(params.motor_speed.shape)}"
        )
    timeouts = torch.as_tensor(segment_timeout_s, dtype=dtype, device=device)
    if timeouts.dim() < 2:
        timeouts = timeouts.expand(batch).reshape(batch, 1).expand(batch, n_segments)
    tick_s = 1.0 / pid.control_rate_hz
    substeps = max(1, round(tick_s / engine.dt))
    lo, span = robot.actuated_cable.min_length_m, robot.actuated_cable.range_m
    segment = torch.zeros(batch, dtype=torch.long, device=device)
    segment_start = torch.zeros(batch, dtype=dtype, device=device)
    hold_until = torch.full((batch,), math.inf, dtype=dtype, device=device)
    integral = torch.zeros(batch, N_ACTUATED, dtype=dtype, device=device)
    previous = torch.zeros_like(integral)
    has_previous = torch.zeros(batch, 1, dtype=torch.bool, device=device)
    pending: deque[torch.Tensor] = deque(torch.zeros_like(integral) for _ in range(round(latency_s / tick_s)))
    times, caps, cables, segments, controls, finished_log, quats = [], [], [], [], [], [], []
    limit = torch.as_tensor(math.inf if max_time_s is None else max_time_s, dtype=dtype, device=device)
    limit = limit.expand(batch)
    tick = 0
    at_end = state
    was_ended = torch.zeros(batch, dtype=torch.bool, device=device)
    while True:
        t = tick * tick_s
        caps_now, lengths = engine.caps_and_cable_lengths(state)
        position = (lengths[:, :N_ACTUATED] - lo) / span
        target = targets[torch.arange(batch, device=device), segment]
        holding = torch.isfinite(hold_until)
        reached = (torch.abs(position - target) < pid.tolerance).all(-1)
        timeout = timeouts[torch.arange(batch, device=device), segment]
        advance = (reached | (t - segment_start >= timeout)) & ~holding
        last = segment == n_segments - 1
        hold_until = torch.where(advance & last, torch.full_like(hold_until, t + final_hold_s), hold_until)
        moving_on = advance & ~last
        segment = segment + moving_on.long()
        segment_start = torch.where(moving_on, torch.full_like(segment_start, t), segment_start)
        integral = integral * ~moving_on[:, None]
        has_previous = has_previous & ~moving_on[:, None]
        finished = t >= hold_until
        ended = finished | (t >= limit)
        newly = ended & ~was_ended
        if bool(newly.any()):
            at_end = _where_state(newly, state, at_end)
        was_ended = ended
        target = targets[torch.arange(batch, device=device), segment]
        error = position - target
        u, integral = pid_update(pid, error, integral, torch.where(has_previous, previous, error), tick_s)
        u = u * ~finished[:, None]
        previous, has_previous = error, torch.ones_like(has_previous)
        times.append(t)
        caps.append(caps_now)
        if record_orientations:
            quats.append(state.quat)
        cables.append(lengths)
        segments.append(segment)
        controls.append(u)
        finished_log.append(finished)
        if bool(ended.all()):
            break
        if detach_between_segments and bool(moving_on.any()):
            state = _detach_where(state, moving_on)
            pending = deque(torch.where(moving_on[:, None], p.detach(), p) for p in pending)
            u = torch.where(moving_on[:, None], u.detach(), u)
            integral = torch.where(moving_on[:, None], integral.detach(), integral)
            previous = torch.where(moving_on[:, None], previous.detach(), previous)
        pending.append(u)
        applied = pending.popleft()
        active = params
        if per_segment:
            active = Params(**{n: v[rows, segment] for n, v in params.as_dict().items()})
        state = engine.steps(active, state, applied, substeps)
        tick += 1
    trace = Trace(
        t_s=torch.tensor(times, dtype=dtype, device=device),
        caps_m=torch.stack(caps, dim=1),
        cables_m=torch.stack(cables, dim=1),
        segment=torch.stack(segments, dim=1),
        control=torch.stack(controls, dim=1),
        finished=torch.stack(finished_log, dim=1),
        quat=torch.stack(quats, dim=1) if record_orientations else None,
    )
    return at_end, trace


def run_commands(engine: Engine, params: Params, state: State, applied: torch.Tensor, tick_s: float) -> torch.Tensor:
    """Open loop: the commands ``applied`` ((B, T, 6), those that reach the motors during each
    tick) held for the ticks of ``tick_s``, from ``state``; returns the end caps (B, T + 1, 6, 3)
    at every tick, the start's first."""
    substeps = max(1, round(tick_s / engine.dt))
    caps = [engine.cap_positions(state)]
    for k in range(applied.shape[1]):
        state = engine.steps(params, state, applied[:, k], substeps)
        caps.append(engine.cap_positions(state))
    return torch.stack(caps, 1)


def _where_state(envs: torch.Tensor, chosen: State, other: State) -> State:
    """Per environment, ``chosen`` where ``envs`` (B,) bool is set, else ``other``."""
    return State(
        **{
            name: torch.where(envs.reshape(-1, *[1] * (value.dim() - 1)), value, getattr(other, name))
            for name, value in vars(chosen).items()
        }
    )


def _detach_where(state: State, envs: torch.Tensor) -> State:
    """``state`` with the environments ``envs`` (B,) bool cut from the graph."""
    return State(
        **{
            name: torch.where(envs.reshape(-1, *[1] * (value.dim() - 1)), value.detach(), value)
            for name, value in vars(state).items()
        }
    )


def state_from_caps(engine: Engine, params: Params, caps_m: torch.Tensor | np.ndarray) -> State:
    """Engine state (at rest, not yet settled) from end-cap centres (B, 6, 3) or (6, 3).

    Each rod's centre and axis come from its two caps (its length is kept at the
    model's); its roll about the axis, which caps cannot show, follows the model
    convention (body x away from the robot's centroid). Actuated rest lengths are
    those that hold the pose in static equilibrium with the ground
    (:func:`~pipeline.physics.statics.equilibrium_rest_lengths`); :func:`settle` may follow.
    """
    model = engine.model
    robot = model.robot
    caps = np.asarray(torch.as_tensor(caps_m).detach().cpu(), dtype=float)
    if caps.ndim == 2:
        caps = np.broadcast_to(caps, (params.batch_size, 6, 3))
    if caps.shape != (params.batch_size, 6, 3) or not np.isfinite(caps).all():
        raise ValueError(f"caps_m must be finite with shape ({params.batch_size}, 6, 3), got {caps.shape}")
    centres, rotations = rod_frames(robot, caps)
    dtype, device = model.dtype, model.device
    pos = torch.tensor(centres, dtype=dtype, device=device)
    rot = torch.tensor(rotations, dtype=dtype, device=device)
    batch = params.batch_size
    zeros = torch.zeros(batch, N_ACTUATED, dtype=dtype, device=device)
    state = State(
        pos=pos,
        quat=matrix_to_quat(rot),
        vel=torch.zeros_like(pos),
        omega=torch.zeros_like(pos),
        rest_length=zeros,
        motor_omega=zeros,
    )
    rest = equilibrium_rest_lengths(engine, params, state)
    return state.replace(rest_length=rest.detach())


@torch.no_grad()
def settle(
    engine: Engine, params: Params, state: State, pid: PIDConfig, hold_target: torch.Tensor, duration_s: float = 2.0
) -> State:
    """Let ``state`` come to rest under gravity with the PID holding ``hold_target`` ((6,) shared or
    (B, 6) per environment)."""
    hold_target = torch.as_tensor(hold_target, dtype=state.pos.dtype, device=state.pos.device)
    final, _ = run_policy(
        engine,
        params,
        state,
        hold_target[..., None, :],
        pid,
        segment_timeout_s=duration_s,
        final_hold_s=duration_s,
        max_time_s=duration_s,
    )
    return final.replace(
        vel=torch.zeros_like(final.vel),
        omega=torch.zeros_like(final.omega),
        motor_omega=torch.zeros_like(final.motor_omega),
    ).detach()


def rest_start(engine: Engine, params: Params, robot: RobotConfig) -> State:
    """The robot at rest on face 0 (support triangle 0, 2, 5), settled in ``engine`` for 1 s
    with every cable at its rest target."""
    caps = resting_on_face(robot, reference_prism(robot))
    return settle(engine, params, state_from_caps(engine, params, caps), robot.pid, torch.ones(6), duration_s=1.0)
