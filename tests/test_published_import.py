"""``r2s2r import-r2s2r``: a processed trajectory of the R2S2R paper's code through track, attach
and sysid.

The file is made from a run of the twin in the published format (a JSON list of frames, end caps
in the code's scaled units, targets, commands, the PID's settings in the first frame), with the
uneven stamps, a gap and a duplicated stamp such recordings have.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import DataError
from storage.catalog import tracked_file
from storage.layout import Ref, read_manifest
from storage.published import CAP_KEYS, LENGTH_SCALE, export_published
from storage.recording import HARDWARE_FILE
from storage.trajectory import CABLE_COLS, caps_array, read_trajectory
from tasks.attach import run_attach
from tasks.collect import run_collect
from tasks.import_recording import run_import_published
from tasks.sysid import run_sysid, sysid_data
from tasks.track import run_track

from .conftest import write_test_pipeline

START_S = 1_650_000_000.0


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """A twin collect of 6 random targets in the published format, every other tick (25 Hz, as tracked)."""
    folder = tmp_path_factory.mktemp("published")
    configs = load_all(write_test_pipeline(folder, n_targets=6, record_frames=False))
    ref, summary = run_collect(configs, 1)
    path = folder / "processed_data.json"
    export_published(Path(ref.path) / summary["policy_id"], configs.robot, path, every=2, start_time_s=START_S)
    return json.loads(path.read_text())


def _write(path: Path, frames: list[dict]) -> Path:
    path.write_text(json.dumps(frames))
    return path


def _imported(frames: list[dict], tmp_path: Path) -> tuple[LoadedConfigs, list[dict], Ref, dict, Ref, Ref]:
    """The run imported with a duplicated stamp and 15 frames (0.6 s) lost, tracked and attached."""
    uneven = [*frames[:30], frames[30], *frames[30:60], *frames[75:]]
    path = _write(tmp_path / "processed_data.json", uneven)
    configs = load_all(write_test_pipeline(tmp_path, n_targets=8))
    collect_ref, summary = run_import_published(configs, 1, path)
    folder = Path(collect_ref.path) / summary["policy_id"]
    hardware, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    assert not meta.cables_recorded and not set(CABLE_COLS) & set(hardware.columns)
    assert len(hardware) == len(uneven) and summary["duplicated_stamps"] == 1
    (gap,) = meta.gaps
    assert gap.t_end_s - gap.t_start_s == pytest.approx(uneven[61]["time"] - uneven[60]["time"], abs=1e-9)
    track_ref, _ = run_track(configs, 1, collect_ref)
    tracked, tracked_meta = read_trajectory(tracked_file(track_ref, summary["policy_id"]), expect_source="tracked")
    assert tracked_meta.model_extra["tracking"]["method"] == "given"
    expected = np.array([[f[key] for key in CAP_KEYS] for f in uneven]) / LENGTH_SCALE
    assert np.array_equal(caps_array(tracked), expected)
    attach_ref, attach = run_attach(configs, 1, track_ref, collect_ref)
    assert not attach["inferred"] and attach["arrangement"] == "config"
    return configs, uneven, collect_ref, summary, track_ref, attach_ref


def test_a_published_trajectory_imports_tracks_and_attaches(frames: list[dict], tmp_path: Path) -> None:
    configs, uneven, collect_ref, summary, track_ref, attach_ref = _imported(frames, tmp_path)
    data = sysid_data(configs, collect_ref, track_ref, attach_ref)
    (recording,) = data.recordings.values()
    # the duplicated stamp is read once; the lengths are unknown, the commands and end caps as given
    assert len(recording.t_s) == len(uneven) - 1 and np.isnan(recording.cables_m).all()
    # one gait a target (a change of target_gaits), the last 30 % held out
    assert len(data.gaits) == summary["n_targets"] and data.held and data.fit


@pytest.mark.slow
def test_sysid_identifies_from_a_published_trajectory(frames: list[dict], tmp_path: Path) -> None:
    configs, _, collect_ref, _, track_ref, attach_ref = _imported(frames, tmp_path)
    data = sysid_data(configs, collect_ref, track_ref, attach_ref)
    sysid_ref, figures, _ = run_sysid(configs, 1, data)
    assert read_manifest(sysid_ref)["complete"]
    assert np.isfinite(figures["holdout.after.key_frame_error_mm"])
    assert np.isfinite([figures[k] for k in figures if k.startswith("value.")]).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f[3].pop("controls"), "frame 3: no 'controls'"),
        (lambda f: f[5].update(rod_23_end_pt1=[0.1, float("nan"), 0.2]), "frame 5: 'rod_23_end_pt1' is .* finite"),
        (lambda f: f[9].update(time=f[2]["time"]), "frame 9: 'time' .* is before frame 8's"),
        (lambda f: f[0].pop("RANGE"), "frame 0: no 'RANGE'"),
        (lambda f: f[4].update(target_gaits=[1, 0, 1]), "frame 4: 'target_gaits' has 3 values; expected 6"),
    ],
    ids=["missing key", "NaN", "stamps backwards", "no PID settings", "short targets"],
)
def test_a_bad_published_file_is_refused_by_frame_and_field(
    frames: list[dict], tmp_path: Path, change, message
) -> None:
    bad = json.loads(json.dumps(frames[:20]))
    change(bad)
    path = _write(tmp_path / "bad.json", bad)
    configs = load_all(write_test_pipeline(tmp_path, n_targets=8))
    with pytest.raises(DataError, match=f"bad.json: {message}"):
        run_import_published(configs, 1, path)
    assert not (Path(configs.pipeline.runs_dir) / "test" / "iter_1" / "collect").exists()


def test_the_command_line_refuses_a_file_that_is_no_list(tmp_path: Path) -> None:
    pipeline = write_test_pipeline(tmp_path, n_targets=2)
    path = _write(tmp_path / "one.json", {"time": 1.0})
    result = subprocess.run(
        [str(Path(sys.executable).parent / "r2s2r"), "import-r2s2r", str(path), "-c", str(pipeline)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "expected a JSON list of two or more frames" in result.stderr
    assert "Traceback" not in result.stderr
