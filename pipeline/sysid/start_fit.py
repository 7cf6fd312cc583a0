"""Window start states fitted, through the engine, to what the robot did just after them.

A settled start (:func:`~pipeline.sysid.windows.window_starts`) has the tracked pose
to within the tracking noise but no velocity, and its motors and rest lengths are
those of a robot at rest; mid-way through a trajectory the robot moves. At the true
parameters those errors alone leave the Key Frame Loss a floor larger than a 10 %
change of friction adds (docs/sysid.md, *What limits it*). Here each start is corrected
by the state perturbation whose rollout (the window's own policy, from the start)
best matches the data over the first ``span`` seconds: tracked end caps at their
frames and sensed cable lengths at every control tick, weighted by their noise.

The perturbation has :data:`COORDINATES` coordinates per window, each in its own scale
(:data:`SCALES`): rod translations and rotations, linear and angular velocities, the
six actuated rest lengths and motor speeds. It is found by Levenberg-Marquardt with
a forward-difference Jacobian (every window and coordinate one environment of a
single engine batch; the engine's own gradient with respect to a state through
ground contact is too rough for this), with a weak prior toward the settled start
for directions the data does not fix. The fit depends on the parameters it is run
with; :func:`~pipeline.sysid.identify.identify_staged` refits at its estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import run_policy
from pipeline.physics.rotations import quat_integrate, quat_to_matrix
from pipeline.sysid.data import Recording
from pipeline.sysid.windows import WindowStarts

SCALES = {
    "pos": 1e-3,
    "rotation": 1e-2,
    "vel": 0.05,
    "omega": 0.5,
    "rest_length": 1e-3,
    "motor_omega": 5.0,
}
"""Scale of each perturbed part of a start state: m, rad, m/s, rad/s, m, rad/s."""
COORDINATES = 3 * 3 * 4 + 6 + 6
"""Perturbation coordinates per window: 3 rods x (translation, rotation, velocity, angular
velocity), 6 rest lengths, 6 motor speeds."""
DIFFERENCE_STEP = 0.3
"""Forward-difference step of the Jacobian, in each coordinate's scale."""
PRIOR_WEIGHT = 0.1
"""Weight of the prior toward the settled start, per coordinate (in units of one scale)."""


@dataclass(frozen=True)
class LeadIn:
    """What a window's start is fitted to: the recording and its start time ``t_s`` (s) and the
    fitted ``span_s`` (s) after it."""

    recording: Recording
    t_s: float
    span_s: float


def perturbed(state: State, z: torch.Tensor) -> State:
    """``state`` (B envs) moved by ``z`` (B, :data:`COORDINATES`) in units of :data:`SCALES`."""
    batch = state.batch_size
    parts = torch.split(z, [9, 9, 9, 9, 6, 6], dim=1)
    pos, rotation, vel, omega = (p.reshape(batch, 3, 3) for p in parts[:4])
    return State(
        pos=state.pos + pos * SCALES["pos"],
        quat=quat_integrate(state.quat, rotation * SCALES["rotation"], 1.0),
        vel=state.vel + vel * SCALES["vel"],
        omega=state.omega + omega * SCALES["omega"],
        rest_length=state.rest_length + parts[4] * SCALES["rest_length"],
        motor_omega=state.motor_omega + parts[5] * SCALES["motor_omega"],
    )


def difference(a: State, b: State) -> torch.Tensor:
    """``a - b`` (B, :data:`COORDINATES`) in units of :data:`SCALES`, the coordinates of
    :func:`perturbed` (rotation: the small-angle vector of ``a``'s orientation relative to ``b``'s)."""
    relative = quat_to_matrix(a.quat) @ quat_to_matrix(b.quat).transpose(-1, -2)
    rotation = 0.5 * torch.stack(
        [
            relative[..., 2, 1] - relative[..., 1, 2],
            relative[..., 0, 2] - relative[..., 2, 0],
            relative[..., 1, 0] - relative[..., 0, 1],
        ],
        -1,
    )
    parts = [
        (a.pos - b.pos) / SCALES["pos"],
        rotation / SCALES["rotation"],
        (a.vel - b.vel) / SCALES["vel"],
        (a.omega - b.omega) / SCALES["omega"],
        (a.rest_length - b.rest_length) / SCALES["rest_length"],
        (a.motor_omega - b.motor_omega) / SCALES["motor_omega"],
    ]
    return torch.cat([p.flatten(1) for p in parts], 1)


class _Observations:
    """The lead-ins' data on the engine's control ticks: end caps at the tracked frames (padded
    to the most frames of any window, with a mask) and cable lengths at every tick; each lead-in's
    ``last_tick`` (B,) inside its span."""

    def __init__(self, leads: list[LeadIn], tick_s: float) -> None:
        self.ticks = int(np.ceil(max(lead.span_s for lead in leads) / tick_s + 1e-9)) + 1
        offsets = tick_s * np.arange(self.ticks)
        cables = np.stack([[lead.recording.cables_at(lead.t_s + o) for o in offsets] for lead in leads])
        inside = offsets[None] <= np.array([lead.span_s for lead in leads])[:, None] + 1e-9
        self.last_tick = torch.tensor(inside.sum(1) - 1)
        # a recording without cable readings (end caps only) has NaN lengths: they weigh nothing
        self.cable_mask = torch.tensor(inside[:, :, None] & np.isfinite(cables))
        self.cables_m = torch.tensor(np.nan_to_num(cables))
        frames = []
        for lead in leads:
            times = lead.recording.caps_t_s
            inside = (times >= lead.t_s - 1e-9) & (times <= lead.t_s + lead.span_s + 1e-9)
            frames.append((np.round((times[inside] - lead.t_s) / tick_s).astype(int), lead.recording.caps_m[inside]))
        most = max(1, max(len(ticks) for ticks, _ in frames))
        self.cap_ticks = torch.zeros(len(leads), most, dtype=torch.long)
        self.caps_m = torch.zeros(len(leads), most, 6, 3, dtype=torch.float64)
        self.cap_mask = torch.zeros(len(leads), most, dtype=torch.bool)
        for b, (ticks, caps) in enumerate(frames):
            self.cap_ticks[b, : len(ticks)] = torch.as_tensor(ticks).clamp(max=self.ticks - 1)
            self.caps_m[b, : len(ticks)] = torch.as_tensor(caps)
            self.cap_mask[b, : len(ticks)] = True


class StartResiduals:
    """Weighted residuals of perturbed window starts against their lead-ins' data: the engine
    run from ``starts`` moved by a perturbation, with each window's policy (``targets``
    (B, S, 6), ``timeout_s`` (B, S)), over its lead-in; tracked caps at their frames in
    ``caps_sigma_m`` and sensed cable lengths at every control tick in ``cable_sigma_m`` (m)."""

    def __init__(
        self,
        engine: Engine,
        robot: RobotConfig,
        starts: WindowStarts,
        leads: list[LeadIn],
        targets: torch.Tensor,
        timeout_s: np.ndarray,
        caps_sigma_m: float,
        cable_sigma_m: float,
    ) -> None:
        if len(leads) != starts.state.batch_size:
            raise ValueError(f"need one lead-in per start ({starts.state.batch_size}), got {len(leads)}")
        self.engine, self.robot, self.starts, self.targets, self.timeout_s = engine, robot, starts, targets, timeout_s
        self.caps_sigma_m, self.cable_sigma_m = caps_sigma_m, cable_sigma_m
        self.tick_s = 1.0 / robot.pid.control_rate_hz
        self.observed = _Observations(leads, self.tick_s)

    @property
    def count(self) -> int:
        """Number of data residuals over every window (the expected cost of the truth on noisy data)."""
        observed = self.observed
        return int(observed.cap_mask.sum()) * 6 * 3 + int(observed.cable_mask.sum())

    def __call__(self, z: torch.Tensor, rows: torch.Tensor, params: Params) -> torch.Tensor:
        """Residuals (N, R) of perturbations ``z`` (N, :data:`COORDINATES`) of windows ``rows``
        (N,), each run with its own environment of ``params`` (N envs); R is the same for every
        window (padding residuals are zero)."""
        return self.run(z, rows, params)[0]

    def run(self, z: torch.Tensor, rows: torch.Tensor, params: Params) -> tuple[torch.Tensor, State]:
        """The residuals of :meth:`__call__` and the engine's states (N envs) at the end of each
        window's lead-in span."""
        observed = self.observed
        state = perturbed(self.starts.state.index(rows), z)
        ends_s = observed.last_tick[rows].to(state.pos.dtype) * self.tick_s - 1e-9
        with torch.no_grad():
            end, trace = run_policy(
                self.engine,
                params.expand(len(rows)),
                state,
                self.targets[rows].to(state.pos.dtype),
                self.robot.pid,
                segment_timeout_s=torch.as_tensor(self.timeout_s[rows.numpy()], dtype=state.pos.dtype),
                final_hold_s=0.0,
                latency_s=self.robot.pid.latency_s,
                max_time_s=ends_s,
            )
        caps = trace.caps_m[:, : observed.ticks]
        cables = trace.cables_m[:, : observed.ticks]
        if caps.shape[1] < observed.ticks:
            pad = observed.ticks - caps.shape[1]
            caps = torch.cat([caps, caps[:, -1:].expand(-1, pad, -1, -1)], 1)
            cables = torch.cat([cables, cables[:, -1:].expand(-1, pad, -1)], 1)
        at_frames = caps[torch.arange(len(rows))[:, None], observed.cap_ticks[rows]]
        cap_res = (at_frames - observed.caps_m[rows]) / self.caps_sigma_m * observed.cap_mask[rows, :, None, None]
        cable_res = (cables - observed.cables_m[rows]) / self.cable_sigma_m * observed.cable_mask[rows]
        return torch.cat([cap_res.flatten(1), cable_res.flatten(1)], 1), end


def fit_start_states(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    starts: WindowStarts,
    leads: list[LeadIn],
    targets: torch.Tensor,
    timeout_s: np.ndarray,
    iterations: int,
    caps_sigma_m: float,
    cable_sigma_m: float,
) -> State:
    """``starts`` corrected to fit ``leads`` (one per window) with ``params`` (one environment);
    ``targets`` (B, S, 6) and ``timeout_s`` (B, S) are the windows' policies, as run from them;
    the residuals (:class:`StartResiduals`) are weighted by the tracking and cable-sensor noise (m)."""
    batch = starts.state.batch_size
    data = StartResiduals(engine, robot, starts, leads, targets, timeout_s, caps_sigma_m, cable_sigma_m)
    one = Params(**{n: v.detach() for n, v in params.as_dict().items()})

    def residuals(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Data and prior residuals (N, R + COORDINATES) of perturbations ``z`` of windows ``rows``."""
        return torch.cat([data(z, rows, one.expand(len(rows))), PRIOR_WEIGHT * z], 1)

    every = torch.arange(batch)
    z = torch.zeros(batch, COORDINATES, dtype=torch.float64)
    damping = torch.full((batch,), 1e-2, dtype=torch.float64)
    current = residuals(z, every)
    cost = (current**2).sum(1)
    steps = DIFFERENCE_STEP * torch.eye(COORDINATES, dtype=torch.float64).repeat(batch, 1)
    for _ in range(iterations):
        moved = residuals(z.repeat_interleave(COORDINATES, 0) + steps, every.repeat_interleave(COORDINATES))
        jacobian = (moved.reshape(batch, COORDINATES, -1) - current[:, None]) / DIFFERENCE_STEP
        normal = jacobian @ jacobian.transpose(1, 2)
        diagonal = torch.diag_embed(normal.diagonal(dim1=1, dim2=2) + 1e-6)
        step = -torch.linalg.solve(normal + damping[:, None, None] * diagonal, jacobian @ current[:, :, None])[..., 0]
        trial = residuals(z + step, every)
        trial_cost = (trial**2).sum(1)
        better = trial_cost < cost
        z = torch.where(better[:, None], z + step, z)
        current = torch.where(better[:, None], trial, current)
        cost = torch.where(better, trial_cost, cost)
        damping = torch.where(better, damping / 3, damping * 4)
    return perturbed(starts.state, z)
