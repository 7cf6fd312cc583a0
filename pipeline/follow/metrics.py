"""A follow run's figures: how close the robot kept to the path, and how well the action table
predicted each action (the sim-to-real gap in the form the planner feels it).

Motions are in the robot's body frame before the action, as the table holds them
(:class:`~pipeline.follow.motion.ActionTable`): forward and lateral along the heading before the
action (m) and the heading's change (rad, counter-clockwise positive). A run's steps hold, per
action, the ``observed_<motion>``, the ``table_<motion>`` (the action table's entry) and the
``predicted_<motion>`` (what the planner expected: the table, corrected online where it was).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.robot_model import wrapped_rad

MOTIONS = ("forward_m", "lateral_m", "rotation_rad")


def progress_along(waypoints: np.ndarray, track: np.ndarray, lookahead_m: float) -> float:
    """The share of the path ``waypoints`` (n, 2) a track ``track`` (T, 2) covered, m/m: its samples
    matched in order to the nearest waypoint no more than ``lookahead_m`` along the path beyond the
    last match (never back), so that a closed path's end is not taken for its start."""
    along = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(waypoints, axis=0), axis=1))]
    i = 0
    for point in track:
        ahead = np.flatnonzero((along >= along[i]) & (along <= along[i] + lookahead_m))
        i = int(ahead[np.argmin(np.linalg.norm(waypoints[ahead] - point, axis=1))])
    return float(along[i] / along[-1])


def path_figures(waypoints: np.ndarray, track: np.ndarray, lookahead_m: float) -> dict[str, float]:
    """How a tracked centroid ``track`` (T, 2) kept to the path ``waypoints`` (n, 2), m: the mean
    and max distance from the path's nearest waypoint, the end-point error, and the progress
    (:func:`progress_along`)."""
    distances = np.min(np.linalg.norm(track[:, None, :] - waypoints[None], axis=-1), axis=1)
    return {
        "mean_distance_m": float(distances.mean()),
        "max_distance_m": float(distances.max()),
        "end_error_m": float(np.linalg.norm(track[-1] - waypoints[-1])),
        "progress": progress_along(waypoints, track, lookahead_m),
    }


def prediction_errors(steps: pd.DataFrame, source: str = "table") -> tuple[np.ndarray, np.ndarray]:
    """Per step (``steps``: ``<source>_<motion>`` and ``observed_<motion>`` for each of
    :data:`MOTIONS`), the distance between the end position ``source`` (``table`` or
    ``predicted``) expected and the observed one (m), and the absolute difference of the
    rotations (rad, wrapped to [0, pi])."""
    position = np.hypot(
        steps["observed_forward_m"] - steps[f"{source}_forward_m"],
        steps["observed_lateral_m"] - steps[f"{source}_lateral_m"],
    ).to_numpy()
    return position, np.abs(wrapped_rad(steps["observed_rotation_rad"] - steps[f"{source}_rotation_rad"]).to_numpy())


def action_errors(steps: pd.DataFrame) -> pd.DataFrame:
    """Per action and rolling direction taken in a run (``steps``: one row per action with
    ``action``, ``direction``, ``table_<motion>`` and ``observed_<motion>`` for each of
    :data:`MOTIONS`): how often it ran, the table's motion and the mean observed one, and the
    mean :func:`prediction_errors` of the table. Sorted by how often the action ran."""
    rows = []
    for (action, direction), group in steps.groupby(["action", "direction"], sort=False):
        row: dict[str, object] = {"action": action, "direction": int(direction), "count": len(group)}
        for motion in MOTIONS:
            row[f"table_{motion}"] = float(group[f"table_{motion}"].mean())
            row[f"observed_{motion}"] = float(group[f"observed_{motion}"].mean())
        position, rotation = prediction_errors(group)
        row["position_error_m"] = float(position.mean())
        row["rotation_error_rad"] = float(rotation.mean())
        rows.append(row)
    columns = ["action", "direction", "count", *(f"{k}_{m}" for m in MOTIONS for k in ("table", "observed"))]
    frame = pd.DataFrame(rows, columns=[*columns, "position_error_m", "rotation_error_rad"])
    return frame.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)
