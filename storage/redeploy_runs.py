"""The redeploy stage's runs: one recording folder per (policy, start), and the run list.

A run's folder ``<policy>-start<k>/`` has the collect stage's recording layout plus
``tracked.parquet``; ``runs.json`` lists the runs of a complete stage output. The redeploy
stage plans and records them, the evaluate stage replays them, the next iteration's collect
stage copies them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.config import ROBOT_FIELD, LoadedConfigs, StartPoseConfig
from pipeline.errors import DataError
from pipeline.policies import Policy
from storage.catalog import POLICIES_FILE, RUNS_FILE, read_policies
from storage.layout import Ref
from storage.recording import HARDWARE_FILE, POLICY_FILE
from storage.tracked import TRACKED_FILE, tracked_under
from storage.trajectory import caps_array, read_trajectory

RUN_FIELDS = (
    "redeploy.segment_timeout_s",
    "collect.record_frames",
    "hardware_backend",
    ROBOT_FIELD,
)
"""The config fields besides its policy and start pose that a run's recording depends on (not the
hardware's own config file, as for the collect stage: :data:`tasks.collect.KEY_FIELDS`)."""


@dataclass(frozen=True)
class Run:
    """One redeploy run: the ``policy`` from start ``start_index``, recorded under ``folder``;
    ``recorded_as`` hashes all that its recording depends on (policy, start, :data:`RUN_FIELDS`)."""

    policy_key: str
    policy: Policy
    start_index: int
    start: StartPoseConfig
    folder: Path
    recorded_as: str = ""

    @property
    def name(self) -> str:
        return self.folder.name

    def to_json(self) -> dict[str, object]:
        """The run's entry in ``runs.json`` (its policy is in its folder's ``policy.json``)."""
        return {
            "name": self.name,
            "policy_key": self.policy_key,
            "start_index": self.start_index,
            "start": self.start.model_dump(mode="json"),
        }

    @classmethod
    def from_json(cls, payload: dict, stage_dir: Path) -> Run:
        """The run of entry ``payload`` of ``stage_dir``'s ``runs.json``, with its recorded policy."""
        folder = stage_dir / payload["name"]
        recorded = json.loads((folder / POLICY_FILE).read_text())
        policy = Policy(name=recorded["name"], targets=np.asarray(recorded["targets"], float))
        start = StartPoseConfig.model_validate(payload["start"])
        return cls(
            payload["policy_key"], policy, int(payload["start_index"]), start, folder, recorded.get("recorded_as", "")
        )

    def recorded_by_another(self) -> bool:
        """Whether the run's folder holds a recording of another run (another policy, start or
        config, :data:`RUN_FIELDS`)."""
        path = self.folder / POLICY_FILE
        return path.is_file() and json.loads(path.read_text()).get("recorded_as") != self.recorded_as

    def recorded(self) -> bool:
        """Whether the run's folder holds a complete recording of this run."""
        folder = self.folder
        if not all((folder / name).is_file() for name in (HARDWARE_FILE, POLICY_FILE)) or self.recorded_by_another():
            return False
        _, meta = read_trajectory(folder / HARDWARE_FILE, expect_source="hardware")
        return bool(meta.complete)

    def complete(self, tracking_key: str) -> bool:
        """Whether the run's folder holds a complete recording of this run, tracked under
        ``tracking_key`` (:func:`storage.tracked.tracking_key`)."""
        return tracked_under(self.folder / TRACKED_FILE) == tracking_key and self.recorded()

    def tracked(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's tracked times (T,), s, and end caps (T, 6, 3), m."""
        frame = read_trajectory(self.folder / TRACKED_FILE, expect_source="tracked")[0]
        return frame["t"].to_numpy(float), caps_array(frame)

    def tracked_caps(self) -> np.ndarray:
        """The run's tracked end caps (T, 6, 3), m."""
        return self.tracked()[1]


def recorded_runs(redeploy_ref: Ref) -> list[Run]:
    """The runs of a complete redeploy stage output, in order."""
    stage_dir = Path(redeploy_ref.path)
    path = stage_dir / RUNS_FILE
    if not path.is_file():
        raise DataError(f"{path}: missing; the redeploy stage output is incomplete")
    return [Run.from_json(entry, stage_dir) for entry in json.loads(path.read_text())]


def planned_runs(configs: LoadedConfigs, gaits_ref: Ref, stage_dir: Path) -> list[Run]:
    """Every (policy, start) run of ``redeploy``'s config, with the policies of the gaits stage,
    recorded under ``stage_dir``."""
    policies = read_policies(gaits_ref)
    fields = configs.fields(RUN_FIELDS)
    runs = []
    for key in configs.pipeline.redeploy.policies:
        if key not in policies:
            path = Path(gaits_ref.path) / POLICIES_FILE
            raise DataError(f"{path}: no policy '{key}'; the gaits stage wrote {sorted(policies)}")
        policy = Policy(name=policies[key]["name"], targets=np.asarray(policies[key]["targets"], float))
        for k, start in enumerate(configs.pipeline.redeploy.starts):
            identity = {"policy_id": policy.policy_id, "start": start.model_dump(mode="json"), **fields}
            recorded_as = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
            runs.append(Run(key, policy, k, start, stage_dir / f"{key}-start{k}", recorded_as))
    return runs
