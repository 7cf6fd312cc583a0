"""End-cap segmentation in RGB images (OpenCV).

Rod 0's end caps are red, rod 1's green, rod 2's blue (docs/design.md, *Conventions*). A pixel is a
cap pixel when it is saturated and bright with a hue in the colour's band; blobs
are the 8-connected components of the opened mask, largest first, at most two
per colour (a rod has two caps of the same colour).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

ROD_COLOURS = ("red", "green", "blue")
# OpenCV hue is in [0, 180): (low, high) bands per colour; red wraps around 0.
_HUE_BANDS: dict[str, tuple[tuple[int, int], ...]] = {
    "red": ((0, 10), (170, 180)),
    "green": ((45, 80),),
    "blue": ((100, 135),),
}
_MIN_SATURATION = 120
_MIN_VALUE = 40


@dataclass(frozen=True)
class Blob:
    """One candidate end cap in an image: ``rod`` by colour, pixel rows ``v`` and
    columns ``u`` (N,) of its mask, and ``centre_px`` (u, v)."""

    rod: int
    v: np.ndarray
    u: np.ndarray

    @property
    def area_px(self) -> int:
        return int(self.u.size)

    @property
    def centre_px(self) -> tuple[float, float]:
        return float(self.u.mean()), float(self.v.mean())


def colour_masks(rgb: np.ndarray) -> np.ndarray:
    """Per-colour cap masks (3, H, W) uint8 (0/255) of an (H, W, 3) uint8 RGB image."""
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    lower_sv = np.array([_MIN_SATURATION, _MIN_VALUE])
    masks = []
    for colour in ROD_COLOURS:
        mask = np.zeros(rgb.shape[:2], np.uint8)
        for low, high in _HUE_BANDS[colour]:
            band = cv2.inRange(hsv, np.array([low, *lower_sv]), np.array([high, 255, 255]))
            mask = cv2.bitwise_or(mask, band)
        masks.append(mask)
    return np.stack(masks)


def find_blobs(rgb: np.ndarray, min_area_px: int) -> list[Blob]:
    """Cap blobs of an (H, W, 3) uint8 RGB image: at most two per colour, each of at
    least ``min_area_px`` pixels."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"rgb must be an (H, W, 3) uint8 image, got {rgb.shape} {rgb.dtype}")
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
    blobs = []
    for rod, mask in enumerate(colour_masks(rgb)):
        left, top, width, height = cv2.boundingRect(mask)
        if width == 0:
            continue
        opened = cv2.morphologyEx(mask[top : top + height, left : left + width], cv2.MORPH_OPEN, kernel)
        _, labels, stats, _ = cv2.connectedComponentsWithStats(opened, connectivity=8)
        areas = stats[1:, cv2.CC_STAT_AREA]
        for label in 1 + np.argsort(areas)[::-1][:2]:
            if stats[label, cv2.CC_STAT_AREA] < min_area_px:
                break
            x, y, w, h = stats[label, :4]
            v, u = np.nonzero(labels[y : y + h, x : x + w] == label)
            blobs.append(Blob(rod=rod, v=v + y + top, u=u + x + left))
    return blobs
