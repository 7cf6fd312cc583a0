"""Atomic file writes and content hashes.

Every file the pipeline writes goes through :func:`atomic_write_bytes` (or a
function that writes a temporary sibling and calls :func:`commit_temp`): the data
lands under a temporary name in the same folder and is renamed into place, so a
crash or Ctrl-C never leaves half a file under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def temp_sibling(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; removed if the block raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def commit_temp(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to disk, atomically rename it to ``path`` and flush the folder's entry, so
    that once this returns the new file survives a power cut under its final name."""
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Flush ``folder``'s entries (renames, removals) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with temp_sibling(path) as tmp:
        tmp.write_bytes(data)
        commit_temp(tmp, path)


def atomic_write_json(path: Path, payload: object) -> None:
    """Write ``payload`` as indented, key-sorted JSON, atomically."""
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True) + "\n").encode())


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
