"""A two-iteration campaign on the twin (slow): iteration 2 learns from iteration 1's redeploy runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import SysidConfig, load_all
from storage.layout import RunLayout
from storage.tracking import CAMPAIGN_RUN_TAG, ITERATION_TAG, STAGE_TAG, client_for


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, dict[str, object]]:
    """Default sysid, a depth-3 search, the straight policy (one cycle) from three starts, two
    iterations: the campaign's result, its pipeline config and overrides."""
    from flows.campaign import r2s2r_campaign
    from tests.conftest import write_test_pipeline

    config = str(write_test_pipeline(tmp_path_factory.mktemp("campaign"), campaign="twoiter", n_targets=24))
    overrides: dict[str, object] = {f"sysid.{k}": v for k, v in SysidConfig().model_dump(mode="json").items()}
    overrides.update({"gaits.search": {"depth": 3, "beam_width": 8}, "redeploy.policies": ["straight"]})
    return r2s2r_campaign(config, 2, overrides), config, overrides


@pytest.mark.slow
def test_two_iteration_campaign_learns_from_its_redeploy_runs(campaign) -> None:
    """Iteration 2 identifies from iteration 1's random run and redeploy runs (reusing its
    attachment overlay), iteration 1's identified engine beats the uncalibrated one on its
    redeploy runs, and MLflow holds one run per iteration plus the campaign run."""
    result, config, overrides = campaign
    first, second = result["iterations"]
    assert "attach" in first["stages"] and "attach" not in second["stages"]  # iteration 1's overlay reused
    collected = Path(second["stages"]["collect"]["ref"]["path"])
    assert sorted(p.name for p in collected.iterdir() if p.is_dir()) == [f"straight-start{k}" for k in range(3)]
    sysid_summary = json.loads((Path(second["stages"]["sysid"]["ref"]["path"]) / "manifest.json").read_text())
    assert sysid_summary["summary"]["recordings"] == 1 + 3

    gap = first["headline"]
    assert gap["headline/gap_after_m"] < gap["headline/gap_before_m"]

    configs = load_all(config, overrides)
    client = client_for(RunLayout.of(configs))
    runs = client.search_runs([client.get_experiment_by_name("twoiter").experiment_id])
    runs = [r for r in runs if STAGE_TAG not in r.data.tags]  # the stages' child runs aside
    assert sorted(r.data.tags.get(ITERATION_TAG, "campaign") for r in runs) == ["1", "2", "campaign"]
    run = next(r for r in runs if r.data.tags.get(CAMPAIGN_RUN_TAG) == "1")
    history = client.get_metric_history(run.info.run_id, "headline/gap_after_m")
    assert [m.step for m in history] == [1, 2]  # the campaign's learning curve


@pytest.mark.slow
def test_iteration_two_beats_the_uncalibrated_engine_on_its_own_redeploy_runs(campaign) -> None:
    """Iteration 2's identified engine beats the uncalibrated one on its redeploy runs. An engine
    whose rods cannot roll fails it: the uncalibrated engine then wins by compensating errors.
    Whether iteration 2's gap is below iteration 1's is not asserted: the two gaps are of
    different gaits (iteration 2 searches again) and each is decided by the few runs where one
    engine tips a rod over and the other does not (measured here 9.9 -> 13.3 mm; in the main job
    0.042 -> 0.224 m, README): the analytic contact's limit (docs/sysid.md), not noise that a
    slack would cover."""
    second = campaign[0]["iterations"][1]["headline"]
    assert second["headline/gap_after_m"] < second["headline/gap_before_m"]
