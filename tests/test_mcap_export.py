"""Recordings exported as MCAP files for Foxglove, read back with the ``mcap`` reader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mcap.reader import make_reader

from pipeline.config import load_all
from pipeline.errors import DataError
from storage.layout import RunLayout
from storage.mcap_export import export_stage
from storage.recording import FRAMES_FILE, GROUNDTRUTH_FILE, HARDWARE_FILE
from storage.scene import SENSORS_SCHEMA
from storage.tracked import TRACKED_FILE
from tasks.collect import run_collect
from tasks.track import run_track

from .conftest import write_test_pipeline

FOXGLOVE_SCHEMAS = {
    "/ground": "foxglove.SceneUpdate",
    "/tf": "foxglove.FrameTransform",
    "/camera/calibration": "foxglove.CameraCalibration",
    "/camera/color": "foxglove.CompressedImage",
    "/camera/depth": "foxglove.CompressedImage",
    "/robot/truth": "foxglove.SceneUpdate",
    "/robot/tracked": "foxglove.SceneUpdate",
    "/sensors": SENSORS_SCHEMA,
}


@pytest.fixture(scope="module")
def tracked_recording(tmp_path_factory):
    """A two-target random recording on the twin (small camera), and the track stage's output of it."""
    root = tmp_path_factory.mktemp("mcap")
    configs = load_all(write_test_pipeline(root, campaign="mcap", n_targets=2))
    ref, _ = run_collect(configs, 1)
    run_track(configs, 1, ref)
    return configs, Path(ref.path)


def test_an_exported_recording_reads_back_with_the_recordings_channels_counts_and_times(tracked_recording) -> None:
    configs, stage_dir = tracked_recording
    (export,) = export_stage(RunLayout.of(configs), configs.robot, 1, "collect")
    folder = next(stage_dir.glob(f"*/{HARDWARE_FILE}")).parent
    assert export.path == RunLayout.of(configs).exports_dir / "iter_1" / "collect" / f"{folder.name}.mcap"
    sensors = pq.read_table(folder / HARDWARE_FILE, columns=["t", "cable_0"])
    frames = pq.read_table(folder / FRAMES_FILE, columns=["t"])
    truth = pq.read_table(folder / GROUNDTRUTH_FILE, columns=["t"])
    tracked = pq.read_table(stage_dir.parent / "track" / folder.name / TRACKED_FILE, columns=["t"])
    expected = {
        "/ground": 1,
        "/tf": 1,
        "/camera/calibration": 1,
        "/camera/color": frames.num_rows,
        "/camera/depth": frames.num_rows,
        "/robot/truth": truth.num_rows,
        "/robot/tracked": tracked.num_rows,
        "/sensors": sensors.num_rows,
    }
    with export.path.open("rb") as handle:
        reader = make_reader(handle)
        summary = reader.get_summary()
        channels = {c.id: c.topic for c in summary.channels.values()}
        schemas = {c.topic: summary.schemas[c.schema_id].name for c in summary.channels.values()}
        counts = {channels[i]: n for i, n in summary.statistics.channel_message_counts.items()}
        first = min(t[0].as_py() for t in (sensors["t"], frames["t"], truth["t"], tracked["t"]))
        last = max(t[-1].as_py() for t in (sensors["t"], frames["t"], truth["t"], tracked["t"]))
        assert schemas == FOXGLOVE_SCHEMAS
        assert counts == expected and export.messages == expected
        assert summary.statistics.message_start_time == round(first * 1e9)
        assert summary.statistics.message_end_time == round(last * 1e9)
        _, _, message = next(reader.iter_messages(topics=["/sensors"]))
        sample = json.loads(message.data)
        assert sample["t_s"] == sensors["t"][0].as_py() and sample["cable_m"][0] == sensors["cable_0"][0].as_py()
        _, _, image = next(reader.iter_messages(topics=["/camera/color"]))
    stored = pq.read_table(folder / FRAMES_FILE, columns=["rgb_png"])["rgb_png"][0].as_py()
    assert stored in image.data  # the PNG as recorded, not re-encoded


def test_export_names_the_recording_it_cannot_find_and_takes_a_file_for_one(tracked_recording, tmp_path) -> None:
    configs, stage_dir = tracked_recording
    layout = RunLayout.of(configs)
    name = next(stage_dir.glob(f"*/{HARDWARE_FILE}")).parent.name
    with pytest.raises(DataError, match=f"no recording 'nope'; it has {name}"):
        export_stage(layout, configs.robot, 1, "collect", recording="nope")
    (export,) = export_stage(layout, configs.robot, 1, "collect", tmp_path / "one.mcap", recording=name)
    assert export.path == tmp_path / "one.mcap" and export.path.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == ["one.mcap"]  # written atomically: no temporary left
    with pytest.raises(DataError, match="has no complete"):
        export_stage(layout, configs.robot, 1, "redeploy")


def test_the_foxglove_layout_shows_only_channels_the_export_writes() -> None:
    """``docs/foxglove-layout.json``: its 3D panel's topics, its image topic and its plots' series
    are channels (and, for the plots, fields) of the exported files."""
    from .conftest import REPO

    layout = json.loads((REPO / "docs" / "foxglove-layout.json").read_text())
    topics = set(FOXGLOVE_SCHEMAS) | {f"/robot/replay_{engine}" for engine in ("before", "after", "learned")}
    used = set()
    for panel, config in layout["configById"].items():
        used |= set(config.get("topics", {}))
        used |= {v for k, v in config.get("imageMode", {}).items() if k.endswith("Topic")}
        for path in config.get("paths", []):
            topic, field = path["value"].split(".", 1)
            assert field.split("[")[0] in {"target", "control", "cable_m", "motor_rad", "segment"}, (panel, field)
            used.add(topic)
    assert used and used <= topics, used - topics
    assert {"/robot/truth", "/robot/tracked", "/camera/color", "/sensors"} <= used


def test_a_value_the_sensors_did_not_read_is_written_as_null(default_configs, tmp_path) -> None:
    """An imported recording may lack a sensor (NaN in its trajectory): JSON has no NaN, so the
    sample carries null there and its other values as they are."""
    import foxglove
    import numpy as np

    from pipeline.hardware.base import SensorPacket
    from storage.scene import RobotScene

    scene = RobotScene(default_configs.robot, ())
    writer = foxglove.open_mcap(tmp_path / "one.mcap", context=scene.context)
    cables = np.full(9, 0.3)
    cables[4] = np.nan
    scene.sensors(SensorPacket(1.5, 2, np.ones(6), np.zeros(6), cables, {}, np.full(6, np.nan)))
    writer.close()
    with (tmp_path / "one.mcap").open("rb") as handle:
        (_, _, message), *_ = make_reader(handle).iter_messages(topics=["/sensors"])
    sample = json.loads(message.data)
    assert sample["cable_m"] == [0.3] * 4 + [None] + [0.3] * 4 and sample["motor_rad"] == [None] * 6
    assert message.log_time == 1_500_000_000 and sample["segment"] == 2
