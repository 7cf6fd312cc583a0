"""The stage table (flows.stages): the flow, ``status``, ``rerun`` and every cache key derive from
it, so one entry adds a stage."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal, get_args, get_origin

from prefect import task
from pydantic import BaseModel
from typer.testing import CliRunner

from flows import stages as stage_table
from flows.caching import stage_cache_key
from flows.stages import Call, Stage
from pipeline.config import ROBOT_FIELD, LoadedConfigs, load_all
from storage.layout import Ref, RunLayout, write_manifest

from .conftest import write_test_pipeline

CALLS: list[int] = []


@task(name="dummy")
def dummy(configs: LoadedConfigs, iteration: int, mlflow_run_id: str, collect_ref: dict[str, str]) -> dict[str, str]:
    """A stage that writes one file naming the collect output it read."""
    CALLS.append(iteration)
    stage_dir = RunLayout.of(configs).stage_dir(iteration, "dummy")
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "read.json").write_text(json.dumps(collect_ref))
    return write_manifest(stage_dir, "dummy", complete=True, summary={}).to_json()


DUMMY = Stage("dummy", dummy, inputs=("collect",), version="1", sections=("track", ROBOT_FIELD))


def test_the_table_names_every_stage_once_in_flow_order(default_configs: LoadedConfigs) -> None:
    names = stage_table.stage_names()
    assert names == ("collect", "track", "attach", "sysid", "learn", "gaits", "actions", "redeploy", "evaluate")
    assert stage_table.hardware_stages() == ("collect", "redeploy")
    learned = default_configs.updated({"pipeline.engine.contact": "learned"})
    for configs in (default_configs, learned):  # every input runs before the stage that reads it
        for stage in stage_table.TABLE:
            assert all(names.index(name) < names.index(stage.name) for name in stage.inputs_of(configs)), stage.name
    [gaits] = [stage for stage in stage_table.TABLE if stage.name == "gaits"]
    assert gaits.inputs_of(default_configs) == ("attach", "sysid")
    assert gaits.inputs_of(learned) == ("attach", "sysid", "learn")


def test_a_stage_key_is_its_identity_inputs_sections_and_version(default_configs: LoadedConfigs) -> None:
    """The key changes with the input's hash, the config sections named and the version, and with
    nothing else (another section's change leaves it)."""
    call = Call(default_configs, 1, {"collect": {"path": "x", "sha256": "a"}}, fresh=False)
    key = DUMMY.cache_key(None, DUMMY.parameters(call))
    assert key.startswith("dummy-v1-")
    assert key == stage_cache_key("dummy", "1", default_configs, 1, {"collect": {"sha256": "a"}}, DUMMY.sections)
    other_input = dataclasses.replace(call, refs={"collect": {"path": "x", "sha256": "b"}})
    assert DUMMY.cache_key(None, DUMMY.parameters(other_input)) != key
    for section, field, value in (("track", "gate_m", 0.2), ("sysid", "gradient.lr", 0.5)):
        changed = default_configs.updated({f"pipeline.{section}.{field}": value})
        changed_call = dataclasses.replace(call, configs=changed)
        same = DUMMY.cache_key(None, DUMMY.parameters(changed_call)) == key
        assert same is (section not in DUMMY.sections), section
    assert dataclasses.replace(DUMMY, version="2").cache_key(None, DUMMY.parameters(call)).startswith("dummy-v2-")


EVERY_STAGE = frozenset(stage_table.stage_names())
READERS: dict[str, frozenset[str]] = {
    "campaign": EVERY_STAGE,  # identity: every key holds it
    "runs_dir": EVERY_STAGE,
    "hardware_backend": frozenset({"collect", "sysid", "redeploy", "evaluate"}),  # sysid, evaluate: the truth
    "hardware_config": frozenset({"sysid", "evaluate"}),  # their figures against the truth; the hardware
    # stages record the robot the file describes, which may change like a real one (tasks.collect.KEY_FIELDS)
    "collect": frozenset({"collect"}),
    "collect.record_frames": frozenset({"collect", "redeploy"}),
    "collect.segment_timeout_s": frozenset({"collect", "sysid", "learn"}),
    "track": frozenset({"track", "redeploy"}),  # redeploy tracks every run it records
    "attach": frozenset({"attach"}),
    "sysid": frozenset({"sysid"}),
    "learn": frozenset({"learn"}),
    "gaits": frozenset({"gaits"}),
    "gaits.search.dt_s": frozenset({"gaits", "actions", "evaluate"}),  # they simulate at the search's step
    "redeploy": frozenset({"redeploy", "evaluate"}),
    "redeploy.segment_timeout_s": frozenset({"gaits", "learn", "actions", "redeploy", "evaluate"}),
    "engine.contact": frozenset({"gaits", "actions"}),  # the engine they judge and tabulate in
    "follow.table": frozenset({"actions"}),
    "follow.planner.max_spread_m": frozenset({"actions"}),  # the summary's share of usable entries
    "follow.planner.max_spread_deg": frozenset({"actions"}),
}
"""Which stages' outputs each pipeline config field changes (the most specific prefix, here or in
:data:`NO_OUTPUT`, applies), read off the code: ``tasks/<stage>.py`` and what it calls."""
NO_OUTPUT = {
    "robot_config": "a path; the robot config's content is keyed by its hash",
    "collect.checkpoint_every_s": "how often a recording is flushed to disk, not what it holds",
    "redeploy.concurrent_runs": "whether the runs are submitted at once; each run records alone",
    "runner": "where the tasks run, not what they compute",
    "engine.compiled": "the compiled step equals the eager one (test_engine checks it)",
    "follow.planner": "trajectory following is a command of its own, not a stage (docs/follow.md)",
    "follow.end_radius_m": "trajectory following is a command of its own, not a stage",
    "follow.max_actions": "trajectory following is a command of its own, not a stage",
    "follow.corridor_m": "trajectory following is a command of its own, not a stage",
    "network": "where the robot is reached, not what it records",
    "camera": "which camera watches the robot: part of the hardware, which (like hardware_config) may change "
    "without making a recording stale (record anew with --recollect)",
    "bag_import": "read by r2s2r import-bag, a command of its own, not a stage",
}
"""Fields that change no stage's output, and why."""


def _leaves(model: BaseModel, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        path = f"{prefix}{name}"
        out += _leaves(value, f"{path}.") if isinstance(value, BaseModel) else [(path, value)]
    return out


def _other_values(value: object) -> list[object]:
    """Candidate values other than ``value``, as YAML would give them (the first valid one is used)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value * 1.5 + 0.01, value * 0.5]
    if isinstance(value, Path):
        return [str(value) + "-other"]
    if isinstance(value, str):
        return [
            "learned",
            "analytic",
            "onboard",
            "camera",
            "cw",
            "ccw",
            "straight",
            "dask",
            "processes",
            "all_step",
            "redeploy_and_random",
            "network",
            "held",
            "mujoco",
            "bfloat16",
            f"{value}-other",
        ]
    if isinstance(value, tuple) and value:
        if isinstance(value[0], BaseModel):
            return [[v.model_dump(mode="json") for v in value[:-1]]]
        return [list(value[:-1]), list(reversed(value)), [value[0]], [*value, value[-1]]]
    if isinstance(value, tuple):
        return [["friction"], [0.5]]
    if value is None:
        return [2, [0.0, 0.5, 1.0], "127.0.0.1:8786", ["roll_150"]]
    if isinstance(value, dict):
        return [{"friction": {"value": 0.7, "scale": 0.1}}, {"friction": 0.2}]
    raise AssertionError(f"no other value for {value!r}")


def _only_value(model: BaseModel, field: str) -> bool:
    """Whether ``field`` admits one value (a one-member ``Literal``): nothing to change."""
    *parents, last = field.split(".")
    for part in parents:
        model = getattr(model, part)
    annotation = type(model).model_fields[last].annotation
    return get_origin(annotation) is Literal and len(get_args(annotation)) == 1


def _specificity(field: str, prefixes: dict[str, object]) -> int:
    """The length of the longest of ``prefixes`` that ``field`` falls under (0: none)."""
    return max((len(p) for p in prefixes if field == p or field.startswith(f"{p}.")), default=0)


def _readers(field: str) -> frozenset[str] | None:
    prefixes = [p for p in READERS if field == p or field.startswith(f"{p}.")]
    return READERS[max(prefixes, key=len)] if prefixes else None


def test_every_stage_key_covers_every_config_field_that_changes_its_output(default_configs: LoadedConfigs) -> None:
    """Walk every field of the pipeline config: changed to another valid value, it must change
    the key of every stage whose output it changes (:data:`READERS`), or be one that changes no
    output (:data:`NO_OUTPUT`, with why). A new field fails here until it is placed. The robot
    config's content is in every key."""

    def keys(configs: LoadedConfigs) -> dict[str, str]:
        return {s.name: stage_cache_key(s.name, s.version, configs, 1, {}, s.sections) for s in stage_table.TABLE}

    base = keys(default_configs)
    missed = {}
    for field, value in _leaves(default_configs.pipeline):
        if _specificity(field, NO_OUTPUT) > _specificity(field, READERS):
            continue
        readers = _readers(field)
        assert readers is not None, f"{field}: say which stages' outputs it changes (READERS) or why none (NO_OUTPUT)"
        for other in _other_values(value):
            try:
                changed = default_configs.updated({f"pipeline.{field}": other})
            except (ValueError, KeyError):
                continue
            if changed.pipeline != default_configs.pipeline:
                break
        else:
            if _only_value(default_configs.pipeline, field):
                continue
            raise AssertionError(f"{field}: no other valid value among {_other_values(value)}")
        new = keys(changed)
        unchanged = sorted(stage for stage in readers if new[stage] == base[stage])
        if unchanged:
            missed[field] = unchanged
    assert not missed, f"fields that change these stages' outputs but not their keys: {missed}"
    robot = default_configs.updated({"robot.pid.kp": default_configs.robot.pid.kp + 1})
    assert all(keys(robot)[stage] != base[stage] for stage in EVERY_STAGE)


def test_the_gaits_key_covers_the_learn_output_only_when_the_learned_contact_judges(
    default_configs: LoadedConfigs,
) -> None:
    """With ``engine.contact: analytic`` the gaits stage neither reads nor keys the learn stage's
    output (a new contact model leaves the gaits and the redeploy runs they feed alone); with
    ``learned`` it reads it, and another model makes it stale."""
    [gaits] = [stage for stage in stage_table.TABLE if stage.name == "gaits"]
    refs = {name: {"path": name, "sha256": name} for name in ("attach", "sysid")}
    learned = default_configs.updated({"pipeline.engine.contact": "learned"})
    keys = {}
    for label, configs in (("analytic", default_configs), ("learned", learned)):
        for model in ("a", "b"):
            call = Call(configs, 1, {**refs, "learn": {"path": "learn", "sha256": model}}, fresh=False)
            parameters = gaits.parameters(call)
            assert ("learn_ref" in parameters) is (label == "learned")
            keys[label, model] = gaits.cache_key(None, parameters)
    assert keys["analytic", "a"] == keys["analytic", "b"]
    assert keys["learned", "a"] != keys["learned", "b"]
    assert keys["analytic", "a"] != keys["learned", "a"]


def test_a_stage_added_to_the_table_runs_in_the_flow_and_shows_in_status(
    prefect_server, tmp_path: Path, monkeypatch
) -> None:
    """A dummy stage after collect, added to a copy of the table: the flow runs it (then takes it
    from the cache, or recomputes it when refreshed, as ``r2s2r rerun`` asks), ``status`` and
    ``r2s2r status`` show it, and a change of a section in its key makes it stale while one
    outside its key does not."""
    from flows.cli import app
    from flows.iteration import r2s2r_iteration
    from flows.status import stage_status

    monkeypatch.setattr(stage_table, "TABLE", (*stage_table.TABLE, DUMMY))
    config = str(write_test_pipeline(tmp_path, campaign="dummy", n_targets=1, record_frames=False))
    configs = load_all(config)
    CALLS.clear()

    first = r2s2r_iteration(config, iteration=1, stages=["collect", "dummy"])
    second = r2s2r_iteration(config, iteration=1, stages=["dummy"])
    assert CALLS == [1]
    collect_ref = first["stages"]["collect"]["ref"]
    assert first["stages"]["dummy"]["cached"] is False and second["stages"]["dummy"]["cached"] is True
    dummy_dir = Path(first["stages"]["dummy"]["ref"]["path"])
    assert json.loads((dummy_dir / "read.json").read_text()) == collect_ref
    assert Ref.from_json(second["stages"]["dummy"]["ref"]) == Ref.from_json(first["stages"]["dummy"]["ref"])

    assert stage_status(configs, 1)["dummy"] == "cached"
    assert stage_status(load_all(config, {"track.gate_m": 0.2}), 1)["dummy"] == "stale"
    assert stage_status(load_all(config, {"sysid.gradient.lr": 0.5}), 1)["dummy"] == "cached"
    shown = CliRunner().invoke(app, ["status", "--config", config], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    assert "dummy" in shown.output

    refreshed = r2s2r_iteration(config, iteration=1, stages=["dummy"], refresh=["dummy"])  # as r2s2r rerun asks
    assert CALLS == [1, 1] and refreshed["stages"]["dummy"]["cached"] is False
