"""RGB-D frames: one Parquet file per trajectory, PNG bytes per image (docs/design.md, *Data contracts*).

Columns: ``t`` (s, float64), ``rgb_png`` (PNG of an H x W x 3 uint8 RGB image),
``depth_png`` (16-bit PNG of an H x W uint16 depth image; metres = value *
``depth_scale_m``; 0 = no reading). Schema metadata (JSON under ``r2s2r``) holds
``schema_version``, ``policy_id``, ``complete`` and ``camera``: intrinsics
``fx, fy, cx, cy`` (px), ``width_px``, ``height_px``, ``depth_scale_m`` and
``camera_to_world`` (4 x 4, OpenCV axes: x right, y down, z forward).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError
from pipeline.hardware.base import CameraInfo
from storage.tables import read_meta

log = logging.getLogger(__name__)

FRAMES_SCHEMA_VERSION = 1
FRAMES_SCHEMA = pa.schema(
    [
        pa.field("t", pa.float64(), nullable=False),
        pa.field("rgb_png", pa.binary(), nullable=False),
        pa.field("depth_png", pa.binary(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Frame:
    t_s: float
    rgb: np.ndarray
    depth: np.ndarray


def encode_frame(t_s: float, rgb: np.ndarray, depth: np.ndarray) -> dict[str, object]:
    """A frames-table row from an RGB (H, W, 3) uint8 and a depth (H, W) uint16 image."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise DataError(f"rgb image must be (H, W, 3) uint8, got {rgb.shape} {rgb.dtype}")
    if depth.dtype != np.uint16 or depth.shape != rgb.shape[:2]:
        raise DataError(f"depth image must be {rgb.shape[:2]} uint16, got {depth.shape} {depth.dtype}")
    ok_rgb, rgb_png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    ok_depth, depth_png = cv2.imencode(".png", depth)
    if not (ok_rgb and ok_depth):
        raise DataError("PNG encoding failed")
    return {"t": float(t_s), "rgb_png": rgb_png.tobytes(), "depth_png": depth_png.tobytes()}


def frames_meta(path: Path) -> dict[str, object]:
    """Validated metadata of a frames file."""
    meta = read_meta(path)
    if meta.get("schema_version") != FRAMES_SCHEMA_VERSION:
        raise DataError(
            f"{path}: frames schema_version {meta.get('schema_version')!r}, expected {FRAMES_SCHEMA_VERSION}"
        )
    camera = meta.get("camera")
    needed = ("fx", "fy", "cx", "cy", "width_px", "height_px", "depth_scale_m", "camera_to_world")
    if not isinstance(camera, dict) or any(k not in camera for k in needed):
        raise DataError(f"{path}: metadata field 'camera' must hold {', '.join(needed)}")
    return meta


def frame_count(path: Path) -> int:
    """How many frames the frames file at ``path`` holds (its row count, from the Parquet footer)."""
    return pq.ParquetFile(path).metadata.num_rows


def iter_encoded_frames(path: Path) -> Iterator[tuple[float, bytes, bytes]]:
    """Each frame's time (s) and its PNG-encoded colour and depth images as stored, not decoded."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=64, columns=["t", "rgb_png", "depth_png"]):
        yield from zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True)


def iter_frames(path: str | Path, tolerant: bool = False) -> Iterator[Frame | None]:
    """Decode frames one at a time (constant memory).

    A frame that does not decode to an RGB image and a uint16 depth image of the
    size in the metadata raises :class:`DataError`; with ``tolerant`` it is logged
    and yielded as ``None`` instead, so the caller can count it and go on.
    """
    path = Path(path)
    meta = frames_meta(path)
    size = (meta["camera"]["height_px"], meta["camera"]["width_px"])
    parquet = pq.ParquetFile(path)
    if parquet.schema_arrow.remove_metadata() != FRAMES_SCHEMA:
        raise DataError(f"{path}: columns {parquet.schema_arrow.names}, expected {FRAMES_SCHEMA.names}")
    for batch in parquet.iter_batches(batch_size=16):
        for t, rgb_png, depth_png in zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True):
            bgr = cv2.imdecode(np.frombuffer(rgb_png, np.uint8), cv2.IMREAD_COLOR)
            depth = cv2.imdecode(np.frombuffer(depth_png, np.uint8), cv2.IMREAD_UNCHANGED)
            if bgr is None or depth is None or depth.dtype != np.uint16 or bgr.shape[:2] != size or depth.shape != size:
                message = f"{path}: frame at t = {t:.3f} s is not a {size} RGB + uint16 depth pair"
                if not tolerant:
                    raise DataError(message)
                log.warning("%s; skipped", message)
                yield None
                continue
            yield Frame(t_s=t, rgb=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), depth=depth)


def camera_from_meta(path: Path) -> CameraInfo:
    """The camera of a frames file, from its validated metadata."""
    camera = dict(frames_meta(path)["camera"])
    camera["camera_to_world"] = np.asarray(camera["camera_to_world"], float)
    if camera["camera_to_world"].shape != (4, 4):
        raise DataError(f"{path}: camera.camera_to_world must be 4 x 4")
    return CameraInfo(**camera)


def first_frame_png(path: Path) -> bytes | None:
    """The first RGB frame of the frames file ``path`` as PNG bytes; None if it holds none."""
    first = next(iter_frames(path), None)
    if first is None:
        return None
    ok, png = cv2.imencode(".png", cv2.cvtColor(first.rgb, cv2.COLOR_RGB2BGR))
    return png.tobytes() if ok else None
