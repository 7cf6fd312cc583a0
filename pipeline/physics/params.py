"""Engine parameters: one value per environment, with physical bounds.

A :class:`Params` holds a (B,) tensor per identifiable parameter of the registry
(:mod:`pipeline.parameter_specs`), in its order. Values outside their bounds are an error
(:class:`ParameterBoundsError`), never silently clamped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from pipeline.config import RobotConfig
from pipeline.errors import R2S2RError
from pipeline.parameter_specs import PARAMETERS

BOUNDS: dict[str, tuple[float, float]] = {spec.name: spec.bounds for spec in PARAMETERS}
"""Physical (low, high) bounds by parameter (:mod:`pipeline.parameter_specs`)."""
UNITS: dict[str, str] = {spec.name: spec.unit for spec in PARAMETERS}
"""SI unit by parameter."""


class ParameterBoundsError(R2S2RError):
    """An engine parameter lies outside its physical bounds."""


@dataclass(frozen=True)
class Params:
    """Per-environment engine parameters, each a (B,) tensor in SI units (see :data:`UNITS`)."""

    motor_speed: torch.Tensor
    motor_time_constant: torch.Tensor
    friction: torch.Tensor
    restitution: torch.Tensor
    actuated_stiffness: torch.Tensor
    actuated_damping: torch.Tensor
    passive_stiffness: torch.Tensor
    passive_cubic_stiffness: torch.Tensor
    passive_damping: torch.Tensor
    passive_rest_length: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.motor_speed.shape[0])

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def replace(self, **values: torch.Tensor) -> Params:
        return replace(self, **values)

    def expand(self, batch: int) -> Params:
        """These parameters of one environment repeated for ``batch`` environments (views that keep
        gradients); themselves when they already have ``batch``."""
        if self.batch_size == batch:
            return self
        if self.batch_size != 1:
            raise ValueError(f"cannot expand parameters of {self.batch_size} environments to {batch}")
        return Params(**{name: value.expand(batch) for name, value in self.as_dict().items()})

    @staticmethod
    def concat(sets: list[Params]) -> Params:
        """The environments of ``sets`` one after another (batch: the sum of theirs)."""
        return Params(**{f.name: torch.cat([getattr(p, f.name) for p in sets]) for f in fields(Params)})

    def validate(self) -> Params:
        """Raise :class:`ParameterBoundsError` naming the parameter, environment and bounds."""
        batch = self.batch_size
        for name, value in self.as_dict().items():
            if value.shape != (batch,):
                raise ParameterBoundsError(f"parameter '{name}': expected shape ({batch},), got {tuple(value.shape)}")
            lo, hi = BOUNDS[name]
            bad = ~torch.isfinite(value) | (value < lo) | (value > hi)
            if bool(bad.any()):
                env = int(torch.nonzero(bad)[0, 0])
                raise ParameterBoundsError(
                    f"parameter '{name}' = {float(value[env])!r} in environment {env} is outside its bounds "
                    f"[{lo}, {hi}] {UNITS[name]}"
                )
        return self

    @classmethod
    def from_robot(
        cls,
        robot: RobotConfig,
        batch: int = 1,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
        **overrides: float,
    ) -> Params:
        """Parameters from the robot config (nominal or identified values), with ``overrides``
        by parameter name."""
        values = robot_values(robot)
        unknown = set(overrides) - set(values)
        if unknown:
            raise ParameterBoundsError(f"unknown engine parameters {sorted(unknown)}; known: {sorted(values)}")
        values.update(overrides)
        return cls(
            **{k: torch.full((batch,), float(v), dtype=dtype, device=device) for k, v in values.items()}
        ).validate()


ROBOT_FIELDS: dict[str, tuple[str, str]] = {spec.name: spec.robot_field for spec in PARAMETERS}
"""Where each engine parameter lives in the robot config (section, field): the sysid overlay's keys."""


def robot_values(robot: RobotConfig) -> dict[str, float]:
    """The engine parameters a robot config holds, by name (SI units, see :data:`UNITS`)."""
    return {name: float(getattr(getattr(robot, section), field)) for name, (section, field) in ROBOT_FIELDS.items()}


def robot_overlay(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """A nested robot-config overlay (``{"motor": {"speed": ...}}``) for engine parameter ``values``."""
    overlay: dict[str, dict[str, float]] = {}
    for name, value in values.items():
        section, field = ROBOT_FIELDS[name]
        overlay.setdefault(section, {})[field] = float(value)
    return overlay
