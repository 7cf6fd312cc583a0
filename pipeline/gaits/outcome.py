"""What a policy does in the engine: centre-of-mass travel, heading change, faces, success.

:func:`simulate_targets` runs target sequences for a batch of environments (the PID
inside, as on the robot) and summarises each one as an :class:`Outcome`; the gait
search, the smoothing check and the simulated side of the sim-to-real gap read it.

Directions (docs/design.md, *Conventions*): heading = principal axis rotated +90 deg about z; "forward"
is the centre-of-mass displacement along the *start* heading, "rotation" the change of
heading, counter-clockwise (seen from above) positive.

A run can also fold the prism flat: the rods slide over one another until every end cap lies on
the ground, and the flat robot then crawls where its cables pull it. This is the robot's doing,
not the engine's: from the rest pose, the shape (0, 0.9, 0, 0, 0.9, 0) (four actuated cables
retracted) lays the prism flat in the engine and on the twin alike (highest end cap 0.064 and
0.061 rod lengths above the ground; ``tests/test_gaits.py`` and ``tests/test_twin.py``). A flat
robot can spin or slide far in the engine, and such runs would carry a policy's mean score.
Such a run is a failure, whatever it moved: :attr:`Outcome.collapsed` flags it,
:attr:`Outcome.succeeded` leaves it out and :meth:`Outcome.credited` counts it as no motion.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.gaits.symmetry import bottom_face
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import Trace, run_policy
from pipeline.robot_model import heading_rad, principal_axis

COLLAPSE_HEIGHT_FRACTION = 0.1
"""A run folded the prism flat if at some tick its highest end-cap centre was lower than this
fraction of a rod length above the ground. Over a gait search's runs that lowest height falls in
two groups: about 0.06-0.08 rod lengths (the prism flat: every end cap on the ground, rods lying
across one another, many of them reaching their targets all the same) and the rest, nearly all
above 0.3 (standing, or tipping over an edge); 0.1 lies between them."""


@dataclass(frozen=True)
class Outcome:
    """Per environment (B,), from its start to the tick it finished (its final hold done):
    ``forward_m`` CoM displacement along the start heading (m),
    ``lateral_m`` along the start heading rotated +90 deg (m), ``rotation_rad`` heading change
    (rad, ccw positive, :func:`heading_change_rad`), ``start_face`` / ``end_face`` indices into
    :data:`~pipeline.gaits.symmetry.FACES`, ``reached`` whether every target was reached before
    its timeout, ``collapsed`` whether the prism folded flat on the way
    (:data:`COLLAPSE_HEIGHT_FRACTION`); ``final`` the engine state at the end and ``trace`` the rollout."""

    forward_m: np.ndarray
    lateral_m: np.ndarray
    rotation_rad: np.ndarray
    start_face: np.ndarray
    end_face: np.ndarray
    reached: np.ndarray
    collapsed: np.ndarray
    final: State
    trace: Trace

    @property
    def faces_changed(self) -> np.ndarray:
        """Forward face steps (B,) from start to end face, mod 3 (0: same face)."""
        return (self.end_face - self.start_face) % 3

    @property
    def succeeded(self) -> np.ndarray:
        """Whether each run (B,) reached every target without folding the prism flat."""
        return self.reached & ~self.collapsed

    def credited(self, values: np.ndarray) -> np.ndarray:
        """``values`` (B,), one per run (a displacement, a rotation, a score), with 0 for the runs
        that folded the prism flat: what such a run moved is not a gait's doing."""
        return np.where(self.collapsed, 0.0, np.asarray(values, dtype=float))


def folded_flat(caps_m: np.ndarray, rod_length_m: float) -> np.ndarray:
    """Whether the prism lay flat at some sample of the end caps ``caps_m`` (..., T, 6, 3) (m, z up
    from the ground), rods ``rod_length_m`` long (:data:`COLLAPSE_HEIGHT_FRACTION`): (...,) bool."""
    return caps_m[..., 2].max(-1).min(-1) < COLLAPSE_HEIGHT_FRACTION * rod_length_m


def heading_change_rad(caps_m: np.ndarray, max_tilt: float = 0.7) -> float:
    """Heading change (rad, ccw positive) from the first to the last of end caps ``caps_m``
    (T, 6, 3), unwrapped over the samples whose principal axis is within ``max_tilt`` (its z
    component) of horizontal: while the robot tips over, the axis can point nearly straight up
    and its heading is noise, which plain unwrapping would count as whole turns."""
    axis = principal_axis(caps_m)
    level = np.abs(axis[:, 2]) < max_tilt
    level[[0, -1]] = True
    headings = np.unwrap(heading_rad(caps_m[level]))
    return float(headings[-1] - headings[0])


def summarise(robot: RobotConfig, trace: Trace, targets: torch.Tensor, final_hold_s: float, final: State) -> Outcome:
    """The :class:`Outcome` of a finished rollout ``trace`` of ``targets`` (B, S, 6) whose last
    target was held for ``final_hold_s`` (s)."""
    caps = trace.caps_m.detach().numpy()
    finished = trace.finished.numpy()
    end = np.where(finished.any(1), finished.argmax(1), caps.shape[1] - 1)
    rows = np.arange(len(caps))
    com = caps.mean(axis=2)[..., :2]
    start_heading = heading_rad(caps[:, 0])
    forward_dir = np.stack([np.cos(start_heading), np.sin(start_heading)], axis=-1)
    lateral_dir = np.stack([-forward_dir[:, 1], forward_dir[:, 0]], axis=-1)
    displacement = com[rows, end] - com[:, 0]
    return Outcome(
        forward_m=(displacement * forward_dir).sum(-1),
        lateral_m=(displacement * lateral_dir).sum(-1),
        rotation_rad=np.array([heading_change_rad(caps[b, : end[b] + 1]) for b in rows]),
        start_face=np.array([bottom_face(c) for c in caps[:, 0]]),
        end_face=np.array([bottom_face(c) for c in caps[rows, end]]),
        reached=_all_reached(robot, trace, targets.detach().numpy(), final_hold_s),
        collapsed=np.array([folded_flat(caps[b, : end[b] + 1], robot.rod.length_m) for b in rows], dtype=bool),
        final=final,
        trace=trace,
    )


def _all_reached(robot: RobotConfig, trace: Trace, targets: np.ndarray, final_hold_s: float) -> np.ndarray:
    """Whether every target of each environment was reached (B,): the cables were within the
    PID tolerance of target j on the tick the policy moved on from it (for the last target, the
    tick its final hold began), rather than timing out."""
    lo, span = robot.actuated_cable.min_length_m, robot.actuated_cable.range_m
    position = (trace.cables_m[..., : targets.shape[-1]].detach().numpy() - lo) / span
    segment = trace.segment.numpy()
    finished = trace.finished.numpy()
    hold_ticks = round(final_hold_s * robot.pid.control_rate_hz)
    reached = np.zeros(segment.shape[0], dtype=bool)
    for b in range(segment.shape[0]):
        moved_on = np.flatnonzero(np.diff(segment[b])) + 1
        done = np.flatnonzero(finished[b])
        if len(moved_on) < targets.shape[1] - 1 or len(done) == 0:
            continue
        ticks = np.append(moved_on, done[0] - hold_ticks)
        error = np.abs(position[b, ticks] - targets[b, np.arange(targets.shape[1])]).max(-1)
        reached[b] = bool((error < robot.pid.tolerance).all())
    return reached


@torch.no_grad()
def simulate_targets(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    state: State,
    targets: np.ndarray | torch.Tensor,
    timeout_s: float,
    final_hold_s: float = 1.0,
) -> Outcome:
    """Run ``targets`` ((S, 6) shared or (B, S, 6)) from ``state`` (B environments) and summarise.

    The final hold (s) lets the robot come to rest on the last target, so the end face and
    heading are those of a settled robot.
    """
    targets = torch.as_tensor(np.asarray(targets, float), dtype=state.pos.dtype)
    if targets.dim() == 2:
        targets = targets.expand(state.batch_size, *targets.shape)
    final, trace = run_policy(
        engine,
        params,
        state,
        targets,
        robot.pid,
        timeout_s,
        final_hold_s=final_hold_s,
        latency_s=robot.pid.latency_s,
    )
    return summarise(robot, trace, targets, final_hold_s, final)
