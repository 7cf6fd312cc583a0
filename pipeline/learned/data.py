"""Training data for the learned contact: trajectories of end caps and motor commands at the
control ticks, turned into engine states and rollout windows.

A :class:`Trajectory` is what every source gives alike: the twin's true end caps, the analytic
engine's own rollouts, or the tracked end caps of a recording. End caps fix every graph node
(nodes lie on the rods' axes), so a node-position loss needs nothing else. The states along a
trajectory (:func:`states_along`) take each rod's centre and axis from its caps, velocities from
finite differences over the last tick (what the paper's features use), the rod's roll from the
data where it has one (else the model's convention: no spin), and the actuated rest lengths from
rest lengths that hold the first pose in static equilibrium, moved by the measured winch angles
where the data have them, else by the engine's motor model run on the commands (delayed by the
control latency). The roll matters: it places the cables' attachment points, 17.5 mm off the
axis, and on the twin's data the true rolls and winch angles halve the analytic engine's one-tick
error from the states (docs/learned-contact.md). :func:`windows` cuts them into rollout windows
of a curriculum length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from pipeline.config import RobotConfig
from pipeline.control import REST_LENGTH_LIMITS_M
from pipeline.errors import DataError
from pipeline.learned.graph import RobotGraph
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rotations import matrix_to_quat, quat_to_matrix
from pipeline.physics.statics import equilibrium_rest_lengths
from pipeline.robot_model import N_ACTUATED, rod_frames, rod_rolls
from pipeline.sysid.data import Recording


@dataclass(frozen=True)
class Trajectory:
    """One trajectory at the control ticks ``t_k = k * tick_s``: ``caps_m`` (T, 6, 3) end-cap
    centres (world, m) and ``control`` (T, 6) the motor commands issued at each tick (they reach
    the motors the control latency later). ``name`` names it in errors.

    Where the source has them: ``rolls_rad`` (T, 3) each rod's roll about its axis
    (:func:`~pipeline.robot_model.rod_rolls`: the simulator's truth, or the tracker's estimate),
    which places the cables' attachment points; ``motor_rad`` (T, 6) the winch angles (the motor
    encoders), which give the actuated cables' rest lengths without integrating a motor model;
    ``lost`` (T,) the ticks inside a gap of the recording (samples lost on the way), which no
    rollout window may use."""

    name: str
    caps_m: np.ndarray
    control: np.ndarray
    tick_s: float
    rolls_rad: np.ndarray | None = None
    motor_rad: np.ndarray | None = None
    lost: np.ndarray | None = None

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
        for field, width in (("rolls_rad", 3), ("motor_rad", N_ACTUATED)):
            value = getattr(self, field)
            if value is not None and (np.shape(value) != (n, width) or not np.isfinite(value).all()):
                raise DataError(f"trajectory '{self.name}': {field} must be finite, of shape ({n}, {width})")
        if self.lost is not None and np.shape(self.lost) != (n,):
            raise DataError(f"trajectory '{self.name}': lost must have one flag a tick ({n})")

    def __len__(self) -> int:
        return len(self.caps_m)


def recording_trajectory(recording: Recording, robot: RobotConfig, tick_s: float) -> Trajectory:
    """A recording as a :class:`Trajectory`: its tracked end caps interpolated at the control ticks
    from its first sensor sample on, and the command of the sensor sample nearest each tick; where
    the recording has them, the winch angles and the tracked rods' rolls (``robot``'s rod frames),
    each interpolated at the ticks; the ticks inside the recording's gaps are marked ``lost``."""
    if recording.control is None:
        raise DataError(f"recording '{recording.name}': no motor commands recorded; the learned contact needs them")
    ticks = recording.t_s[0] + tick_s * np.arange(int((recording.t_s[-1] - recording.t_s[0]) / tick_s) + 1)
    nearest = np.clip(np.searchsorted(recording.t_s, ticks - tick_s / 2), 0, len(recording.t_s) - 1)
    motors = rolls = None
    if recording.motor_rad is not None:
        motors = np.stack([np.interp(ticks, recording.t_s, a) for a in recording.motor_rad.T], -1)
    if recording.rod_quat is not None:
        rotations = quat_to_matrix(torch.tensor(recording.rod_quat, dtype=torch.float64)).numpy()
        tracked = np.unwrap(rod_rolls(robot, recording.caps_m, rotations), axis=0)
        rolls = np.stack([np.interp(ticks, recording.caps_t_s, r) for r in tracked.T], -1)
    caps = recording.caps_at(ticks)
    lost = np.zeros(len(ticks), bool)
    for start_s, end_s in recording.gaps_s:  # interpolated across a gap: not data
        lost |= (ticks > start_s) & (ticks < end_s)
    return Trajectory(
        recording.name, caps, recording.control[nearest], tick_s, rolls_rad=rolls, motor_rad=motors, lost=lost
    )


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
    (T, 6) during each tick and the graph's ``nodes`` (T, N, 3); ``lost`` (T,) the ticks inside a
    gap of the recording (None: none)."""

    name: str
    states: State
    applied: torch.Tensor
    nodes: torch.Tensor
    lost: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.applied)

    def part(self, start: int, stop: int) -> StatesAlong:
        """Ticks ``start`` to ``stop`` (exclusive) as a trajectory of their own."""
        return StatesAlong(
            f"{self.name}[{start}:{stop}]",
            self.states.index(slice(start, stop)),
            self.applied[start:stop],
            self.nodes[start:stop],
            None if self.lost is None else self.lost[start:stop],
        )


def _rotation_rate(rotations: np.ndarray, tick_s: float) -> np.ndarray:
    """Angular velocities (T, 3, 3) (world) that turn each rod's frame ``rotations`` (T, 3, 3, 3)
    from the previous tick to this one in ``tick_s`` (zero at the first tick)."""
    turn = Rotation.from_matrix((rotations[1:] @ np.swapaxes(rotations[:-1], -1, -2)).reshape(-1, 3, 3))
    rate = turn.as_rotvec().reshape(len(rotations) - 1, -1, 3) / tick_s
    return np.concatenate([np.zeros_like(rate[:1]), rate])


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
    the nodes (the training targets) stay as recorded. Where the trajectory has the rods' rolls,
    the states take them (and the spin about each axis from their change); where it has the
    winch angles, the rest lengths and motor speeds come from them."""
    model = engine.model
    dtype, device = model.dtype, model.device
    caps = np.asarray(trajectory.caps_m, float)
    window = min(smoothing_ticks, len(caps)) // 2 * 2 - 1  # odd, at most the trajectory
    from scipy.signal import savgol_filter  # here: 0.3 s that commands which never smooth skip

    smoothed = savgol_filter(caps, window, 2, axis=0) if window >= 3 else caps
    centres, rotations = rod_frames(model.robot, smoothed, trajectory.rolls_rad)
    pos = torch.as_tensor(centres, dtype=dtype, device=device)
    rot = torch.as_tensor(rotations, dtype=dtype, device=device)
    tick = trajectory.tick_s
    vel = torch.cat([torch.zeros_like(pos[:1]), (pos[1:] - pos[:-1]) / tick])
    if trajectory.rolls_rad is None:
        omega = _axis_rate(rot[..., 2], tick)
    else:
        omega = torch.as_tensor(_rotation_rate(rotations, tick), dtype=dtype, device=device)
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
    if trajectory.motor_rad is None:
        rest_lengths, motor_omega = _motor_model(engine, params, rest, applied, tick)
    else:
        angles = torch.as_tensor(trajectory.motor_rad, dtype=dtype, device=device)
        turned = angles - angles[:1]
        rest_lengths = (rest - engine.winch_radius * turned).clamp(*REST_LENGTH_LIMITS_M)
        motor_omega = torch.cat([torch.zeros_like(turned[:1]), (turned[1:] - turned[:-1]) / tick])
    states = State(
        pos=pos,
        quat=matrix_to_quat(rot),
        vel=vel,
        omega=omega,
        rest_length=rest_lengths,
        motor_omega=motor_omega,
    )
    if window >= 3:
        centres, rotations = rod_frames(model.robot, caps, trajectory.rolls_rad)
    nodes = graph.node_positions(
        torch.as_tensor(centres, dtype=dtype, device=device), torch.as_tensor(rotations, dtype=dtype, device=device)
    )
    return StatesAlong(trajectory.name, states, applied, nodes, trajectory.lost)


def _motor_model(
    engine: Engine, params: Params, rest: torch.Tensor, applied: torch.Tensor, tick_s: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rest lengths and motor speeds (each (T, 6)) at every tick from the engine's motor model run
    on the commands ``applied`` (T, 6) from ``rest`` (1, 6) with the motors at rest."""
    speed = torch.zeros_like(rest)
    rests, speeds = [], []
    substeps = max(1, round(tick_s / engine.dt))
    with torch.no_grad():
        for k in range(len(applied)):
            rests.append(rest)
            speeds.append(speed)
            for _ in range(substeps):
                rest, speed = engine.motors(params, rest, speed, applied[k : k + 1])
    return torch.cat(rests), torch.cat(speeds)


def windows(trajectories: list[StatesAlong], length: int, stride: int = 1) -> Windows:
    """The windows of ``length`` ticks that start at a tick with a velocity (the second on) and
    touch no lost tick (their start's velocity, steps and targets all from data): every one
    (``stride`` 1), or along each trajectory the first and then each next one that starts at least
    ``stride`` ticks after the last taken (``stride == length``: windows that tile the trajectory,
    each tick predicted once)."""
    starts, controls, targets = [], [], []
    for along in trajectories:
        n = len(along.applied)
        first = torch.arange(1, n - length)
        if along.lost is not None and along.lost.any():
            lost = np.r_[0, np.cumsum(along.lost)]  # lost ticks before each index
            spans = first.numpy()
            first = first[torch.as_tensor(lost[spans + length + 1] - lost[spans - 1] == 0)]
        if stride > 1:
            first = first[torch.as_tensor(_spaced(first.numpy(), stride))]
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


def _spaced(starts: np.ndarray, stride: int) -> np.ndarray:
    """Indices into the increasing ``starts`` of the first and of each next start at least
    ``stride`` after the last one kept."""
    kept, last = [], None
    for i, start in enumerate(starts):
        if last is None or start - last >= stride:
            kept.append(i)
            last = start
    return np.asarray(kept, dtype=np.int64)
