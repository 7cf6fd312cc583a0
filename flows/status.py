"""Which stages of a campaign are cached, stale or missing under the current config.

A stage's Prefect cache key is derived from its entry in the stage table
(:meth:`flows.stages.Stage.cache_key`: its input refs' hashes, its config sections and its code
version); Prefect keeps each result under its key in the local result storage
(``<runs>/.prefect/storage`` by default). So, per iteration and stage:

* **missing**: the stage folder holds no complete output;
* **cached**: it does, and a result is stored under the key that the current config and
  the inputs on disk give (the next run reuses it);
* **stale**: it does, but not under that key (the config or an input changed since), or
  an input stage is itself stale or missing: the next run recomputes it;
* **corrupt**: it does, but a file does not match the manifest (missing, truncated, edited):
  the next run keeps it aside and recomputes it (a hardware stage's recording is kept aside and
  the run stops with a message, :func:`flows.iteration.r2s2r_iteration`). Files are checked by
  size and modification time, and hashed where those changed or with ``verify``.
"""

from __future__ import annotations

from flows import stages as stage_table
from flows.stages import Call
from pipeline.config import LoadedConfigs
from pipeline.errors import DataError
from storage.layout import RunLayout, stage_state


def iterations_on_disk(layout: RunLayout) -> list[int]:
    """The campaign's iterations that have a folder, in order."""
    found = [int(p.name.removeprefix("iter_")) for p in layout.campaign_dir.glob("iter_*") if p.is_dir()]
    return sorted(found)


def stage_status(
    configs: LoadedConfigs, iteration: int, verify: bool = False, problems: dict[str, str] | None = None
) -> dict[str, str]:
    """``cached`` / ``stale`` / ``missing`` / ``corrupt`` for every stage of ``iteration`` (module
    docstring); ``verify`` hashes every file; ``problems`` (if given) receives, per corrupt stage,
    the file that does not match."""
    layout = RunLayout.of(configs)
    status: dict[str, str] = {}
    refs: dict[str, dict[str, str]] = {}
    for stage in stage_table.table():
        source = stage.source_iteration(configs, iteration)
        state = stage_state(layout.stage_dir(source, stage.name), full=verify)
        if state.ref is not None:
            refs[stage.name] = state.ref.to_json()
        if source != iteration:
            status[stage.name] = stage_status(configs, source, verify, problems)[stage.name]
            continue
        if state.kind == "corrupt" and problems is not None:
            problems[stage.name] = state.problem
        if state.ref is None:
            status[stage.name] = "corrupt" if state.kind == "corrupt" else "missing"
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
