"""Tribar-layout export and import: a twin recording round trip, bad input, the stage and the CLI."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import DataError
from storage.frames import frames_meta, iter_frames
from storage.layout import read_manifest
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.trajectory import CABLE_COLS, CONTROL_COLS, TARGET_COLS, imu_cols, read_trajectory, write_trajectory
from storage.tribar import EXPORT_MAX_SPEED, Extrinsics, export_tribar, import_tribar, source_digest
from tasks.collect import run_collect
from tasks.import_recording import import_policy_name, run_import

from .conftest import write_test_pipeline

START_S = 1_700_000_000.0  # a ROS-like absolute time stamp for header.secs
IMU_COLS = [c for r in range(3) for c in imu_cols(r)]


class Recording:
    """A twin collection (``folder``), its export (``tribar``) and the pipeline config that made it."""

    def __init__(self, root: Path) -> None:
        self.config_path = write_test_pipeline(root, campaign="twin", n_targets=2)
        self.configs: LoadedConfigs = load_all(self.config_path)
        ref, summary = run_collect(self.configs, iteration=1)
        self.folder = Path(ref.path) / summary["policy_id"]
        self.tribar = root / "Tribar run #1"
        self.n_frames = export_tribar(self.folder, self.tribar, start_time_s=START_S)
        self.hardware, _ = read_trajectory(self.folder / HARDWARE_FILE, expect_source="hardware")
        self.frames = list(iter_frames(self.folder / FRAMES_FILE))
        t_hw = self.hardware["t"].to_numpy()
        t_frames = np.array([f.t_s for f in self.frames])
        self.nearest = np.abs(t_hw[None, :] - t_frames[:, None]).argmin(axis=1)  # sensor row of each frame

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.tribar, dest)
        return dest


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return Recording(tmp_path_factory.mktemp("tribar"))


def _import(src: Path, dest: Path, **kw):
    return import_tribar(src, dest, campaign="real", iteration=1, policy_id="real-1", robot_config_hash="h", **kw)


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    payload = json.loads(path.read_text())
    edit(payload)
    path.write_text(json.dumps(payload))


def test_export_writes_the_tribar_layout(rec: Recording) -> None:
    assert rec.n_frames == len(rec.frames) > 10
    assert {p.name for p in rec.tribar.iterdir()} == {"color", "depth", "data", "config.json"}
    assert sorted(p.name for p in (rec.tribar / "data").iterdir())[:2] == ["0000.json", "0001.json"]
    row = rec.hardware.iloc[rec.nearest[3]]
    data = json.loads((rec.tribar / "data" / "0003.json").read_text())
    assert data["header"] == {"seq": int(rec.nearest[3]), "secs": START_S + row["t"]}
    assert data["sensors"]["4"]["length"] == pytest.approx(row["cable_4"] * 1000, abs=5e-4)  # mm
    assert data["motors"]["2"]["target"] == row["target_2"]
    assert data["motors"]["5"]["speed"] == pytest.approx(row["control_5"] * EXPORT_MAX_SPEED)
    assert data["imu"]["1"]["orientation"] == {a: row[f"imu1_q{a}"] for a in "wxyz"}
    bgr = cv2.imread(str(rec.tribar / "color" / "0003.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(bgr[..., ::-1], rec.frames[3].rgb)  # BGR on disk
    config = json.loads((rec.tribar / "config.json").read_text())
    assert config["depth_scale"] == pytest.approx(1 / rec.configs.twin.camera.depth_scale_m)
    assert (config["im_w"], config["im_h"]) == (320, 240)


def test_round_trip_reproduces_sensors_images_and_camera(rec: Recording, tmp_path: Path) -> None:
    report = _import(rec.tribar, tmp_path / "imported")
    assert report.n_candidates == report.n_imported == rec.n_frames
    assert report.skipped == {} and report.n_time_fixed == 0
    assert report.control_recorded and report.imu_rods == (0, 1, 2) and report.notes == []

    hw, meta = read_trajectory(tmp_path / "imported" / HARDWARE_FILE, expect_source="hardware")
    orig = rec.hardware.iloc[rec.nearest].reset_index(drop=True)
    assert meta.complete and meta.control_recorded and meta.policy_id == "real-1"
    assert meta.model_extra["start_time_s"] == START_S
    assert len(hw) == rec.n_frames
    assert np.abs(hw[CABLE_COLS] - orig[CABLE_COLS]).to_numpy().max() <= 0.5e-6 + 1e-12  # 1 µm rounding in mm
    np.testing.assert_array_equal(hw[TARGET_COLS], orig[TARGET_COLS])
    np.testing.assert_allclose(hw[CONTROL_COLS], orig[CONTROL_COLS], atol=1e-12)
    np.testing.assert_array_equal(hw[IMU_COLS], orig[IMU_COLS])
    np.testing.assert_allclose(hw["t"], orig["t"] - orig["t"].iloc[0], atol=1e-6)
    _, rank = np.unique(orig["segment"], return_inverse=True)
    np.testing.assert_array_equal(hw["segment"], rank)
    distinct = orig[TARGET_COLS].to_numpy()[np.r_[True, np.diff(rank) > 0]]
    np.testing.assert_array_equal(report.targets, distinct)

    imported = list(iter_frames(tmp_path / "imported" / FRAMES_FILE))
    assert len(imported) == rec.n_frames
    for new, old, t in zip(imported, rec.frames, hw["t"], strict=True):
        np.testing.assert_array_equal(new.rgb, old.rgb)
        np.testing.assert_array_equal(new.depth, old.depth)
        assert new.t_s == t
    camera = frames_meta(tmp_path / "imported" / FRAMES_FILE)["camera"]
    original = frames_meta(rec.folder / FRAMES_FILE)["camera"]
    for key in ("fx", "fy", "cx", "cy", "width_px", "height_px"):
        assert camera[key] == original[key], key
    assert camera["depth_scale_m"] == pytest.approx(original["depth_scale_m"], rel=1e-12)
    np.testing.assert_array_equal(camera["camera_to_world"], original["camera_to_world"])


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "missing_depth": lambda src: (src / "depth" / "0003.png").unlink(),
    "missing_color": lambda src: (src / "color" / "0003.png").unlink(),
    "missing_data": lambda src: (src / "data" / "0003.json").unlink(),
    "depth_wrong_size": lambda src: cv2.imwrite(str(src / "depth" / "0003.png"), np.ones((120, 160), np.uint16)),
    "depth_wrong_dtype": lambda src: cv2.imwrite(str(src / "depth" / "0003.png"), np.ones((240, 320), np.uint8)),
    "color_wrong_size": lambda src: cv2.imwrite(str(src / "color" / "0003.png"), np.ones((240, 320), np.uint8)),
    "unreadable_json": lambda src: (src / "data" / "0003.json").write_text('{"header": {"secs": 1'),
    "bad_length": lambda src: _edit_json(src / "data" / "0003.json", lambda d: d["sensors"]["4"].update(length=np.nan)),
    "bad_target": lambda src: _edit_json(src / "data" / "0003.json", lambda d: d["motors"]["1"].update(target=1.5)),
    "bad_stamp": lambda src: _edit_json(src / "data" / "0003.json", lambda d: d["header"].pop("secs")),
}


@pytest.mark.parametrize("reason", sorted(MUTATIONS))
def test_bad_frames_are_skipped_and_counted(
    rec: Recording, tmp_path: Path, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    src = rec.copy(tmp_path / "src")
    MUTATIONS[reason](src)
    with caplog.at_level(logging.WARNING, logger="storage.tribar"):
        report = _import(src, tmp_path / "imported")
    assert report.skipped == {reason: 1}
    assert report.n_imported == rec.n_frames - 1
    assert f"skipped frame 3 of {src} ({reason})" in caplog.text
    hw, _ = read_trajectory(tmp_path / "imported" / HARDWARE_FILE)
    assert len(hw) == len(list(iter_frames(tmp_path / "imported" / FRAMES_FILE))) == rec.n_frames - 1
    frame3_t = rec.hardware["t"].iloc[rec.nearest[3]] - rec.hardware["t"].iloc[rec.nearest[0]]
    assert np.abs(hw["t"] - frame3_t).min() > 1e-3  # frame 3 is the one missing


def test_decreasing_stamp_is_held_and_reported(rec: Recording, tmp_path: Path) -> None:
    src = rec.copy(tmp_path / "src")
    early = json.loads((src / "data" / "0002.json").read_text())["header"]["secs"]
    _edit_json(src / "data" / "0005.json", lambda d: d["header"].update(secs=early))
    report = _import(src, tmp_path / "imported")
    assert report.n_time_fixed == 1 and report.n_imported == rec.n_frames and report.skipped == {}
    t = read_trajectory(tmp_path / "imported" / HARDWARE_FILE)[0]["t"].to_numpy()
    assert np.all(np.diff(t) >= 0) and t[5] == t[4]


def test_recording_without_motor_command_has_no_control_columns(rec: Recording, tmp_path: Path) -> None:
    src = rec.copy(tmp_path / "src")
    for path in (src / "data").glob("*.json"):
        _edit_json(path, lambda d: d.pop("info"))
    report = _import(src, tmp_path / "imported")
    assert not report.control_recorded and "control_* not written" in report.notes[0]
    hw, meta = read_trajectory(tmp_path / "imported" / HARDWARE_FILE, expect_source="hardware")
    assert meta.control_recorded is False and not set(CONTROL_COLS) & set(hw.columns)

    # the contract stays strict both ways
    raw = meta.model_dump(mode="json")
    with pytest.raises(DataError, match="control_recorded = false but the file has columns"):
        write_trajectory(tmp_path / "a.parquet", hw.assign(**{c: 0.0 for c in CONTROL_COLS}), raw)
    with pytest.raises(DataError, match="requires columns"):
        write_trajectory(tmp_path / "b.parquet", hw, {**raw, "control_recorded": True})
    with pytest.raises(DataError, match="only for source 'hardware'"):
        write_trajectory(tmp_path / "c.parquet", hw, {**raw, "source": "sim"})


CONFIG_ERRORS: dict[str, tuple[Callable[[dict], None] | None, str]] = {
    "no config": (None, r"config\.json: not found"),
    "cam_intr shape": (lambda c: c.update(cam_intr=[[600.0, 0.0, 320.0]]), r"field 'cam_intr' must be a 3 x 3"),
    "cam_intr fx": (lambda c: c["cam_intr"][0].__setitem__(0, -1.0), r"field 'cam_intr' must be a 3 x 3"),
    "cam_intr text": (lambda c: c.update(cam_intr="K"), r"field 'cam_intr'"),
    "im_w": (lambda c: c.pop("im_w"), r"field 'im_w' must be a positive integer"),
    "cam_extr": (lambda c: c["cam_extr"][0].__setitem__(0, 5.0), r"field 'cam_extr' must be a 4 x 4 rigid"),
    "depth_scale": (lambda c: c.update(depth_scale=0), r"field 'depth_scale' must be a positive number"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_ERRORS))
def test_bad_config_raises_before_writing(rec: Recording, tmp_path: Path, case: str) -> None:
    edit, message = CONFIG_ERRORS[case]
    src = rec.copy(tmp_path / "src")
    if edit is None:
        (src / "config.json").unlink()
    else:
        _edit_json(src / "config.json", edit)
    with pytest.raises(DataError, match=message) as info:
        _import(src, tmp_path / "imported")
    assert str(src / "config.json") in str(info.value)
    assert not (tmp_path / "imported").exists()


def test_config_conventions_extrinsics_and_depth_scale(rec: Recording, tmp_path: Path) -> None:
    src = rec.copy(tmp_path / "src")
    _edit_json(src / "config.json", lambda c: c.update(depth_scale=0.00025))  # metres per unit (SDK convention)
    _import(src, tmp_path / "imported", extrinsics=Extrinsics.WORLD_TO_CAMERA)
    camera = frames_meta(tmp_path / "imported" / FRAMES_FILE)["camera"]
    extr = np.array(json.loads((src / "config.json").read_text())["cam_extr"])
    np.testing.assert_allclose(camera["camera_to_world"], np.linalg.inv(extr), atol=1e-12)
    assert camera["depth_scale_m"] == 0.00025


def test_run_import_writes_a_collect_stage_and_never_overwrites(rec: Recording, tmp_path: Path) -> None:
    configs = load_all(write_test_pipeline(tmp_path, campaign="real"))
    ref, summary = run_import(configs, 2, rec.tribar)
    manifest = read_manifest(ref)
    policy_id = summary["policy_id"]
    assert policy_id == f"tribar-Tribar-run-1-{source_digest(rec.tribar)[:8]}"
    assert import_policy_name(rec.tribar) == "tribar-Tribar-run-1"
    assert manifest["complete"] and manifest["stage"] == "collect" and manifest["summary"] == summary
    assert set(manifest["files"]) == {
        f"{policy_id}/{HARDWARE_FILE}",
        f"{policy_id}/{FRAMES_FILE}",
        f"{policy_id}/policy.json",
        "plots/first_frame.png",
    }
    assert not (Path(ref.path) / policy_id / GROUNDTRUTH_FILE).exists()
    assert summary["n_frames"] == rec.n_frames and summary["n_skipped"] == 0
    policy = json.loads((Path(ref.path) / policy_id / "policy.json").read_text())
    assert policy["policy_id"] == policy_id and len(policy["targets"]) == summary["n_targets"] >= 2
    _, meta = read_trajectory(Path(ref.path) / policy_id / HARDWARE_FILE, expect_source="hardware")
    assert (meta.campaign, meta.iteration, meta.policy_id) == ("real", 2, policy_id)

    with pytest.raises(DataError, match="already holds a complete collection"):
        run_import(configs, 2, rec.tribar)
    again, _ = run_collect(configs, 2)  # the collect stage takes it as its own output
    assert again == ref


def test_an_import_with_too_few_usable_frames_is_refused_and_writes_nothing(rec: Recording, tmp_path: Path) -> None:
    """Most frames unusable (truncated PNGs): refused with how many were skipped and why, exit
    status 2, and nothing under the runs folder; a lower ``--min-share`` takes what there is."""
    src = rec.copy(tmp_path / "src")
    for png in sorted((src / "color").glob("*.png"))[: rec.n_frames // 2]:
        png.write_bytes(png.read_bytes()[:100])
    runs = rec.configs.pipeline.runs_dir / "fewframes"
    args = ("import-tribar", str(src), "--config", str(rec.config_path), "--campaign", "fewframes")
    code, _, err = _r2s2r(*args)
    usable = rec.n_frames - rec.n_frames // 2
    assert code == 2 and "Traceback" not in err
    assert f"{usable} of {rec.n_frames} frames usable" in err and f"{rec.n_frames // 2} unreadable_color" in err
    assert not [p for p in runs.rglob("*") if p.is_file()]
    code, _, err = _r2s2r(*args, "--min-share", "0.4")
    assert code == 0, err
    manifest = json.loads((runs / "iter_1" / "collect" / "manifest.json").read_text())
    assert manifest["summary"]["n_frames"] == usable


def _r2s2r(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: exit code, stdout, and stderr with line wrapping undone."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, " ".join(result.stderr.split())


def test_cli_import_tribar(rec: Recording, tmp_path: Path) -> None:
    args = ("import-tribar", str(rec.tribar), "--config", str(rec.config_path), "--campaign", "cli", "-k", "3")
    code, out, err = _r2s2r(*args)
    assert code == 0, err
    assert "n_frames" in out and "policy_id" in out
    manifest = json.loads((rec.configs.pipeline.runs_dir / "cli" / "iter_3" / "collect" / "manifest.json").read_text())
    assert manifest["complete"] is True and manifest["summary"]["n_frames"] == rec.n_frames

    code, _, err = _r2s2r(*args)
    assert code == 2 and "already holds a complete collection" in err and "Traceback" not in err

    code, _, err = _r2s2r("import-tribar", str(tmp_path / "nowhere"), "--config", str(rec.config_path), "-k", "4")
    assert code == 2 and "nowhere: not a folder" in err and "Traceback" not in err
    code, _, err = _r2s2r("import-tribar", str(rec.tribar), "--config", str(rec.config_path), "--extrinsics", "up")
    assert code == 2 and "expected camera_to_world or world_to_camera" in err
