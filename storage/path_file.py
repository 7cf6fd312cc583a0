"""Path files for trajectory following: 2D waypoints (m, world frame) in YAML or CSV.

YAML: a list of ``[x, y]`` pairs, or a mapping with such a list under ``waypoints``. CSV: two
columns, ``x`` and ``y`` (a header row of those names is optional). :func:`read_path` also
takes the built-in paths by name (:func:`pipeline.follow.paths.builtin`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from pipeline.errors import ConfigError, DataError
from pipeline.follow.paths import BUILTINS, builtin


def read_path(spec: str) -> tuple[str, np.ndarray]:
    """The path ``spec`` names: a built-in (``line:2``) or a YAML or CSV file; its name and its
    waypoints (n, 2). :class:`DataError` naming the file and what was expected for a file that
    does not hold waypoints; :class:`ConfigError` for a name that is neither."""
    points = builtin(spec)
    if points is not None:
        return spec, points
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"path {spec!r}: neither a file nor one of the built-ins {', '.join(BUILTINS)}")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return path.stem, _from_yaml(path)
    if suffix == ".csv":
        return path.stem, _from_csv(path)
    raise DataError(f"{path}: a path file is YAML (.yaml, .yml) or CSV (.csv)")


def _from_yaml(path: Path) -> np.ndarray:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(raw, dict):
        raw = raw.get("waypoints")
    try:
        points = np.asarray(raw, dtype=float)
    except (TypeError, ValueError):
        points = np.empty((0,))
    if points.ndim != 2 or points.shape[1] != 2:
        raise DataError(f"{path}: expected a list of [x, y] waypoints in metres (or one under 'waypoints')")
    return points


def _from_csv(path: Path) -> np.ndarray:
    try:
        frame = pd.read_csv(path, header=None, comment="#", skip_blank_lines=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a CSV of x, y waypoints ({exc})") from None
    if frame.shape[1] != 2:
        raise DataError(f"{path}: expected two columns, x and y (m), got {frame.shape[1]}")
    if [str(v).strip().lower() for v in frame.iloc[0]] == ["x", "y"]:
        frame = frame.iloc[1:]
    try:
        return frame.to_numpy(dtype=float)
    except ValueError:
        raise DataError(f"{path}: every waypoint must be two numbers, x and y (m)") from None
