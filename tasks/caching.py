"""Cache keys of the stage tasks (DESIGN §6): the iteration's identity, the content
hashes of the input refs, the stage's config, the robot config and a stage code version."""

from __future__ import annotations

import hashlib
import json

from pipeline.config import LoadedConfigs, config_hash


def stage_cache_key(
    stage: str, version: str, configs: LoadedConfigs, iteration: int, inputs: dict[str, dict[str, str]]
) -> str:
    """Key of ``stage`` (code ``version``) for ``iteration`` with input refs ``inputs``
    (name -> ref JSON) and the stage's section of the pipeline config."""
    identity = json.dumps(
        {
            "runs_dir": str(configs.pipeline.runs_dir.resolve()),
            "campaign": configs.pipeline.campaign,
            "iteration": iteration,
            "inputs": {name: ref["sha256"] for name, ref in inputs.items()},
            "config": getattr(configs.pipeline, stage).model_dump(mode="json"),
            "robot": config_hash(configs.robot),
        },
        sort_keys=True,
    )
    return f"{stage}-v{version}-{hashlib.sha256(identity.encode()).hexdigest()[:24]}"
