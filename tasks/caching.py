"""Cache keys of the stage tasks (DESIGN §6): the iteration's identity, the content
hashes of the input refs, the stage's config, the robot config and a stage code version."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect.settings import get_current_settings

from pipeline.config import LoadedConfigs, config_hash
from storage.layout import complete_stage_ref


def stage_cache_key(
    stage: str,
    version: str,
    configs: LoadedConfigs,
    iteration: int,
    inputs: dict[str, dict[str, str]],
    sections: tuple[str, ...] | None = None,
) -> str:
    """Key of ``stage`` (code ``version``) for ``iteration`` with input refs ``inputs``
    (name -> ref JSON) and the pipeline config's ``sections`` (default: the stage's own)."""
    identity = json.dumps(
        {
            "runs_dir": str(configs.pipeline.runs_dir.resolve()),
            "campaign": configs.pipeline.campaign,
            "iteration": iteration,
            "inputs": {name: ref["sha256"] for name, ref in inputs.items()},
            "config": {name: getattr(configs.pipeline, name).model_dump(mode="json") for name in sections or (stage,)},
            "robot": config_hash(configs.robot),
        },
        sort_keys=True,
    )
    return f"{stage}-v{version}-{hashlib.sha256(identity.encode()).hexdigest()[:24]}"


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
