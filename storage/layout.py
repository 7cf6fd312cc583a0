"""Run layout, per-stage manifests and refs (docs/design.md, *Data contracts*).

``runs/<campaign>/iter_<k>/<stage>/`` holds a stage's output files and a
``manifest.json`` listing each file with its sha256. Stages hand each other
:class:`Ref` objects (folder + manifest hash), never arrays.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.config import LoadedConfigs
from pipeline.errors import DataError
from storage.files import atomic_write_json, sha256_file

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ref:
    """A stage output: the folder holding it and the sha256 of its manifest."""

    path: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, str]) -> Ref:
        return cls(path=payload["path"], sha256=payload["sha256"])


@dataclass(frozen=True)
class RunLayout:
    """Paths of one campaign under a runs folder."""

    runs_dir: Path
    campaign: str

    @classmethod
    def of(cls, configs: LoadedConfigs) -> RunLayout:
        """The layout of the campaign that ``configs`` name (``runs_dir``, ``campaign``)."""
        return cls(configs.pipeline.runs_dir, configs.pipeline.campaign)

    @property
    def campaign_dir(self) -> Path:
        return self.runs_dir / self.campaign

    def iteration_dir(self, iteration: int) -> Path:
        if iteration < 1:
            raise ValueError(f"iteration must be >= 1, got {iteration}")
        return self.campaign_dir / f"iter_{iteration}"

    def stage_dir(self, iteration: int, stage: str) -> Path:
        return self.iteration_dir(iteration) / stage

    @property
    def mlflow_db(self) -> Path:
        return self.runs_dir / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.runs_dir / "mlartifacts"

    @property
    def prefect_home(self) -> Path:
        return self.runs_dir / ".prefect"


def write_manifest(stage_dir: Path, stage: str, complete: bool, summary: dict[str, object]) -> Ref:
    """Hash every file under ``stage_dir`` (except the manifest) and write the manifest.

    Returns the stage's :class:`Ref`.
    """
    files = {}
    for path in sorted(p for p in stage_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(stage_dir).as_posix()
        if rel == MANIFEST or path.name.startswith("."):
            continue
        files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "stage": stage,
        "complete": complete,
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": files,
        "summary": summary,
    }
    atomic_write_json(stage_dir / MANIFEST, manifest)
    return Ref(path=str(stage_dir), sha256=sha256_file(stage_dir / MANIFEST))


def complete_stage_ref(stage_dir: Path) -> Ref | None:
    """The ref of ``stage_dir`` if its manifest says it is complete, else None."""
    manifest = stage_dir / MANIFEST
    if not manifest.is_file() or not json.loads(manifest.read_text()).get("complete"):
        return None
    return Ref(path=str(stage_dir), sha256=sha256_file(manifest))


def read_manifest(ref: Ref, verify_files: bool = True) -> dict:
    """Load a ref's manifest, checking its hash and (optionally) every file's hash.

    Raises :class:`DataError` naming the file that is missing or changed.
    """
    stage_dir = Path(ref.path)
    manifest_path = stage_dir / MANIFEST
    if not manifest_path.is_file():
        raise DataError(f"{manifest_path}: manifest missing; the stage output was deleted or never finished")
    if sha256_file(manifest_path) != ref.sha256:
        raise DataError(f"{manifest_path}: manifest changed since the ref was made (sha256 mismatch)")
    manifest = json.loads(manifest_path.read_text())
    if verify_files:
        for rel, info in manifest["files"].items():
            path = stage_dir / rel
            if not path.is_file():
                raise DataError(f"{path}: listed in {manifest_path} but missing")
            if sha256_file(path) != info["sha256"]:
                raise DataError(f"{path}: content differs from the sha256 in {manifest_path}")
    return manifest


def existing_ref(layout: RunLayout, iteration: int, stage: str) -> Ref:
    """The ref of a stage's complete output on disk; :class:`DataError` if there is none."""
    stage_dir = layout.stage_dir(iteration, stage)
    ref = complete_stage_ref(stage_dir)
    if ref is None:
        raise DataError(f"{stage_dir}: stage '{stage}' has no complete output for iteration {iteration}; run it first")
    return ref


def set_aside(stage_dir: Path, why: str) -> Path:
    """Keep an earlier stage output (``why``: "incomplete" or "replaced") by renaming its folder
    to ``<stage>.<why>-<UTC time>``; returns where it now is."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    target = stage_dir.with_name(f"{stage_dir.name}.{why}-{stamp}")
    shutil.move(stage_dir, target)
    log.warning("earlier %s stage output kept at %s", why, target)
    return target
