"""Engine parameters: one value per environment, with physical bounds.

A :class:`Params` holds a (B,) tensor per identifiable parameter. Values outside
their bounds are an error (:class:`ParameterBoundsError`), never silently clamped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from pipeline.config import RobotConfig
from pipeline.errors import R2S2RError

BOUNDS: dict[str, tuple[float, float]] = {
    "motor_speed": (0.01, 2.0),  # s in omega = s * omega_max * u (dimensionless)
    "motor_time_constant": (0.0, 0.5),  # s, first-order lag of motor speed behind its command
    "friction": (0.0, 2.0),  # Coulomb coefficient, ground
    "restitution": (0.0, 1.0),  # ground
    "actuated_stiffness": (1.0, 1e4),  # N/m
    "actuated_damping": (0.0, 100.0),  # N s/m
    "passive_stiffness": (0.1, 1e4),  # N/m
    "passive_cubic_stiffness": (0.0, 1e6),  # N/m^3
    "passive_damping": (0.0, 100.0),  # N s/m
    "passive_rest_length": (0.01, 0.5),  # m
}
UNITS = {
    "motor_speed": "1",
    "motor_time_constant": "s",
    "friction": "1",
    "restitution": "1",
    "actuated_stiffness": "N/m",
    "actuated_damping": "N s/m",
    "passive_stiffness": "N/m",
    "passive_cubic_stiffness": "N/m^3",
    "passive_damping": "N s/m",
    "passive_rest_length": "m",
}


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


ROBOT_FIELDS: dict[str, tuple[str, str]] = {
    "motor_speed": ("motor", "speed"),
    "motor_time_constant": ("motor", "time_constant_s"),
    "friction": ("ground", "friction"),
    "restitution": ("ground", "restitution"),
    "actuated_stiffness": ("actuated_cable", "stiffness_n_per_m"),
    "actuated_damping": ("actuated_cable", "damping_n_s_per_m"),
    "passive_stiffness": ("passive_cable", "stiffness_n_per_m"),
    "passive_cubic_stiffness": ("passive_cable", "cubic_stiffness_n_per_m3"),
    "passive_damping": ("passive_cable", "damping_n_s_per_m"),
    "passive_rest_length": ("passive_cable", "rest_length_m"),
}
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
