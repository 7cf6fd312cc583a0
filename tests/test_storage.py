"""Parquet contracts, frames, manifests, atomic writes and crash recovery."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import DataError
from storage.files import atomic_write_bytes, atomic_write_json
from storage.frames import FRAMES_SCHEMA, encode_frame, iter_frames
from storage.layout import Ref, read_manifest, write_manifest
from storage.tables import PartedTableWriter, read_meta, recover_parts, write_table
from storage.trajectory import CAP_COLS, TARGET_COLS, make_meta, read_trajectory, write_trajectory


def _groundtruth(n: int = 20) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(0.015, 0.025, n))
    data = {"t": t, "segment": np.repeat(np.arange(4), n // 4).astype(np.int32)}
    data.update({c: rng.uniform(0, 1, n) for c in TARGET_COLS})
    data.update({c: rng.normal(0, 0.1, n) for c in CAP_COLS})
    return pd.DataFrame(data)


def _meta(**kw):
    base = dict(
        source="groundtruth",
        robot_config_hash="abc",
        campaign="c",
        iteration=1,
        policy_id="p-1",
        sample_rate_hz=50.0,
        complete=True,
    )
    base.update(kw)
    return make_meta(**base)


def test_trajectory_round_trip(tmp_path: Path) -> None:
    df = _groundtruth().assign(target_4=1.5)  # a follow action's gait at 150 mm of range
    path = write_trajectory(tmp_path / "traj.parquet", df, _meta())
    back, meta = read_trajectory(path, expect_source="groundtruth")
    pd.testing.assert_frame_equal(back, df)
    assert meta.source == "groundtruth" and meta.complete and meta.units["cap"] == "m"
    assert meta.schema_version == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda df: df.drop(columns=["cap3_y"]), "requires columns"),
        (lambda df: df.assign(extra=1.0), "unknown columns"),
        (lambda df: df.assign(cap0_x=df["cap0_x"].astype(np.float32)), "'cap0_x' must be float64"),
        (lambda df: df.assign(segment=df["segment"].astype(float)), "'segment' must be integer"),
        (lambda df: df.assign(t=df["t"][::-1].to_numpy()), "non-decreasing"),
        (lambda df: df.assign(target_2=2.5), r"\[0, 2.0\]"),
        (lambda df: df.assign(target_2=-0.1), r"\[0, 2.0\]"),
    ],
)
def test_trajectory_writer_rejects_bad_frames(tmp_path: Path, mutate, message: str) -> None:
    with pytest.raises(DataError, match=message):
        write_trajectory(tmp_path / "bad.parquet", mutate(_groundtruth()), _meta())
    assert not (tmp_path / "bad.parquet").exists()


def test_reader_rejects_foreign_and_mismatched_files(tmp_path: Path) -> None:
    df = _groundtruth()
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pandas(df), plain)
    with pytest.raises(DataError, match="missing 'r2s2r' schema metadata"):
        read_trajectory(plain)

    wrong_version = tmp_path / "v2.parquet"
    write_table(wrong_version, pa.Table.from_pandas(df, preserve_index=False), {**_meta(), "schema_version": 2})
    with pytest.raises(DataError, match="schema_version"):
        read_trajectory(wrong_version)

    no_source = tmp_path / "nosource.parquet"
    meta = _meta()
    meta.pop("source")
    write_table(no_source, pa.Table.from_pandas(df, preserve_index=False), meta)
    with pytest.raises(DataError, match="source"):
        read_trajectory(no_source)

    good = write_trajectory(tmp_path / "good.parquet", df, _meta())
    with pytest.raises(DataError, match="expected source 'hardware'"):
        read_trajectory(good, expect_source="hardware")

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        read_trajectory(garbage)
    with pytest.raises(DataError, match="not found"):
        read_trajectory(tmp_path / "absent.parquet")


def test_hardware_source_requires_sensors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="source 'hardware' requires columns"):
        write_trajectory(tmp_path / "hw.parquet", _groundtruth(), _meta(source="hardware"))


def test_frames_round_trip_and_validation(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    depth = rng.integers(0, 65535, (12, 16), dtype=np.uint16)
    rows = [encode_frame(0.1 * i, rgb, depth) for i in range(3)]
    camera = {
        "fx": 10.0,
        "fy": 10.0,
        "cx": 7.5,
        "cy": 5.5,
        "width_px": 16,
        "height_px": 12,
        "depth_scale_m": 0.001,
        "camera_to_world": np.eye(4).tolist(),
    }
    path = tmp_path / "frames.parquet"
    write_table(path, pa.Table.from_pylist(rows, schema=FRAMES_SCHEMA), {"schema_version": 1, "camera": camera})
    frames = list(iter_frames(path))
    assert [f.t_s for f in frames] == pytest.approx([0.0, 0.1, 0.2])
    np.testing.assert_array_equal(frames[2].rgb, rgb)
    np.testing.assert_array_equal(frames[2].depth, depth)

    with pytest.raises(DataError, match="uint16"):
        encode_frame(0.0, rgb, depth.astype(np.float32))
    with pytest.raises(DataError, match="uint16"):
        encode_frame(0.0, rgb, depth[:5])
    wrong_size = tmp_path / "wrong.parquet"
    write_table(
        wrong_size,
        pa.Table.from_pylist(rows, schema=FRAMES_SCHEMA),
        {"schema_version": 1, "camera": {**camera, "width_px": 20}},
    )
    with pytest.raises(DataError, match="frame at t = 0.000 s"):
        list(iter_frames(wrong_size))
    no_camera = tmp_path / "nocam.parquet"
    write_table(no_camera, pa.Table.from_pylist(rows, schema=FRAMES_SCHEMA), {"schema_version": 1})
    with pytest.raises(DataError, match="'camera'"):
        list(iter_frames(no_camera))


def test_atomic_write_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    """A write that fails after its temporary file exists (the rename, here) leaves the old
    content under the final name and no temporary file beside it."""
    import storage.files

    target = tmp_path / "out.json"
    atomic_write_json(target, {"a": 1})

    def failing_replace(src: object, dst: object) -> None:
        assert Path(str(src)).is_file()  # the new content was written, under its temporary name
        raise OSError("disk full")

    monkeypatch.setattr(storage.files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_json(target, {"a": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    atomic_write_bytes(target, b"{}")
    assert target.read_text() == "{}"


def test_manifest_detects_changes(tmp_path: Path) -> None:
    stage = tmp_path / "collect"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "a.bin").write_bytes(b"abc")
    ref = write_manifest(stage, "collect", complete=True, summary={"n": 1})
    manifest = read_manifest(ref)
    assert manifest["files"]["sub/a.bin"]["bytes"] == 3
    assert Ref.from_json(ref.to_json()) == ref
    (stage / "sub" / "a.bin").write_bytes(b"abd")
    with pytest.raises(DataError, match="a.bin: content differs"):
        read_manifest(ref)
    (stage / "sub" / "a.bin").unlink()
    with pytest.raises(DataError, match="a.bin: listed in"):
        read_manifest(ref)
    (stage / "manifest.json").write_text("{}")
    with pytest.raises(DataError, match="manifest changed"):
        read_manifest(ref)


def test_parted_writer_survives_a_crash(tmp_path: Path) -> None:
    schema = pa.schema([pa.field("t", pa.float64(), nullable=False)])
    final = tmp_path / "data.parquet"
    writer = PartedTableWriter(final, schema, {"who": "test"})
    for i in range(5):
        writer.append({"t": float(i)})
    writer.flush()
    writer.append({"t": 5.0})  # buffered, not flushed: lost in a crash
    del writer  # the process "dies" here: no finalize
    assert not final.exists()
    with pytest.raises(DataError, match=r"data.parquet.parts: parts of an unfinished recording"):
        PartedTableWriter(final, schema, {"who": "test"})  # a new writer never opens over them
    recovered = recover_parts(final)
    assert recovered == final
    assert pq.read_table(final).column("t").to_pylist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert read_meta(final) == {"who": "test", "complete": False, "merged_parts": ["part-00000.parquet"]}
    assert recover_parts(final) is None

    writer = PartedTableWriter(final, schema, {"who": "test"})
    writer.append({"t": 1.0})
    writer.finalize(complete=True)
    assert read_meta(final)["complete"] is True
    assert not final.with_name("data.parquet.parts").exists()


def test_a_crash_between_the_merge_and_the_clean_up_is_recovered_once(tmp_path: Path, monkeypatch) -> None:
    """The final file is committed before the parts are removed; a crash in between leaves parts
    that recovery recognises as merged: it removes them and leaves the complete file as it is
    (a second merge would stamp it incomplete, or double its rows)."""
    import storage.tables as tables

    schema = pa.schema([pa.field("t", pa.float64(), nullable=False)])
    final = tmp_path / "data.parquet"
    writer = PartedTableWriter(final, schema, {"who": "test"})
    for i in range(3):
        writer.append({"t": float(i)})
        writer.flush()
    remove = tables._remove_parts

    def crash(path: Path) -> None:
        raise KeyboardInterrupt("killed after the rename")

    monkeypatch.setattr(tables, "_remove_parts", crash)
    with pytest.raises(KeyboardInterrupt):
        writer.finalize(complete=True)
    monkeypatch.setattr(tables, "_remove_parts", remove)
    assert final.is_file() and len(list(final.with_name("data.parquet.parts").glob("part-*"))) == 3
    committed = final.read_bytes()
    for expected in (final, None):  # idempotent: a second recovery finds nothing to do
        assert recover_parts(final) == expected
        assert final.read_bytes() == committed
        assert not final.with_name("data.parquet.parts").exists()
    assert read_meta(final)["complete"] is True
    assert pq.read_table(final).column("t").to_pylist() == [0.0, 1.0, 2.0]


def test_headline_figures_are_picked_from_the_stage_metrics_and_ordered() -> None:
    """The headline keeps the figures that say whether an iteration worked (and every identified
    value and its error), renamed under ``headline/``, and orders them: gap, held-out error,
    motion, then identified values, then their errors."""
    from storage.tracking import headline_metrics, headline_order

    metrics = {
        "sysid/truth_error_pct.friction": -30.0,
        "sysid/value.friction": 0.5,
        "evaluate/gap.after.com_error_m": 0.05,
        "evaluate/gap.before.com_error_m": 0.2,
        "sysid/holdout.after.key_frame_error_mm": 8.0,
        "gaits/search_wall_s": 100.0,
        "track/error_cap_error_mean_mm": 3.0,
    }
    headline = headline_metrics(metrics)
    assert sorted(headline, key=headline_order) == [
        "headline/gap_before_m",
        "headline/gap_after_m",
        "headline/heldout_after_mm",
        "headline/identified.friction",
        "headline/identified_error_pct.friction",
    ]
    assert headline["headline/gap_after_m"] == 0.05 and headline["headline/identified.friction"] == 0.5
