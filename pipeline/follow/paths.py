"""Paths to follow: 2D waypoints in the world frame, split into segments at sharp corners.

A :class:`Path` is a list of segments, each a polyline resampled to evenly spaced waypoints
(m). The planner follows one segment at a time (:mod:`pipeline.follow.planner`), as the Tribar
paper follows a triangle leg by leg. Built-ins: :func:`line`, :func:`arc`, :func:`triangle`,
named on the command line by :func:`builtin` (``line:2``, ``arc:1:180``, ``triangle:1.5``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from pipeline.errors import ConfigError
from pipeline.robot_model import wrapped_rad


@dataclass(frozen=True)
class Path:
    """Segments (each (n_i, 2), m, world frame, n_i >= 2), followed in order."""

    segments: tuple[np.ndarray, ...]

    @property
    def waypoints(self) -> np.ndarray:
        """Every waypoint (n, 2), segment after segment (shared corners once)."""
        return np.vstack([self.segments[0], *(s[1:] for s in self.segments[1:])])

    @property
    def length_m(self) -> float:
        return float(sum(np.linalg.norm(np.diff(s, axis=0), axis=1).sum() for s in self.segments))


def from_waypoints(waypoints: np.ndarray, corner_deg: float, spacing_m: float, name: str = "path") -> Path:
    """The path through ``waypoints`` (n, 2), m: split where it turns by more than ``corner_deg``,
    each segment resampled every ``spacing_m``. :class:`ConfigError` (naming ``name``) for fewer
    than two distinct waypoints or values that are not finite."""
    points = np.asarray(waypoints, dtype=float)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ConfigError(f"{name}: waypoints must be pairs (x, y) in metres, got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ConfigError(f"{name}: waypoints must be finite numbers")
    keep = np.r_[True, np.linalg.norm(np.diff(points, axis=0), axis=1) > 1e-9]
    points = points[keep]
    if len(points) < 2:
        raise ConfigError(f"{name}: a path needs at least two distinct waypoints, got {len(points)}")
    legs = np.diff(points, axis=0)
    angles = np.arctan2(legs[:, 1], legs[:, 0])
    turns = np.abs(wrapped_rad(np.diff(angles)))
    cuts = [0, *(i + 1 for i in np.flatnonzero(turns > math.radians(corner_deg))), len(points) - 1]
    return Path(tuple(_resample(points[a : b + 1], spacing_m) for a, b in itertools.pairwise(cuts)))


def _resample(polyline: np.ndarray, spacing_m: float) -> np.ndarray:
    """``polyline`` (n, 2) resampled at even arc length, about ``spacing_m`` apart, ends kept."""
    arc = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(polyline, axis=0), axis=1))]
    count = max(2, math.ceil(arc[-1] / spacing_m) + 1)
    s = np.linspace(0.0, arc[-1], count)
    return np.stack([np.interp(s, arc, polyline[:, 0]), np.interp(s, arc, polyline[:, 1])], axis=1)


def line(length_m: float, start: tuple[float, float] = (0.0, 0.0), heading_rad: float = 0.0) -> np.ndarray:
    """Waypoints (2, 2) of a straight line ``length_m`` long from ``start`` along ``heading_rad``."""
    direction = np.array([math.cos(heading_rad), math.sin(heading_rad)])
    return np.stack([np.asarray(start, float), np.asarray(start, float) + length_m * direction])


def arc(radius_m: float, sweep_deg: float, start: tuple[float, float] = (0.0, 0.0), n: int = 64) -> np.ndarray:
    """Waypoints (n, 2) of a circular arc from ``start``, leaving along +x and turning
    counter-clockwise (negative ``sweep_deg``: clockwise) through ``sweep_deg``."""
    sign = 1.0 if sweep_deg >= 0 else -1.0
    phi = np.linspace(0.0, math.radians(abs(sweep_deg)), n)
    x = radius_m * np.sin(phi)
    y = sign * radius_m * (1.0 - np.cos(phi))
    return np.stack([x, y], axis=1) + np.asarray(start, float)


def triangle(leg_m: float, start: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Waypoints (4, 2) of a right triangle with legs ``leg_m``: along +x, then +y, then back."""
    corners = np.array([[0.0, 0.0], [leg_m, 0.0], [leg_m, leg_m], [0.0, 0.0]])
    return corners + np.asarray(start, float)


BUILTINS = {"line": (2.0,), "arc": (1.0, 180.0), "triangle": (1.5,)}
"""Built-in paths and their default sizes: the Tribar paper's 2 m line, 1 m radius arc over
180 deg and right triangle with 1.5 m legs (m, deg)."""


def builtin(spec: str) -> np.ndarray | None:
    """The waypoints of a built-in path ``name[:size[:size]]`` (:data:`BUILTINS`), or None if
    ``spec`` names none; :class:`ConfigError` for sizes that are not positive numbers (an arc's
    sweep may be negative: clockwise)."""
    name, *sizes = spec.split(":")
    if name not in BUILTINS:
        return None
    defaults = BUILTINS[name]
    if len(sizes) > len(defaults):
        raise ConfigError(f"path {spec!r}: {name} takes at most {len(defaults)} sizes")
    try:
        values = [float(v) for v in sizes] + list(defaults[len(sizes) :])
    except ValueError:
        raise ConfigError(f"path {spec!r}: sizes must be numbers (m, deg)") from None
    signed = {1} if name == "arc" else set()  # the arc's sweep: its sign is the sense it turns
    if not all(math.isfinite(v) and (v != 0 if i in signed else v > 0) for i, v in enumerate(values)):
        raise ConfigError(f"path {spec!r}: sizes must be positive (an arc's sweep: not zero)")
    if name == "line":
        return line(values[0])
    if name == "arc":
        return arc(values[0], values[1])
    return triangle(values[0])
