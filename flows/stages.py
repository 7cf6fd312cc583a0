"""The stage table: every stage of an iteration, once.

Each :class:`Stage` names its Prefect task, the stages whose refs it reads (``inputs``, each
passed to the task as ``<input>_ref``), its code version and the config sections in its cache
key. The iteration flow (:mod:`flows.iteration`) runs the table in order, ``r2s2r status``
(:mod:`flows.status`) and ``r2s2r rerun`` read it, and every stage's Prefect cache key is
derived from its entry (:meth:`Stage.cache_key`). Adding a stage is one entry here and one
task module in ``tasks/``.

A stage's task is called as ``task(configs, iteration, mlflow_run_id, <input>_ref=...,
**extra)``: ``extra`` holds the arguments of :attr:`Stage.arguments` (data from other
iterations) and of :attr:`Stage.fan_out` (parallel task runs the flow submits first: the gait
search's shards, the redeploy runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prefect import Task
from prefect.context import TaskRunContext

from flows.caching import is_cached, stage_cache_key
from pipeline.config import ROBOT_FIELD, LoadedConfigs
from storage.catalog import attach_iteration
from storage.layout import Ref, RunLayout, existing_ref
from tasks import collect, gaits, redeploy
from tasks.actions import actions
from tasks.attach import attach
from tasks.evaluate import evaluate
from tasks.learn import learn
from tasks.sysid import sysid
from tasks.track import track

Refs = Mapping[str, dict[str, str]]
"""Stage refs (JSON) by stage name."""


@dataclass(frozen=True)
class Call:
    """What a stage's hooks see when the flow runs it: the configs, the iteration, the refs of
    its inputs, and whether the stage is to be recomputed even if cached (``fresh``)."""

    configs: LoadedConfigs
    iteration: int
    refs: Refs
    fresh: bool

    @property
    def layout(self) -> RunLayout:
        return RunLayout.of(self.configs)


@dataclass(frozen=True)
class Stage:
    """One stage of an iteration (see the module docstring)."""

    name: str
    task: Task
    inputs: tuple[str, ...]
    version: str
    sections: tuple[str, ...]
    """Config fields in the cache key: pipeline config sections or fields by dotted name
    (:func:`flows.caching.config_field`), and ``robot`` for the robot config: every field that
    changes the stage's output (``tests/test_stages.py`` walks them)."""
    hardware: bool = False
    """Whether the stage drives the hardware: it never runs again unless asked (``--recollect``)."""
    arguments: Callable[[Call], dict[str, object]] | None = None
    """Extra task arguments that are part of the key (data from other iterations)."""
    key_inputs: Callable[[dict], Refs] | None = None
    """Refs other than ``<input>_ref`` in the key, from the task's parameters."""
    fan_out: Callable[[Call, bool], dict[str, object]] | None = None
    """Submits the stage's parallel task runs before it (told whether the stage is cached) and
    returns extra task arguments that are not part of the key."""
    source_iteration: Callable[[LoadedConfigs, int], int] = field(default=lambda configs, iteration: iteration)
    """The iteration whose output this iteration uses (another: the stage is not run, its output reused)."""
    needs_robot: Callable[[LoadedConfigs, int], bool] = field(default=lambda configs, iteration: True)
    """For a hardware stage: whether running it now would drive the robot."""
    optional_inputs: Callable[[LoadedConfigs], tuple[str, ...]] = field(default=lambda configs: ())
    """Stages the config makes it read besides :attr:`inputs` (passed and keyed the same way)."""
    figures: tuple[tuple[str, str], ...] = ()
    """The stage's key figures for its closing line: (metric on the iteration run, format), in order."""

    def figure_text(self, metrics: Mapping[str, float]) -> str:
        """The :attr:`figures` that ``metrics`` (the iteration run's) hold, formatted, joined."""
        return ", ".join(text.format(metrics[key]) for key, text in self.figures if key in metrics)

    def inputs_of(self, configs: LoadedConfigs) -> tuple[str, ...]:
        """The stages whose refs it reads under ``configs``: :attr:`inputs`, then the optional ones."""
        return self.inputs + self.optional_inputs(configs)

    def cache_key(self, context: TaskRunContext | None, parameters: dict) -> str:
        """The Prefect cache key of the stage for its task's ``parameters``: the iteration's
        identity, the hashes of its input refs (and :attr:`key_inputs`), its :attr:`sections`
        and its version (:func:`flows.caching.stage_cache_key`)."""
        inputs = {name: parameters[f"{name}_ref"] for name in self.inputs_of(parameters["configs"])}
        if self.key_inputs is not None:
            inputs.update(self.key_inputs(parameters))
        return stage_cache_key(
            self.name, self.version, parameters["configs"], parameters["iteration"], inputs, self.sections
        )

    def prefect_task(self, fresh: bool = False) -> Task:
        """The stage's task with its cache key and JSON result persistence (``fresh``: recomputed
        even if cached)."""
        return self.task.with_options(
            cache_key_fn=self.cache_key, persist_result=True, result_serializer="json", refresh_cache=fresh
        )

    def parameters(self, call: Call, mlflow_run_id: str = "") -> dict[str, object]:
        """The task's parameters (without the fan-out's), as the cache key sees them."""
        parameters: dict[str, object] = {"configs": call.configs, "iteration": call.iteration}
        if mlflow_run_id:
            parameters["mlflow_run_id"] = mlflow_run_id
        parameters.update({f"{name}_ref": call.refs[name] for name in self.inputs_of(call.configs)})
        if self.arguments is not None:
            parameters.update(self.arguments(call))
        return parameters

    def is_cached(self, call: Call) -> bool:
        """Whether a result is stored under the key the call gives, and it is the output on disk."""
        return is_cached(self.cache_key(None, self.parameters(call)))


def earlier_data_refs(
    configs: LoadedConfigs, layout: RunLayout, iteration: int
) -> dict[int, tuple[dict[str, str], dict[str, str]]]:
    """The collect and track refs (JSON) of the earlier iterations whose trajectories the sysid and
    learn stages of ``iteration`` also use (all so far, or the last ``sysid.data.window`` with this one)."""
    window = configs.pipeline.sysid.data.window or iteration
    return {
        k: (existing_ref(layout, k, "collect").to_json(), existing_ref(layout, k, "track").to_json())
        for k in range(max(1, iteration - window + 1), iteration)
    }


def _collect_key_inputs(parameters: dict) -> Refs:
    """Iteration k > 1 collects iteration k - 1's redeploy runs: that stage's manifest hash."""
    configs, iteration = parameters["configs"], parameters["iteration"]
    if iteration == 1:
        return {}
    sha = collect.previous_redeploy_sha(RunLayout.of(configs), iteration)
    return {"redeploy_previous": {"sha256": sha or "none"}}


def _sysid_key_inputs(parameters: dict) -> Refs:
    """The earlier iterations' collect and track refs that sysid and learn also read."""
    inputs: dict[str, dict[str, str]] = {}
    for k, (collect_ref, track_ref) in sorted((parameters.get("earlier_refs") or {}).items()):
        inputs.update({f"collect_{k}": collect_ref, f"track_{k}": track_ref})
    return inputs


def _gait_shards(call: Call, cached: bool) -> dict[str, object]:
    """Submit the gait search's shards (unless the stage is cached); their results."""
    if cached and not call.fresh:
        return {"shard_results": None}
    count = call.configs.pipeline.gaits.search.shards
    inputs = (call.refs["attach"], call.refs["sysid"])
    futures = [gaits.search_shard.submit(call.configs, *inputs, k) for k in range(count)]
    return {"shard_results": [future.result() for future in futures]}


def _redeploy_runs(call: Call, cached: bool) -> dict[str, object]:
    """Set aside runs of other gaits, then submit every (policy, start) run (each skipped where
    its folder holds it), at once or one after another (``redeploy.concurrent_runs``)."""
    config = call.configs.pipeline.redeploy
    redeploy.set_aside_other_runs(call.configs, call.iteration, Ref.from_json(call.refs["gaits"]), fresh=call.fresh)
    futures = []
    for index in range(len(config.policies) * len(config.starts)):
        futures.append(
            redeploy.redeploy_run.submit(call.configs, call.iteration, call.refs["attach"], call.refs["gaits"], index)
        )
        if not config.concurrent_runs:
            futures[-1].result()
    for future in futures:
        future.result()
    return {}


TABLE: tuple[Stage, ...] = (
    Stage(
        "collect",
        collect.collect,
        inputs=(),
        version="3",
        sections=collect.KEY_FIELDS,
        hardware=True,
        arguments=lambda call: {"fresh": call.fresh},
        key_inputs=_collect_key_inputs,
        needs_robot=collect.needs_hardware,
        figures=(("collect/n_frames", "{:.0f} camera frames"), ("collect/n_sensor_samples", "{:.0f} sensor samples")),
    ),
    Stage(
        "track",
        track,
        inputs=("collect",),
        version="1",
        sections=("track", ROBOT_FIELD),
        figures=(
            ("track/samples_per_s", "{:.0f} frames/s"),
            ("track/error_cap_error_mean_mm", "end caps {:.1f} mm from the truth (mean)"),
        ),
    ),
    Stage(
        "attach",
        attach,
        inputs=("track", "collect"),
        version="1",
        sections=("attach", ROBOT_FIELD),
        source_iteration=attach_iteration,
        figures=(("attach/rest_cable_residual_rms_m", "rest cable lengths fit to {:.4f} m rms"),),
    ),
    Stage(
        "sysid",
        sysid,
        inputs=("collect", "track", "attach"),
        version="8",
        sections=("sysid", "collect.segment_timeout_s", "hardware_backend", "hardware_config", ROBOT_FIELD),
        arguments=lambda call: {"earlier_refs": earlier_data_refs(call.configs, call.layout, call.iteration)},
        key_inputs=_sysid_key_inputs,
        figures=(
            ("sysid/holdout.before.key_frame_error_mm", "held-out key-frame error {:.1f} mm before"),
            ("sysid/holdout.after.key_frame_error_mm", "{:.1f} mm identified"),
        ),
    ),
    Stage(
        "learn",
        learn,
        inputs=("collect", "track", "attach", "sysid"),
        version="5",
        sections=("learn", "collect.segment_timeout_s", "redeploy.segment_timeout_s", ROBOT_FIELD),
        arguments=lambda call: {"earlier_refs": earlier_data_refs(call.configs, call.layout, call.iteration)},
        key_inputs=_sysid_key_inputs,
        figures=(
            ("learn/validation_loss", "validation loss {:.3g}"),
            ("learn/holdout.learned.key_frame_error_mm", "held-out key-frame error {:.1f} mm"),
        ),
    ),
    Stage(
        "gaits",
        gaits.gaits,
        inputs=("attach", "sysid"),
        version="8",
        sections=("gaits", "redeploy.segment_timeout_s", "engine.contact", ROBOT_FIELD),
        fan_out=_gait_shards,
        optional_inputs=lambda configs: ("learn",) if configs.pipeline.engine.contact == "learned" else (),
        figures=(
            ("gaits/policy.straight.forward_m", "straight policy {:.3f} m forward"),
            ("gaits/policy.turning.rotation_deg", "turning policy {:.0f} deg"),
        ),
    ),
    Stage(
        "actions",
        actions,
        inputs=("attach", "sysid", "gaits"),
        version="2",
        sections=(
            "follow.table",
            "follow.planner.max_spread_m",
            "follow.planner.max_spread_deg",
            "follow.planner.min_agreeing_share",
            "redeploy.segment_timeout_s",
            "gaits.search.dt_s",
            "engine.contact",
            ROBOT_FIELD,
        ),
        optional_inputs=lambda configs: ("learn",) if configs.pipeline.engine.contact == "learned" else (),
        figures=(("actions/actions", "{:.0f} actions"), ("actions/usable_share", "{:.0%} usable")),
    ),
    Stage(
        "redeploy",
        redeploy.redeploy,
        inputs=("attach", "gaits"),
        version="4",
        sections=redeploy.KEY_FIELDS,
        hardware=True,
        fan_out=_redeploy_runs,
        figures=(("redeploy/runs", "{:.0f} runs"),),
    ),
    Stage(
        "evaluate",
        evaluate,
        inputs=("attach", "sysid", "learn", "gaits", "redeploy"),
        version="6",
        sections=("redeploy", "gaits", "hardware_backend", "hardware_config", ROBOT_FIELD),
        figures=(
            ("evaluate/gap.before.com_error_m", "sim-to-real gap {:.3f} m before"),
            ("evaluate/gap.after.com_error_m", "{:.3f} m identified"),
            ("evaluate/gap.learned.com_error_m", "{:.3f} m learned"),
        ),
    ),
)
"""The stages of an iteration, in the order they run."""


def table() -> tuple[Stage, ...]:
    """The stage table now in force (:data:`TABLE`; a test may replace it)."""
    return TABLE


def stage_names() -> tuple[str, ...]:
    """The stages' names, in order."""
    return tuple(stage.name for stage in table())


def hardware_stages() -> tuple[str, ...]:
    """The stages that drive the hardware: never rerun unless asked (``r2s2r rerun --recollect``)."""
    return tuple(stage.name for stage in table() if stage.hardware)
