"""Which stages of a campaign are cached, stale or missing under the current config.

A stage's Prefect cache key is derived from its entry in the stage table
(:meth:`flows.stages.Stage.cache_key`: its input refs' hashes, its config sections and its code
version); Prefect keeps each result under its key in the local result storage
(``<runs>/.prefect/storage`` by default). So, per iteration and stage:

* **missing**: the stage folder holds no complete output;
* **cached**: it does, and a result is stored under the key that the current config and
  the inputs on disk give (the next run reuses it);
* **stale**: it does, but not under that key (the config or an input changed since), or
  an input stage is itself stale or missing: the next run recomputes it.
"""

from __future__ import annotations

from flows import stages as stage_table
from flows.stages import Call
from pipeline.config import LoadedConfigs
from pipeline.errors import DataError
from storage.layout import RunLayout, complete_stage_ref


def iterations_on_disk(layout: RunLayout) -> list[int]:
    """The campaign's iterations that have a folder, in order."""
    found = [int(p.name.removeprefix("iter_")) for p in layout.campaign_dir.glob("iter_*") if p.is_dir()]
    return sorted(found)


def stage_status(configs: LoadedConfigs, iteration: int) -> dict[str, str]:
    """``cached`` / ``stale`` / ``missing`` for every stage of ``iteration`` (module docstring)."""
    layout = RunLayout.of(configs)
    status: dict[str, str] = {}
    refs: dict[str, dict[str, str]] = {}
    for stage in stage_table.table():
        source = stage.source_iteration(configs, iteration)
        ref = complete_stage_ref(layout.stage_dir(source, stage.name))
        if ref is None:
            status[stage.name] = "missing"
            continue
        refs[stage.name] = ref.to_json()
        if source != iteration:
            status[stage.name] = stage_status(configs, source)[stage.name]
            continue
        if any(status[name] != "cached" for name in stage.inputs_of(configs)):
            status[stage.name] = "stale"
            continue
        try:
            cached = stage.is_cached(Call(configs, iteration, refs, fresh=False))
        except DataError:  # data of another iteration it reads is missing
            cached = False
        status[stage.name] = "cached" if cached else "stale"
    return status
