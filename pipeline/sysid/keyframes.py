"""Key frames and the mask filter of the Key Frame Loss (R2S2R paper, Sec. IV-G, Fig. 10).

A trajectory is split into gaits (windows in which every actuated cable only
retracts, holds or extends). Data and engine gaits are matched by index; each
runs on its own clock from the gait's start. The key frame of gait ``i`` is the
last instant both executions are still in that gait: ``min(D_engine_i, D_data_i)``
after the gait's start, so a faster engine is compared where it has just finished
(pushing it to slow down) and a slower one where the data has finished (pushing it
to speed up).

The mask filter keeps only the key frames that agree with the whole trajectory's
execution time: if the engine needs less time in total than the data, only gaits
in which it was also faster are kept (their gradients slow it down), and vice versa.
"""

from __future__ import annotations

import numpy as np


def key_frame_offsets(engine_durations_s: np.ndarray, data_durations_s: np.ndarray) -> np.ndarray:
    """Key-frame time after each gait's start (s), ``(G,)``: the earlier of the two gait ends."""
    engine, data = _durations(engine_durations_s, data_durations_s)
    return np.minimum(engine, data)


def mask_filter(engine_durations_s: np.ndarray, data_durations_s: np.ndarray, tolerance_s: float) -> np.ndarray:
    """Boolean ``(G,)``: which gaits' key frames push the engine's total execution time toward the data's.

    When the totals differ by at most ``tolerance_s`` (s; e.g. one control tick) every gait is kept.
    Gaits whose durations agree within ``tolerance_s`` are always kept (their key frames carry
    shape and contact information, not timing).
    """
    engine, data = _durations(engine_durations_s, data_durations_s)
    gap = engine.sum() - data.sum()
    if abs(gap) <= tolerance_s:
        return np.ones(len(engine), dtype=bool)
    difference = engine - data
    agrees = np.sign(difference) == np.sign(gap)
    return agrees | (np.abs(difference) <= tolerance_s)


def _durations(engine_durations_s: np.ndarray, data_durations_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    engine = np.asarray(engine_durations_s, dtype=float)
    data = np.asarray(data_durations_s, dtype=float)
    if engine.shape != data.shape or engine.ndim != 1:
        raise ValueError(f"engine and data durations must be two (G,) arrays, got {engine.shape} and {data.shape}")
    if not (np.isfinite(engine).all() and np.isfinite(data).all()) or (engine < 0).any() or (data < 0).any():
        raise ValueError("gait durations must be finite and non-negative")
    return engine, data
