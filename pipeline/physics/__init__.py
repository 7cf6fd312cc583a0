"""Differentiable tensegrity physics engine (torch), docs/design.md.

``RobotModel`` (static geometry), ``Params`` (per-environment parameters with
bounds), ``State`` and ``Engine.step(params, state, control)``; rollouts with the
firmware PID in :mod:`pipeline.physics.rollout`.
"""

from pipeline.physics.engine import Engine, State
from pipeline.physics.model import RobotModel
from pipeline.physics.params import BOUNDS, ParameterBoundsError, Params

__all__ = ["BOUNDS", "Engine", "ParameterBoundsError", "Params", "RobotModel", "State"]
