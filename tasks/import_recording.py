"""Import a real recording (Tribar layout, or a ROS bag) as an iteration's ``collect`` stage output.

:func:`run_import` writes the same layout and manifest as :func:`tasks.collect.run_collect`
(``<stage>/<policy_id>/{hardware,frames}.parquet``, ``policy.json``, ``plots/``,
``manifest.json``), without ``groundtruth.parquet`` (real data have none), so the
downstream stages run on it as on a twin collection.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.config import LoadedConfigs, config_hash
from pipeline.errors import DataError
from storage.files import sha256_file
from storage.layout import Ref, RunLayout, complete_stage_ref, set_aside, write_manifest
from storage.published import PublishedReport, import_published
from storage.recording import write_first_frame_plot, write_policy_json
from storage.rosbag_import import BagReport, bag_digest, import_bag
from storage.tribar import (
    DEFAULT_MIN_IMPORTED_SHARE,
    Extrinsics,
    ImportReport,
    import_tribar,
    read_tribar_config,
    source_digest,
)

STAGE = "collect"
"""The stage whose output an import writes."""

log = logging.getLogger(__name__)


def import_policy_name(src_dir: Path) -> str:
    """``tribar-<folder name>``, reduced to the characters a policy id may hold (``[A-Za-z0-9_.-]``)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", src_dir.resolve().name).strip("-.")[:48]
    return f"tribar-{slug or 'recording'}"


def run_import(
    configs: LoadedConfigs,
    iteration: int,
    src_dir: str | Path,
    extrinsics: Extrinsics = Extrinsics.CAMERA_TO_WORLD,
    min_imported_share: float = DEFAULT_MIN_IMPORTED_SHARE,
) -> tuple[Ref, dict[str, object]]:
    """Import ``src_dir`` into ``runs/<campaign>/iter_<iteration>/collect/``.

    The policy id is :func:`import_policy_name` plus the first 8 hex digits of
    :func:`storage.tribar.source_digest`; ``policy.json`` holds the distinct
    consecutive target vectors. Refuses (:class:`DataError`) to replace a complete
    collect stage. The import is written to a temporary folder and moved into place once
    complete: an import that fails (bad ``config.json``, fewer than ``min_imported_share`` of
    the frames usable, a fault) leaves nothing behind; an incomplete stage output found in
    its place is then kept aside, as ``run_collect`` does. Returns the stage ref and the
    import summary (:meth:`ImportReport.summary` plus ``policy_id``).
    """
    src_dir = Path(src_dir)
    read_tribar_config(src_dir, extrinsics)
    name = import_policy_name(src_dir)
    importer = functools.partial(import_tribar, src_dir, extrinsics=extrinsics, min_imported_share=min_imported_share)
    return _into_collect(configs, iteration, src_dir, name, f"{name}-{source_digest(src_dir)[:8]}", importer)


def run_import_bag(configs: LoadedConfigs, iteration: int, bag: str | Path) -> tuple[Ref, dict[str, object]]:
    """Import the ROS 1 or ROS 2 bag ``bag`` (a ``.bag`` file or a ROS 2 bag folder) into
    ``runs/<campaign>/iter_<iteration>/collect/`` with the topic map ``bag_import``
    (:func:`storage.rosbag_import.import_bag`), as :func:`run_import` does a Tribar folder."""
    bag = Path(bag)
    if not bag.exists():
        raise DataError(f"{bag}: no such bag (a .bag file, or a ROS 2 bag folder)")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", bag.resolve().stem).strip("-.")[:48] or "recording"
    name = f"bag-{slug}"
    importer = functools.partial(import_bag, bag, configs.pipeline.bag_import)
    return _into_collect(configs, iteration, bag, name, f"{name}-{bag_digest(bag)[:8]}", importer)


def run_import_published(configs: LoadedConfigs, iteration: int, path: str | Path) -> tuple[Ref, dict[str, object]]:
    """Import a processed trajectory published with the R2S2R paper's code (a JSON list of frames,
    :mod:`storage.published`) into ``runs/<campaign>/iter_<iteration>/collect/``: the end caps as
    given (the track stage takes them), targets and commands, no cable readings or frames."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file (a processed_data.json of the R2S2R code)")
    # the R2S2R code names every file processed_data.json, in a folder named after the run
    stem = path.resolve().parent.name if path.stem == "processed_data" else path.stem
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")[:48]
    name = f"r2s2r-{slug or 'recording'}"
    importer = functools.partial(import_published, path)
    return _into_collect(configs, iteration, path, name, f"{name}-{sha256_file(path)[:8]}", importer)


def _into_collect(
    configs: LoadedConfigs,
    iteration: int,
    source: Path,
    name: str,
    policy_id: str,
    importer: Callable[..., ImportReport | BagReport | PublishedReport],
) -> tuple[Ref, dict[str, object]]:
    """Write an import as iteration ``iteration``'s collect stage: ``importer(folder, campaign=...,
    iteration=..., policy_id=..., robot_config_hash=...)`` fills the recording folder and returns
    its report (the targets held and a summary). Refuses to replace a complete collect stage;
    works in a temporary folder renamed into place when done."""
    layout = RunLayout.of(configs)
    stage_dir = layout.stage_dir(iteration, STAGE)
    if complete_stage_ref(stage_dir) is not None:
        raise DataError(
            f"{stage_dir}: already holds a complete collection; import into another iteration or campaign "
            "(collected data are never overwritten)"
        )
    stage_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{STAGE}-import-", dir=stage_dir.parent))
    try:
        folder = work / policy_id
        report = importer(
            folder,
            campaign=configs.pipeline.campaign,
            iteration=iteration,
            policy_id=policy_id,
            robot_config_hash=config_hash(configs.robot),
        )
        write_policy_json(folder, name, policy_id, np.array(report.targets))
        write_first_frame_plot(work, folder)
        summary: dict[str, object] = {"policy_id": policy_id, **report.summary()}
        written = write_manifest(work, STAGE, complete=True, summary=summary)
        if stage_dir.exists():
            set_aside(layout, stage_dir, "incomplete")
        work.rename(stage_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    ref = Ref(path=str(stage_dir), sha256=written.sha256)
    log.info("imported %s as %s", source, ref.path)
    return ref, summary
