"""Policies: sequences of target shapes, their generation and feasibility check.

A policy is a list of targets, each six normalised actuated-cable lengths in
[0, 1] (0 = fully contracted, 1 = fully extended). Every policy starts from the
rest state; generated policies also end at rest (all ones), as in the R2S2R paper.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from pipeline.config import CollectConfig, RobotConfig
from pipeline.errors import PolicyError
from pipeline.published_gaits import PUBLISHED_GAITS, published_gait
from pipeline.robot_model import N_ACTUATED, REST_TARGET, target_to_length

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """A named sequence of targets, ``targets`` (n, 6) float in [0, 1]."""

    name: str
    targets: np.ndarray

    @property
    def policy_id(self) -> str:
        """``<name>-<8 hex>``: the name plus a hash of the targets, stable across runs."""
        digest = hashlib.sha256(np.ascontiguousarray(self.targets, dtype=np.float64).tobytes()).hexdigest()
        return f"{self.name}-{digest[:8]}"

    def __len__(self) -> int:
        return len(self.targets)


def actuated_triangles(robot: RobotConfig) -> list[tuple[int, int, int]]:
    """Indices of the actuated cables forming each side's triangle (odd caps, even caps)."""
    odd = tuple(j for j, (a, b) in enumerate(robot.topology.actuated) if a % 2 == 1 and b % 2 == 1)
    even = tuple(j for j, (a, b) in enumerate(robot.topology.actuated) if a % 2 == 0 and b % 2 == 0)
    if len(odd) != 3 or len(even) != 3:
        raise PolicyError("topology.actuated must form one triangle on the odd caps and one on the even caps")
    return [odd, even]


def _triangle_violations(robot: RobotConfig, target: np.ndarray) -> list[tuple[int, float]]:
    """(cable, excess in m) for each cable too long to close its triangle with slack."""
    lengths = target_to_length(robot, target)
    slack = robot.feasibility.min_triangle_slack_m
    out = []
    for tri in actuated_triangles(robot):
        for j in tri:
            others = sum(lengths[k] for k in tri if k != j)
            excess = lengths[j] - (others - slack)
            if excess > 1e-12:
                out.append((j, excess))
    return out


def feasible_target(
    robot: RobotConfig, target: np.ndarray, label: str
) -> tuple[np.ndarray, list[tuple[int, float, float]]]:
    """``target`` (6,) with every too-long cable shortened to the longest length its side's
    triangle allows (``repair`` mode), and the repairs as (cable, before, after); in ``reject``
    mode, or if no repair exists, :class:`PolicyError` names ``label`` and the cable."""
    target = np.array(target, dtype=float)
    repairs = []
    violations = _triangle_violations(robot, target)
    while violations:
        j, excess = max(violations, key=lambda v: v[1])
        if robot.feasibility.mode == "reject":
            raise PolicyError(
                f"{label} = {target.tolist()} violates the triangle inequality at cable {j} by "
                f"{excess * 1000:.1f} mm (needs {robot.feasibility.min_triangle_slack_m * 1000:.0f} mm slack); "
                "shorten that cable"
            )
        repaired = target[j] - excess / robot.actuated_cable.range_m
        if repaired < 0:
            raise PolicyError(
                f"{label} = {target.tolist()} cannot be repaired: the other two cables of cable {j}'s triangle "
                "are too short"
            )
        repairs.append((j, float(target[j]), float(repaired)))
        target[j] = repaired
        violations = _triangle_violations(robot, target)
    return target, repairs


def check_policy(robot: RobotConfig, policy: Policy) -> Policy:
    """Validate ``policy`` against the robot's reachable shapes.

    Targets must be finite and in [0, 1]. Each side's three actuated cables must
    satisfy the triangle inequality with ``feasibility.min_triangle_slack_m`` to
    spare (Tribar paper: ``[0, 0, 1]`` on one side cannot be reached; the published fix
    lowers the 1 to 0.8). In ``repair`` mode a too-long cable is shortened to the
    longest feasible length and the repairs are logged (one line per policy); in ``reject`` mode, or if no
    repair exists, :class:`PolicyError` names the target and cable.
    """
    targets = np.array(policy.targets, dtype=float)
    if targets.ndim != 2 or targets.shape[1] != N_ACTUATED or len(targets) == 0:
        raise PolicyError(f"policy '{policy.name}': targets must have shape (n >= 1, 6), got {targets.shape}")
    bad = ~np.isfinite(targets) | (targets < 0) | (targets > 1)
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        raise PolicyError(
            f"policy '{policy.name}': target {i} cable {j} = {float(targets[i, j])}; expected a number in [0, 1]"
        )
    repaired = []
    for i, target in enumerate(targets):
        targets[i], repairs = feasible_target(robot, target, f"policy '{policy.name}': target {i}")
        repaired += [f"target {i} cable {j} repaired {before:.3f} -> {after:.3f}" for j, before, after in repairs]
    if repaired:  # one line per policy: a repeated gait repairs the same cables every cycle
        log.warning("policy '%s' (triangle inequality): %s", policy.name, "; ".join(repaired))
    return Policy(name=policy.name, targets=targets)


def random_policy(robot: RobotConfig, n_targets: int, seed: int, levels: tuple[float, ...] | None = None) -> Policy:
    """Seeded random policy: ``n_targets`` random shapes followed by the rest shape.

    Values are uniform in [0, 1], or drawn from ``levels`` when given. Infeasible
    shapes are handled by :func:`check_policy`.
    """
    rng = np.random.default_rng(seed)
    if levels is None:
        shapes = rng.uniform(0.0, 1.0, size=(n_targets, N_ACTUATED))
    else:
        shapes = rng.choice(np.asarray(levels, float), size=(n_targets, N_ACTUATED))
    targets = np.vstack([shapes, REST_TARGET])
    return check_policy(robot, Policy(name=f"random{seed}", targets=targets))


def gait_policy(robot: RobotConfig, name: str, cycles: int) -> Policy:
    """A published gait repeated ``cycles`` times, then the rest shape."""
    if name not in PUBLISHED_GAITS:
        raise PolicyError(f"unknown gait '{name}'; expected one of {', '.join(PUBLISHED_GAITS)} or 'random'")
    cycle = published_gait(name)
    targets = np.vstack([np.tile(cycle, (cycles, 1)), REST_TARGET])
    return check_policy(robot, Policy(name=name, targets=targets))


def policy_from_name(
    robot: RobotConfig, name: str, cycles: int, n_random: int, seed: int, levels: tuple[float, ...] | None = None
) -> Policy:
    """``random`` or a published gait name -> a checked policy."""
    if name == "random":
        return random_policy(robot, n_random, seed, levels)
    return gait_policy(robot, name, cycles)


def collect_policy(robot: RobotConfig, config: CollectConfig, seed_offset: int = 0) -> Policy:
    """The policy the collect stage runs, from ``collect.policy`` (a random policy's seed plus
    ``seed_offset``, so that later iterations get fresh random data)."""
    seed = config.random.seed + seed_offset
    n_random, levels = config.random.n_targets, config.random.levels
    return policy_from_name(robot, config.policy, config.gait_cycles, n_random, seed, levels)
