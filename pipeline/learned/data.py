"""Training data for the learned contact: trajectories of end caps and motor commands at the
control ticks, turned into engine states and rollout windows.

A :class:`Trajectory` is what every source gives alike: the twin's true end caps, the analytic
engine's own rollouts, or the tracked end caps of a recording. End caps fix every graph node
(nodes lie on the rods' axes), so a node-position loss needs nothing else. The states along a
trajectory (:func:`states_along`) take each rod's centre and axis from its caps, velocities from
finite differences over the last tick (what the paper's features use), the rod's roll by the
model's convention, and the actuated rest lengths and motor speeds from the engine's motor model
run on the commands (delayed by the control latency) from rest lengths that hold the first pose in
static equilibrium. :func:`windows` cuts them into rollout windows of a curriculum length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.signal import savgol_filter

from pipeline.errors import DataError
from pipeline.learned.graph import RobotGraph
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rotations import matrix_to_quat
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.robot_model import N_ACTUATED, rod_frames
from pipeline.sysid.data import Recording


@dataclass(frozen=True)
class Trajectory:
    """One trajectory at the control ticks ``t_k = k * tick_s``: ``caps_m`` (T, 6, 3) end-cap
    centres (world, m) and ``control`` (T, 6) the motor commands issued at each tick (they reach
    the motors the control latency later). ``name`` names it in errors."""

    name: str
    caps_m: np.ndarray
    control: np.ndarray
    tick_s: float

    def __post_init__(self) -> None:
        n = len(self.caps_m)
        if np.shape(self.caps_m) != (n, 6, 3) or np.shape(self.control) != (n, N_ACTUATED):
            raise DataError(
                f"trajectory '{self.name}': caps_m {np.shape(self.caps_m)} and control {np.shape(self.control)} "
                f"must be (T, 6, 3) and (T, {N_ACTUATED})"
            )
        if n < 3:
            raise DataError(f"trajectory '{self.name}': {n} ticks; at least 3 are needed (a velocity and a step)")
        if not (np.isfinite(self.caps_m).all() and np.isfinite(self.control).all()):
            raise DataError(f"trajectory '{self.name}': end caps and commands must be finite")

    def __len__(self) -> int:
        return len(self.caps_m)


def recording_trajectory(recording: Recording, tick_s: float) -> Trajectory:
    """A recording as a :class:`Trajectory`: its tracked end caps interpolated at the control ticks
    from its first sensor sample on, and the command of the sensor sample nearest each tick."""
    if recording.control is None:
        raise DataError(f"recording '{recording.name}': no motor commands recorded; the learned contact needs them")
    ticks = recording.t_s[0] + tick_s * np.arange(int((recording.t_s[-1] - recording.t_s[0]) / tick_s) + 1)
    nearest = np.clip(np.searchsorted(recording.t_s, ticks - tick_s / 2), 0, len(recording.t_s) - 1)
    return Trajectory(recording.name, recording.caps_at(ticks), recording.control[nearest], tick_s)


@dataclass(frozen=True)
class Windows:
    """Rollout windows of ``length`` ticks: ``start`` (W environments), ``control`` (W, length, 6)
    the commands applied during each tick, ``target`` (W, length, N, 3) the nodes after each tick."""

    start: State
    control: torch.Tensor
    target: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.control.shape[1])

    def __len__(self) -> int:
        return int(self.control.shape[0])

    def take(self, rows: torch.Tensor) -> Windows:
        return Windows(self.start.index(rows), self.control[rows], self.target[rows])


@dataclass(frozen=True)
class StatesAlong:
    """A trajectory as engine states, one environment per tick (T), with the commands ``applied``
    (T, 6) during each tick and the graph's ``nodes`` (T, N, 3)."""

    name: str
    states: State
    applied: torch.Tensor
    nodes: torch.Tensor

    def __len__(self) -> int:
        return len(self.applied)

    def part(self, start: int, stop: int) -> StatesAlong:
        """Ticks ``start`` to ``stop`` (exclusive) as a trajectory of their own."""
        return StatesAlong(
            f"{self.name}[{start}:{stop}]",
            self.states.index(slice(start, stop)),
            self.applied[start:stop],
            self.nodes[start:stop],
        )


def _axis_rate(z: torch.Tensor, tick_s: float) -> torch.Tensor:
    """Angular velocities (T, 3, 3) that turn each rod axis ``z`` (T, 3, 3) from the previous tick
    to this one in ``tick_s`` (zero at the first tick; no spin about the axis)."""
    before, after = z[:-1], z[1:]
    normal = torch.linalg.cross(before, after)
    sin = normal.norm(dim=-1, keepdim=True)
    angle = torch.atan2(sin, (before * after).sum(-1, keepdim=True))
    rate = normal / sin.clamp(min=1e-12) * angle / tick_s
    return torch.cat([torch.zeros_like(z[:1]), rate])


def states_along(
    engine: Engine,
    params: Params,
    graph: RobotGraph,
    trajectory: Trajectory,
    latency_s: float,
    smoothing_ticks: int = 0,
) -> StatesAlong:
    """The engine states along ``trajectory`` (see the module's docstring); ``params`` (one
    environment) gives the motor model and the statics, ``engine.dt`` the motor model's step.
    With ``smoothing_ticks`` (> 2) the states' end caps are first smoothed over that many ticks
    (Savitzky-Golay, quadratic), which tames the finite-difference velocities of tracked data;
    the nodes (the training targets) stay as recorded."""
    model = engine.model
    dtype, device = model.dtype, model.device
    caps = np.asarray(trajectory.caps_m, float)
    window = min(smoothing_ticks, len(caps)) // 2 * 2 - 1  # odd, at most the trajectory
    smoothed = savgol_filter(caps, window, 2, axis=0) if window >= 3 else caps
    centres, rotations = rod_frames(model.robot, smoothed)
    pos = torch.as_tensor(centres, dtype=dtype, device=device)
    rot = torch.as_tensor(rotations, dtype=dtype, device=device)
    tick = trajectory.tick_s
    vel = torch.cat([torch.zeros_like(pos[:1]), (pos[1:] - pos[:-1]) / tick])
    omega = _axis_rate(rot[..., 2], tick)
    commands = torch.as_tensor(trajectory.control, dtype=dtype, device=device)
    delay = round(latency_s / tick)
    applied = torch.cat([torch.zeros_like(commands[:delay]), commands])[: len(commands)]
    first = State(
        pos=pos[:1],
        quat=matrix_to_quat(rot[:1]),
        vel=torch.zeros_like(pos[:1]),
        omega=torch.zeros_like(pos[:1]),
        rest_length=torch.zeros(1, N_ACTUATED, dtype=dtype, device=device),
        motor_omega=torch.zeros(1, N_ACTUATED, dtype=dtype, device=device),
    )
    with torch.no_grad():
        rest = equilibrium_rest_lengths(engine, params, first).detach()
        speed = torch.zeros_like(rest)
        rests, speeds = [], []
        substeps = max(1, round(tick / engine.dt))
        for k in range(len(trajectory)):
            rests.append(rest)
            speeds.append(speed)
            for _ in range(substeps):
                rest, speed = engine.motors(params, rest, speed, applied[k : k + 1])
    states = State(
        pos=pos,
        quat=matrix_to_quat(rot),
        vel=vel,
        omega=omega,
        rest_length=torch.cat(rests),
        motor_omega=torch.cat(speeds),
    )
    if window >= 3:
        centres, rotations = rod_frames(model.robot, caps)
    nodes = graph.node_positions(
        torch.as_tensor(centres, dtype=dtype, device=device), torch.as_tensor(rotations, dtype=dtype, device=device)
    )
    return StatesAlong(trajectory.name, states, applied, nodes)


def windows(trajectories: list[StatesAlong], length: int) -> Windows:
    """Every window of ``length`` ticks that starts at a tick with a velocity (the second on)."""
    starts, controls, targets = [], [], []
    for along in trajectories:
        n = len(along.applied)
        first = torch.arange(1, n - length)
        if not len(first):
            continue
        ticks = first[:, None] + torch.arange(length)[None]
        starts.append(along.states.index(first))
        controls.append(along.applied[ticks])
        targets.append(along.nodes[ticks + 1])
    if not starts:
        names = ", ".join(a.name for a in trajectories) or "none"
        raise DataError(f"no trajectory is longer than {length + 1} ticks (trajectories: {names})")
    return Windows(State.concat(starts), torch.cat(controls), torch.cat(targets))
