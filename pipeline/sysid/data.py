"""What sysid reads from one recorded trajectory, and its split into gaits (R2S2R paper, Fig. 10).

A :class:`Recording` joins the hardware stream (time, policy segment, targets,
motor commands, sensed cable lengths; e.g. 50 Hz) with the tracked end caps
(e.g. 10 Hz). :func:`split_gaits` cuts it into :class:`Gait` windows, one per
policy target: inside a gait every actuated cable is driven one way only
(retract, hold or extend) by the PID, and the gait ends when the firmware
reported the target reached (or the segment timed out). Its key frame is the
gait's last instant. A gait in which some cable's command changed sign (the PID
correcting an overshoot) is flagged as not monotonic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig
from pipeline.errors import DataError
from pipeline.robot_model import N_ACTUATED, length_to_target

RETRACT, HOLD, EXTEND = -1, 0, 1
COMMAND_THRESHOLD = 0.05
"""|u| below this counts as no command when reading directions from the recorded controls."""


@dataclass(frozen=True)
class Recording:
    """One trajectory: ``t_s`` (N,) s, ``segment`` (N,) policy target index, ``targets`` (N, 6)
    normalised, ``control`` (N, 6) motor commands or None, ``cables_m`` (N, 9) sensed lengths;
    ``caps_t_s`` (M,) s and ``caps_m`` (M, 6, 3) tracked end-cap centres (world, m);
    ``segment_timeout_s``: the longest the recorder held a target (s), where known. Where the
    recording has them: ``motor_rad`` (N, 6) the winch angles at the sensor samples and
    ``rod_quat`` (M, 3, 4) the tracked rods' orientations (w, x, y, z) at the tracked frames.
    ``gaps_s``: the (start, end) robot times (s) between which samples were lost (the trajectory's
    ``gaps``)."""

    name: str
    t_s: np.ndarray
    segment: np.ndarray
    targets: np.ndarray
    control: np.ndarray | None
    cables_m: np.ndarray
    caps_t_s: np.ndarray
    caps_m: np.ndarray
    segment_timeout_s: float | None = None
    motor_rad: np.ndarray | None = None
    rod_quat: np.ndarray | None = None
    gaps_s: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.t_s)
        shapes = {
            "segment": (self.segment, (n,)),
            "targets": (self.targets, (n, 6)),
            "cables_m": (self.cables_m, (n, 9)),
        }
        if self.control is not None:
            shapes["control"] = (self.control, (n, 6))
        if self.motor_rad is not None:
            shapes["motor_rad"] = (self.motor_rad, (n, 6))
        shapes["caps_m"] = (self.caps_m, (len(self.caps_t_s), 6, 3))
        if self.rod_quat is not None:
            shapes["rod_quat"] = (self.rod_quat, (len(self.caps_t_s), 3, 4))
        for field, (value, shape) in shapes.items():
            if np.shape(value) != shape:
                raise DataError(f"recording '{self.name}': {field} has shape {np.shape(value)}, expected {shape}")
        if n < 2 or len(self.caps_t_s) < 2:
            raise DataError(f"recording '{self.name}': needs at least two sensor samples and two tracked frames")
        if np.any(np.diff(self.t_s) <= 0) or np.any(np.diff(self.caps_t_s) <= 0):
            raise DataError(f"recording '{self.name}': sample times must increase strictly")
        if np.any(np.diff(self.segment) < 0):
            raise DataError(f"recording '{self.name}': the segment index must never decrease")
        if not np.isfinite(self.caps_m).all():
            raise DataError(f"recording '{self.name}': tracked end caps must be finite")

    def timeout_or(self, default_s: float) -> float:
        """The recording's own segment timeout (s), else ``default_s``."""
        return default_s if self.segment_timeout_s is None else self.segment_timeout_s

    def caps_at(self, times_s: np.ndarray) -> np.ndarray:
        """Tracked end caps (K, 6, 3) linearly interpolated at ``times_s`` (K,) (clamped to the ends)."""
        times = np.atleast_1d(np.asarray(times_s, float))
        flat = self.caps_m.reshape(len(self.caps_t_s), -1)
        return np.stack([np.interp(times, self.caps_t_s, flat[:, j]) for j in range(flat.shape[1])], -1).reshape(
            len(times), 6, 3
        )

    def cables_at(self, time_s: float) -> np.ndarray:
        """Sensed lengths of the nine cables (9,) in m, interpolated at ``time_s``."""
        return np.array([np.interp(time_s, self.t_s, self.cables_m[:, i]) for i in range(self.cables_m.shape[1])])

    def positions_at(self, robot: RobotConfig, time_s: float) -> np.ndarray:
        """Sensed actuated cable lengths, normalised (6,), interpolated at ``time_s``."""
        return length_to_target(robot, self.cables_at(time_s)[:N_ACTUATED])


@dataclass(frozen=True)
class Gait:
    """One gait of a recording: policy target ``index`` executed from ``start_s`` to ``end_s``
    (the key frame; s, recording clock). ``direction`` (6,) per actuated cable: -1 retract,
    0 hold, +1 extend; ``monotonic``: no cable's command changed sign; ``reached``: the
    firmware reported the target reached (not a timeout or the end of the recording)."""

    recording: str
    index: int
    start_s: float
    end_s: float
    target: np.ndarray
    direction: np.ndarray
    monotonic: bool
    reached: bool

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def split_gaits(recording: Recording, robot: RobotConfig, segment_timeout_s: float) -> list[Gait]:
    """The recording's gaits in order (see the module docstring).

    A gait ends where the next segment starts; the last one where all six sensed
    lengths first come within the PID tolerance of its target (else at the end of
    the recording). A gait that lasted the recording's own ``segment_timeout_s`` (else the
    argument ``segment_timeout_s``) or more is not ``reached``.
    """
    segment_timeout_s = recording.timeout_or(segment_timeout_s)
    t, segment = recording.t_s, recording.segment
    firsts = np.flatnonzero(np.r_[True, np.diff(segment) != 0])
    positions = length_to_target(robot, recording.cables_m[:, :N_ACTUATED])
    gaits = []
    for k, first in enumerate(firsts):
        after = firsts[k + 1] if k + 1 < len(firsts) else len(t)
        target = recording.targets[first]
        if k + 1 < len(firsts):
            end, reached = t[after], t[after] - t[first] < segment_timeout_s - 1e-9
        else:
            inside = np.all(np.abs(positions[first:] - target) < robot.pid.tolerance, axis=1)
            end, reached = (t[first + int(np.argmax(inside))], True) if inside.any() else (t[-1], False)
        rows = slice(first, after)
        direction, monotonic = _directions(recording, robot, rows, target)
        gaits.append(
            Gait(
                recording=recording.name,
                index=int(segment[first]),
                start_s=float(t[first]),
                end_s=float(end),
                target=np.asarray(target, float),
                direction=direction,
                monotonic=monotonic,
                reached=bool(reached),
            )
        )
    return gaits


def _directions(recording: Recording, robot: RobotConfig, rows: slice, target: np.ndarray) -> tuple[np.ndarray, bool]:
    """Per-cable direction of a gait and whether every cable kept it.

    From the recorded commands when there are any (``u > 0`` winds in: retract),
    else from the sensed lengths (the start's distance to the target, outside the
    PID tolerance).
    """
    if recording.control is not None:
        u = recording.control[rows]
        winds, unwinds = (u > COMMAND_THRESHOLD).any(0), (u < -COMMAND_THRESHOLD).any(0)
        net = u.sum(0)
        direction = np.where(net > 0, RETRACT, np.where(net < 0, EXTEND, HOLD))
        direction = np.where(winds | unwinds, direction, HOLD)
        return direction.astype(int), not bool((winds & unwinds).any())
    start = length_to_target(robot, recording.cables_m[rows.start, :N_ACTUATED])
    error = target - start
    direction = np.where(np.abs(error) < robot.pid.tolerance, HOLD, np.sign(error)).astype(int)
    return direction, True
