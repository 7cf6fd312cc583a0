"""The parameter registry (pipeline.parameter_specs): every table of engine-parameter facts derives
from it, and each spec agrees with the robot config and the optimiser."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
from pydantic import ValidationError

from pipeline.config import LoadedConfigs, SysidConfig
from pipeline.parameter_specs import NAMES, PARAMETERS, SPECS
from pipeline.physics.params import BOUNDS, ROBOT_FIELDS, UNITS, Params, robot_overlay, robot_values
from pipeline.sysid.parameters import ParameterSpace


def test_the_engine_parameters_are_the_registrys_in_its_order() -> None:
    assert tuple(f.name for f in fields(Params)) == NAMES
    assert list(BOUNDS) == list(UNITS) == list(ROBOT_FIELDS) == list(NAMES)
    assert all(BOUNDS[s.name] == s.bounds and UNITS[s.name] == s.unit for s in PARAMETERS)


def test_each_spec_names_a_robot_field_whose_default_lies_in_its_bounds(default_configs: LoadedConfigs) -> None:
    values = robot_values(default_configs.robot)
    for spec in PARAMETERS:
        section, field = spec.robot_field
        assert values[spec.name] == getattr(getattr(default_configs.robot, section), field)
        low, high = spec.bounds
        assert low <= values[spec.name] <= high, spec.name
    overlay = robot_overlay({"friction": 0.5, "passive_rest_length": 0.07})
    assert overlay == {"ground": {"friction": 0.5}, "passive_cable": {"rest_length_m": 0.07}}


def test_a_config_lists_only_registered_parameters() -> None:
    assert SysidConfig(parameters=("passive_damping",)).parameters == ("passive_damping",)
    with pytest.raises(ValidationError, match="motor_time_constant"):  # the message lists the known names
        SysidConfig(parameters=("stiffness",))


def test_the_optimiser_coordinate_is_the_specs_scale_linear_or_log(default_configs: LoadedConfigs) -> None:
    start = Params.from_robot(default_configs.robot)
    space = ParameterSpace(("friction", "actuated_damping"), start)
    friction, damping = SPECS["friction"], SPECS["actuated_damping"]
    assert not friction.log_scaled and damping.log_scaled
    p0 = float(start.friction[0])
    assert space.theta_of("friction", p0 + 0.3) == pytest.approx(0.3 / friction.scale)
    d0 = float(start.actuated_damping[0])
    assert space.theta_of("actuated_damping", 2 * d0) == pytest.approx(math.log(2.0) / damping.scale)
