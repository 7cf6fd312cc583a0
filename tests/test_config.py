"""Config loading: good files load; each kind of bad file names the file and field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.config import PipelineConfig, RobotConfig, TwinConfig, apply_overrides, config_hash, load_all, load_yaml
from pipeline.errors import ConfigError

from .conftest import DEFAULT_PIPELINE, REPO

ROBOT = REPO / "configs" / "robot" / "tribar.yaml"
TWIN = REPO / "configs" / "hardware" / "twin.yaml"


def test_relative_paths_resolve_against_the_pipeline_file_not_the_working_folder(tmp_path, monkeypatch) -> None:
    """The shipped pipeline names its robot, twin and runs folder relative to itself: a copy in
    another folder (with the configs beside it as in the repository) loads the copies, wherever
    the process runs."""
    copy = tmp_path / "configs"
    shutil.copytree(REPO / "configs", copy)
    robot = yaml.safe_load((copy / "robot" / "tribar.yaml").read_text())
    robot["rod"]["length_m"] = 0.4  # tells the copy from the original
    (copy / "robot" / "tribar.yaml").write_text(yaml.safe_dump(robot))
    monkeypatch.chdir(REPO)
    configs = load_all(copy / "pipeline" / "default.yaml")
    assert configs.robot.rod.length_m == 0.4
    assert configs.pipeline.robot_config == copy / "robot" / "tribar.yaml"
    assert configs.pipeline.hardware_config == copy / "hardware" / "twin.yaml"
    assert configs.pipeline.runs_dir == tmp_path / "runs"
    assert configs.twin == load_yaml(TWIN, TwinConfig)  # the twin copied unchanged
    assert load_all(DEFAULT_PIPELINE).robot == load_yaml(ROBOT, RobotConfig)


def _bad(tmp_path: Path, source: Path, edit) -> Path:
    data = yaml.safe_load(source.read_text())
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("edit", "field", "expectation"),
    [
        (lambda d: d["rod"].pop("length_m"), "rod.length_m", "Field required"),
        (lambda d: d["rod"].update(length_m="long"), "rod.length_m", "valid number"),
        (lambda d: d["rod"].update(length_m=-0.3), "rod.length_m", "greater than 0"),
        (lambda d: d["pid"].update(kpp=6.0), "pid.kpp", "Extra inputs are not permitted"),
        (lambda d: d["pid"].update(tolerance=1.5), "pid.tolerance", "less than 1"),
        (lambda d: d["feasibility"].update(mode="fix"), "feasibility.mode", "'reject' or 'repair'"),
        (lambda d: d["topology"].update(actuated=[[0, 1]] * 6), "topology", "same rod"),
        (lambda d: d["topology"].update(rods=[[0, 1], [2, 3], [4, 9]]), "topology.rods", "less than or equal to 5"),
        (lambda d: d["motor"].update(offset_m=0.16), "<root>", "overlaps the end cap"),
    ],
)
def test_bad_robot_config_names_file_and_field(tmp_path: Path, edit, field: str, expectation: str) -> None:
    path = _bad(tmp_path, ROBOT, edit)
    with pytest.raises(ConfigError) as info:
        load_yaml(path, RobotConfig)
    message = str(info.value)
    assert str(path) in message
    assert f"'{field}" in message
    assert expectation in message


def test_bad_twin_and_pipeline_configs(tmp_path: Path) -> None:
    path = _bad(tmp_path, TWIN, lambda d: d["sensors"].update(cable_bias_m=[0.0] * 8))
    with pytest.raises(ConfigError, match="sensors.cable_bias_m"):
        load_yaml(path, TwinConfig)
    path = _bad(tmp_path, TWIN, lambda d: d["camera"].update(max_depth_m=100.0, depth_scale_m=0.001))
    with pytest.raises(ConfigError, match="uint16"):
        load_yaml(path, TwinConfig)
    path = _bad(tmp_path, DEFAULT_PIPELINE, lambda d: d.update(campaign="has space"))
    with pytest.raises(ConfigError, match="'campaign'"):
        load_yaml(path, PipelineConfig)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_yaml(tmp_path / "missing.yaml", RobotConfig)
    broken = tmp_path / "broken.yaml"
    broken.write_text("rod: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(broken, RobotConfig)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_yaml(scalar, RobotConfig)


def test_pipeline_references_missing_robot_config(tmp_path: Path) -> None:
    path = _bad(tmp_path, DEFAULT_PIPELINE, lambda d: d.update(robot_config="nowhere.yaml"))
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_all(path)


def test_overrides(default_configs) -> None:
    changed = apply_overrides(default_configs.pipeline, {"collect.random.seed": 5}, DEFAULT_PIPELINE)
    assert changed.collect.random.seed == 5
    with pytest.raises(ConfigError, match="no field 'sed'"):
        apply_overrides(default_configs.pipeline, {"collect.random.sed": 5}, DEFAULT_PIPELINE)
    with pytest.raises(ConfigError, match="collect.segment_timeout_s"):
        apply_overrides(default_configs.pipeline, {"collect.segment_timeout_s": -1}, DEFAULT_PIPELINE)


def test_sysid_sections_take_nested_keys_and_refuse_flat_ones(default_configs) -> None:
    """``sysid`` is nested by the steps of identification: a nested key changes that step's field
    alone, a key of the flat form (``sysid.lr``) is no field, and a wrong value names its path."""
    sysid = default_configs.pipeline.sysid
    changed = sysid.updated({"gradient.lr": 0.05, "search.generations": 3})
    assert (changed.gradient.lr, changed.search.generations) == (0.05, 3)
    assert changed.loss == sysid.loss and changed.gradient.iterations == sysid.gradient.iterations
    with pytest.raises(ConfigError, match="no field 'lr'"):
        apply_overrides(default_configs.pipeline, {"sysid.lr": 0.05}, DEFAULT_PIPELINE)
    with pytest.raises(ConfigError, match="sysid.loss.kind"):
        apply_overrides(default_configs.pipeline, {"sysid.loss.kind": "l2"}, DEFAULT_PIPELINE)
    with pytest.raises(KeyError, match="no field 'mask_filter'"):
        sysid.updated({"mask_filter": False})


def test_config_hash_tracks_content(default_configs) -> None:
    robot = default_configs.robot
    assert config_hash(robot) == config_hash(robot.model_copy())
    other = robot.model_copy(update={"name": "other"})
    assert config_hash(other) != config_hash(robot)
