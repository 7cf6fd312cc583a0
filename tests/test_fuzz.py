"""Bad input, many kinds of it: every case ends in exit status 2 with a message that names the
file or the field, no traceback, and the files under the runs folder as they were.

Five families: pipeline, robot and twin config files; ``--set`` overrides; recordings in a
collect stage (read by ``r2s2r rerun track``); Tribar folders (``r2s2r import-tribar``); paths
to follow (``r2s2r follow``). The
runs folder is compared by the sha256 of every file before and after, except the tracking
stores (``mlflow.db``, ``mlartifacts/``, ``.prefect/``): a flow that starts and then meets a bad
recording logs its failed run there, which is the record of the attempt, not data.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from pipeline.config import load_all
from storage.layout import read_manifest, write_manifest
from storage.recording import FRAMES_FILE, HARDWARE_FILE
from storage.tribar import export_tribar
from tasks.collect import run_collect

from .conftest import REPO, write_test_pipeline

TRACKING_STORES = ("mlflow.db", "mlartifacts", ".prefect")


def _snapshot(runs: Path) -> dict[str, str]:
    """sha256 of every file under ``runs`` but the tracking stores."""
    if not runs.exists():
        return {}
    return {
        p.relative_to(runs).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(runs.rglob("*"))
        if p.is_file() and not p.relative_to(runs).parts[0].startswith(TRACKING_STORES)
    }


def _refused(args: list[str], runs: Path, names: tuple[str, ...]) -> str:
    """Run the CLI; assert exit status 2, no traceback, a message naming each of ``names``, and
    the runs folder unchanged; return the message (line wrapping undone)."""
    before = _snapshot(runs)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    message = " ".join((result.stdout + result.stderr).split())
    assert result.exit_code == 2, f"exit {result.exit_code}: {message}"
    assert isinstance(result.exception, SystemExit) and "Traceback" not in message
    unwrapped = "".join(message.split())  # the console may wrap a long path anywhere
    for name in names:
        assert "".join(name.split()) in unwrapped, f"{name!r} not in: {message}"
    assert _snapshot(runs) == before
    return message


# --- config files ---------------------------------------------------------------------------


def _pipeline_yaml(tmp_path: Path) -> dict:
    """A valid pipeline config (absolute paths, runs under ``tmp_path``) as a dict to spoil."""
    data = yaml.safe_load((REPO / "configs" / "pipeline" / "default.yaml").read_text())
    data["robot_config"] = str(REPO / "configs" / "robot" / "tribar.yaml")
    data["hardware_config"] = str(REPO / "configs" / "hardware" / "twin.yaml")
    data["runs_dir"] = str(tmp_path / "runs")
    return data


def _set(*path_value: object) -> Callable[[dict], None]:
    *path, value = path_value

    def edit(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _drop(*path: str) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return edit


PIPELINE_CASES: dict[str, tuple[Callable[[dict], None], tuple[str, ...]]] = {
    "timeout is text": (_set("collect", "segment_timeout_s", "soon"), ("collect.segment_timeout_s",)),
    "timeout negative": (_set("collect", "segment_timeout_s", -1.0), ("collect.segment_timeout_s",)),
    "no collect section": (_drop("collect"), ("collect",)),
    "unknown top-level key": (_set("colect", {}), ("colect",)),
    "unknown nested key": (_set("track", "gate", 0.1), ("track.gate",)),
    "campaign escapes": (_set("campaign", ".."), ("campaign",)),
    "campaign has a slash": (_set("campaign", "a/b"), ("campaign",)),
    "campaign is hidden": (_set("campaign", ".x"), ("campaign",)),
    "runs_dir under a file": (_set("runs_dir", "/dev/null/runs"), ("runs_dir", "/dev/null")),
    "robot config missing": (_set("robot_config", "/nonexistent/robot.yaml"), ("/nonexistent/robot.yaml",)),
    "twin config missing": (_set("hardware_config", "/nonexistent/twin.yaml"), ("/nonexistent/twin.yaml",)),
    "unknown policy": (_set("collect", "policy", "moonwalk"), ("collect.policy",)),
    "zero targets": (_set("collect", "random", "n_targets", 0), ("collect.random.n_targets",)),
    "unknown sysid parameter": (_set("sysid", "parameters", ["gravity"]), ("sysid.parameters",)),
    "unknown turn": (_set("gaits", "turn", "left"), ("gaits.turn",)),
    "unknown contact": (_set("engine", "contact", "magic"), ("engine.contact",)),
    "unknown backend": (_set("hardware_backend", "ros"), ("hardware_backend",)),
    "track method": (_set("track", "method", "lidar"), ("track.method",)),
    "redeploy start is text": (_set("redeploy", "starts", ["north"]), ("redeploy.starts",)),
}


@pytest.mark.parametrize("case", sorted(PIPELINE_CASES))
def test_a_bad_pipeline_config_is_refused(tmp_path: Path, case: str) -> None:
    edit, names = PIPELINE_CASES[case]
    data = _pipeline_yaml(tmp_path)
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    _refused(["collect", "--config", str(path)], tmp_path / "runs", (str(path), *names))
    assert not (tmp_path / "runs").exists()  # nothing ran


FILE_CASES: dict[str, tuple[str, str]] = {
    "pipeline not YAML": ("pipeline", "collect: [unclosed\n"),
    "pipeline empty": ("pipeline", ""),
    "pipeline a list": ("pipeline", "- 1\n- 2\n"),
    "robot not YAML": ("robot", "rod: {length_m: 0.3\n"),
    "robot rod negative": ("robot", "rod_length"),
    "twin unknown key": ("twin", "twin_key"),
}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_a_bad_config_file_is_refused(tmp_path: Path, case: str) -> None:
    which, text = FILE_CASES[case]
    data = _pipeline_yaml(tmp_path)
    pipeline = tmp_path / "pipeline.yaml"
    names: tuple[str, ...]
    if which == "pipeline":
        pipeline.write_text(text)
        names = (str(pipeline),)
    else:
        robot = yaml.safe_load((REPO / "configs" / "robot" / "tribar.yaml").read_text())
        twin = yaml.safe_load((REPO / "configs" / "hardware" / "twin.yaml").read_text())
        target = tmp_path / f"{which}.yaml"
        if text == "rod_length":
            robot["rod"]["length_m"] = -0.3
            target.write_text(yaml.safe_dump(robot))
            names = (str(target), "rod.length_m")
        elif text == "twin_key":
            twin["ground"]["stickiness"] = 1.0
            target.write_text(yaml.safe_dump(twin))
            names = (str(target), "ground.stickiness")
        else:
            target.write_text(text)
            names = (str(target),)
        data["robot_config" if which == "robot" else "hardware_config"] = str(target)
        pipeline.write_text(yaml.safe_dump(data))
    _refused(["collect", "--config", str(pipeline)], tmp_path / "runs", names)
    assert not (tmp_path / "runs").exists()


# --- --set overrides ------------------------------------------------------------------------

SET_CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "unclosed list": ("x=[unclosed", ("x=[unclosed", "not valid YAML")),
    "no equals sign": ("novalue", ("novalue", "expected key.path=value")),
    "empty key": ("=3", ("'=3'", "expected key.path=value")),
    "unknown field": ("collect.random.sed=3", ("no field 'sed'",)),
    "seed is text": ("collect.random.seed=abc", ("collect.random.seed",)),
    "campaign escapes": ("campaign=..", ("campaign",)),
    "runs_dir under a file": ("runs_dir=/dev/null/runs", ("runs_dir", "/dev/null")),
    "unknown policy": ("collect.policy=bogus", ("collect.policy", "bogus")),
    "negative targets": ("collect.random.n_targets=-5", ("collect.random.n_targets",)),
    "zero step": ("sysid.dt_s=0", ("sysid.dt_s",)),
    "unknown contact": ("engine.contact=magic", ("engine.contact",)),
    "unknown track method": ("track.method=lidar", ("track.method",)),
    "section replaced by a number": ("gaits=3", ("gaits",)),
}


@pytest.mark.parametrize("case", sorted(SET_CASES))
def test_a_bad_override_is_refused_before_anything_runs(tmp_path: Path, case: str) -> None:
    value, names = SET_CASES[case]
    config = write_test_pipeline(tmp_path)
    _refused(["collect", "--config", str(config), "--set", value], tmp_path / "runs", names)
    assert not (tmp_path / "runs").exists()


# --- recordings -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a pipeline config and a complete twin collection (two targets) to copy."""
    root = tmp_path_factory.mktemp("collected")
    configs = load_all(write_test_pipeline(root, campaign="fuzz", n_targets=2))
    run_collect(configs, 1)
    return root


def _rewrite(path: Path, edit: Callable[[pa.Table], pa.Table]) -> None:
    table = edit(pq.read_table(path))
    pq.write_table(table, path)


def _replace_column(name: str, values: Callable[[np.ndarray], np.ndarray]) -> Callable[[pa.Table], pa.Table]:
    def edit(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index(name)
        column = pa.array(values(table.column(name).to_numpy()))
        return table.set_column(index, pa.field(name, column.type), column)

    return edit


RECORDING_CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...]]] = {
    "truncated": (HARDWARE_FILE, lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), ("Parquet",)),
    "not Parquet": (HARDWARE_FILE, lambda p: p.write_text("t,cable_0\n0,0.1\n"), ("Parquet",)),
    "no metadata": (HARDWARE_FILE, lambda p: _rewrite(p, lambda t: t.replace_schema_metadata({})), ("metadata",)),
    "missing column": (HARDWARE_FILE, lambda p: _rewrite(p, lambda t: t.drop(["cable_3"])), ("cable_3",)),
    "column of text": (
        HARDWARE_FILE,
        lambda p: _rewrite(p, _replace_column("cable_0", lambda v: v.astype(str))),
        ("cable_0",),
    ),
    "NaN stamps": (HARDWARE_FILE, lambda p: _rewrite(p, _replace_column("t", lambda v: v * np.nan)), ("'t'",)),
    "time runs backwards": (HARDWARE_FILE, lambda p: _rewrite(p, _replace_column("t", lambda v: v[::-1])), ("'t'",)),
    "target out of range": (
        HARDWARE_FILE,
        lambda p: _rewrite(p, _replace_column("target_0", lambda v: v + 2.0)),
        ("target_",),
    ),
    "other source": (
        HARDWARE_FILE,
        lambda p: shutil.copy(p.with_name("groundtruth.parquet"), p),
        ("expected source 'hardware'",),
    ),
    "frames truncated": (FRAMES_FILE, lambda p: p.write_bytes(p.read_bytes()[:2000]), ("Parquet",)),
}


@pytest.mark.parametrize("case", sorted(RECORDING_CASES))
def test_a_bad_recording_is_refused_by_the_stage_that_reads_it(collected: Path, tmp_path: Path, case: str) -> None:
    """The recording is spoiled and its manifest written anew to match (a file some other tool
    wrote, not one corrupted on disk, which ``status`` reports and the flow keeps aside): the
    track stage refuses it, naming the file."""
    name, spoil, names = RECORDING_CASES[case]
    config = write_test_pipeline(tmp_path, campaign="fuzz", n_targets=2)
    source = collected / "runs" / "fuzz" / "iter_1" / "collect"
    stage = tmp_path / "runs" / "fuzz" / "iter_1" / "collect"
    shutil.copytree(source, stage)
    [path] = stage.glob(f"*/{name}")
    spoil(path)
    summary = json.loads((stage / "manifest.json").read_text())["summary"]
    read_manifest(write_manifest(stage, "collect", complete=True, summary=summary))
    _refused(["rerun", "track", "--config", str(config)], tmp_path / "runs", (str(path), *names))


# --- Tribar folders -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tribar(collected: Path) -> Path:
    """The collection exported in the Tribar layout."""
    folder = collected / "tribar"
    [recording] = (collected / "runs" / "fuzz" / "iter_1" / "collect").glob(f"*/{HARDWARE_FILE}")
    export_tribar(recording.parent, folder, start_time_s=1_700_000_000.0)
    return folder


def _edit_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def spoil(src: Path) -> None:
        payload = json.loads((src / "config.json").read_text())
        edit(payload)
        (src / "config.json").write_text(json.dumps(payload))

    return spoil


def _truncate_pngs(src: Path) -> None:
    for png in (src / "color").glob("*.png"):
        png.write_bytes(png.read_bytes()[:64])


TRIBAR_CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...], tuple[str, ...]]] = {
    "no config.json": (lambda src: (src / "config.json").unlink(), ("config.json",), ()),
    "config.json not JSON": (lambda src: (src / "config.json").write_text("{"), ("config.json",), ()),
    "no intrinsics": (_edit_config(lambda c: c.pop("cam_intr")), ("cam_intr",), ()),
    "intrinsics of text": (_edit_config(lambda c: c.update(cam_intr="wide")), ("cam_intr",), ()),
    "every color image truncated": (_truncate_pngs, ("usable frame",), ()),
    "no data files": (lambda src: shutil.rmtree(src / "data"), ("usable frame",), ()),
    "a file, not a folder": (lambda src: (shutil.rmtree(src), src.write_text("x")), ("not a folder",), ()),
    "bad extrinsics option": (lambda src: None, ("--extrinsics",), ("--extrinsics", "sideways")),
    "share above one": (lambda src: None, ("--min-share",), ("--min-share", "2")),
}


@pytest.mark.parametrize("case", sorted(TRIBAR_CASES))
def test_a_bad_tribar_folder_is_refused(tribar: Path, tmp_path: Path, case: str) -> None:
    spoil, names, options = TRIBAR_CASES[case]
    src = tmp_path / "src"
    shutil.copytree(tribar, src)
    spoil(src)
    config = write_test_pipeline(tmp_path, campaign="real")
    args = ["import-tribar", str(src), "--config", str(config), *options]
    _refused(args, tmp_path / "runs", names)
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


# --- paths to follow ------------------------------------------------------------------------

PATH_CASES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "one waypoint": ("one.yaml", "- [0.0, 0.0]\n", ("one.yaml", "at least two distinct waypoints")),
    "NaN waypoint": ("nan.csv", "x,y\n0,0\nnan,1\n", ("nan.csv", "finite")),
    "not YAML or CSV": ("path.txt", "0 0\n1 1\n", ("path.txt", "YAML")),
    "not valid YAML": ("bad.yaml", "- [0, 0\n", ("bad.yaml", "not valid YAML")),
    "outside the camera's view": ("", "line:20", ("line:20", "outside the camera's view")),
    "unknown built-in": ("", "spiral", ("spiral", "built-ins")),
    "negative size": ("", "arc:-1", ("arc:-1", "positive")),
}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_a_bad_path_to_follow_is_refused_before_the_robot_moves(tmp_path: Path, case: str) -> None:
    name, text, names = PATH_CASES[case]
    spec = text
    if name:
        spec = str(tmp_path / name)
        Path(spec).write_text(text)
    config = write_test_pipeline(tmp_path, campaign="follow")
    _refused(["follow", spec, "--config", str(config)], tmp_path / "runs", names)
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]


def test_the_fuzz_covers_forty_cases() -> None:
    families = (PIPELINE_CASES, FILE_CASES, SET_CASES, RECORDING_CASES, TRIBAR_CASES, PATH_CASES)
    assert sum(len(cases) for cases in families) >= 40
