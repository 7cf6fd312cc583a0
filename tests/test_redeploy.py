"""The redeploy and evaluate stages on their own: runs from three starts, a hardware fault, resuming,
the gap table and the iteration summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import load_all
from pipeline.errors import HardwareError
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import REST_TARGET, Policy
from pipeline.published_gaits import published_gait
from pipeline.truth import twin_true_params
from storage.catalog import (
    GAP_FILE,
    POLICIES_FILE,
    REPEATABILITY_FILE,
    RUNS_FILE,
    SUMMARY_FILE,
)
from storage.files import atomic_write_json
from storage.layout import RunLayout, read_manifest, write_manifest
from storage.recording import Recording
from storage.redeploy_runs import recorded_runs
from storage.trajectory import read_trajectory
from tasks.evaluate import gap_summary, run_evaluate, summary_markdown
from tasks.redeploy import run_redeploy, set_aside_other_runs
from tests.conftest import empty_overlays, small_twin, write_test_pipeline

IDENTIFIED_FRICTION = 0.3
"""The friction of the hand-made sysid output: "after" is another engine than "before"."""


def _inputs(configs, iteration: int):
    """Attach, sysid and gaits stage outputs by hand: no attachment overlay, a sysid overlay that
    only sets the friction (:data:`IDENTIFIED_FRICTION`), and the published ccw turn as the
    turning policy."""
    layout = RunLayout.of(configs)
    refs = empty_overlays(configs, iteration)
    sysid = Path(refs["sysid"].path)
    (sysid / "identified.yaml").write_text(yaml.safe_dump({"ground": {"friction": IDENTIFIED_FRICTION}}))
    refs["sysid"] = write_manifest(sysid, "sysid", complete=True, summary={})
    folder = layout.stage_dir(iteration, "gaits")
    folder.mkdir(parents=True)
    turn = Policy("turning-ccw", np.vstack([published_gait("ccw"), REST_TARGET]))
    atomic_write_json(folder / POLICIES_FILE, {"turning": {"name": turn.name, "targets": turn.targets.tolist()}})
    refs["gaits"] = write_manifest(folder, "gaits", complete=True, summary={})
    return refs


def test_redeploy_keeps_finished_runs_through_a_fault_and_resumes(tmp_path: Path, monkeypatch) -> None:
    """A run cut short by a fault in a process that then dies (its part files never merged) is
    recovered and kept aside; the resumed stage records it again and keeps every finished run."""
    configs = load_all(write_test_pipeline(tmp_path, campaign="redeploy", checkpoint_every_s=0.2))
    refs = _inputs(configs, 1)
    twin = small_twin(configs.twin)
    with monkeypatch.context() as killed:
        killed.setattr(Recording, "close", lambda self, complete, reason=None: [])  # dies before merging
        with pytest.raises(HardwareError, match="connection lost"):
            run_redeploy(configs, 1, refs["attach"], refs["gaits"], MujocoTwin(configs.robot, twin, 1.0))
    stage = Path(refs["gaits"].path).parent / "redeploy"
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["complete"] is False and "connection lost" in manifest["summary"]["error"]
    assert list((stage / "turning-start0" / "hardware.parquet.parts").glob("part-*"))
    flushed = pq.read_table(stage / "turning-start0" / "hardware.parquet.parts").num_rows

    executions = []
    hardware = MujocoTwin(configs.robot, twin)
    original = hardware.execute

    def counting(*args, **kwargs):
        executions.append(1)
        yield from original(*args, **kwargs)

    hardware.execute = counting
    ref, summary = run_redeploy(configs, 1, refs["attach"], refs["gaits"], hardware)
    assert len(executions) == 3
    kept = list((RunLayout.of(configs).set_aside_dir / "iter_1" / "redeploy").glob("turning-start0.incomplete-*"))
    assert len(kept) == 1  # what was recorded before the fault is kept, marked incomplete, where no stage lists it
    cut_short, meta = read_trajectory(kept[0] / "hardware.parquet", expect_source="hardware")
    assert meta.complete is False and len(cut_short) == flushed > 0
    assert read_manifest(ref)["complete"] is True
    assert [run.name for run in recorded_runs(ref)] == [f"turning-start{k}" for k in range(3)]
    assert (
        json.loads((stage / RUNS_FILE).read_text())[1]["start"]["yaw_deg"]
        == configs.pipeline.redeploy.starts[1].yaw_deg
    )
    evaluated, gap_summary = run_evaluate(configs, 1, refs["attach"], refs["sysid"], refs["learn"], refs["gaits"], ref)
    gap = pd.read_parquet(Path(evaluated.path) / GAP_FILE)
    assert sorted(gap["start"].unique()) == [0, 1, 2] and set(gap["engine"]) == {"before", "after", "learned", "truth"}
    # the learned engine here answers no contact: with no ground, no horizontal force acts on the
    # robot (cables and rod contact are internal), so its centre of mass never moves sideways
    learned = gap[gap["engine"] == "learned"]
    np.testing.assert_allclose(learned["sim_forward_m"].to_numpy(), 0.0, atol=1e-9)
    assert (gap[gap["engine"] == "before"]["sim_forward_m"].abs() > 1e-3).any()
    # "after" replays with the identified friction, "before" with the config's: the same real runs,
    # other simulated ones (a third of the friction lets the turning robot slide)
    before, after = (gap[gap["engine"] == e].sort_values("start") for e in ("before", "after"))
    np.testing.assert_array_equal(before["real_rotation_deg"].to_numpy(), after["real_rotation_deg"].to_numpy())
    sim_gap = np.abs(before["sim_rotation_deg"].to_numpy() - after["sim_rotation_deg"].to_numpy())
    assert sim_gap.max() > 1.0, sim_gap  # measured 2.9, 2.7 and 0.1 deg over the three starts
    # "truth" replays with the twin's own values (its friction, motor speed, latency): other simulated runs again
    truth = gap[gap["engine"] == "truth"].sort_values("start")
    assert np.abs(truth["sim_rotation_deg"].to_numpy() - after["sim_rotation_deg"].to_numpy()).max() > 1.0
    analytic = gap[gap["engine"] != "learned"]
    assert not analytic["sim_collapsed"].any() and not gap["real_collapsed"].any()  # the published turn stands
    assert gap_summary["gap.after.turning.sim_collapsed_runs"] == 0
    real = gap.groupby("start")["real_rotation_deg"].first()
    assert (real > 0).all()  # the published ccw turn turns the twin counter-clockwise from every start
    repeatability = json.loads((stage / REPEATABILITY_FILE).read_text())["turning"]
    assert repeatability["rotation_deg_mean"] == pytest.approx(real.mean())
    assert repeatability["collapsed_runs"] == 0  # the published turn keeps the prism standing
    assert summary["repeatability.turning.rotation_deg_mean"] == pytest.approx(real.mean())
    assert gap_summary["gap.after.com_error_m"] == pytest.approx(after["com_error_m"].mean())
    assert gap_summary["gap.after.turning.com_error_m"] == pytest.approx(after["com_error_m"].mean())
    assert gap_summary["gap.after.com_error_median_m"] == pytest.approx(after["com_error_m"].median())
    markdown = (Path(evaluated.path) / SUMMARY_FILE).read_text()
    means = (gap[gap["engine"] == e]["com_error_m"].mean() for e in ("before", "after", "learned", "truth"))
    assert "| turning | {:.3f} → {:.3f} → {:.3f} → {:.3f} |".format(*means) in markdown

    run_redeploy(configs, 1, refs["attach"], refs["gaits"], hardware)
    assert len(executions) == 3  # every run already recorded: nothing runs again

    # new gaits: the recorded runs are kept aside, never overwritten
    set_aside_other_runs(configs, 1, refs["gaits"])
    assert stage.is_dir()  # same policies: nothing moved
    set_aside_other_runs(configs, 1, refs["gaits"], fresh=True)
    replaced = RunLayout.of(configs).set_aside_dir / "iter_1"
    assert not stage.exists() and len(list(replaced.glob("redeploy.replaced-*"))) == 1


def test_summary_shows_the_gap_and_the_identified_values_against_the_twins_truth(tmp_path: Path) -> None:
    configs = load_all(write_test_pipeline(tmp_path, campaign="summary"))
    layout = RunLayout.of(configs)
    refs = {}
    for stage, summary in (
        (
            "sysid",
            {
                "value.friction": 0.6,
                "start.friction": 0.8,
                "profile_low.friction": 0.5,
                "profile_high.friction": 0.7,
            },
        ),
        ("gaits", {"forward.forward_m": 0.3}),
    ):
        folder = layout.stage_dir(1, stage)
        folder.mkdir(parents=True)
        refs[stage] = write_manifest(folder, stage, complete=True, summary=summary)
    rows = [
        {
            "policy": "straight",
            "engine": engine,
            "com_error_m": com,
            "com_error_pct_rod": 0.0,
            "heading_error_deg": deg,
            "sim_collapsed": flat,
        }
        for engine, com, deg, flat in (
            ("before", 0.5, 10.0, True),
            ("after", 0.2, 5.0, False),
            ("after", 0.01, 3.0, False),
            ("after", 0.03, 7.0, False),
        )
    ]
    gap = gap_summary(rows)
    assert gap["gap.after.com_error_median_m"] == pytest.approx(0.03)  # the mean is 0.08
    assert gap["gap.before.sim_collapsed_runs"] == 1 and gap["gap.after.straight.sim_collapsed_runs"] == 0
    markdown = summary_markdown(configs, 1, gap, refs, "MLflow run `abc`")
    truth = float(twin_true_params(configs.robot, configs.twin).friction[0])
    assert f"| friction | 0.8 | 0.6 | 0.5 to 0.7 | {truth:.4g} | {100 * (0.6 - truth) / truth:+.1f} |" in markdown
    assert "| straight | 0.500 → 0.080 | 10.0 → 5.0 | 0.500 → 0.030 |" in markdown
    assert "| all | 0.500 → 0.080 |" in markdown
    assert "MLflow run `abc`" in markdown and "- forward.forward_m: 0.300" in markdown
