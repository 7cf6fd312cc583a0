"""The ``follow`` section of the pipeline config: trajectory following with an action table
(seed 002, :mod:`pipeline.follow`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipeline.config.base import Positive, StrictModel


class PlannerConfig(StrictModel):
    """The depth-2 exhaustive search over the action table and its cost (:mod:`pipeline.follow.planner`).
    The Tribar paper's weights are not published in its text; these were chosen on the planner's
    tests (a line, an arc and a triangle on a synthetic table, ``tests/test_follow.py``)."""

    depth: Annotated[int, Field(ge=1, le=3)] = Field(default=2, description="Actions looked ahead per replan.")
    distance_weight_per_m: Annotated[float, Field(ge=0)] = Field(
        default=10.0, description="w_d: cost per metre of distance from the path's nearest waypoint."
    )
    angle_weight_per_rad: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="w_a: cost per radian between the heading and the path's tangent there."
    )
    progress_weight: Annotated[float, Field(ge=0)] = Field(
        default=4.0,
        description="w_p: cost of standing at the segment's start, falling linearly to 0 at its end.",
    )
    switch_radius_m: Positive = Field(
        default=0.27,
        description="A segment ends within this distance of its last waypoint (or where that waypoint is "
        "the nearest); the Tribar paper's 27 cm on a robot of our size.",
    )
    corner_deg: Annotated[float, Field(gt=0, lt=180)] = Field(
        default=45.0, description="A path turning more than this at a waypoint is split into segments there."
    )
    waypoint_spacing_m: Positive = Field(
        default=0.02, description="Segments are resampled to waypoints this far apart."
    )
    correction_prior: Positive | None = Field(
        default=2.0,
        description="Correct the table online from the motions observed in the run, each action's mean "
        "residual shrunk towards its group's with this weight (in actions; pipeline.follow.correction); "
        "null: plan with the table as it is.",
    )


class ActionTableConfig(StrictModel):
    """How the ``actions`` stage simulates the action table (:mod:`pipeline.follow.table`)."""

    paper_actions: tuple[str, ...] | None = Field(
        default=None,
        description="Which of the Tribar paper's 51 actions to tabulate, by name (roll_<R>, roll_<L>_<R>, ccw, cw); "
        "null: all. The gaits the gaits stage found are always added.",
    )
    ensemble_motor_speed: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.05, description="The ensemble's motor speeds lower and higher by this fraction (0: none)."
    )
    ensemble_friction: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.0, description="The ensemble's frictions lower and higher by this fraction (0: none)."
    )


class FollowConfig(StrictModel):
    """Trajectory following (``follow`` section; docs/follow.md)."""

    table: ActionTableConfig = ActionTableConfig()
    planner: PlannerConfig = PlannerConfig()
    end_radius_m: Positive = Field(
        default=0.1, description="The path is done within this distance of its last waypoint."
    )
    max_actions: Annotated[int, Field(ge=1)] = Field(default=60, description="A run stops after this many actions.")
    corridor_m: Positive = Field(
        default=0.5, description="A run stops when the robot is farther than this from the path."
    )
