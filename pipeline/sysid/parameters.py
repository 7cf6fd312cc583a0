"""The optimiser's view of the engine parameters: scaled coordinates, bounds and priors.

Each identified parameter ``p`` gets one coordinate ``theta`` of order one:

* ``linear``: ``theta = (p - p0) / scale`` (motor speed, friction, restitution, time constant,
  cubic stiffness, rest length);
* ``log``: ``theta = ln(p / p0) / scale`` (stiffnesses and dampings: a change by a factor).

so one Adam learning rate suits all of them. After every step the coordinates are
projected back inside the parameter's physical bounds (:data:`BOUNDS`, shrunk by a
relative margin), so no parameter outside them is ever produced. An optional prior
(sim-to-real notes) adds ``((p - value) / scale)^2`` per parameter to the loss.
"""

from __future__ import annotations

import math

import torch

from pipeline.config import PriorConfig, SysidConfig
from pipeline.errors import ConfigError
from pipeline.parameter_specs import PARAMETERS
from pipeline.physics.params import BOUNDS, Params

LOG_SCALED = {spec.name for spec in PARAMETERS if spec.log_scaled}
DEFAULT_SCALES = {spec.name: spec.scale for spec in PARAMETERS}
BOUND_MARGIN = 1e-3
"""Projection keeps each parameter this fraction of its bound range inside the bounds."""


def search_bounds(name: str) -> tuple[float, float]:
    """The values (SI) the search keeps parameter ``name`` within: its bounds less a margin."""
    lo, hi = BOUNDS[name]
    margin = BOUND_MARGIN * (hi - lo)
    return lo + margin, hi - margin


class ParameterSpace:
    """Coordinates ``theta`` (P,) for ``names`` around the starting parameters ``start`` (one env)."""

    def __init__(
        self,
        names: tuple[str, ...],
        start: Params,
        scales: dict[str, float] | None = None,
        priors: dict[str, PriorConfig] | None = None,
    ) -> None:
        unknown = [n for n in names if n not in BOUNDS]
        if unknown or len(set(names)) != len(names):
            raise ConfigError(f"sysid.parameters: unknown or repeated names {names}; known: {sorted(BOUNDS)}")
        if start.batch_size != 1:
            raise ValueError("the starting parameters must be of one environment")
        self.names = names
        self.start = start.replace(**{k: v.detach() for k, v in start.as_dict().items()})
        self.scales = {n: float((scales or {}).get(n, DEFAULT_SCALES[n])) for n in names}
        self.priors = dict(priors or {})
        self.p0 = {n: float(getattr(start, n)[0]) for n in names}
        for n in names:
            if n in LOG_SCALED and self.p0[n] <= 0:
                raise ConfigError(f"sysid: '{n}' is optimised on a log scale and must start > 0, got {self.p0[n]}")
        self._low = torch.tensor([self.theta_of(n, search_bounds(n)[0]) for n in names], dtype=torch.float64)
        self._high = torch.tensor([self.theta_of(n, search_bounds(n)[1]) for n in names], dtype=torch.float64)

    @classmethod
    def configured(cls, names: tuple[str, ...], start: Params, config: SysidConfig) -> ParameterSpace:
        """The space of ``names`` around ``start`` with ``config``'s scales and priors."""
        return cls(names, start, dict(config.scales), dict(config.priors))

    def theta_of(self, name: str, value: float) -> float:
        """The coordinate of ``value`` (SI) of parameter ``name``."""
        if name in LOG_SCALED:
            return math.log(value / self.p0[name]) / self.scales[name]
        return (value - self.p0[name]) / self.scales[name]

    @property
    def lower(self) -> torch.Tensor:
        """Lowest allowed coordinates (P,)."""
        return self._low.clone()

    @property
    def upper(self) -> torch.Tensor:
        """Highest allowed coordinates (P,)."""
        return self._high.clone()

    def initial(self) -> torch.Tensor:
        """Coordinates of the start, projected inside the bounds (P,)."""
        return self.project(torch.zeros(len(self.names), dtype=torch.float64))

    def project(self, theta: torch.Tensor) -> torch.Tensor:
        """``theta`` clamped into the bounds (same tensor, modified in place, returned)."""
        with torch.no_grad():
            theta.copy_(torch.maximum(torch.minimum(theta, self._high), self._low))
        return theta

    def values(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameter values (0-d tensors, differentiable in ``theta``) by name."""
        out = {}
        for i, n in enumerate(self.names):
            if n in LOG_SCALED:
                out[n] = self.p0[n] * torch.exp(theta[i] * self.scales[n])
            else:
                out[n] = self.p0[n] + theta[i] * self.scales[n]
        return out

    def slopes(self, theta: torch.Tensor) -> dict[str, float]:
        """Each parameter's value change (SI) per unit of its coordinate at ``theta``."""
        values = self.values(theta)
        return {n: float(values[n]) * self.scales[n] if n in LOG_SCALED else self.scales[n] for n in self.names}

    def params(self, theta: torch.Tensor) -> Params:
        """One environment's engine parameters: the start with the identified ones replaced."""
        dtype = self.start.motor_speed.dtype
        return self.start.replace(**{n: v.to(dtype).reshape(1) for n, v in self.values(theta).items()})

    def prior_penalty(self, theta: torch.Tensor) -> torch.Tensor:
        """Sum over parameters with a prior of ((p - value) / scale)^2 (0 without priors)."""
        values = self.values(theta)
        penalty = torch.zeros((), dtype=torch.float64)
        for name, prior in self.priors.items():
            if name in values:
                penalty = penalty + ((values[name] - prior.value) / prior.scale) ** 2
        return penalty
