"""Why a closed-loop run stops after an action, from what the camera saw (pure).

The planner ends a run at the path's end and the loop after ``follow.max_actions``; after each
action the robot's observation can end it too:

* the prism folded flat (:func:`pipeline.gaits.outcome.folded_flat`: every end cap near the
  ground, rods lying across one another). No action of the table stands it up again: the table's
  entries start from a standing prism, and a flat robot only crawls where its cables pull it;
* the robot left the corridor of ``corridor_m`` around the path;
* the robot left the camera's view (:data:`OUT_OF_VIEW`; the loop sees it when not one of the
  action's last frames can be tracked).
"""

from __future__ import annotations

import numpy as np

from pipeline.gaits.outcome import folded_flat

FOLDED = "folded flat"
"""The stop reason of a run whose robot folded flat."""
OUT_OF_VIEW = "out of the camera's view"
"""The stop reason of a run whose robot the camera no longer saw after an action."""


def stop_reason(caps_m: np.ndarray, distance_m: float, corridor_m: float, rod_length_m: float) -> str | None:
    """Why the run stops after an action whose tracked end caps at rest are ``caps_m`` (6, 3) (m,
    z up from the ground) and which left the robot's centroid ``distance_m`` from the path;
    ``corridor_m`` the corridor's half-width, ``rod_length_m`` the rods' length (m). None: it
    goes on."""
    if bool(folded_flat(np.asarray(caps_m)[None], rod_length_m)):
        return FOLDED
    if distance_m > corridor_m:
        return f"left the {corridor_m} m corridor"
    return None
