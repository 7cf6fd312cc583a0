"""The action table as Parquet (``actions.parquet``): one row per action, bottom face and rolling
direction, with the motion the planner uses and its spread (:mod:`pipeline.follow.table`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.errors import DataError
from pipeline.follow.motion import ActionTable
from pipeline.follow.table import TabulatedActions
from storage.tables import read_meta, write_table

COLUMNS = (
    "action",
    "face",
    "direction",
    "forward_m",
    "lateral_m",
    "rotation_rad",
    "next_face",
    "forward_std_m",
    "lateral_std_m",
    "rotation_std_rad",
    "succeeded",
)
"""``direction``: 0 rolling forward, 1 in reverse; motions along the heading before the action."""


def action_frame(tabulated: TabulatedActions) -> pd.DataFrame:
    """One row per (action, face, direction), in that order."""
    table = tabulated.table
    a, f, d = np.meshgrid(np.arange(len(table.names)), np.arange(table.faces), np.arange(2), indexing="ij")
    return pd.DataFrame(
        {
            "action": np.asarray(table.names)[a.ravel()],
            "face": f.ravel(),
            "direction": d.ravel(),
            "forward_m": table.forward_m.ravel(),
            "lateral_m": table.lateral_m.ravel(),
            "rotation_rad": table.rotation_rad.ravel(),
            "next_face": table.next_face.ravel(),
            "forward_std_m": tabulated.forward_std_m.ravel(),
            "lateral_std_m": tabulated.lateral_std_m.ravel(),
            "rotation_std_rad": tabulated.rotation_std_rad.ravel(),
            "succeeded": tabulated.succeeded.ravel(),
        }
    )


def write_action_table(path: Path, tabulated: TabulatedActions, meta: dict[str, object]) -> None:
    """Write the table to ``path`` (atomically) with ``meta``."""
    write_table(path, pa.Table.from_pandas(action_frame(tabulated), preserve_index=False), meta)


def read_action_table(path: Path) -> TabulatedActions:
    """The table and its spread from ``path``; :class:`DataError` naming the file when it does not
    hold one."""
    read_meta(path)
    frame = pd.read_parquet(path)
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{path}: an action table needs columns {missing}")
    names = tuple(dict.fromkeys(frame["action"]))
    faces = int(frame["face"].max()) + 1
    if len(frame) != len(names) * faces * 2:
        raise DataError(
            f"{path}: {len(frame)} rows, expected one per action ({len(names)}), face ({faces}) and direction"
        )
    frame = frame.sort_values(
        ["action", "face", "direction"], key=lambda c: c.map(names.index) if c.name == "action" else c
    )
    shape = (len(names), faces, 2)

    def grid(column: str) -> np.ndarray:
        return frame[column].to_numpy().reshape(shape)

    table = ActionTable(
        names, grid("forward_m"), grid("lateral_m"), grid("rotation_rad"), grid("next_face").astype(int)
    )
    return TabulatedActions(
        table, grid("forward_std_m"), grid("lateral_std_m"), grid("rotation_std_rad"), grid("succeeded").astype(bool)
    )
