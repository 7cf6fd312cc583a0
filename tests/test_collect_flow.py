"""The collect stage and the r2s2r_iteration flow (Prefect + MLflow, for real)."""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from flows.stages import stage_names
from flows.status import stage_status
from pipeline.config import load_all, robot_with_overlay
from pipeline.errors import DataError, HardwareError
from pipeline.hardware.twin import MujocoTwin
from pipeline.policies import random_policy
from storage.catalog import TRAINING_FILE
from storage.frames import iter_frames
from storage.layout import Ref, RunLayout, complete_stage_ref, read_manifest, write_manifest
from storage.recording import (
    FRAMES_FILE,
    GROUNDTRUTH_FILE,
    HARDWARE_FILE,
    Recording,
    RecordingIdentity,
    recover_recording,
)
from storage.tracked import TRACKED_FILE
from storage.tracking import (
    CAMPAIGN_RUN_TAG,
    EXPERIMENT_KIND_TAG,
    ITERATION_TAG,
    PARENT_TAG,
    client_for,
    stage_runs,
)
from storage.trajectory import read_trajectory
from tasks.collect import SOURCE_KEY, needs_hardware, run_collect

from .conftest import write_test_pipeline


def test_run_collect_writes_the_contract(test_pipeline: Path) -> None:
    configs = load_all(test_pipeline)
    ref, summary = run_collect(configs, iteration=1)
    manifest = read_manifest(ref)
    assert manifest["complete"] is True
    folder = Path(ref.path) / summary["policy_id"]
    hardware, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
    truth, truth_meta = read_trajectory(folder / GROUNDTRUTH_FILE, expect_source="groundtruth")
    assert meta.complete and truth_meta.complete
    assert meta.iteration == 1 and meta.campaign == "test" and meta.policy_id == summary["policy_id"]
    assert len(hardware) == len(truth) == summary["n_sensor_samples"]
    assert {"imu0_qw", "motor_5", "cable_8"} <= set(hardware.columns)
    assert hardware["segment"].max() == summary["n_targets"] - 1
    frames = list(iter_frames(folder / FRAMES_FILE))
    assert len(frames) == summary["n_frames"] > 0
    assert set(manifest["files"]) >= {
        f"{summary['policy_id']}/{HARDWARE_FILE}",
        "plots/top_view.png",
        "plots/first_frame.png",
    }

    again, _ = run_collect(configs, iteration=1)
    assert again == ref  # complete data are never overwritten
    n_sensor = summary["n_sensor_samples"]
    assert not needs_hardware(configs, 1) and not needs_hardware(
        load_all(test_pipeline, {"collect.checkpoint_every_s": 9}), 1
    )

    # another collect config: that recording is not this config's; kept aside, recorded anew
    more = load_all(test_pipeline, {"collect.random.n_targets": configs.pipeline.collect.random.n_targets + 1})
    assert needs_hardware(more, 1)
    other, other_summary = run_collect(more, iteration=1)
    assert other_summary["n_targets"] > summary["n_targets"] and other.sha256 != ref.sha256
    kept = list((RunLayout.of(configs).set_aside_dir / "iter_1").glob("collect.replaced-*"))
    assert len(kept) == 1 and len(read_trajectory(kept[0] / summary["policy_id"] / HARDWARE_FILE)[0]) == n_sensor
    assert not needs_hardware(more, 1)


def test_disconnect_keeps_partial_recording(tmp_path: Path) -> None:
    configs = load_all(write_test_pipeline(tmp_path, checkpoint_every_s=0.5))
    robot = MujocoTwin(configs.robot, configs.twin, fail_after_s=1.3)
    with pytest.raises(HardwareError, match="connection lost"):
        run_collect(configs, iteration=1, robot=robot)
    stage = RunLayout(configs.pipeline.runs_dir, "test").stage_dir(1, "collect")
    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest["complete"] is False and "connection lost" in manifest["summary"]["error"]
    folder = next(p for p in stage.iterdir() if p.is_dir() and p.name != "plots")
    hardware, meta = read_trajectory(folder / HARDWARE_FILE)
    assert meta.complete is False and "HardwareError" in meta.model_extra["incomplete_reason"]
    assert len(hardware) == 65  # 1.3 s at 50 Hz: every packet streamed before the fault
    assert len(list(iter_frames(folder / FRAMES_FILE))) == 7

    # The rerun resumes: the partial recording stays as it is, the rest of the policy is recorded
    # from the segment the fault cut short.
    stopped = int(hardware["segment"].max())
    ref, summary = run_collect(configs, iteration=1)
    assert read_manifest(ref)["complete"] is True
    assert summary["policy_id"] == folder.name and summary["resumed_from_segment"] == stopped
    assert not RunLayout.of(configs).set_aside_dir.exists()
    assert len(read_trajectory(folder / HARDWARE_FILE)[0]) == 65  # untouched
    rest = stage / summary["resumed_policy_id"]
    resumed, resumed_meta = read_trajectory(rest / HARDWARE_FILE)
    # the summary (and so MLflow) counts the whole recording: the part cut short and the rest
    assert summary["n_sensor_samples"] == 65 + len(resumed)
    assert summary["n_frames"] == 7 + len(list(iter_frames(rest / FRAMES_FILE)))
    assert summary["n_targets"] == len(json.loads((folder / "policy.json").read_text())["targets"])
    assert summary["targets_reached"] == summary["n_targets"]
    assert summary["duration_s"] == pytest.approx(np.ptp(hardware["t"]) + np.ptp(resumed["t"]), abs=0.05)
    targets = json.loads((folder / "policy.json").read_text())["targets"]
    assert resumed_meta.complete and resumed["segment"].max() == len(targets) - stopped - 1
    assert json.loads((rest / "policy.json").read_text())["targets"] == targets[stopped:]

    # sysid reads the partial recording up to its last finished segment
    from storage.catalog import load_recordings
    from tasks.track import run_track

    shutil.copytree(rest, stage / "not-in-the-manifest")  # e.g. a folder a user put there
    track_ref, track_summary = run_track(configs, 1, ref)
    assert sorted(r["policy_id"] for r in track_summary["recordings"]) == sorted([folder.name, rest.name])
    recordings = load_recordings(ref, track_ref, 8.0)
    assert set(recordings) == {folder.name, rest.name}
    assert recordings[folder.name].segment.max() == stopped - 1


def test_a_later_collect_follows_the_redeploy_runs_it_copies(tmp_path: Path, twin, monkeypatch) -> None:
    """Iteration 2 collects iteration 1's redeploy runs. Unchanged, a rerun returns the same
    collection; once they are recorded again (new gaits, so new redeploy runs), a rerun copies the
    new ones and keeps the old collection aside, and with ``redeploy_and_random`` carries the
    iteration's own random recording over instead of running the hardware again: only a first
    collection of the random policy needs the robot (``needs_hardware``, which lets a flow without
    the hardware copy the new runs)."""
    config = write_test_pipeline(tmp_path, campaign="stale", n_targets=2, later_iterations="redeploy_and_random")
    configs = load_all(config)
    layout = RunLayout.of(configs)
    redeploy_dir = layout.stage_dir(1, "redeploy")

    def redeploy_run(seed: int) -> None:
        folder = redeploy_dir / "straight-start0"
        folder.mkdir(parents=True)
        twin.reset()
        identity = RecordingIdentity("stale", 1, "straight-start0", "hash", 50.0, (0, 1, 2), 3.0)
        recording = Recording(folder, identity, camera=None, checkpoint_every_s=1.0)
        for packet in twin.execute(random_policy(twin.robot, 2, seed=seed), 3.0, record_frames=False):
            recording.add(packet)
        recording.close(complete=True)
        write_manifest(redeploy_dir, "redeploy", complete=True, summary={"runs": 1})

    executions = []
    original = MujocoTwin.execute

    def counting_execute(self, *args, **kwargs):
        executions.append(1)
        yield from original(self, *args, **kwargs)

    redeploy_run(seed=1)
    copy_only = load_all(config, {"collect.later_iterations": "redeploy"})
    assert needs_hardware(configs, 1) and needs_hardware(configs, 2) and not needs_hardware(copy_only, 2)
    monkeypatch.setattr(MujocoTwin, "execute", counting_execute)
    first, summary = run_collect(configs, iteration=2, robot=twin)
    assert not needs_hardware(configs, 2)
    assert executions == [1] and summary[SOURCE_KEY] == complete_stage_ref(redeploy_dir).sha256
    random_policy_id = summary["policy_id"]
    assert run_collect(configs, iteration=2, robot=twin)[0] == first
    monkeypatch.setattr(MujocoTwin, "execute", original)
    shutil.rmtree(redeploy_dir)
    redeploy_run(seed=2)
    assert not needs_hardware(configs, 2)  # stale, its random recording carried over
    policy_id = summary["policy_id"]
    shutil.move(Path(first.path) / policy_id, tmp_path / policy_id)
    assert needs_hardware(configs, 2)  # stale and nothing to carry over: the robot records it again
    shutil.move(tmp_path / policy_id, Path(first.path) / policy_id)
    monkeypatch.setattr(MujocoTwin, "execute", counting_execute)
    second, summary = run_collect(configs, iteration=2, robot=twin)
    assert executions == [1] and second.sha256 != first.sha256
    assert summary[SOURCE_KEY] == complete_stage_ref(redeploy_dir).sha256
    assert summary["policy_id"] == random_policy_id  # the random recording kept
    copied = read_trajectory(Path(second.path) / "straight-start0" / HARDWARE_FILE)[0]
    source = read_trajectory(redeploy_dir / "straight-start0" / HARDWARE_FILE)[0]
    assert copied.equals(source)
    random_folder = Path(second.path) / str(summary["policy_id"])
    [replaced] = (layout.set_aside_dir / "iter_2").glob("collect.replaced-*")
    for name in (HARDWARE_FILE, GROUNDTRUTH_FILE):  # carried over as it was recorded, not run again
        assert (random_folder / name).read_bytes() == (replaced / random_policy_id / name).read_bytes()
    read_manifest(second)  # every file listed and unchanged


def test_recover_recording_after_a_killed_process(tmp_path: Path, twin) -> None:
    twin.reset()
    identity = RecordingIdentity("c", 1, "p-1", "hash", 50.0, (0, 1, 2), 8.0)
    recording = Recording(tmp_path, identity, camera=None, checkpoint_every_s=0.2)
    for packet in twin.execute(random_policy(twin.robot, 2, seed=1), 8.0, record_frames=False):
        recording.add(packet)
        if recording.last_t_s >= 1.0:
            break  # the process dies here: close() is never called
    recovered = recover_recording(tmp_path)
    assert sorted(p.name for p in recovered) == [GROUNDTRUTH_FILE, HARDWARE_FILE]
    hardware, meta = read_trajectory(tmp_path / HARDWARE_FILE)
    assert meta.complete is False and meta.segment_timeout_s == 8.0
    # 50 Hz, each stamp jittered by less than 0.4 of a tick: at most 51 packets before 1 s (the one
    # due at 1 s may come early) and the one that crossed it; the session twin's noise state
    # depends on the tests that ran before this one
    assert 40 <= len(hardware) <= 52
    assert np.all(np.diff(hardware["t"]) > 0)


def test_flow_caches_collect_and_keeps_one_mlflow_run_per_iteration(
    prefect_server, tmp_path: Path, monkeypatch
) -> None:
    from flows.iteration import r2s2r_iteration

    executions = []
    original = MujocoTwin.execute

    def counting_execute(self, *args, **kwargs):
        executions.append(1)
        yield from original(self, *args, **kwargs)

    monkeypatch.setattr(MujocoTwin, "execute", counting_execute)
    config = str(write_test_pipeline(tmp_path, campaign="flowtest", n_targets=2))
    first = r2s2r_iteration(config, iteration=1)
    second = r2s2r_iteration(config, iteration=1)
    assert executions == [1] * 4  # collect, then the redeploy of one policy from three starts
    assert first["stages"]["collect"]["cached"] is False
    assert second["stages"]["collect"]["cached"] is True
    assert second["stages"]["collect"]["ref"] == first["stages"]["collect"]["ref"]
    assert first["mlflow_run_id"] == second["mlflow_run_id"]

    third = r2s2r_iteration(config, iteration=2, stages=["collect"])
    assert executions == [1] * 4  # iteration 2 collects iteration 1's redeploy runs: no hardware
    collected = sorted(p.name for p in Path(third["stages"]["collect"]["ref"]["path"]).iterdir() if p.is_dir())
    assert collected == ["turning-start0", "turning-start1", "turning-start2"]
    assert third["mlflow_run_id"] != first["mlflow_run_id"]

    configs = load_all(config)
    redeployed = Path(third["stages"]["collect"]["ref"]["path"]) / "turning-start0" / HARDWARE_FILE
    assert read_trajectory(redeployed)[1].segment_timeout_s == configs.pipeline.redeploy.segment_timeout_s
    client = client_for(RunLayout.of(configs))
    experiment = client.get_experiment_by_name("flowtest")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.tags[ITERATION_TAG] for r in runs if ITERATION_TAG in r.data.tags) == ["1", "2"]
    run = client.get_run(first["mlflow_run_id"])
    campaign = next(r for r in runs if r.data.tags.get(CAMPAIGN_RUN_TAG) == "1")
    assert run.data.tags[PARENT_TAG] == campaign.info.run_id  # the run tree: campaign, iterations, stages
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"  # the UI opens on the runs

    def stage_run(stage: str) -> str:
        """The stage's one child run of iteration 1's run (its second invocation was cached)."""
        (found,) = stage_runs(client, run.info.run_id, stage)
        assert found.info.status == "FINISHED" and found.data.params["robot.config_hash"]
        return found.info.run_id

    assert run.info.status == "FINISHED"
    assert run.data.params["robot.pid.kp"] == "6.0"
    assert run.data.params["pipeline.collect.policy"] == "random"
    assert run.data.metrics["collect/n_frames"] > 0
    assert run.data.metrics["collect/duration_s"] > 1.0
    # each computed stage's wall and CPU time: collecting takes a good share of the recording's
    # duration (the twin steps and renders every frame), and it computes rather than waits
    assert run.data.metrics["time/collect_wall_s"] > run.data.metrics["collect/duration_s"] / 4
    assert 0.1 * run.data.metrics["time/collect_wall_s"] < run.data.metrics["time/collect_cpu_s"]
    artifacts = {a.path for a in client.list_artifacts(stage_run("collect"))}
    assert artifacts == {"top_view.png", "first_frame.png"}
    from mlflow.artifacts import download_artifacts

    logged = Path(
        download_artifacts(run_id=stage_run("collect"), artifact_path="top_view.png", tracking_uri=client.tracking_uri)
    )
    plot = Path(first["stages"]["collect"]["ref"]["path"]) / "plots" / "top_view.png"
    assert logged.read_bytes() == plot.read_bytes() and plot.read_bytes().startswith(b"\x89PNG")
    assert client.get_run(stage_run("collect")).data.params["collect.policy"] == "random"  # its config section
    assert "prefect.flow_run_id" in run.data.tags
    assert run.data.tags["r2s2r.env.mujoco"] == version("mujoco")
    assert run.data.tags["r2s2r.env.torch"] == version("torch")
    assert run.data.tags["r2s2r.env.cpu_capability"] == torch.backends.cpu.get_cpu_capability()

    # the later stages ran after collect, were cached the second time, and logged to the same run
    for stage in ("track", "attach", "sysid", "learn", "gaits", "actions", "redeploy", "evaluate"):
        assert first["stages"][stage]["cached"] is False
        assert second["stages"][stage]["cached"] is True
    assert run.data.metrics["track/error_cap_error_mean_mm"] < 10.0  # 320 x 240 test camera
    assert run.data.metrics["track/error_identity_swaps"] == 0
    assert {a.path for a in client.list_artifacts(stage_run("attach"))} >= {"attachment.png"}
    overlay = Path(first["stages"]["attach"]["ref"]["path"]) / "attachment.yaml"
    phases = robot_with_overlay(configs.robot, yaml.safe_load(overlay.read_text()), overlay).attachment.phase_rad
    assert phases == pytest.approx([run.data.metrics[f"attach/phase_rad_{r}"] for r in range(3)])
    assert phases != pytest.approx(configs.robot.attachment.phase_rad, abs=1e-3)  # the overlay moved them
    sysid_dir = Path(first["stages"]["sysid"]["ref"]["path"])
    identified = yaml.safe_load((sysid_dir / "identified.yaml").read_text())
    assert set(identified) == {"motor", "ground", "pid"} and set(identified["ground"]) == {"friction", "restitution"}
    history = pq.read_table(sysid_dir / "history.parquet").to_pandas()
    methods = history["method"].tolist()  # warm-up, 2 generations, profile moves, one shooting step
    assert methods == ["gradient"] * 2 + ["search"] * 2 + ["profile"] * (len(methods) - 5) + ["shooting"]
    assert history["loss"].notna().all()
    assert run.data.params["sysid.identified.motor_speed"] == f"{identified['motor']['speed']:.6g}"
    assert len(client.get_metric_history(stage_run("sysid"), "sysid/loss")) == len(methods)
    truth_error = identified["ground"]["friction"] - configs.twin.ground.friction_sliding  # the twin's hidden truth
    assert run.data.metrics["sysid/truth_error.friction"] == pytest.approx(truth_error, abs=1e-6)
    low, high = run.data.metrics["sysid/profile_low.friction"], run.data.metrics["sysid/profile_high.friction"]
    assert low <= identified["ground"]["friction"] <= high
    assert "sysid/profile_low.motor_speed" not in run.data.metrics  # the search's range, dropped once shot
    after_mm = run.data.metrics["sysid/holdout.after.key_frame_error_mm"]
    assert 0 < run.data.metrics["sysid/holdout.after.key_frame_error_median_mm"] < 1000  # the typical held-out gait
    latency_ms = round(1000 * identified["pid"]["latency_s"])  # the grid's best at its best motor speed
    assert run.data.metrics[f"sysid/latency_loss.{latency_ms}ms"] == min(
        run.data.metrics[f"sysid/latency_loss.{round(1000 * s)}ms"] for s in configs.pipeline.sysid.latency.grid_s
    )
    assert f"sysid/latency_motor_speed.{latency_ms}ms" in run.data.metrics
    truth_mm = run.data.metrics["sysid/holdout.truth.key_frame_error_mm"]  # the twin's own values, replayed
    before_mm = run.data.metrics["sysid/holdout.before.key_frame_error_mm"]
    for key, mm in (
        ("holdout.truth.key_frame_error_reduction_pct", truth_mm),
        ("holdout.key_frame_error_reduction_pct", after_mm),
    ):
        assert run.data.metrics[f"sysid/{key}"] == pytest.approx(100 * (1 - mm / before_mm))
    assert {a.path for a in client.list_artifacts(stage_run("sysid"))} >= {
        "parameters.png",
        "identified.yaml",
        "history.parquet",
    }
    for name in ("identified.yaml", "history.parquet"):  # the stage's files, as they are on disk
        logged = download_artifacts(run_id=stage_run("sysid"), artifact_path=name, tracking_uri=client.tracking_uri)
        assert Path(logged).read_bytes() == (sysid_dir / name).read_bytes(), name
    models = {m.name: m for m in client.search_logged_models([experiment.experiment_id])}
    assert set(models) == {"identified-robot", "learned-contact"}
    model = models["identified-robot"]  # the identified robot, loadable
    assert model.source_run_id == stage_run("sysid") and model.tags["r2s2r.robot_config_hash"]
    assert model.params["identified.motor_speed"] == f"{identified['motor']['speed']:.6g}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # as a user points MLflow at the runs
    model_dir = Path(download_artifacts(f"models:/{model.model_id}"))
    assert (model_dir / "identified.xml").read_bytes() == (sysid_dir / "identified.xml").read_bytes()
    # the learned contact, loadable by a user from MLflow for the identified robot
    from pipeline.physics.model import RobotModel
    from storage.catalog import identified_robot
    from storage.contact_model import load_contact_model

    learned = models["learned-contact"]
    assert learned.source_run_id == stage_run("learn")
    contact_file = Path(download_artifacts(f"models:/{learned.model_id}")) / "contact_model.safetensors"
    learn_dir = Path(first["stages"]["learn"]["ref"]["path"])
    assert contact_file.read_bytes() == (learn_dir / "contact_model.safetensors").read_bytes()
    refs = {s: Ref.from_json(first["stages"][s]["ref"]) for s in ("attach", "sysid")}
    robot = identified_robot(configs, refs["attach"], refs["sysid"])
    _, _, metadata = load_contact_model(contact_file, RobotModel.from_robot(robot))
    assert metadata["pretrained_on"].startswith("the analytic engine") and metadata["fine_tuned_on"]
    assert run.data.metrics["learn/holdout.learned.key_frame_error_mm"] > 0
    headline = {k: v for k, v in run.data.metrics.items() if k.startswith("headline/")}
    assert headline["headline/heldout_after_mm"] == run.data.metrics["sysid/holdout.after.key_frame_error_mm"]
    assert headline["headline/identified.friction"] == identified["ground"]["friction"]

    gaits_dir = Path(first["stages"]["gaits"]["ref"]["path"])
    policies = json.loads((gaits_dir / "policies.json").read_text())
    assert set(policies) == {"straight", "turning"} and all(p["simulated"]["reached"] for p in policies.values())
    for name, policy in policies.items():  # each judged over the parameter ensemble and 3 perturbed starts
        assert policy["expansion"]["perturbed_starts"] == 3 and 0 <= policy["expansion"]["reached_share"] <= 1
        assert run.data.metrics[f"gaits/policy.{name}.expansion_reached_share"] == policy["expansion"]["reached_share"]
    gaits_json = json.loads((gaits_dir / "gaits.json").read_text())
    found, found_search = gaits_json["found"], gaits_json["search"]
    assert found["ccw"]["rotation_deg"] >= found["cw"]["rotation_deg"]  # depth 2 here: whatever turns most
    assert found["forward"]["forward_m"] > found["backward"]["forward_m"]
    table = pq.read_table(gaits_dir / "gaits.parquet").to_pandas()  # ensemble means of found and published gaits
    assert set(table["source"]) == {"found", "published"}
    assert table[["ensemble_forward_m", "ensemble_rotation_deg"]].notna().all().all()
    assert "gaits/forward.forward_m" in run.data.metrics and "gaits/search_simulated" in run.data.metrics
    assert run.data.metrics["gaits/search_collapsed"] == sum(found_search["collapsed_per_level"])
    redeploy_dir = Path(first["stages"]["redeploy"]["ref"]["path"])
    runs = sorted(p.name for p in redeploy_dir.iterdir() if (p / "tracked.parquet").is_file())
    assert runs == ["turning-start0", "turning-start1", "turning-start2"]
    repeatability = json.loads((redeploy_dir / "repeatability.json").read_text())["turning"]
    assert repeatability["runs"] == 3 and repeatability["rotation_deg_std"] >= 0
    assert "redeploy/repeatability.turning.rotation_deg_mean" in run.data.metrics
    evaluate_dir = Path(first["stages"]["evaluate"]["ref"]["path"])
    gap = pq.read_table(evaluate_dir / "gap.parquet").to_pandas()
    assert len(gap) == 3 * 4 and set(gap["engine"]) == {"before", "after", "learned", "truth"}
    assert (gap["com_error_m"] >= 0).all() and gap["heading_error_deg"].between(0, 180).all()
    for key in (
        "gap.before.com_error_m",
        "gap.learned.com_error_m",
        "gap.truth.com_error_m",
        "gap.after.turning.heading_error_deg",
    ):
        assert f"evaluate/{key}" in run.data.metrics, key
    assert {a.path for a in client.list_artifacts(stage_run("evaluate"))} >= {
        "gap.parquet",
        "summary.md",
        "turning-start0.png",
    }
    assert {a.path for a in client.list_artifacts(stage_run("sysid"))} >= {"identified.xml"}
    summary_md = (evaluate_dir / "summary.md").read_text()
    assert f"| {identified['ground']['friction']:.4g} | {low:.4g} to {high:.4g} |" in summary_md  # profile range
    # Prefect and MLflow link up: the flow run id as a tag there, the MLflow run id in the summary artifact here
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tasks.evaluate import artifact_key

    with get_client(sync_client=True) as prefect:
        key_filter = ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("flowtest", 1)]))
        artifacts = prefect.read_artifacts(artifact_filter=key_filter)
        flow_run = prefect.read_flow_run(run.data.tags["prefect.flow_run_id"])
    assert artifacts and artifacts[0].type == "markdown" and first["mlflow_run_id"] in artifacts[0].data
    assert flow_run.name and artifacts[0].flow_run_id is not None

    # status: everything of iteration 1 cached; a new learning rate makes sysid and what follows stale
    assert stage_status(configs, 1) == dict.fromkeys(stage_names(), "cached")
    changed = load_all(config, {"sysid.gradient.lr": 0.05})
    assert stage_status(changed, 1) == {
        **dict.fromkeys(("collect", "track", "attach"), "cached"),
        **dict.fromkeys(("sysid", "learn", "gaits", "actions", "redeploy", "evaluate"), "stale"),
    }
    # the learned contact's training is its own: gaits does not read it, evaluate does
    retrained = load_all(config, {"learn.fine_tune.epochs": [2]})
    assert stage_status(retrained, 1) == {
        **dict.fromkeys(("collect", "track", "attach", "sysid", "gaits", "actions", "redeploy"), "cached"),
        **dict.fromkeys(("learn", "evaluate"), "stale"),
    }
    assert stage_status(configs, 2)["collect"] == "cached" and stage_status(configs, 2)["track"] == "missing"

    # the terminal table of the iterations' headline metrics
    from typer.testing import CliRunner

    from flows.cli import app

    table = CliRunner().invoke(app, ["compare", "--config", config], env={"COLUMNS": "1000"})
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert any("iteration 1" in line and "iteration 2" in line for line in lines)
    row = next(line for line in lines if "headline/gap_after_m" in line)
    expected = run.data.metrics["evaluate/gap.after.com_error_m"]
    assert row.split("│")[2].strip() == f"{expected:.4g}"  # iteration 1's column

    # r2s2r rerun learn with a longer fine-tuning: learn is fine-tuned again from the cached
    # pre-training and evaluate replays the redeploy runs in the new model; gaits and redeploy stay
    import tasks.learn

    curricula = []
    original_train = tasks.learn.train

    def counting_train(*args, **kwargs):
        curricula.append(args[6])
        return original_train(*args, **kwargs)

    monkeypatch.setattr(tasks.learn, "train", counting_train)
    longer = {"learn.fine_tune.epochs": [2]}
    command = ["rerun", "learn", "--config", config, "--iteration", "1", "--set", "learn.fine_tune.epochs=[2]"]
    result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert [c.epochs for c in curricula] == [(2,)] and executions == [1] * 4  # no pre-training, no hardware
    assert stage_status(load_all(config, longer), 1) == dict.fromkeys(stage_names(), "cached")
    learn_dir = RunLayout.of(configs).stage_dir(1, "learn")
    assert pq.read_table(learn_dir / TRAINING_FILE).num_rows == 2  # the two fine-tuning epochs

    # r2s2r rerun gaits with more straight cycles: collect, track, attach and sysid are reused (no
    # hardware, no tracking), gaits recomputed; redeploy and evaluate are left stale (the robot would
    # have to run the new gaits)
    import tasks.track

    tracking = []
    original_track = tasks.track.track_recording

    def counting_track(*args, **kwargs):
        tracking.append(1)
        return original_track(*args, **kwargs)

    monkeypatch.setattr(tasks.track, "track_recording", counting_track)
    more_cycles = {"gaits.straight_cycles": 2}
    command = ["rerun", "gaits", "--config", config, "--iteration", "1", "--set", "gaits.straight_cycles=2"]
    result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert executions == [1] * 4 and tracking == []
    assert "needs the hardware" in result.output
    assert stage_status(load_all(config, more_cycles), 1) == {
        **dict.fromkeys(("collect", "track", "attach", "sysid", "learn", "gaits", "actions"), "cached"),
        **dict.fromkeys(("redeploy", "evaluate"), "stale"),
    }
    assert stage_status(configs, 1)["gaits"] == "stale"  # its folder now holds the two-cycle output
    assert stage_status(configs, 1)["sysid"] == "cached"
    refused = CliRunner().invoke(app, ["rerun", "collect", "--config", config])
    assert refused.exit_code == 2 and "--recollect" in refused.output

    # a truncated attach file: `status` names it, the next run keeps the output aside and recomputes it
    attach_dir = RunLayout.of(configs).stage_dir(1, "attach")
    overlay = attach_dir / "attachment.yaml"
    overlay.write_bytes(overlay.read_bytes()[:-5])
    problems: dict[str, str] = {}
    assert stage_status(configs, 1, problems=problems)["attach"] == "corrupt"
    assert str(overlay) in problems["attach"]
    rerun = r2s2r_iteration(config, iteration=1, stages=["attach"])
    assert rerun["stages"]["attach"]["cached"] is False
    assert yaml.safe_load(overlay.read_text()) and stage_status(configs, 1)["attach"] != "corrupt"
    set_aside = RunLayout.of(configs).set_aside_dir / "iter_1"
    assert len(list(set_aside.glob("attach.corrupt-*"))) == 1

    # an edit that keeps the size and the time is found by hashing (status --verify)
    tracked = next(RunLayout.of(configs).stage_dir(1, "track").glob(f"*/{TRACKED_FILE}"))
    stat = tracked.stat()
    data = bytearray(tracked.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tracked.write_bytes(bytes(data))
    os.utime(tracked, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert stage_status(configs, 1)["track"] != "corrupt"
    assert stage_status(configs, 1, verify=True)["track"] == "corrupt"

    # a changed recording is never recorded again behind the user's back: refused, kept aside
    recording = next(Path(first["stages"]["collect"]["ref"]["path"]).glob(f"*/{HARDWARE_FILE}"))
    recording.write_bytes(recording.read_bytes() + b"\0")
    with pytest.raises(DataError, match=rf"{recording.name}: .* bytes where .*kept at .*collect\.corrupt-"):
        r2s2r_iteration(config, iteration=1, stages=["collect"])
    assert executions == [1] * 4 and len(list(set_aside.glob("collect.corrupt-*"))) == 1
