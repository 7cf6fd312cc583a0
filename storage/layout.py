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
from typing import Literal

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

    @property
    def exports_dir(self) -> Path:
        """Where files exported for other tools go (``r2s2r export-mcap``): outside every iteration
        folder, so that no stage lists them."""
        return self.campaign_dir / "exports"

    @property
    def set_aside_dir(self) -> Path:
        """Where outputs that were replaced, interrupted or found corrupt are kept: outside every
        iteration folder, so that no stage lists them (:func:`set_aside`)."""
        return self.campaign_dir / "set-aside"


def write_manifest(stage_dir: Path, stage: str, complete: bool, summary: dict[str, object]) -> Ref:
    """Hash every file under ``stage_dir`` (except the manifest) and write the manifest.

    Returns the stage's :class:`Ref`.
    """
    files = {}
    for path in sorted(p for p in stage_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(stage_dir).as_posix()
        if rel == MANIFEST or path.name.startswith("."):
            continue
        stat = path.stat()
        files[rel] = {"sha256": sha256_file(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
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


@dataclass(frozen=True)
class StageState:
    """What a stage folder holds: ``missing`` (no manifest), ``incomplete`` (its manifest says so),
    ``corrupt`` (complete, but a file does not match its manifest: ``problem`` names it) or
    ``complete`` (``ref`` is its ref)."""

    kind: Literal["missing", "incomplete", "corrupt", "complete"]
    ref: Ref | None = None
    problem: str = ""


def file_problem(stage_dir: Path, manifest: dict, full: bool = False) -> str:
    """The first file of ``manifest`` under ``stage_dir`` that does not match it ("" if none): one
    that is missing or has another size, or, where its modification time differs from the
    manifest's (or with ``full``), another sha256."""
    for rel, info in manifest["files"].items():
        path = stage_dir / rel
        try:
            stat = path.stat()
        except FileNotFoundError:
            return f"{path}: listed in {stage_dir / MANIFEST} but missing"
        if stat.st_size != info["bytes"]:
            return f"{path}: {stat.st_size} bytes where {stage_dir / MANIFEST} says {info['bytes']}"
        if (full or stat.st_mtime_ns != info.get("mtime_ns")) and sha256_file(path) != info["sha256"]:
            return f"{path}: content differs from the sha256 in {stage_dir / MANIFEST}"
    return ""


def stage_state(stage_dir: Path, full: bool = False) -> StageState:
    """The :class:`StageState` of ``stage_dir``; ``full`` hashes every file (else only those whose
    size or modification time changed, :func:`file_problem`)."""
    manifest_path = stage_dir / MANIFEST
    if not manifest_path.is_file():
        return StageState("missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        return StageState("corrupt", problem=f"{manifest_path}: not a readable manifest ({exc})")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return StageState("corrupt", problem=f"{manifest_path}: no 'files' table")
    if not manifest.get("complete"):
        return StageState("incomplete")
    problem = file_problem(stage_dir, manifest, full)
    if problem:
        return StageState("corrupt", problem=problem)
    return StageState("complete", Ref(path=str(stage_dir), sha256=sha256_file(manifest_path)))


def complete_stage_ref(stage_dir: Path) -> Ref | None:
    """The ref of ``stage_dir`` if it holds a complete output whose files match its manifest
    (:func:`stage_state`), else None: a corrupt output is never reused."""
    return stage_state(stage_dir).ref


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
    problem = file_problem(stage_dir, manifest, full=True) if verify_files else ""
    if problem:
        raise DataError(problem)
    return manifest


def existing_ref(layout: RunLayout, iteration: int, stage: str) -> Ref:
    """The ref of a stage's complete output on disk; :class:`DataError` if there is none."""
    stage_dir = layout.stage_dir(iteration, stage)
    state = stage_state(stage_dir)
    if state.kind == "corrupt":
        raise DataError(
            f"{state.problem}: stage '{stage}' of iteration {iteration} does not match its manifest; run it again"
        )
    if state.ref is None:
        raise DataError(f"{stage_dir}: stage '{stage}' has no complete output for iteration {iteration}; run it first")
    return state.ref


def set_aside(layout: RunLayout, path: Path, why: str) -> Path:
    """Keep an earlier output (a stage folder or a recording folder inside one; ``why``:
    "incomplete", "replaced" or "corrupt") by moving it to ``<campaign>/set-aside/<its path under
    the campaign>.<why>-<UTC time>``, where no stage reads; returns where it now is."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    relative = path.resolve().relative_to(layout.campaign_dir.resolve())
    target = layout.set_aside_dir / relative.parent / f"{relative.name}.{why}-{stamp}"
    suffix = 1
    while target.exists():
        target = target.with_name(f"{relative.name}.{why}-{stamp}-{suffix}")
        suffix += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, target)
    log.warning("earlier %s output %s kept at %s", why, path, target)
    return target
