"""The trajectory Parquet contract (docs/design.md, *Data contracts*).

One file per trajectory, one row per sample, wide columns:

=====================  =======  ==============================================
column                 unit     required for source
=====================  =======  ==============================================
``t``                  s        all (float64, non-decreasing, may be non-uniform)
``segment``            -        all (int32, index of the policy target)
``target_0..5``        -        all (normalised, [0, MAX_TARGET]; see below)
``control_0..5``       -        hardware (see below), sim (motor command, [-1, 1])
``cable_0..8``         m        hardware (sensed lengths)
``cap{i}_x/_y/_z``     m        groundtruth, tracked, sim (end-cap centres, world)
``cap{i}_conf``        -        optional ([0, 1])
``rod{r}_x/_y/_z``     m        optional (rod centres)
``rod{r}_qw/qx/qy/qz`` -        optional (rod orientation, world)
``imu{r}_qw/qx/qy/qz`` -        optional (IMU orientation of rod r)
``motor_0..5``         rad      optional (winch angles)
=====================  =======  ==============================================

Schema metadata (JSON under key ``r2s2r``) is validated by :class:`TrajectoryMeta`.

``control_recorded`` (default true) says whether the motor command was recorded.
Only a ``hardware`` file may set it to false (imported recordings whose format
has no usable motor command, see :mod:`storage.tribar`); such a file must then
have no ``control_*`` column at all. Every other source requires it true.

A target is normalised by the robot config: 0 commands ``actuated_cable.min_length_m``, 1 that
plus ``range_m``. Policies stay in [0, 1]; trajectory following's actions command gaits at a
larger range, as the Tribar paper does (up to 1.5 on the Tribar: 150 mm of range on a 100 mm
config range, :mod:`pipeline.follow.actions`), so a file may hold targets up to
:data:`MAX_TARGET`.

``segment_timeout_s`` (optional, s): the longest the recorder held each target
before moving on; a segment that lasted this long timed out (target not reached).
Recordings that do not say (imported ones) are read with the collect stage's value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import DataError
from storage.tables import read_meta, write_table

SCHEMA_VERSION = 1
MAX_TARGET = 2.0
"""The largest normalised target a trajectory may hold: twice the config's range (the follow
actions go to 1.5); a larger value is a unit mix-up, not a gait."""
Source = Literal["hardware", "groundtruth", "tracked", "sim"]

UNITS = {"t": "s", "cable": "m", "cap": "m", "rod_position": "m", "motor": "rad", "target": "1", "control": "1"}


class Gap(BaseModel):
    """Samples lost on the way from a networked robot (``docs/robot-protocol.md``): ``missing``
    messages between robot times ``t_start_s`` and ``t_end_s`` (s), the last sample before the gap
    and the first after it. The samples around a gap are kept as they came, never interpolated."""

    t_start_s: float
    t_end_s: float
    missing: int = Field(ge=1)


class TrajectoryMeta(BaseModel):
    """Schema metadata every trajectory file carries."""

    model_config = ConfigDict(extra="allow")

    schema_version: Literal[1]
    source: Source
    robot_config_hash: str = Field(min_length=1)
    campaign: str
    iteration: int = Field(ge=1)
    policy_id: str = Field(min_length=1)
    sample_rate_hz: float = Field(gt=0)
    units: dict[str, str]
    complete: bool
    control_recorded: bool = True
    cables_recorded: bool = True
    """False for a recording without cable readings (end caps given, e.g. a published trajectory)."""
    segment_timeout_s: float | None = Field(default=None, gt=0)
    gaps: list[Gap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _control_only_optional_for_hardware(self) -> TrajectoryMeta:
        if not self.control_recorded and self.source != "hardware":
            raise ValueError(f"control_recorded may be false only for source 'hardware', not '{self.source}'")
        if not self.cables_recorded and self.source != "hardware":
            raise ValueError(f"cables_recorded may be false only for source 'hardware', not '{self.source}'")
        return self


GAP_FACTOR = 2.5
"""In an imported recording, a step between samples longer than this many median steps is a gap."""


def stamp_gaps(t_s: np.ndarray) -> tuple[list[dict[str, float]], int]:
    """The gaps of an imported recording's non-decreasing stamps ``t_s`` (s), as :class:`Gap`
    fields (steps over :data:`GAP_FACTOR` median steps, ``missing`` the samples the median step
    would have put there), and how many stamps repeat the one before."""
    steps = np.diff(np.asarray(t_s, float))
    moving = steps[steps > 0]
    gaps = []
    if moving.size:
        median = float(np.median(moving))
        for i in np.flatnonzero(steps > GAP_FACTOR * median):
            missing = max(1, round(steps[i] / median) - 1)
            gaps.append({"t_start_s": float(t_s[i]), "t_end_s": float(t_s[i + 1]), "missing": missing})
    return gaps, int(np.sum(steps == 0))


@dataclass
class StampedImport:
    """What an import of a time-stamped recording (a bag, a published trajectory) read from
    ``source``: samples and frames, the duration and first stamp (s), the targets held (each six
    values in [0, 1]), the gaps and duplicated stamps (:func:`stamp_gaps`)."""

    source: Path
    n_samples: int = 0
    n_frames: int = 0
    duration_s: float = 0.0
    start_time_s: float = 0.0
    targets: list[list[float]] = field(default_factory=list)
    gaps: list[dict[str, float]] = field(default_factory=list)
    duplicated_stamps: int = 0
    source_format: ClassVar[str] = ""
    """The format's name in the collect stage's summary."""

    @property
    def sample_rate_hz(self) -> float:
        """Mean samples per second (0 for fewer than two distinct stamps)."""
        return (self.n_samples - 1) / self.duration_s if self.duration_s > 0 else 0.0

    def summary(self) -> dict[str, object]:
        """The collect stage summary's fields of the import."""
        return {
            "source_format": self.source_format,
            "source": str(self.source),
            "n_sensor_samples": self.n_samples,
            "n_frames": self.n_frames,
            "n_targets": len(self.targets),
            "duration_s": self.duration_s,
            "start_time_s": self.start_time_s,
            "sample_rate_hz": self.sample_rate_hz,
            "gaps": len(self.gaps),
            "duplicated_stamps": self.duplicated_stamps,
        }


def _cols(prefix: str, n: int) -> list[str]:
    return [f"{prefix}_{i}" for i in range(n)]


TARGET_COLS = _cols("target", 6)
CONTROL_COLS = _cols("control", 6)
CABLE_COLS = _cols("cable", 9)
MOTOR_COLS = _cols("motor", 6)
CAP_COLS = [f"cap{i}_{a}" for i in range(6) for a in "xyz"]
CONF_COLS = [f"cap{i}_conf" for i in range(6)]
ROD_POS_COLS = [f"rod{r}_{a}" for r in range(3) for a in "xyz"]
ROD_QUAT_COLS = [f"rod{r}_q{a}" for r in range(3) for a in "wxyz"]
_IMU_RE = re.compile(r"^imu[0-2]_q[wxyz]$")

REQUIRED = {
    "hardware": ["t", "segment", *TARGET_COLS, *CONTROL_COLS, *CABLE_COLS],
    "groundtruth": ["t", "segment", *TARGET_COLS, *CAP_COLS],
    "tracked": ["t", "segment", *TARGET_COLS, *CAP_COLS],
    "sim": ["t", "segment", *TARGET_COLS, *CONTROL_COLS, *CAP_COLS],
}
_KNOWN = {
    "t",
    "segment",
    *TARGET_COLS,
    *CONTROL_COLS,
    *CABLE_COLS,
    *MOTOR_COLS,
    *CAP_COLS,
    *CONF_COLS,
    *ROD_POS_COLS,
    *ROD_QUAT_COLS,
}


def imu_cols(rod: int) -> list[str]:
    return [f"imu{rod}_q{a}" for a in "wxyz"]


def column_type(name: str) -> pa.DataType:
    """Arrow type of a trajectory column."""
    return pa.int32() if name == "segment" else pa.float64()


def arrow_schema(columns: list[str]) -> pa.Schema:
    return pa.schema([pa.field(c, column_type(c), nullable=False) for c in columns])


def make_meta(
    source: Source,
    robot_config_hash: str,
    campaign: str,
    iteration: int,
    policy_id: str,
    sample_rate_hz: float,
    complete: bool,
    **extra: object,
) -> dict[str, object]:
    """Metadata dict for a new trajectory file (validated)."""
    meta = TrajectoryMeta(
        schema_version=SCHEMA_VERSION,
        source=source,
        robot_config_hash=robot_config_hash,
        campaign=campaign,
        iteration=iteration,
        policy_id=policy_id,
        sample_rate_hz=sample_rate_hz,
        units=UNITS,
        complete=complete,
        **extra,
    )
    return meta.model_dump(mode="json")


def _validate_frame(path: Path, df: pd.DataFrame, meta: TrajectoryMeta) -> None:
    source = meta.source
    required = REQUIRED[source]
    if not meta.control_recorded:
        required = [c for c in required if c not in CONTROL_COLS]
        present = [c for c in CONTROL_COLS if c in df.columns]
        if present:
            raise DataError(f"{path}: metadata says control_recorded = false but the file has columns {present}")
    if not meta.cables_recorded:
        required = [c for c in required if c not in CABLE_COLS]
        present = [c for c in CABLE_COLS if c in df.columns]
        if present:
            raise DataError(f"{path}: metadata says cables_recorded = false but the file has columns {present}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(f"{path}: source '{source}' requires columns {missing[:6]}{'...' if len(missing) > 6 else ''}")
    unknown = [c for c in df.columns if c not in _KNOWN and not _IMU_RE.match(c)]
    if unknown:
        raise DataError(f"{path}: unknown columns {unknown}; see storage.trajectory for the schema")
    for col in df.columns:
        expected = column_type(col)
        if expected == pa.int32() and not pd.api.types.is_integer_dtype(df[col]):
            raise DataError(f"{path}: column '{col}' must be integer, got {df[col].dtype}")
        if expected == pa.float64() and df[col].dtype != np.float64:
            raise DataError(f"{path}: column '{col}' must be float64, got {df[col].dtype}")
    t = df["t"].to_numpy()
    if len(t) and (not np.isfinite(t).all() or np.any(np.diff(t) < 0)):
        raise DataError(f"{path}: column 't' must be finite and non-decreasing")
    targets = df[TARGET_COLS].to_numpy()
    if ((targets < 0) | (targets > MAX_TARGET)).any():
        raise DataError(f"{path}: target_* columns must lie in [0, {MAX_TARGET}]")


def write_trajectory(path: Path, df: pd.DataFrame, meta: dict[str, object]) -> Path:
    """Validate ``df`` against the contract for ``meta['source']`` and write it atomically."""
    try:
        checked = TrajectoryMeta.model_validate(meta)
    except ValidationError as exc:
        raise DataError(f"{path}: invalid trajectory metadata: {exc}") from exc
    _validate_frame(path, df, checked)
    table = pa.Table.from_pandas(df, schema=arrow_schema(list(df.columns)), preserve_index=False)
    write_table(path, table, checked.model_dump(mode="json"))
    return path


def read_trajectory(path: str | Path, expect_source: Source | None = None) -> tuple[pd.DataFrame, TrajectoryMeta]:
    """Read and validate a trajectory file.

    Raises :class:`DataError` naming the file and the field that does not match
    (missing metadata, wrong schema version, missing or mistyped column, ...).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: trajectory file not found")
    raw = read_meta(path)
    try:
        meta = TrajectoryMeta.model_validate(raw)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) + f": {e['msg']}" for e in exc.errors())
        raise DataError(f"{path}: invalid trajectory metadata ({fields})") from exc
    if expect_source is not None and meta.source != expect_source:
        raise DataError(f"{path}: expected source '{expect_source}', file has '{meta.source}'")
    df = pq.read_table(path).to_pandas()
    _validate_frame(path, df, meta)
    return df, meta


def caps_array(df: pd.DataFrame) -> np.ndarray:
    """End-cap centres (n, 6, 3) in metres from a trajectory frame."""
    return df[CAP_COLS].to_numpy().reshape(len(df), 6, 3)
