"""Which stages of a campaign are cached, stale or missing under the current config.

A stage's Prefect cache key is a content hash of its input refs, its section of the
pipeline config, the robot config and the stage's code version
(:func:`tasks.caching.stage_cache_key`); Prefect keeps each result under its key in the
local result storage (``<runs>/.prefect/storage`` by default). So, per iteration and stage:

* **missing**: the stage folder holds no complete output;
* **cached**: it does, and a result is stored under the key that the current config and
  the inputs on disk give (the next run reuses it);
* **stale**: it does, but not under that key (the config or an input changed since), or
  an input stage is itself stale or missing: the next run recomputes it.
"""

from __future__ import annotations

from flows.iteration import STAGES, attach_iteration, earlier_data_refs
from pipeline.config import LoadedConfigs
from pipeline.errors import DataError
from storage.layout import RunLayout, complete_stage_ref
from tasks import attach, collect, evaluate, gaits, redeploy, sysid, track
from tasks.caching import is_cached

KEY_FUNCTIONS = {
    "collect": collect.cache_key,
    "track": track.cache_key,
    "attach": attach.cache_key,
    "sysid": sysid.cache_key,
    "gaits": gaits.cache_key,
    "redeploy": redeploy.cache_key,
    "evaluate": evaluate.cache_key,
}
INPUTS = {
    "collect": (),
    "track": ("collect",),
    "attach": ("track", "collect"),
    "sysid": ("collect", "track", "attach"),
    "gaits": ("attach", "sysid"),
    "redeploy": ("attach", "gaits"),
    "evaluate": ("attach", "sysid", "gaits", "redeploy"),
}


def iterations_on_disk(layout: RunLayout) -> list[int]:
    """The campaign's iterations that have a folder, in order."""
    found = [int(p.name.removeprefix("iter_")) for p in layout.campaign_dir.glob("iter_*") if p.is_dir()]
    return sorted(found)


def stage_status(configs: LoadedConfigs, iteration: int) -> dict[str, str]:
    """``cached`` / ``stale`` / ``missing`` for every stage of ``iteration`` (module docstring)."""
    layout = RunLayout(configs.pipeline.runs_dir, configs.pipeline.campaign)
    status: dict[str, str] = {}
    refs: dict[str, dict[str, str]] = {}
    for stage in STAGES:
        source = attach_iteration(configs, iteration) if stage == "attach" else iteration
        ref = complete_stage_ref(layout.stage_dir(source, stage))
        if ref is None:
            status[stage] = "missing"
            continue
        refs[stage] = ref.to_json()
        if source != iteration:
            status[stage] = stage_status(configs, source)[stage]
            continue
        if any(status[name] != "cached" for name in INPUTS[stage]):
            status[stage] = "stale"
            continue
        parameters: dict[str, object] = {"configs": configs, "iteration": iteration}
        parameters.update({f"{name}_ref": refs[name] for name in INPUTS[stage]})
        if stage == "sysid":
            try:
                parameters["earlier_refs"] = earlier_data_refs(configs, layout, iteration)
            except DataError:
                status[stage] = "stale"
                continue
        key = KEY_FUNCTIONS[stage](None, parameters)
        status[stage] = "cached" if is_cached(key) else "stale"
    return status
