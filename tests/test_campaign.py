"""A two-iteration campaign on the twin (slow): iteration 2 learns from iteration 1's redeploy runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import SysidConfig, load_all
from storage.layout import RunLayout
from storage.tracking import CAMPAIGN_RUN_TAG, ITERATION_TAG, client_for


@pytest.mark.slow
def test_two_iteration_campaign_narrows_the_gap(tmp_path: Path) -> None:
    """Default sysid, a depth-3 search, the straight policy from three starts. Both iterations'
    identified engines beat the uncalibrated one on the redeploy runs, iteration 2 (identified
    from iteration 1's random run and redeploy runs) is no worse than iteration 1 (5 mm slack
    for tracking noise), and MLflow holds one run per iteration plus the campaign run."""
    from flows.campaign import r2s2r_campaign
    from tests.conftest import write_test_pipeline

    config = str(write_test_pipeline(tmp_path, campaign="twoiter", n_targets=24))
    overrides: dict[str, object] = {f"sysid.{k}": v for k, v in SysidConfig().model_dump(mode="json").items()}
    overrides.update({"gaits.search": {"depth": 3, "beam_width": 8}, "redeploy.policies": ["straight"]})
    result = r2s2r_campaign(config, 2, overrides)
    first, second = result["iterations"]
    assert "attach" in first["stages"] and "attach" not in second["stages"]  # iteration 1's overlay reused
    collected = Path(second["stages"]["collect"]["ref"]["path"])
    assert sorted(p.name for p in collected.iterdir() if p.is_dir()) == [f"straight-start{k}" for k in range(3)]
    sysid_summary = json.loads((Path(second["stages"]["sysid"]["ref"]["path"]) / "manifest.json").read_text())
    assert sysid_summary["summary"]["recordings"] == 1 + 3

    gaps = [item["headline"] for item in result["iterations"]]
    for gap in gaps:
        assert gap["evaluate.gap.after.com_error_m"] < gap["evaluate.gap.before.com_error_m"]
    assert gaps[1]["evaluate.gap.after.com_error_m"] <= gaps[0]["evaluate.gap.after.com_error_m"] + 0.005

    configs = load_all(config, overrides)
    client = client_for(RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign))
    runs = client.search_runs([client.get_experiment_by_name("twoiter").experiment_id])
    assert sorted(r.data.tags.get(ITERATION_TAG, "campaign") for r in runs) == ["1", "2", "campaign"]
    campaign = next(r for r in runs if r.data.tags.get(CAMPAIGN_RUN_TAG) == "1")
    history = client.get_metric_history(campaign.info.run_id, "evaluate.gap.after.com_error_m")
    assert [m.step for m in history] == [1, 2]
