"""Parquet tables written in flushed parts so that an interrupted run keeps its data.

:class:`PartedTableWriter` buffers rows, writes each flush as a separate small
Parquet part (atomically) in ``<final>.parts/``, and on :meth:`finalize` merges the
parts into the final file, stamping ``complete`` in the schema metadata. If the
process dies before finalising, :func:`recover_parts` later merges the parts
with ``complete = false``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError
from storage.files import commit_temp, temp_sibling

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
        if parts.exists():
            shutil.rmtree(parts)
        parts.mkdir(parents=True)

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
    """Concatenate ``<final>.parts/*.parquet`` into ``final_path`` and remove the parts."""
    parts = sorted(parts_dir(final_path).glob("part-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    table = pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()
    write_table(final_path, table, meta)
    shutil.rmtree(parts_dir(final_path))
    return final_path


def recover_parts(final_path: Path) -> Path | None:
    """Merge parts left by a run that died, marking the result incomplete.

    Returns the recovered file, or None if there was nothing to recover.
    """
    parts = sorted(parts_dir(final_path).glob("part-*.parquet"))
    if not parts:
        return None
    meta = read_meta(parts[0])
    schema = pq.read_schema(parts[0]).remove_metadata()
    return merge_parts(final_path, schema, {**meta, "complete": False})
