"""What an identification returns: its steps and its answer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.physics.params import Params
from pipeline.sysid.parameters import ParameterSpace


@dataclass(frozen=True)
class Step:
    """One optimiser step: parameter values before it, the losses there, and its gradient.

    ``method`` is ``gradient`` (Adam; ``lr`` its learning rate), ``search`` (a CMA-ES
    generation; ``values`` its mean, ``loss`` the robust loss there, ``lr`` its step size,
    ``gradient`` zero) or ``shooting`` (a Levenberg-Marquardt step of gait-wise multiple shooting;
    ``lr`` its damping, see :meth:`~pipeline.sysid.shooting.GaitShooting.solve`)."""

    iteration: int
    values: dict[str, float]
    loss: float
    unfiltered_loss: float
    prior: float
    kept_fraction: float
    gradient: dict[str, float]
    lr: float
    wall_s: float
    method: str = "gradient"


@dataclass
class Identification:
    """The identified values (SI), the parameters for the engine, and the step history;
    ``profile``: for each searched parameter, the range (low, high) (SI) of values on its
    loss profile that score about as well as the answer
    (:meth:`~pipeline.sysid.evolution.Profile.widths`); ``standard_error``: for each parameter
    gait shooting refined, its standard error (SI) from the cost's curvature at the answer
    (:meth:`~pipeline.sysid.shooting.GaitShooting.parameter_covariance`)."""

    values: dict[str, float]
    params: Params
    history: list[Step] = field(default_factory=list)
    converged: bool = False
    wall_s: float = 0.0
    profile: dict[str, tuple[float, float]] = field(default_factory=dict)
    standard_error: dict[str, float] = field(default_factory=dict)

    @classmethod
    def at(cls, space: ParameterSpace, theta: torch.Tensor, **rest: object) -> Identification:
        """The answer ``theta`` (``space``'s scaled coordinates) with its values and parameters;
        ``rest``: the other fields."""
        values = {n: float(v) for n, v in space.values(theta).items()}
        return cls(values=values, params=space.params(theta), **rest)

    @property
    def iterations(self) -> int:
        return len(self.history)
