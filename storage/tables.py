"""Parquet tables written in flushed parts so that an interrupted run keeps its data.

:class:`PartedTableWriter` buffers rows, writes each flush as a separate small
Parquet part (atomically) in ``<final>.parts/``, and on :meth:`finalize` merges the
parts into the final file, stamping ``complete`` in the schema metadata. If the
process dies before finalising, :func:`recover_parts` later merges the parts
with ``complete = false``.

The merge commits in an order that a crash at any point leaves recoverable: the final file is
written under a temporary name, flushed, renamed into place (the folder flushed too), and only
then are the parts removed. The final file names the parts it holds (``merged_parts`` in its
metadata), so a crash between the rename and the removal leaves parts that
:func:`recover_parts` recognises as merged and only removes. A writer never opens over parts
left by another process: they are recovered first (or kept aside) by the caller.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError
from storage.files import commit_temp, fsync_dir, temp_sibling

META_KEY = b"r2s2r"


def parts_dir(final_path: Path) -> Path:
    return final_path.with_name(final_path.name + ".parts")


def write_table(path: Path, table: pa.Table, meta: dict[str, object]) -> None:
    """Write ``table`` to ``path`` atomically with ``meta`` as JSON schema metadata."""
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[META_KEY] = json.dumps(meta, sort_keys=True).encode()
    table = table.replace_schema_metadata(schema_meta)
    with temp_sibling(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        commit_temp(tmp, path)


def read_meta(path: Path) -> dict[str, object]:
    """The JSON metadata of a table written by :func:`write_table`."""
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from exc
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise DataError(f"{path}: missing '{META_KEY.decode()}' schema metadata; not written by r2s2r")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: '{META_KEY.decode()}' metadata is not valid JSON ({exc})") from exc


class PartedTableWriter:
    """Append rows (dicts of column -> scalar or bytes), flush parts, finalise once."""

    def __init__(self, final_path: Path, schema: pa.Schema, meta: dict[str, object]) -> None:
        self.final_path = final_path
        self.schema = schema
        self.meta = meta
        self._rows: list[dict[str, object]] = []
        self._n_parts = 0
        self.n_rows = 0
        parts = parts_dir(final_path)
        if any(parts.glob("part-*.parquet")):
            raise DataError(
                f"{parts}: parts of an unfinished recording are there; recover them "
                "(storage.tables.recover_parts) or keep them aside before writing anew"
            )
        parts.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict[str, object]) -> None:
        self._rows.append(row)
        self.n_rows += 1

    def flush(self) -> None:
        """Write buffered rows as a new part file."""
        if not self._rows:
            return
        table = pa.Table.from_pylist(self._rows, schema=self.schema)
        write_table(parts_dir(self.final_path) / f"part-{self._n_parts:05d}.parquet", table, self.meta)
        self._n_parts += 1
        self._rows = []

    def finalize(self, complete: bool, extra_meta: dict[str, object] | None = None) -> Path:
        """Merge all parts into the final file; ``complete`` is stored in the metadata."""
        self.flush()
        return merge_parts(self.final_path, self.schema, {**self.meta, **(extra_meta or {}), "complete": complete})


def merge_parts(final_path: Path, schema: pa.Schema, meta: dict[str, object]) -> Path:
    """Concatenate ``<final>.parts/*.parquet`` into ``final_path`` (naming them in its metadata,
    ``merged_parts``), then remove the parts (module docstring: the commit order)."""
    parts = sorted(parts_dir(final_path).glob("part-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    table = pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()
    write_table(final_path, table, {**meta, "merged_parts": [p.name for p in parts]})
    _remove_parts(final_path)
    return final_path


def _remove_parts(final_path: Path) -> None:
    folder = parts_dir(final_path)
    if folder.exists():
        shutil.rmtree(folder)
        fsync_dir(final_path.parent)


def recover_parts(final_path: Path) -> Path | None:
    """Merge parts left by a run that died, marking the result incomplete. Idempotent: parts that
    the final file already holds (a crash after its rename, before their removal) are only
    removed, and the file is left as it is.

    Returns the recovered file, or None if there was nothing to recover.
    """
    parts = sorted(parts_dir(final_path).glob("part-*.parquet"))
    if not parts:
        _remove_parts(final_path)  # an empty folder (or temporary files) of a writer that died
        return None
    if final_path.is_file() and read_meta(final_path).get("merged_parts") == [p.name for p in parts]:
        _remove_parts(final_path)
        return final_path
    meta = read_meta(parts[-1])  # the newest part's: what the writer knew last (e.g. gaps)
    schema = pq.read_schema(parts[0]).remove_metadata()
    return merge_parts(final_path, schema, {**meta, "complete": False})
