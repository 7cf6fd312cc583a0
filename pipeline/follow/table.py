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

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.config import RobotConfig
from pipeline.config.follow import PlannerConfig
from pipeline.follow.actions import Action, on_face
from pipeline.follow.motion import ActionTable
from pipeline.gaits.ensemble import perturbed_starts
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


def members(
    engine: Engine, ensemble: Params, robot: RobotConfig, starts: int, start_sigma_m: float, seed: int = 0
) -> tuple[Params, State]:
    """The ensemble's members on each face, face-major (F * M environments, M = K + ``starts``):
    on face f, the K parameter sets of ``ensemble`` (the nominal first) from rest, then the nominal
    set from ``starts`` starts near that rest (end caps moved by ``start_sigma_m``, m, and settled)."""
    faces, k = len(FACES), ensemble.batch_size
    rests = face_starts(engine, Params.concat([ensemble] * faces), robot)
    nominal = Params(**{name: value[:1] for name, value in ensemble.as_dict().items()})
    params, states = [], []
    for face in range(faces):
        params.append(ensemble)
        states.append(rests.index(slice(face * k, (face + 1) * k)))
        if starts:
            rest = rests.index(slice(face * k, face * k + 1))
            params.append(nominal.expand(starts))
            states.append(perturbed_starts(engine, nominal, robot, rest, starts, start_sigma_m, seed + face))
    return Params.concat(params), State.concat(states)


def tabulate(
    engine: Engine,
    ensemble: Params,
    robot: RobotConfig,
    actions: list[Action],
    timeout_s: float,
    starts: int = 0,
    start_sigma_m: float = 0.0,
) -> TabulatedActions:
    """Simulate every action x face x direction x member (:func:`members`: the K parameter sets of
    ``ensemble``, then ``starts`` perturbed starts) and tabulate it (module docstring); each
    target is held at most ``timeout_s``."""
    faces = len(FACES)
    member_params, member_starts = members(engine, ensemble, robot, starts, start_sigma_m)
    count = ensemble.batch_size + starts
    length = max(len(a.targets) for a in actions)
    runs = []
    for action in actions:
        for face in range(faces):
            for direction in (False, True):
                targets = on_face(action, robot, face, direction)
                runs.append(np.vstack([targets, np.repeat(REST_TARGET[None], length - len(targets), 0)]))
    targets = np.repeat(np.stack(runs), count, axis=0)  # (A * F * 2 * M, n, 6), the members innermost
    run = np.arange(len(targets))
    env = torch.as_tensor((run // (2 * count)) % faces * count + run % count)  # face f, member m: f * M + m
    params = Params(**{name: value[env] for name, value in member_params.as_dict().items()})
    outcome = simulate_targets(engine, params, robot, member_starts.index(env), targets, timeout_s)
    shape = (len(actions), faces, 2, count)

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


def planning_table(tabulated: TabulatedActions, planner: PlannerConfig) -> ActionTable:
    """The mean table with ``usable`` set where every member succeeded and the members agree: the
    spread of the end position (the root sum of the forward and lateral std) at most
    ``planner.max_spread_m`` (m), of the rotation at most ``planner.max_spread_deg`` (deg); and
    cleared for every entry of an action that agrees so on fewer than ``planner.min_agreeing_share``
    of its faces and directions."""
    position = np.hypot(tabulated.forward_std_m, tabulated.lateral_std_m)
    agree = (position <= planner.max_spread_m) & (np.degrees(tabulated.rotation_std_rad) <= planner.max_spread_deg)
    agree &= tabulated.succeeded
    share = agree.reshape(len(agree), -1).mean(axis=1)
    return dataclasses.replace(tabulated.table, usable=agree & (share >= planner.min_agreeing_share)[:, None, None])
