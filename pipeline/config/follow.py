"""The ``follow`` section of the pipeline config: trajectory following with an action table
(seed 002, :mod:`pipeline.follow`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.config.base import Positive, StrictModel


class PlannerConfig(StrictModel):
    """The depth-2 exhaustive search over the action table and its cost (:mod:`pipeline.follow.planner`).
    The Tribar paper's weights are not published in its text; these were chosen on the planner's
    tests (a line, an arc and a triangle on a synthetic table, ``tests/test_follow.py``) and
    offline on the twin's paths (docs/follow.md, *Planner*)."""

    depth: Annotated[int, Field(ge=1, le=3)] = Field(default=2, description="Actions looked ahead per replan.")
    distance_weight_per_m: Annotated[float, Field(ge=0)] = Field(
        default=20.0, description="w_d: cost per metre of distance from the path's nearest waypoint."
    )
    angle_weight_per_rad: Annotated[float, Field(ge=0)] = Field(
        default=1.0, description="w_a: cost per radian between the heading and the direction the robot should head in."
    )
    lookahead_m: Annotated[float, Field(ge=0)] = Field(
        default=0.3,
        description="The direction the robot should head in: towards the path's point this far (m) ahead of its "
        "nearest waypoint (about where the next roll or two end), so that a robot off the path heads back to it; "
        "0: the path's tangent at the nearest waypoint (the Tribar paper's) (docs/follow.md).",
    )
    progress_weight: Annotated[float, Field(ge=0)] = Field(
        default=4.0,
        description="w_p: cost of standing at the segment's start, falling linearly to 0 at its end.",
    )
    cost: Literal["final", "sum"] = Field(
        default="sum",
        description="What a sequence of actions costs: 'final', the cost of the pose it ends in (the Tribar "
        "paper's); 'sum', the sum over the poses after each of its actions, which favours sequences that "
        "make progress first (docs/follow.md).",
    )
    turn_either_way: bool = Field(
        default=True,
        description="A turn in place may run in either direction, the same action reversed turning the robot "
        "the same way; every roll runs in the rolling direction. False: every action in the rolling direction "
        "only (the Tribar paper's) (docs/follow.md).",
    )
    turn_max_step_m: Positive = Field(
        default=0.15,
        description="A turn in place ends on the face it starts from, having moved the robot less than this "
        "(m): the turns move it up to 0.11 m, a found gait that rolls through all three faces 0.5 m.",
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
    max_spread_m: Positive = Field(
        default=0.03,
        description="The planner leaves out a table entry whose members end farther apart than this (the root "
        "sum of the forward and lateral std, m): an action on a tipping point.",
    )
    max_spread_deg: Positive = Field(
        default=5.0, description="... or whose members turn the robot more differently than this (std, deg)."
    )
    min_agreeing_share: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.3,
        description="The planner leaves out every entry of an action whose members agree on fewer than this "
        "share of its six faces and directions (0.3: where they agree on one at most): the faces are images of "
        "one another, so an action on a tipping point from all but one is on one from that one too (0: judge "
        "each entry alone).",
    )
    min_step_m: Annotated[float, Field(ge=0)] = Field(
        default=0.02,
        description="The planner leaves out an entry predicted (after the online correction) to move the robot "
        "less than this (m) ...",
    )
    min_turn_deg: Annotated[float, Field(ge=0)] = Field(
        default=3.0,
        description="... and turn it less than this (deg): a gait cycle spent for nothing, which the search, "
        "blind to time, would otherwise repeat while the path waits.",
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
        default=0.3,
        description="The ensemble's frictions lower and higher by this fraction (0: none): sysid's friction can "
        "miss the robot's by a third, and an action whose outcome flips within that is left out of the search.",
    )
    starts: Annotated[int, Field(ge=0)] = Field(
        default=3, description="The ensemble also runs each action from this many starts near rest (nominal values)."
    )
    start_sigma_m: Annotated[float, Field(ge=0)] = Field(
        default=0.002, description="... those starts: Gaussian noise of this standard deviation on every end cap (m)."
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
