"""The action table: every action simulated from every bottom face in both rolling directions.

:func:`tabulate` runs each :class:`~pipeline.follow.actions.Action` (mapped by
:func:`~pipeline.follow.actions.on_face`) from the robot at rest on each face, in one engine
batch over an ensemble of parameters (:func:`pipeline.gaits.ensemble.ensemble_params`), and
keeps, per action, face and direction, the motion along the heading before the action
(forward, lateral, m), the heading change (rad), the face it ends on, and the spread of each
over the ensemble (std): the :class:`~pipeline.follow.planner.ActionTable` the planner searches,
as the Tribar paper tabulates its actions in its simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.follow.actions import Action, on_face
from pipeline.follow.motion import ActionTable
from pipeline.gaits.outcome import simulate_targets
from pipeline.gaits.symmetry import FACES, support_triangle
from pipeline.physics.engine import Engine, State
from pipeline.physics.params import Params
from pipeline.physics.rollout import settle, state_from_caps
from pipeline.robot_model import REST_TARGET, reference_prism, resting_on_face


@dataclass(frozen=True)
class TabulatedActions:
    """The mean table and the ensemble's spread (std) of each motion, arrays (A, F, 2), and
    whether every ensemble member reached every target without folding the prism flat."""

    table: ActionTable
    forward_std_m: np.ndarray
    lateral_std_m: np.ndarray
    rotation_std_rad: np.ndarray
    succeeded: np.ndarray


def face_starts(engine: Engine, params: Params, robot: RobotConfig) -> State:
    """The robot at rest on each face (:data:`FACES` order), settled 1 s with every cable at rest:
    ``params`` has F * E environments, face-major, and environment f * E + m rests on face f."""
    caps = np.stack([resting_on_face(robot, reference_prism(robot), support_triangle(robot, f)) for f in range(3)])
    caps = np.repeat(caps, params.batch_size // len(caps), axis=0)
    state = state_from_caps(engine, params, caps)
    return settle(engine, params, state, robot.pid, torch.ones(6), duration_s=1.0)


def tabulate(
    engine: Engine, ensemble: Params, robot: RobotConfig, actions: list[Action], timeout_s: float
) -> TabulatedActions:
    """Simulate every action x face x direction x ensemble member (``ensemble``: E environments)
    and tabulate it (module docstring); each target is held at most ``timeout_s``."""
    faces, members = len(FACES), ensemble.batch_size
    length = max(len(a.targets) for a in actions)
    runs = []
    for action in actions:
        for face in range(faces):
            for direction in (False, True):
                targets = on_face(action, robot, face, direction)
                runs.append(np.vstack([targets, np.repeat(REST_TARGET[None], length - len(targets), 0)]))
    targets = np.repeat(np.stack(runs), members, axis=0)  # (A * F * 2 * E, n, 6), the members innermost
    starts = face_starts(engine, Params.concat([ensemble] * faces), robot)  # environment f * E + m
    run = np.arange(len(targets))
    member = torch.as_tensor(run % members)
    face = torch.as_tensor((run // (2 * members)) % faces)
    params = Params(**{name: value[member] for name, value in ensemble.as_dict().items()})
    outcome = simulate_targets(engine, params, robot, starts.index(face * members + member), targets, timeout_s)
    shape = (len(actions), faces, 2, members)

    def grid(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, float).reshape(shape)

    forward, lateral, rotation = grid(outcome.forward_m), grid(outcome.lateral_m), grid(outcome.rotation_rad)
    end_face = np.asarray(outcome.end_face).reshape(shape)
    modal_face = np.apply_along_axis(lambda f: np.bincount(f, minlength=faces).argmax(), -1, end_face)
    table = ActionTable(
        tuple(a.name for a in actions), forward.mean(-1), lateral.mean(-1), rotation.mean(-1), modal_face
    )
    succeeded = np.asarray(outcome.succeeded).reshape(shape).all(-1)
    return TabulatedActions(table, forward.std(-1), lateral.std(-1), rotation.std(-1), succeeded)
