"""The registry of the engine's identifiable parameters: one spec per parameter.

Each :class:`ParameterSpec` keeps together what the rest of the code needs to know of a parameter:
its unit, its physical bounds, the robot-config field that holds its nominal (or identified)
value, the scale of its optimiser coordinate and whether that coordinate is logarithmic. The
engine's bounds and units (:mod:`pipeline.physics.params`), the robot-config overlay that sysid
writes, the optimiser's coordinates (:mod:`pipeline.sysid.parameters`) and the names a config may
list (:data:`pipeline.config.EngineParameter`) all derive from :data:`PARAMETERS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParameterSpec:
    """One identifiable engine parameter.

    ``bounds`` are physical (low, high) in ``unit``; a value outside them is an error, never
    clamped. ``robot_field`` is the (section, field) of the robot config that holds the value.
    The optimiser's coordinate is ``(p - p0) / scale``, or ``ln(p / p0) / scale`` when
    ``log_scaled`` (a stiffness or damping changes by a factor), so one learning rate suits all.
    """

    name: str
    unit: str
    bounds: tuple[float, float]
    robot_field: tuple[str, str]
    scale: float
    log_scaled: bool
    description: str


PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec("motor_speed", "1", (0.01, 2.0), ("motor", "speed"), 1.0, False, "s in omega = s * omega_max * u"),
    ParameterSpec(
        "motor_time_constant",
        "s",
        (0.0, 0.5),
        ("motor", "time_constant_s"),
        0.05,
        False,
        "first-order lag of the motor speed behind its command",
    ),
    ParameterSpec("friction", "1", (0.0, 2.0), ("ground", "friction"), 1.0, False, "Coulomb coefficient, ground"),
    ParameterSpec("restitution", "1", (0.0, 1.0), ("ground", "restitution"), 1.0, False, "ground"),
    ParameterSpec(
        "actuated_stiffness",
        "N/m",
        (1.0, 1e4),
        ("actuated_cable", "stiffness_n_per_m"),
        1.0,
        True,
        "actuated cables",
    ),
    ParameterSpec(
        "actuated_damping",
        "N s/m",
        (0.0, 100.0),
        ("actuated_cable", "damping_n_s_per_m"),
        1.0,
        True,
        "actuated cables",
    ),
    ParameterSpec(
        "passive_stiffness", "N/m", (0.1, 1e4), ("passive_cable", "stiffness_n_per_m"), 1.0, True, "passive tendons"
    ),
    ParameterSpec(
        "passive_cubic_stiffness",
        "N/m^3",
        (0.0, 1e6),
        ("passive_cable", "cubic_stiffness_n_per_m3"),
        100.0,
        False,
        "passive tendons, cubic term",
    ),
    ParameterSpec(
        "passive_damping",
        "N s/m",
        (0.0, 100.0),
        ("passive_cable", "damping_n_s_per_m"),
        1.0,
        True,
        "passive tendons",
    ),
    ParameterSpec(
        "passive_rest_length", "m", (0.01, 0.5), ("passive_cable", "rest_length_m"), 0.02, False, "passive tendons"
    ),
)
"""Every identifiable engine parameter, in the order of :class:`pipeline.physics.params.Params`."""

SPECS: dict[str, ParameterSpec] = {spec.name: spec for spec in PARAMETERS}
NAMES: tuple[str, ...] = tuple(SPECS)
