"""Figures saved as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pipeline.hardware.twin_model import ROD_COLOURS


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
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
