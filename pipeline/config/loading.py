"""Loading configs from YAML: validation with errors that name the file and the field, dotted-key
overrides, robot-config overlays and config hashes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pipeline.config.base import StrictModel
from pipeline.config.robot import RobotConfig
from pipeline.config.stages import PipelineConfig
from pipeline.config.twin import TwinConfig
from pipeline.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
S = TypeVar("S", bound=StrictModel)


def _format_validation_error(path: Path, error: ValidationError) -> str:
    lines = [f"{path}: invalid {error.title} configuration"]
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "<root>"
        got = item.get("input")
        got_text = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  field '{field}': {item['msg']}{got_text}")
    return "\n".join(lines)


def load_yaml(path: str | Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``.

    Raises :class:`ConfigError` naming the file, each offending field and what was
    expected.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(path, exc)) from exc


def config_hash(config: BaseModel) -> str:
    """Stable sha256 (hex, first 16 chars) of a config's JSON form."""
    payload = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


ROBOT_FIELD = "robot"
"""The name that stands for the robot config (its hash) among pipeline fields (:meth:`LoadedConfigs.fields`)."""


class LoadedConfigs(StrictModel):
    """A pipeline config together with the robot and hardware configs it names."""

    pipeline: PipelineConfig
    robot: RobotConfig
    twin: TwinConfig | None
    """The twin's hidden config (None without ``hardware_config``: a real robot)."""
    pipeline_path: Path

    def fields(self, names: tuple[str, ...]) -> dict[str, object]:
        """The pipeline config's fields ``names`` as JSON, each a section or a dotted field
        (``gaits.search.dt_s``), and :data:`ROBOT_FIELD` as the robot config's hash. The twin's
        config is never among them: a stage names the file (``hardware_config``), not its content."""
        out: dict[str, object] = {}
        for name in names:
            if name == ROBOT_FIELD:
                out[name] = config_hash(self.robot)
                continue
            value: object = self.pipeline
            for part in name.split("."):
                value = getattr(value, part)
            out[name] = (
                value.model_dump(mode="json")
                if isinstance(value, BaseModel)
                else json.loads(json.dumps(value, default=str))
            )
        return out


def load_all(pipeline_path: str | Path, overrides: dict[str, object] | None = None) -> LoadedConfigs:
    """Load a pipeline config and the configs it references.

    Relative paths inside the pipeline file are resolved against that file's folder.
    ``overrides`` maps dotted keys (``collect.random.seed``) to values applied before
    validation.
    """
    pipeline_path = Path(pipeline_path).resolve()
    pipeline = load_yaml(pipeline_path, PipelineConfig)
    if overrides:
        pipeline = apply_overrides(pipeline, overrides, pipeline_path)
    base = pipeline_path.parent

    def resolve(p: Path) -> Path:
        return p if p.is_absolute() else (base / p).resolve()

    pipeline = pipeline.model_copy(
        update={
            "runs_dir": resolve(pipeline.runs_dir),
            "robot_config": resolve(pipeline.robot_config),
            "hardware_config": None if pipeline.hardware_config is None else resolve(pipeline.hardware_config),
            "camera": pipeline.camera.model_copy(
                update={"bag": None if pipeline.camera.bag is None else resolve(pipeline.camera.bag)}
            ),
        }
    )
    _check_runs_dir(pipeline_path, pipeline.runs_dir)
    for field in ("robot_config", "hardware_config"):
        path = getattr(pipeline, field)
        if path is not None and not path.is_file():
            raise ConfigError(f"{pipeline_path}: field '{field}': {path} is not a file")
    robot = load_yaml(pipeline.robot_config, RobotConfig)
    twin = None if pipeline.hardware_config is None else load_yaml(pipeline.hardware_config, TwinConfig)
    return LoadedConfigs(pipeline=pipeline, robot=robot, twin=twin, pipeline_path=pipeline_path)


def _check_runs_dir(source: Path, runs_dir: Path) -> None:
    """Refuse a ``runs_dir`` that cannot be a writable folder (before anything is written)."""
    existing = runs_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{source}: field 'runs_dir': {runs_dir} cannot be a folder ({existing} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{source}: field 'runs_dir': {runs_dir} is not writable ({existing})")


def apply_overrides(config: S, overrides: dict[str, object], source: Path) -> S:
    """Return ``config`` with dotted-key overrides applied and re-validated."""
    try:
        return config.updated(overrides)
    except KeyError as exc:
        raise ConfigError(f"{source}: override {exc.args[0]}") from exc
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc)) from exc


def _deep_merge(base: dict, overlay: dict, path: str, source: Path) -> dict:
    merged = dict(base)
    for key, value in overlay.items():
        where = f"{path}.{key}" if path else key
        if key not in base:
            raise ConfigError(f"{source}: overlay field '{where}' does not exist in the robot config")
        if isinstance(value, dict) and isinstance(base[key], dict):
            merged[key] = _deep_merge(base[key], value, where, source)
        else:
            merged[key] = value
    return merged


def robot_with_overlay(robot: RobotConfig, overlay: dict[str, object], source: Path) -> RobotConfig:
    """``robot`` with a nested overlay (e.g. ``{"attachment": {"phase_rad": [...]}}``, as the
    attach and sysid stages write) merged in and re-validated; ``source`` names the overlay in errors."""
    merged = _deep_merge(robot.model_dump(mode="json"), overlay, "", source)
    try:
        return RobotConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(source, exc)) from exc
