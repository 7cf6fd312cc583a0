"""The vehicle problem of the R2S2R paper's appendix (Fig. 23): a velocity identified with KFL or multiple shooting.

Model. A vehicle on a line follows the waypoint policy ``[B, A, B]`` with ``A = 0 m`` and
``B = 100 m``, starting at ``A``. Its state is the position ``x`` (m) and the segment ``s``
(index of the current waypoint; ``s = len(waypoints)`` once the last one has been reached).
Every step of ``dt`` (s), with speed ``v`` (m/s)::

    d_k     = sign(w[s_k] - x_k)        (0 once s_k = len(waypoints): the vehicle stays where it is)
    x_{k+1} = x_k + dt * v * d_k
    s_{k+1} = s_k + 1 if x_{k+1} reached or crossed w[s_k], else s_k

A switch keeps the overshoot: the vehicle heads for the next waypoint from where it is.

Gradients are "fixed-event", like the engine's detach rules: the direction ``d_k`` and the
segment ``s_k`` (which waypoint, when the switch happens) are decided on detached values and
carry no gradient, so ``d x_n / d v = dt * sum_{k<n} d_k``. The true derivative also moves the
switch times; across a switch the two can have opposite signs. Positions are float64 tensors.

Ground truth: ``v = 1 m/s`` reaches B at ``t = 100 s``, A at ``t = 200 s`` and B at ``t = 300 s``,
sampled at ``t = 0, 1, ..., 300 s``.

Losses of ``v`` (0-d float64 tensor) against a ground-truth :class:`Trajectory`:

* :func:`all_step_loss`: one rollout from the start; mean squared position error over all samples.
* :func:`multiple_shooting_loss`: ``n`` equal windows, each from the ground-truth full state
  (position and segment) at its start; mean squared defect at the window ends.
* :func:`key_frame_loss`: one window per ground-truth gait (constant segment), from the observed
  position at the gait's start, run until the engine reaches that gait's waypoint; the defect is
  taken at the key frame (:func:`pipeline.sysid.keyframes.key_frame_offsets`) and gaits are kept
  by the mask filter (:func:`pipeline.sysid.keyframes.mask_filter`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.sysid.keyframes import key_frame_offsets, mask_filter

WAYPOINTS_M = (100.0, 0.0, 100.0)
START_M = 0.0
DT_S = 1.0
TRUE_SPEED_MPS = 1.0
HORIZON_STEPS = 300
KFL_CAP_FACTOR = 1.25


@dataclass(frozen=True)
class Trajectory:
    """A sampled run: ``positions_m`` (T+1,) float64 (m) and ``segments`` (T+1,) int, at ``t = k * dt_s``."""

    positions_m: torch.Tensor
    segments: np.ndarray
    dt_s: float
    waypoints_m: tuple[float, ...]

    @property
    def steps(self) -> int:
        """Number of steps T."""
        return len(self.segments) - 1


@dataclass(frozen=True)
class KeyFrames:
    """Per-gait KFL terms, ``(G,)`` each: defects (m, tensor), durations (s), key-frame offsets (s), mask."""

    defects_m: torch.Tensor
    engine_durations_s: np.ndarray
    data_durations_s: np.ndarray
    offsets_s: np.ndarray
    kept: np.ndarray


def rollout(
    speed_mps: torch.Tensor,
    start_m: torch.Tensor | float,
    segment: int,
    steps: int,
    waypoints_m: tuple[float, ...] = WAYPOINTS_M,
    dt_s: float = DT_S,
    until_switch: bool = False,
) -> Trajectory:
    """Run ``steps`` steps from ``(start_m, segment)``, or fewer if ``until_switch`` and the waypoint is reached.

    The events are computed on detached floats; the positions are ``x_0 + dt * v * cumsum(d)``,
    which is the update ``x_{k+1} = x_k + dt * v * d_k`` with ``d_k`` detached.
    """
    x0 = torch.as_tensor(start_m, dtype=torch.float64)
    directions, segments = _events(
        float(speed_mps.detach()), float(x0.detach()), segment, steps, waypoints_m, dt_s, until_switch
    )
    travelled = torch.cumsum(torch.tensor(directions, dtype=torch.float64), dim=0) * (dt_s * speed_mps)
    positions = torch.cat([x0.reshape(1), x0 + travelled])
    return Trajectory(positions, np.asarray(segments), dt_s, waypoints_m)


def _events(
    speed: float, x: float, segment: int, steps: int, waypoints: tuple[float, ...], dt: float, until_switch: bool
) -> tuple[list[float], list[int]]:
    """Directions ``d_k`` (k < n) and segments ``s_k`` (k <= n) of the detached run."""
    directions: list[float] = []
    segments = [segment]
    for _ in range(steps):
        direction = 0.0 if segment >= len(waypoints) else float(np.sign(waypoints[segment] - x))
        x = x + dt * speed * direction
        if segment < len(waypoints) and (waypoints[segment] - x) * direction <= 0.0:
            segment += 1
        directions.append(direction)
        segments.append(segment)
        if until_switch and segment != segments[0]:
            break
    return directions, segments


def ground_truth(speed_mps: float = TRUE_SPEED_MPS, steps: int = HORIZON_STEPS) -> Trajectory:
    """The demonstration: from A with the true speed, sampled every ``DT_S`` for ``steps`` steps."""
    return rollout(torch.tensor(speed_mps, dtype=torch.float64), START_M, 0, steps)


def all_step_loss(speed_mps: torch.Tensor, truth: Trajectory) -> torch.Tensor:
    """Mean squared position error (m^2) of one rollout from the truth's start over all its samples."""
    run = rollout(speed_mps, truth.positions_m[0], int(truth.segments[0]), truth.steps, truth.waypoints_m, truth.dt_s)
    return torch.mean((run.positions_m - truth.positions_m) ** 2)


def multiple_shooting_loss(speed_mps: torch.Tensor, truth: Trajectory, n_windows: int) -> torch.Tensor:
    """Mean squared defect (m^2) at the ends of ``n_windows`` equal windows, each from the true full state."""
    bounds = [round(j * truth.steps / n_windows) for j in range(n_windows + 1)]
    defects = []
    for start, end in itertools.pairwise(bounds):
        run = rollout(
            speed_mps, truth.positions_m[start], int(truth.segments[start]), end - start, truth.waypoints_m, truth.dt_s
        )
        defects.append(run.positions_m[-1] - truth.positions_m[end])
    return torch.mean(torch.stack(defects) ** 2)


def data_gaits(truth: Trajectory) -> list[tuple[int, int]]:
    """``(start, end)`` sample indices of each completed gait (constant segment) of a trajectory."""
    gaits = []
    for segment in range(len(truth.waypoints_m)):
        start = np.flatnonzero(truth.segments >= segment)
        end = np.flatnonzero(truth.segments > segment)
        if len(start) and len(end):
            gaits.append((int(start[0]), int(end[0])))
    return gaits


def key_frames(speed_mps: torch.Tensor, truth: Trajectory) -> KeyFrames:
    """Per-gait key-frame defects (m) of the engine against the truth, with the mask filter's verdict.

    Gait ``i`` of the engine starts from the observed position at the data gait's start, heading for
    waypoint ``i``, and runs until it reaches it, at most ``1.25 D_data + dt``.
    """
    gaits = data_gaits(truth)
    dt = truth.dt_s
    data_steps = [end - start for start, end in gaits]
    runs = []
    for segment, ((start, _), n_data) in enumerate(zip(gaits, data_steps, strict=True)):
        cap = math.floor(KFL_CAP_FACTOR * n_data) + 1
        start_m = truth.positions_m[start].detach()
        runs.append(rollout(speed_mps, start_m, segment, cap, truth.waypoints_m, dt, until_switch=True))
    engine_s = np.array([run.steps * dt for run in runs])
    data_s = np.array(data_steps, dtype=float) * dt
    offsets = key_frame_offsets(engine_s, data_s)
    defects = []
    for (start, _), run, offset in zip(gaits, runs, offsets, strict=True):
        k = round(offset / dt)
        defects.append(run.positions_m[k] - truth.positions_m[start + k])
    kept = mask_filter(engine_s, data_s, tolerance_s=dt)
    return KeyFrames(torch.stack(defects), engine_s, data_s, offsets, kept)


def key_frame_loss(speed_mps: torch.Tensor, truth: Trajectory) -> torch.Tensor:
    """KFL (m^2): mean squared key-frame defect over the gaits the mask filter keeps."""
    frames = key_frames(speed_mps, truth)
    return torch.mean(frames.defects_m[torch.from_numpy(frames.kept)] ** 2)


def identify(
    loss_fn: Callable[[torch.Tensor], torch.Tensor], v0: float, lr: float = 0.1, iterations: int = 150
) -> list[tuple[float, float, float]]:
    """Adam on the speed (m/s) from ``v0``; ``(v, loss, d loss / d v)`` before each of the ``iterations`` steps."""
    speed = torch.tensor(v0, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([speed], lr=lr)
    history = []
    for _ in range(iterations):
        optimizer.zero_grad()
        loss = loss_fn(speed)
        loss.backward()
        history.append((speed.item(), loss.item(), speed.grad.item()))
        optimizer.step()
    return history
