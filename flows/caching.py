"""Cache keys of the stage tasks and the look-up of their stored results.

A stage's key (:func:`stage_cache_key`) is a hash of the iteration's identity (runs folder,
campaign, iteration), the content hashes of its input refs, the config sections it depends on
and a stage code version; Prefect stores each stage result (a small JSON ref) under its key
in its local result storage. :mod:`flows.stages` derives every stage's key from its entry.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect.settings import get_current_settings

from pipeline.config import LoadedConfigs
from storage.layout import complete_stage_ref


def stage_cache_key(
    stage: str,
    version: str,
    configs: LoadedConfigs,
    iteration: int,
    inputs: dict[str, dict[str, str]],
    sections: tuple[str, ...],
) -> str:
    """Key of ``stage`` (code ``version``) for ``iteration`` with input refs ``inputs`` (name ->
    ref JSON) and the config ``sections``: pipeline config fields by (dotted) name, a whole
    section or one field of it (``redeploy.segment_timeout_s``), and ``robot`` for the robot
    config (its hash). A stage with no section keys on its inputs and identity alone."""
    identity: dict[str, object] = {
        "runs_dir": str(configs.pipeline.runs_dir.resolve()),
        "campaign": configs.pipeline.campaign,
        "iteration": iteration,
        "inputs": {name: ref["sha256"] for name, ref in inputs.items()},
    }
    if sections:
        identity["config"] = configs.fields(sections)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return f"{stage}-v{version}-{digest}"


def result_storage() -> Path:
    """Where Prefect stores the stage results (its local result storage)."""
    return Path(get_current_settings().results.local_storage_path)


def stored_ref(key: str) -> dict[str, str] | None:
    """The stage ref (JSON) Prefect stored under cache key ``key``; None if there is none."""
    path = result_storage() / key
    try:
        return json.loads(json.loads(path.read_text())["result"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def on_disk(ref: dict[str, str]) -> bool:
    """Whether ``ref`` is the complete output now in its stage folder (a rerun under another
    config may have replaced it since the result was stored)."""
    current = complete_stage_ref(Path(ref["path"]))
    return current is not None and current.sha256 == ref["sha256"]


def is_cached(key: str) -> bool:
    """Whether Prefect holds a result under cache key ``key`` that is still the output on disk."""
    ref = stored_ref(key)
    return ref is not None and on_disk(ref)
