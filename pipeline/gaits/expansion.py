"""Long open-loop policies from short gaits by symmetry (R2S2R paper, Tribar paper).

A :class:`Gait` is written for face 0 (caps 0, 2, 3, 5 on the ground, support
triangle 0, 2, 5) and ends at the rest shape. Each cycle of an expanded policy is
the gait mapped (:func:`~pipeline.gaits.symmetry.to_face`) to the face the robot is
on when the cycle starts; the robot's face advances by the gait's ``face_steps``
per cycle. Transitions between cycles keep their rest steps:
:mod:`pipeline.gaits.smoothing` removes the redundant ones. The face maps and the
reversal only relabel cables within or between the two sides' triangles, so a gait
that passes :func:`~pipeline.policies.check_policy` expands to policies that do too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import RobotConfig
from pipeline.gaits.outcome import simulate_targets
from pipeline.gaits.symmetry import cable_permutation, relabel, reversal_caps, reverse, to_face
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.policies import REST_TARGET
from pipeline.published_gaits import ROLLING_UNIT
from pipeline.robot_model import N_ACTUATED, N_CAPS


@dataclass(frozen=True)
class Gait:
    """A gait cycle: ``targets`` (n, 6) normalised cable targets in [0, 1] for face 0, the
    last one the rest shape (all ones); ``face_steps`` forward face steps (mod 3) one cycle
    moves the robot, i.e. :attr:`~pipeline.gaits.outcome.Outcome.faces_changed`
    (1: rolls forward, 2: rolls backward, 0: keeps its face)."""

    name: str
    targets: np.ndarray
    face_steps: int

    def __post_init__(self) -> None:
        targets = np.array(self.targets, dtype=float)
        if targets.ndim != 2 or targets.shape[1] != N_ACTUATED or len(targets) == 0:
            raise ValueError(f"gait '{self.name}': targets must have shape (n >= 1, 6), got {targets.shape}")
        if not (np.isfinite(targets).all() and (targets >= 0).all() and (targets <= 1).all()):
            raise ValueError(f"gait '{self.name}': targets must be numbers in [0, 1]")
        if not np.allclose(targets[-1], REST_TARGET):
            raise ValueError(f"gait '{self.name}': the last target must be the rest shape, got {targets[-1].tolist()}")
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "face_steps", int(self.face_steps) % 3)


def published_rolling() -> Gait:
    """The published rolling unit (Tribar paper) followed by the rest shape: one roll forward."""
    return Gait("rolling", np.vstack([ROLLING_UNIT, REST_TARGET]), face_steps=1)


def reversed_gait(gait: Gait, robot: RobotConfig) -> Gait:
    """``gait`` relabelled by :func:`~pipeline.gaits.symmetry.reverse` on face 0: the same
    motion in the mirror direction. The reversal swaps faces 1 and 2, so the face steps
    change sign."""
    return Gait(f"{gait.name}-reversed", reverse(gait.targets, robot, 0), face_steps=-gait.face_steps)


def expand(gait: Gait, cycles: int, start_face: int = 0) -> np.ndarray:
    """``cycles`` cycles of ``gait`` from bottom face ``start_face`` -> targets (cycles * n, 6).

    Cycle ``c`` is mapped to face ``start_face + c * gait.face_steps`` (mod 3).
    """
    parts, _ = _cycles(gait, cycles, start_face)
    return np.concatenate(parts, axis=0) if parts else np.empty((0, N_ACTUATED))


def end_face(gait: Gait, cycles: int, start_face: int = 0) -> int:
    """The face the robot is on after ``cycles`` cycles of ``gait`` from ``start_face``."""
    return (start_face + cycles * gait.face_steps) % 3


def _cycles(gait: Gait, cycles: int, start_face: int) -> tuple[list[np.ndarray], int]:
    """Each cycle's targets (n, 6) on its face, and the face after the last one."""
    if cycles < 0:
        raise ValueError(f"cycles must be >= 0, got {cycles}")
    faces = [end_face(gait, c, start_face) for c in range(cycles)]
    return [to_face(gait.targets, 0, face) for face in faces], end_face(gait, cycles, start_face)


ROTATION_CAPS = (2, 3, 4, 5, 0, 1)
"""End-cap relabelling of one face step (cap i -> i + 2 mod 6): the prism's 3-fold rotation,
whose cable relabelling is :func:`~pipeline.gaits.symmetry.shift_left`."""


def _compose(outer: tuple[int, ...], inner: tuple[int, ...]) -> tuple[int, ...]:
    """Apply ``inner`` then ``outer`` (cap maps)."""
    return tuple(outer[i] for i in inner)


def prism_symmetries(robot: RobotConfig) -> list[tuple[int, ...]]:
    """The six end-cap relabellings of the prism's symmetry group: the face steps (identity and
    the 3-fold rotation twice), each alone and after the 2-fold reversal of face 0."""
    flip = reversal_caps(robot, 0)
    rotations = [tuple(range(N_CAPS)), ROTATION_CAPS, _compose(ROTATION_CAPS, ROTATION_CAPS)]
    return [g for r in rotations for g in (r, _compose(r, flip))]


def support_symmetry(robot: RobotConfig, caps_m: np.ndarray) -> tuple[int, ...]:
    """The symmetry that takes the search's start (support triangle 0, 2, 5 of face 0) to the
    robot's pose ``caps_m`` (6, 3): the one whose image of caps 0, 2, 5 lies lowest."""
    heights = np.asarray(caps_m)[:, 2]
    return min(prism_symmetries(robot), key=lambda g: float(heights[[g[0], g[2], g[5]]].sum()))


def expand_in_engine(
    engine: Engine,
    params: Params,
    robot: RobotConfig,
    state: State,
    gait: np.ndarray,
    cycles: int,
    timeout_s: float,
) -> np.ndarray:
    """``cycles`` cycles of ``gait`` (n, 6; written for support triangle 0, 2, 5) as one open-loop
    policy (cycles * n, 6): before each cycle the engine, continuing from ``state`` (one
    environment), says which support triangle the robot is on, and the cycle is the gait
    relabelled by the symmetry that maps the start onto it. So a gait that lands on the other
    kind of support triangle (R2S2R paper: rolling forward there is the backward gait) or on another
    face keeps its sense.

    ``gait`` may also be (K, n, 6): K gaits of the same length expanded as one batch of K
    environments (``state`` one environment, or K), each on its own -> (K, cycles * n, 6)."""
    gaits = np.asarray(gait, dtype=float)
    batched = gaits.ndim == 3
    gaits = gaits if batched else gaits[None]
    if state.batch_size == 1:
        state = state.repeat(len(gaits))
    params = params.expand(len(gaits))
    parts = []
    for cycle in range(cycles):
        caps = engine.cap_positions(state).numpy()
        targets = np.stack(
            [
                relabel(g, cable_permutation(robot, support_symmetry(robot, c), f"cycle {cycle}"))
                for g, c in zip(gaits, caps, strict=True)
            ]
        )
        state = simulate_targets(engine, params, robot, state, targets, timeout_s, final_hold_s=0.0).final
        parts.append(targets)
    expanded = np.concatenate(parts, axis=1)
    return expanded if batched else expanded[0]
