"""Figures saved as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pipeline.hardware.twin_model import ROD_COLOURS


def _png(fig: plt.Figure) -> bytes:
    """Lay out, render to PNG bytes and close ``fig``."""
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def _top_view_png(fig: plt.Figure, ax: plt.Axes, title: str, legend_size: int) -> bytes:
    """Label a top view (x, y in m, equal aspect, grid, legend) and return its PNG bytes."""
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=legend_size, loc="best")
    return _png(fig)


def top_view_paths(caps_m: np.ndarray, title: str) -> bytes:
    """Plot end-cap paths seen from above.

    ``caps_m``: (n, 6, 3) end-cap centres in metres; caps 2r and 2r+1 share rod r's
    colour, odd caps dashed. Marks start (circle) and end (square) positions.
    Returns the PNG bytes.
    """
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    for cap in range(6):
        colour = ROD_COLOURS[cap // 2][:3]
        xy = caps_m[:, cap, :2]
        ax.plot(xy[:, 0], xy[:, 1], color=colour, linestyle="--" if cap % 2 else "-", lw=1.2, label=f"cap {cap}")
        ax.plot(*xy[0], "o", color=colour, ms=5)
        ax.plot(*xy[-1], "s", color=colour, ms=5)
    centre = caps_m.mean(axis=1)
    ax.plot(centre[:, 0], centre[:, 1], color="k", lw=2, label="centroid")
    return _top_view_png(fig, ax, title, legend_size=7)


def follow_plot(waypoints_m: np.ndarray, track_m: np.ndarray, title: str) -> bytes:
    """Plot a path's waypoints (n, 2) and the robot's tracked centroid (T, 2), m, from above;
    returns the PNG bytes."""
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    ax.plot(waypoints_m[:, 0], waypoints_m[:, 1], color="0.5", lw=6, alpha=0.4, label="path")
    ax.plot(*waypoints_m[-1], "x", color="0.3", ms=10, mew=2, label="end")
    ax.plot(track_m[:, 0], track_m[:, 1], color="k", lw=1.5, label="robot (tracked centroid)")
    ax.plot(*track_m[0], "o", color="k", ms=5)
    ax.plot(*track_m[-1], "s", color="k", ms=5)
    return _top_view_png(fig, ax, title, legend_size=8)


def error_over_time(t_s: np.ndarray, error_mm: np.ndarray, confidence: np.ndarray, title: str) -> bytes:
    """Plot per-cap errors ``error_mm`` (n, 6) and confidences (n, 6) against time ``t_s``
    (n,) in two stacked panels; returns the PNG bytes."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), dpi=100, sharex=True)
    for cap in range(error_mm.shape[1]):
        style = {"color": ROD_COLOURS[cap // 2][:3], "linestyle": "--" if cap % 2 else "-", "lw": 1.0}
        top.plot(t_s, error_mm[:, cap], label=f"cap {cap}", **style)
        bottom.plot(t_s, confidence[:, cap], **style)
    top.set_ylabel("error (mm)")
    top.set_yscale("log")
    top.set_title(title)
    top.grid(True, alpha=0.3)
    top.legend(fontsize=7, ncol=6, loc="upper right")
    bottom.set_ylabel("confidence")
    bottom.set_xlabel("t (s)")
    bottom.set_ylim(0, 1.05)
    bottom.grid(True, alpha=0.3)
    return _png(fig)


def attachment_views(caps_m: np.ndarray, points_m: np.ndarray) -> bytes:
    """Plot the rest-state end caps (6, 3) and their attachment points (6, 3, 3) seen from
    above (x-y) and from the side (x-z); returns the PNG bytes."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 5), dpi=100)
    for ax, (i, j, label) in zip(axes, ((0, 1, "y (m)"), (0, 2, "z (m)")), strict=True):
        for cap in range(6):
            colour = ROD_COLOURS[cap // 2][:3]
            ax.plot(caps_m[cap, i], caps_m[cap, j], "o", color=colour, ms=9, alpha=0.5)
            ax.plot(points_m[cap, :, i], points_m[cap, :, j], "x", color="k", ms=5)
        for rod in range(3):
            ax.plot(caps_m[2 * rod : 2 * rod + 2, i], caps_m[2 * rod : 2 * rod + 2, j], color=ROD_COLOURS[rod][:3])
        ax.set_xlabel("x (m)")
        ax.set_ylabel(label)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(True, alpha=0.3)
    axes[0].set_title("attachment points at rest (x), end caps (o)")
    return _png(fig)


def sysid_history(iterations: np.ndarray, values: dict[str, np.ndarray], loss: np.ndarray, title: str) -> bytes:
    """Parameter trajectories (one panel each, SI units) and the loss over optimiser steps.

    ``iterations`` (n,); ``values`` name -> (n,); ``loss`` (n,). Returns the PNG bytes.
    """
    fig, axes = plt.subplots(len(values) + 1, 1, figsize=(7, 1.8 * (len(values) + 1)), dpi=100, sharex=True)
    for ax, (name, series) in zip(axes, values.items(), strict=False):
        ax.plot(iterations, series, color="C0", lw=1.5)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[-1].plot(iterations, loss, color="C3", lw=1.5)
    axes[-1].set_yscale("log")
    axes[-1].set_ylabel("loss")
    axes[-1].set_xlabel("step")
    axes[-1].grid(True, alpha=0.3)
    axes[0].set_title(title)
    return _png(fig)


def replay_paths(data_caps_m: np.ndarray, engines: dict[str, np.ndarray], title: str) -> bytes:
    """Centroid paths seen from above: the data (black) and each engine replay (label -> (n, 6, 3)
    end caps, m), start circles and end squares. Returns the PNG bytes."""
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    for (label, caps), colour in zip([("data", data_caps_m), *engines.items()], ["k", "C1", "C0", "C2"], strict=False):
        centre = caps.mean(axis=1)
        ax.plot(centre[:, 0], centre[:, 1], color=colour, lw=2 if label == "data" else 1.5, label=label)
        ax.plot(*centre[0, :2], "o", color=colour, ms=5)
        ax.plot(*centre[-1, :2], "s", color=colour, ms=6)
    return _top_view_png(fig, ax, title, legend_size=8)
