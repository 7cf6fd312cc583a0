"""The redeploy stage on its own: runs from three starts, the gap table, a hardware fault, resuming."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.config import load_all
from pipeline.errors import HardwareError
from pipeline.gaits.published import published_gait
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import REST_TARGET, Policy
from storage.files import atomic_write_json
from storage.layout import RunLayout, read_manifest, write_manifest
from storage.trajectory import read_trajectory
from tasks.gaits import POLICIES_FILE
from tasks.redeploy import GAP_FILE, REPEATABILITY_FILE, run_redeploy
from tests.conftest import small_twin, write_test_pipeline


def _inputs(configs, iteration: int):
    """Attach, sysid and gaits stage outputs by hand: no overlays (the robot config as it is) and
    the published ccw turn as the turning policy."""
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    refs = {}
    for stage, name in (("attach", "attachment.yaml"), ("sysid", "identified.yaml")):
        folder = layout.stage_dir(iteration, stage)
        folder.mkdir(parents=True)
        (folder / name).write_text("{}\n")
        refs[stage] = write_manifest(folder, stage, complete=True, summary={})
    folder = layout.stage_dir(iteration, "gaits")
    folder.mkdir(parents=True)
    turn = Policy("turning-ccw", np.vstack([published_gait("ccw"), REST_TARGET]))
    atomic_write_json(folder / POLICIES_FILE, {"turning": {"name": turn.name, "targets": turn.targets.tolist()}})
    refs["gaits"] = write_manifest(folder, "gaits", complete=True, summary={})
    return refs


def test_redeploy_keeps_finished_runs_through_a_fault_and_resumes(tmp_path: Path) -> None:
    configs = load_all(write_test_pipeline(tmp_path, campaign="redeploy"))
    refs = _inputs(configs, 1)
    twin = small_twin(configs.twin)
    with pytest.raises(HardwareError, match="connection lost"):
        run_redeploy(configs, 1, refs["attach"], refs["sysid"], refs["gaits"], MujocoTwin(configs.robot, twin, 1.0))
    stage = Path(refs["gaits"].path).parent / "redeploy"
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["complete"] is False and "connection lost" in manifest["summary"]["error"]
    _, meta = read_trajectory(stage / "turning-start0" / "hardware.parquet", expect_source="hardware")
    assert meta.complete is False  # what was recorded before the fault is kept, marked incomplete

    executions = []
    hardware = MujocoTwin(configs.robot, twin)
    original = hardware.execute

    def counting(*args, **kwargs):
        executions.append(1)
        yield from original(*args, **kwargs)

    hardware.execute = counting
    ref, summary = run_redeploy(configs, 1, refs["attach"], refs["sysid"], refs["gaits"], hardware)
    assert len(executions) == 3
    assert read_manifest(ref)["complete"] is True
    gap = pd.read_parquet(stage / GAP_FILE)
    assert sorted(gap["start"].unique()) == [0, 1, 2] and set(gap["engine"]) == {"before", "after"}
    # no overlays: "before" and "after" are the same engine, so the same gap
    before, after = (gap[gap["engine"] == e].sort_values("start") for e in ("before", "after"))
    np.testing.assert_allclose(before["com_error_m"].to_numpy(), after["com_error_m"].to_numpy())
    real = gap.groupby("start")["real_rotation_deg"].first()
    assert (real > 0).all()  # the published ccw turn turns the twin counter-clockwise from every start
    repeatability = json.loads((stage / REPEATABILITY_FILE).read_text())["turning"]
    assert repeatability["rotation_deg_mean"] == pytest.approx(real.mean())
    assert summary["gap.after.com_error_m"] == pytest.approx(after["com_error_m"].mean())

    run_redeploy(configs, 1, refs["attach"], refs["sysid"], refs["gaits"], hardware)
    assert len(executions) == 3  # every run already recorded: nothing runs again
