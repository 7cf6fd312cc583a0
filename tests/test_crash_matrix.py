"""The crash matrix (slow): an iteration killed with SIGKILL inside each stage, then run again.

For each stage, ``r2s2r iterate`` runs a small campaign in a process group of its own; once the
stage before it has written its complete output (for collect: once its recording has flushed a
first part), the group (the CLI, its Prefect server) is killed after a random delay within the
reference run's time for the stage (for collect: within half a second). The same command then
runs again. It must complete; every stage output must match its manifest (hashed); every
recording that existed at the kill (complete files and flushed parts) must still be there, in
its stage or under ``set-aside/``, with at least the rows it had; and the stages downstream of
a recording that are deterministic (track, sysid, gaits) must give the results of an
uninterrupted run. ``docs/reliability.md`` reports the matrix.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from flows.stages import stage_names
from storage.catalog import POLICIES_FILE
from storage.layout import RunLayout, stage_state
from storage.recording import HARDWARE_FILE
from storage.tables import parts_dir
from storage.tracked import TRACKED_FILE
from storage.trajectory import caps_array, read_trajectory

from .conftest import REPO, write_test_pipeline

pytestmark = pytest.mark.slow

KILLED_IN = ("collect", "track", "sysid", "gaits", "redeploy", "evaluate")
RECORDING_STAGES = ("collect", "redeploy")
DETERMINISTIC = ("track", "sysid", "gaits")
"""Stages whose results an uninterrupted run and a killed-and-resumed one must share
(:func:`_results`), wherever the kill left the recordings they read untouched (a kill in collect
splits its recording in two, so everything downstream differs; a kill in redeploy records its
runs anew)."""


def _results(layout: RunLayout, stage: str) -> object:
    """What ``stage`` computed, without what may differ between runs of the same computation
    (wall times in the tracked files' metadata): the tracked end caps, the identified values,
    the gaits' targets."""
    stage_dir = layout.stage_dir(1, stage)
    if stage == "track":
        return [caps_array(read_trajectory(p)[0]).tolist() for p in sorted(stage_dir.glob(f"*/{TRACKED_FILE}"))]
    if stage == "sysid":
        return yaml.safe_load((stage_dir / "identified.yaml").read_text())
    return json.loads((stage_dir / POLICIES_FILE).read_text())


def _iterate(config: Path) -> subprocess.Popen:
    """``r2s2r iterate -k 1`` on ``config``, in a process group of its own."""
    env = {**os.environ, "COLUMNS": "200"}
    command = [sys.executable, "-c", "from flows.cli import main; main()", "iterate", "-k", "1"]
    command += ["--config", str(config)]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _wall_times(output: str) -> dict[str, float]:
    """Stage -> wall seconds from the CLI's table."""
    walls = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 5 and cells[1] in stage_names() and cells[4]:
            walls[cells[1]] = float(cells[4])
    return walls


def _recorded_rows(layout: RunLayout) -> dict[str, int]:
    """Rows of every hardware recording of iteration 1 (final file and flushed parts), by folder."""
    rows = {}
    for stage in RECORDING_STAGES:
        stage_dir = layout.stage_dir(1, stage)
        for folder in sorted(p for p in stage_dir.glob("*") if p.is_dir()) if stage_dir.is_dir() else []:
            final, parts = folder / HARDWARE_FILE, parts_dir(folder / HARDWARE_FILE)
            count = pq.read_metadata(final).num_rows if final.is_file() else 0
            count += sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet")) if parts.is_dir() else 0
            if count:
                rows[f"{stage}/{folder.name}"] = count
    return rows


def _rows_now(layout: RunLayout, key: str) -> int:
    """The most rows any copy of recording ``key`` (``stage/folder``) now holds, in its stage or
    kept aside."""
    stage, name = key.split("/")
    candidates = [layout.stage_dir(1, stage) / name, *(layout.set_aside_dir / "iter_1").glob(f"{stage}*/{name}")]
    candidates += (layout.set_aside_dir / "iter_1" / stage).glob(f"{name}.*")
    counts = [pq.read_metadata(c / HARDWARE_FILE).num_rows for c in candidates if (c / HARDWARE_FILE).is_file()]
    return max(counts, default=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunLayout, dict[str, float]]:
    """An uninterrupted run of the campaign: its layout and each stage's wall time."""
    root = tmp_path_factory.mktemp("reference")
    config = write_test_pipeline(root, campaign="crash", n_targets=4, checkpoint_every_s=0.5)
    process = _iterate(config)
    output, _ = process.communicate(timeout=1200)
    assert process.returncode == 0, output
    return RunLayout(root / "runs", "crash"), _wall_times(output)


@pytest.mark.parametrize("stage", KILLED_IN)
def test_an_iteration_killed_inside_a_stage_completes_when_run_again(reference, tmp_path: Path, stage: str) -> None:
    reference_layout, walls = reference
    config = write_test_pipeline(tmp_path, campaign="crash", n_targets=4, checkpoint_every_s=0.5)
    layout = RunLayout(tmp_path / "runs", "crash")
    names = stage_names()
    previous = names[names.index(stage) - 1] if stage != "collect" else None
    # collect: once its first part is on disk, within half a second (it records for a few seconds)
    delay = random.Random(stage).uniform(0.0, 0.5 if previous is None else 0.8 * walls[stage])
    process = _iterate(config)
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline and process.poll() is None:
        started = (
            any(layout.stage_dir(1, "collect").glob(f"*/{HARDWARE_FILE}.parts/part-*"))
            if previous is None
            else stage_state(layout.stage_dir(1, previous)).kind == "complete"
        )
        if started:
            break
        time.sleep(0.05)
    time.sleep(delay)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    killed_inside = next((s for s in names if stage_state(layout.stage_dir(1, s)).kind != "complete"), None)
    assert killed_inside == stage, f"the kill landed in {killed_inside}, not {stage} (delay {delay:.1f} s)"
    at_kill = _recorded_rows(layout)

    rerun = _iterate(config)
    output, _ = rerun.communicate(timeout=1200)
    assert rerun.returncode == 0, output
    for name in names:
        state = stage_state(layout.stage_dir(1, name), full=True)
        assert state.kind == "complete", f"{name}: {state.kind} {state.problem}"
    lost = {key: (rows, _rows_now(layout, key)) for key, rows in at_kill.items() if _rows_now(layout, key) < rows}
    assert not lost, f"recordings with fewer rows than at the kill (then, now): {lost}"
    if stage not in RECORDING_STAGES:
        for name in DETERMINISTIC:
            assert _results(layout, name) == _results(reference_layout, name), name
