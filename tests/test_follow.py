"""Trajectory following (seed 002): paths, and the action-table planner on a synthetic table."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.config.follow import FollowConfig
from pipeline.errors import ConfigError, DataError
from pipeline.follow.correction import Correction
from pipeline.follow.motion import FORWARD, REVERSE, ActionTable, Pose
from pipeline.follow.paths import arc, from_waypoints, line, triangle
from pipeline.follow.planner import distances_to_path, follow_table, plan

CONFIG = FollowConfig().planner
END_M = FollowConfig().end_radius_m


def synthetic_table(drift_m: float = 0.0, turn_bias_rad: float = 0.0) -> ActionTable:
    """A table shaped like the Tribar paper's action set on three faces: rolling at seven ranges
    (one roll forward, 9-15 cm), six gradual turns (a longer step on one side), and cw and ccw turns
    in place; in reverse each moves the same way along the reversed heading. ``drift_m`` (lateral,
    to the left) and ``turn_bias_rad`` are a systematic error the planner does not know of."""
    rows = [(f"roll_{r}", 0.09 + (r - 90) / 1000, 0.0, 0.0, 1) for r in range(90, 151, 10)]
    rows += [(f"gradual_{s}{k}", 0.11, 0.0, sign * k * 0.08, 1) for k in (1, 2, 3) for s, sign in (("l", 1), ("r", -1))]
    rows += [("ccw", 0.0, 0.0, math.radians(20), 0), ("cw", 0.0, 0.0, -math.radians(20), 0)]
    faces = 3
    shape = (len(rows), faces, 2)
    forward, lateral, rotation = (np.zeros(shape) for _ in range(3))
    next_face = np.zeros(shape, int)
    for a, (_, f, lat, rot, rolls) in enumerate(rows):
        for face in range(faces):
            forward[a, face] = [f, -f]
            lateral[a, face] = [lat + drift_m, -(lat + drift_m)]
            rotation[a, face] = rot + turn_bias_rad
            next_face[a, face] = [(face + rolls) % faces, (face - rolls) % faces]
    return ActionTable(tuple(r[0] for r in rows), forward, lateral, rotation, next_face)


def _path(points: np.ndarray, name: str = "test"):
    return from_waypoints(points, CONFIG.corner_deg, CONFIG.waypoint_spacing_m, name)


def test_paths_split_at_corners_and_refuse_bad_waypoints() -> None:
    assert len(_path(triangle(1.5)).segments) == 3
    assert len(_path(arc(1.0, 180)).segments) == 1 and _path(arc(1.0, 180)).length_m == pytest.approx(math.pi, 1e-3)
    straight = _path(line(2.0))
    assert (
        len(straight.segments) == 1 and np.diff(straight.segments[0][:, 0]).max() <= CONFIG.waypoint_spacing_m + 1e-12
    )
    with pytest.raises(ConfigError, match="mine.yaml: a path needs at least two distinct waypoints"):
        _path(np.array([[0.0, 0.0], [0.0, 0.0]]), "mine.yaml")
    with pytest.raises(ConfigError, match="finite"):
        _path(np.array([[0.0, 0.0], [np.nan, 1.0]]))
    with pytest.raises(ConfigError, match="pairs"):
        _path(np.zeros((3, 3)))


def test_one_replan_prefers_the_roll_that_keeps_to_the_path() -> None:
    """On a line ahead, with the robot 5 cm to its left and heading along it, the cheapest
    sequence of two begins with a roll that turns right, not a turn in place."""
    table = synthetic_table()
    step = plan(table, _path(line(2.0)).segments[0], Pose(0.3, 0.05, 0.0), 0, FORWARD, CONFIG)
    name = table.names[step.action]
    assert name.startswith(("gradual_r", "roll_")) and step.predicted.x_m > 0.3


def test_the_heading_is_measured_against_the_point_ahead_on_the_path() -> None:
    """10 cm left of a 2 m line along x, the robot should head for the line's point ``lookahead_m``
    (0.3 m) ahead of its nearest waypoint: heading there costs no angle, heading along the line
    costs atan(0.1 / 0.3); past the line's end the point lies on its last leg extended. With
    ``lookahead_m`` 0 (the Tribar paper's) the line's tangent is the direction to head in."""
    from pipeline.follow.planner import path_cost

    segment = _path(line(2.0)).segments[0]
    weights = {"distance_weight_per_m": 0.0, "progress_weight": 0.0, "angle_weight_per_rad": 1.0}
    ahead = CONFIG.model_copy(update=weights)
    tangent = CONFIG.model_copy(update={**weights, "lookahead_m": 0.0})
    back = -math.atan2(0.1, ahead.lookahead_m)

    def cost(x_m: float, heading_rad: float, config) -> float:
        return float(path_cost(segment, np.array(x_m), np.array(0.1), np.array(heading_rad), config))

    assert cost(1.0, back, ahead) == pytest.approx(0.0, abs=1e-9)
    assert cost(1.0, 0.0, ahead) == pytest.approx(-back)
    assert cost(1.9, back, ahead) == pytest.approx(0.0, abs=1e-9)
    assert cost(1.0, 0.0, tangent) == pytest.approx(0.0, abs=1e-9)
    assert cost(1.0, back, tangent) == pytest.approx(-back)


@pytest.mark.parametrize(
    ("name", "points", "mean_m", "drift_m"),
    [
        ("line", line(2.0), 0.06, 0.01),
        ("arc", arc(1.0, 180), 0.06, 0.0),
        ("triangle", triangle(1.5), 0.10, 0.0),
    ],
)
def test_the_planner_follows_the_papers_paths_on_a_table(name, points, mean_m, drift_m) -> None:
    """Closed loop on the table's own motion, with a systematic drift on the line the plan does not
    know of: each path ends within the end radius, with the Tribar paper's goals for the mean
    distance from the path (0.06 m on the line and arc, 0.10 m on the triangle)."""
    path = _path(points)
    truth = synthetic_table(drift_m=drift_m)
    result = follow_table(synthetic_table(), path, Pose(0.0, 0.0, 0.0), 0, CONFIG, END_M, 200, motion=truth)
    assert result.finished, name
    end = result.poses[-1]
    assert math.hypot(end.x_m - path.waypoints[-1, 0], end.y_m - path.waypoints[-1, 1]) <= 0.15
    assert distances_to_path(path, result.poses).mean() <= mean_m


def test_a_turn_in_place_ends_on_its_face_near_where_it_started() -> None:
    """The turns in place are cw and ccw on every face, both ways; a roll is not, nor is an entry
    that ends on its own face 0.55 m away (a gait that rolled through all three faces)."""
    table = synthetic_table()
    cycle = table.names.index("roll_150")
    table.next_face[cycle, 1, FORWARD], table.forward_m[cycle, 1, FORWARD] = 1, 0.55
    turns = table.turns_in_place(CONFIG.turn_max_step_m)
    expected = np.zeros(turns.shape, bool)
    expected[[table.names.index("cw"), table.names.index("ccw")]] = True
    np.testing.assert_array_equal(turns, expected)


def test_a_turn_the_table_lacks_in_the_rolling_direction_is_taken_in_the_other() -> None:
    """Rolling in reverse with the heading it rolls along 60 deg left of the line, and the cw turn
    unusable in reverse: the search takes the cw turn forward (it turns the robot the same way);
    confined to the rolling direction it turns the robot ccw, away from the line."""
    table = synthetic_table()
    cw = table.names.index("cw")
    usable = np.ones(table.forward_m.shape, bool)
    usable[cw, :, REVERSE] = False
    table = dataclasses.replace(table, usable=usable)
    segment = _path(line(2.0)).segments[0]
    pose = Pose(0.3, 0.0, math.pi + math.radians(60))
    step = plan(table, segment, pose, 0, REVERSE, CONFIG)
    assert (step.action, step.direction) == (cw, FORWARD)
    confined = plan(table, segment, pose, 0, REVERSE, CONFIG.model_copy(update={"turn_either_way": False}))
    assert confined.direction == REVERSE and table.rotation_rad[confined.action, 0, REVERSE] > 0


def test_a_sharp_corner_is_taken_by_rolling_in_reverse() -> None:
    """A path that doubles back at 145 deg: at the corner the heading points away from the next
    segment, so the robot rolls in reverse instead of turning around, and still reaches the end."""
    path = _path(np.array([[0.0, 0.0], [1.0, 0.0], [0.2, 0.55]]))
    result = follow_table(synthetic_table(), path, Pose(0.0, 0.0, 0.0), 0, CONFIG, END_M, 200)
    assert result.finished and result.directions[0] == FORWARD and result.directions[-1] == REVERSE
    turns_in_place = sum(synthetic_table().names[a] in ("cw", "ccw") for a in result.actions)
    assert turns_in_place <= 4


def test_the_action_table_rolls_forward_turns_both_ways_and_maps_faces(default_configs) -> None:
    """The table in the engine with the robot config's values, over an ensemble of five motor
    speeds and frictions: the roll at the config's range (100 mm) moves the robot forward in its
    body frame (measured 0.23 m) and onto the next face, its reverse as far backward, and the roll
    with the longer step on the right (90 mm left, 150 mm right) turns less clockwise than the one
    with the longer step on the left (measured +0.4 and -17.5 deg); ccw and cw turn the heading
    in opposite senses (measured +3.2 and -17.4 deg); and the symmetry maps each action to every
    face with the same motion, within the ensemble's spread (the engine and the starts are
    symmetric, so here to rounding)."""
    from pipeline.follow.actions import paper_actions
    from pipeline.follow.table import tabulate
    from pipeline.gaits.ensemble import ensemble_params
    from pipeline.physics.engine import Engine
    from pipeline.physics.model import RobotModel
    from pipeline.physics.params import Params

    robot = default_configs.robot
    names = ("roll_100", "roll_90_150", "roll_150_90", "ccw", "cw")
    actions = [a for a in paper_actions(robot) if a.name in names]
    assert len(paper_actions(robot)) == 51
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    ensemble = ensemble_params(Params.from_robot(robot), 0.05, 0.15)
    tabulated = tabulate(engine, ensemble, robot, actions, 3.0)
    table = tabulated.table
    roll, right, left, ccw, cw = (table.names.index(name) for name in names)
    assert (table.forward_m[roll, :, FORWARD] > 0.15).all() and (table.forward_m[roll, :, REVERSE] < -0.15).all()
    np.testing.assert_array_equal(table.next_face[roll, :, FORWARD], [1, 2, 0])
    assert (table.rotation_rad[ccw] > 0).all() and (table.rotation_rad[cw] < 0).all()
    assert table.rotation_rad[right, 0, FORWARD] - table.rotation_rad[left, 0, FORWARD] > math.radians(8)
    for values, spread in (
        (table.forward_m, tabulated.forward_std_m),
        (table.rotation_rad, tabulated.rotation_std_rad),
    ):
        np.testing.assert_allclose(values, values[:, :1].repeat(3, axis=1), atol=1e-6 + 3 * spread.max())
    assert tabulated.succeeded[roll].all()


def test_the_planner_leaves_out_the_entries_whose_members_disagree() -> None:
    """:func:`planning_table` marks an entry usable only where every member succeeded and the
    members agree within ``max_spread_m`` and ``max_spread_deg``, and no entry of an action that
    agrees on fewer than ``min_agreeing_share`` (0.3) of its six entries; the planner then never picks
    an entry marked unusable, even the one it would pick otherwise."""
    from pipeline.follow.table import TabulatedActions, planning_table

    table = synthetic_table()
    zeros = np.zeros(table.forward_m.shape)
    best = plan(table, _path(line(2.0)).segments[0], Pose(0.0, 0.0, 0.0), 0, FORWARD, CONFIG).action
    forward_std = zeros.copy()
    forward_std[best] = 0.05  # the planner's favourite rolls the robot on or not, by start
    rotation_std = zeros.copy()
    rotation_std[0, :, REVERSE] = math.radians(8)  # half of roll_90's entries: the rest stay usable
    succeeded = np.ones(zeros.shape, bool)
    succeeded[1, 2, FORWARD] = False
    forward_std[2, :2] = 0.05  # four of roll_110's six entries: its other two stay usable
    forward_std[3, :2] = forward_std[3, 2, FORWARD] = 0.05  # five of roll_120's: its sixth goes with them
    tabulated = TabulatedActions(table, forward_std, zeros, rotation_std, succeeded)
    masked = planning_table(tabulated, CONFIG)
    alone = np.ones(zeros.shape, bool)
    alone[best], alone[0, :, REVERSE], alone[1, 2, FORWARD] = False, False, False
    alone[2, :2], alone[3, :2], alone[3, 2, FORWARD] = False, False, False
    expected = alone.copy()
    expected[3] = False
    np.testing.assert_array_equal(masked.usable, expected)
    each = planning_table(tabulated, CONFIG.model_copy(update={"min_agreeing_share": 0.0}))
    np.testing.assert_array_equal(each.usable, alone)
    step = plan(masked, _path(line(2.0)).segments[0], Pose(0.0, 0.0, 0.0), 0, FORWARD, CONFIG)
    assert step.action != best


def test_the_action_table_file_reads_back_the_table_and_refuses_another(tmp_path) -> None:
    import pandas as pd

    from pipeline.follow.table import TabulatedActions
    from storage.action_table import read_action_table, write_action_table
    from storage.tables import write_table

    table = synthetic_table(drift_m=0.003)
    spread = np.random.default_rng(0).uniform(0.0, 0.02, table.forward_m.shape)
    succeeded = spread < 0.015
    path = tmp_path / "actions.parquet"
    write_action_table(path, TabulatedActions(table, spread, 2 * spread, 3 * spread, succeeded), {})
    back = read_action_table(path)
    assert back.table.names == table.names
    for name in ("forward_m", "lateral_m", "rotation_rad", "next_face"):
        np.testing.assert_array_equal(getattr(back.table, name), getattr(table, name))
    np.testing.assert_array_equal(back.lateral_std_m, 2 * spread)
    np.testing.assert_array_equal(back.rotation_std_rad, 3 * spread)
    np.testing.assert_array_equal(back.succeeded, succeeded)
    other = tmp_path / "other.parquet"
    write_table(other, pa.Table.from_pandas(pd.DataFrame({"action": ["x"], "face": [0]})), {})
    with pytest.raises(DataError, match=r"other.parquet: an action table needs columns"):
        read_action_table(other)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("one.yaml", "- [0.0, 0.0]\n", "at least two distinct waypoints"),
        ("nan.csv", "x,y\n0,0\nnan,1\n", "finite"),
        ("bad.yaml", "waypoints: [[0, 0], [1\n", "not valid YAML"),
        ("triples.yaml", "- [0, 0, 0]\n- [1, 0, 0]\n", "list of \\[x, y\\] waypoints"),
        ("words.csv", "0,0\nnorth,east\n", "two numbers"),
        ("three.csv", "0,0,0\n1,1,1\n", "two columns"),
        ("path.txt", "0 0\n1 1\n", "YAML \\(.yaml, .yml\\) or CSV"),
    ],
)
def test_a_bad_path_file_is_refused_naming_it(tmp_path, name, text, message) -> None:
    from storage.path_file import read_path

    file = tmp_path / name
    file.write_text(text)
    with pytest.raises((ConfigError, DataError), match=message) as raised:
        _path(read_path(str(file))[1], str(file))
    assert str(file) in str(raised.value)


def test_path_files_and_built_ins_give_their_waypoints(tmp_path) -> None:
    from storage.path_file import read_path

    (tmp_path / "l.yaml").write_text("waypoints:\n  - [0, 0]\n  - [1.5, 0.5]\n")
    (tmp_path / "l.csv").write_text("x,y\n0,0\n1.5,0.5\n")
    for file in ("l.yaml", "l.csv"):
        name, points = read_path(str(tmp_path / file))
        np.testing.assert_array_equal(points, [[0, 0], [1.5, 0.5]])
        assert name == "l"
    np.testing.assert_allclose(read_path("line:3")[1], [[0, 0], [3, 0]])
    assert _path(read_path("arc")[1]).length_m == pytest.approx(math.pi, 1e-3)  # radius 1 m, 180 deg
    assert len(_path(read_path("triangle:2")[1]).segments) == 3
    with pytest.raises(ConfigError, match="neither a file nor one of the built-ins"):
        read_path("spiral")
    with pytest.raises(ConfigError, match="positive"):
        read_path("line:-1")
    with pytest.raises(ConfigError, match="not zero"):
        read_path("arc:1:0")
    clockwise = read_path("arc:1:-90")[1]
    assert clockwise[-1] == pytest.approx([1.0, -1.0])  # a quarter circle turning right from +x


@pytest.mark.parametrize("path_name", ["line", "arc"])
def test_the_online_correction_keeps_the_robot_on_the_path_where_the_table_is_biased(path_name) -> None:
    """The robot moves 5 cm further to the left on every action and turns 3 deg more clockwise than
    the table says. Planning with the table as it is, the closed loop misses the Tribar goal of
    0.06 m from the path on average (measured 0.080 on the line, 0.070 on the arc: the roll it
    trusts keeps disappointing it); corrected online from what each action did
    (:mod:`pipeline.follow.correction`), it meets it (measured 0.021 and 0.018)."""
    points = line(2.0) if path_name == "line" else arc(1.0, 180)
    path = _path(points)
    truth = synthetic_table(drift_m=0.05, turn_bias_rad=-math.radians(3))
    start = Pose(0.0, 0.0, 0.0)
    uncorrected = CONFIG.model_copy(update={"correction_prior": None})
    plain = follow_table(synthetic_table(), path, start, 0, uncorrected, END_M, 80, motion=truth)
    corrected = follow_table(synthetic_table(), path, start, 0, CONFIG, END_M, 80, motion=truth)
    assert corrected.finished
    assert distances_to_path(path, corrected.poses).mean() <= 0.06 < distances_to_path(path, plain.poses).mean()


def test_the_correction_shrinks_each_actions_residual_towards_its_groups() -> None:
    """An action seen once gets its residual shrunk towards its group's mean (k = 2: a third of the
    way from the group's to its own); an action of the same group never taken gets the group's
    mean; an action of the other group (turns in place) nothing."""

    table = synthetic_table()
    roll, other_roll, still, ccw = (table.names.index(n) for n in ("roll_100", "roll_150", "roll_120", "ccw"))
    correction = Correction(table, prior_weight=2.0)
    correction.observe(roll, 0, FORWARD, (table.forward_m[roll, 0, 0] + 0.03, 0.06, -0.03), 1)
    correction.observe(still, 1, FORWARD, (table.forward_m[still, 0, 0], 0.0, 0.0), 2)
    residuals = correction.residuals()
    group = np.array([0.015, 0.03, -0.015])  # the two rolls' mean
    np.testing.assert_allclose(residuals[roll, FORWARD], (np.array([0.03, 0.06, -0.03]) + 2 * group) / 3, atol=1e-12)
    np.testing.assert_allclose(residuals[other_roll, FORWARD], group, atol=1e-12)
    np.testing.assert_array_equal(residuals[ccw], 0.0)
    np.testing.assert_array_equal(residuals[roll, REVERSE], 0.0)
    assert correction.applied().lateral_m[other_roll, 2, FORWARD] == pytest.approx(group[1])


def test_an_action_that_ends_on_another_face_than_the_table_says_is_planned_as_seen() -> None:
    """A turn in place that rolled the robot over (the table's shortest roll at the edge of
    rolling, on the twin) did something else than the table's motion, not the same a little off:
    it is planned with what it was seen to do, the face it ended on replaces the table's, and its
    residual does not move the other turn in place, which the group's mean would otherwise make
    roll too. A roll that rocked back onto its face is treated alike."""

    table = synthetic_table()
    ccw, cw, roll, other_roll = (table.names.index(n) for n in ("ccw", "cw", "roll_90", "roll_150"))
    correction = Correction(table, prior_weight=2.0)
    rolled = (0.26, 0.01, math.radians(7))
    correction.observe(ccw, 0, FORWARD, rolled, 1)
    rocked = (0.005, 0.0, 0.0)
    correction.observe(roll, 2, FORWARD, rocked, 2)
    applied = correction.applied()
    np.testing.assert_allclose(applied.motion(ccw, 0, FORWARD), rolled, atol=1e-12)
    assert applied.next_face[ccw, 1, FORWARD] == 2
    np.testing.assert_allclose(applied.motion(roll, 0, FORWARD), rocked, atol=1e-12)
    assert applied.next_face[roll, 1, FORWARD] == 1
    np.testing.assert_array_equal(correction.residuals()[[cw, other_roll]], 0.0)


def test_an_action_is_planned_to_end_as_it_ended_most_often_with_those_times_residuals() -> None:
    """A turn in place that stayed on its face three times and rolled once (on the twin, a cw turn
    at iteration 2's tipping point) is planned as turning in place, with the three turns' residual
    shrunk towards its group's, not as a quarter of a roll; once it has rolled as often as it
    stayed, the latest outcome decides, and it is planned as the rolls it made."""

    table = synthetic_table()
    cw = table.names.index("cw")
    correction = Correction(table, prior_weight=2.0)
    turned = (0.01, -0.02, -math.radians(10))
    rolled = (0.2, 0.03, -math.radians(5))
    for _ in range(3):
        correction.observe(cw, 0, FORWARD, turned, 0)
    correction.observe(cw, 0, FORWARD, rolled, 1)
    applied = correction.applied()
    assert applied.next_face[cw, 2, FORWARD] == 2
    residual = np.subtract(turned, table.motion(cw, 0, FORWARD))
    np.testing.assert_allclose(applied.motion(cw, 1, FORWARD), table.motion(cw, 1, FORWARD) + residual, atol=1e-12)
    for _ in range(2):
        correction.observe(cw, 1, FORWARD, rolled, 2)
    applied = correction.applied()
    assert applied.next_face[cw, 2, FORWARD] == 0
    np.testing.assert_allclose(applied.motion(cw, 0, FORWARD), rolled, atol=1e-12)


def test_an_action_that_did_next_to_nothing_is_not_run_again_straight_away() -> None:
    """A turn in place that turned the robot 1 deg (on the twin, a found gait that turns it 15 deg
    after a roll and next to nothing after itself) leaves the robot as it was: the planner does
    not run it again from the same face next, while the correction's mean, still weighed by what
    the table says, predicts a turn; once another action has moved the robot it may."""
    from pipeline.follow.planner import Follower

    table = synthetic_table()
    ccw = table.names.index("ccw")
    path = _path(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
    follower = Follower(table, path, CONFIG, END_M)
    at_corner = Pose(1.0, 0.0, 0.0)
    step = follower.step(at_corner, 0)
    assert table.names[step.action] == "ccw"
    follower.observe(step, 0, at_corner, Pose(1.0, 0.0, math.radians(1)), 0)
    assert not follower.planning_table().usable[ccw, 0, step.direction]
    assert follower.planning_table().usable[ccw, 1:, step.direction].all()
    again = follower.step(Pose(1.0, 0.0, math.radians(1)), 0)
    assert (again.action, again.direction) != (step.action, step.direction)
    follower.observe(step, 0, at_corner, Pose(1.0, 0.0, math.radians(20)), 0)
    assert follower.planning_table().usable[ccw, 0, step.direction]


def test_progress_follows_the_track_in_order_so_a_closed_paths_end_is_not_its_start() -> None:
    """On the triangle (which ends where it starts), a track that went round counts as all of
    the path and one that stopped at the second corner as two thirds; a track that never left
    the start, as none."""
    from pipeline.follow.metrics import path_figures, progress_along

    waypoints = _path(triangle(1.0)).waypoints
    assert progress_along(waypoints, waypoints, 0.5) == pytest.approx(1.0)
    legs = np.r_[0.0, np.cumsum(np.linalg.norm(np.diff(waypoints, axis=0), axis=1))]
    to_second_corner = waypoints[legs <= 1.0 + 1.0 + 1e-9]
    assert progress_along(waypoints, to_second_corner, 0.5) == pytest.approx(2.0 / (2.0 + math.sqrt(2.0)), abs=0.01)
    assert progress_along(waypoints, waypoints[:1].repeat(5, axis=0), 0.5) == 0.0
    figures = path_figures(waypoints, waypoints + np.array([0.0, 0.03]), 0.5)
    assert figures["mean_distance_m"] <= 0.03 and figures["end_error_m"] == pytest.approx(0.03)


def test_the_motion_between_two_poses_inverts_moved_and_the_errors_group_per_action() -> None:
    """:meth:`Pose.motion_to` gives back the body-frame motion :meth:`Pose.moved` applied (the
    rotation wrapped across +-pi); :func:`action_errors` groups steps per action and direction
    with the mean predicted and observed motion and the table's error."""
    from pipeline.follow.metrics import action_errors

    before = Pose(0.4, -0.2, 3.0)
    after = before.moved(0.21, -0.03, 0.5)
    assert before.motion_to(after) == pytest.approx((0.21, -0.03, 0.5))
    assert Pose(0, 0, 3.1).motion_to(Pose(0, 0, -3.1))[2] == pytest.approx(2 * math.pi - 6.2)
    steps = pd.DataFrame(
        {
            "action": ["roll_100", "cw", "roll_100"],
            "direction": [FORWARD, FORWARD, FORWARD],
            "table_forward_m": [0.2, 0.0, 0.2],
            "observed_forward_m": [0.23, -0.04, 0.17],
            "table_lateral_m": [0.0, 0.0, 0.0],
            "observed_lateral_m": [0.04, 0.03, -0.04],
            "table_rotation_rad": [-0.1, -0.3, -0.1],
            "observed_rotation_rad": [-0.2, -0.5, 0.0],
        }
    )
    errors = action_errors(steps)
    assert list(errors["action"]) == ["roll_100", "cw"] and list(errors["count"]) == [2, 1]
    roll = errors.iloc[0]
    assert roll["observed_forward_m"] == pytest.approx(0.2) and roll["position_error_m"] == pytest.approx(0.05)
    assert roll["rotation_error_rad"] == pytest.approx(0.1)
    assert errors.iloc[1]["position_error_m"] == pytest.approx(0.05)


def test_the_observed_pose_is_the_papers(default_configs) -> None:
    """Centroid of the six caps, heading the principal axis (odd caps to even caps) turned 90 deg
    counter-clockwise; turning the robot about z turns the heading by as much."""
    from scipy.spatial.transform import Rotation

    from pipeline.follow.motion import observed
    from pipeline.robot_model import reference_prism, resting_on_face

    caps = resting_on_face(default_configs.robot, reference_prism(default_configs.robot))
    pose, face = observed(caps)
    axis = caps[[0, 2, 4]].mean(0) - caps[[1, 3, 5]].mean(0)
    assert face == 0 and (pose.x_m, pose.y_m) == pytest.approx(tuple(caps.mean(0)[:2]))
    assert pose.heading_rad == pytest.approx(math.atan2(axis[1], axis[0]) + math.pi / 2)
    turned, _ = observed(Rotation.from_euler("z", 0.7).apply(caps) + np.array([0.3, -0.2, 0.0]))
    assert (turned.heading_rad - pose.heading_rad) % (2 * math.pi) == pytest.approx(0.7)


def test_a_run_stops_where_the_robot_folded_flat_or_left_the_corridor(default_configs) -> None:
    """After an action the run stops where the robot lies folded flat (four actuated cables
    retracted from rest lay the engine's prism flat, as on the twin; tests/test_gaits.py), however
    near the path, and where it left the corridor; a standing robot inside the corridor goes on."""
    from pipeline.follow.stops import FOLDED, stop_reason
    from pipeline.gaits.outcome import simulate_targets
    from pipeline.physics import Engine, Params, RobotModel
    from pipeline.physics.rollout import rest_start
    from pipeline.robot_model import reference_prism, resting_on_face
    from tests.conftest import FOLD

    robot = default_configs.robot
    engine = Engine(RobotModel.from_robot(robot), dt=0.005)
    params = Params.from_robot(robot)
    flat = simulate_targets(engine, params, robot, rest_start(engine, params, robot), FOLD[None], 2.0)
    folded = flat.trace.caps_m[0, -1].numpy()
    standing = resting_on_face(robot, reference_prism(robot))
    rod = robot.rod.length_m
    assert stop_reason(folded, 0.01, 0.5, rod) == FOLDED
    assert stop_reason(standing, 0.49, 0.5, rod) is None
    assert stop_reason(standing, 0.51, 0.5, rod) == "left the 0.5 m corridor"


def test_a_short_line_closed_loop_on_the_twin_with_the_pose_from_tracking(tmp_path) -> None:
    """The iteration's action table (the paper's rolling and turning actions, and the published turns
    as the gaits found), then a 0.5 m line on the twin: the robot is placed at its start, each
    replan takes the pose the camera tracker gives after the action, and the run ends within
    the end tolerance. The poses the planner saw are the tracker's: within 2 cm of the twin's
    ground truth, not equal."""
    from pipeline.config import load_all
    from pipeline.published_gaits import CCW_TURN, CW_TURN_UNIT
    from storage.catalog import GAITS_FILE
    from storage.layout import RunLayout, write_manifest
    from storage.trajectory import caps_array, read_trajectory
    from tasks.actions import run_actions
    from tasks.follow import ACTION_ERRORS_FILE, STEPS_FILE, run_follow
    from tests.conftest import empty_overlays, write_test_pipeline

    configs = load_all(write_test_pipeline(tmp_path, campaign="follow"))
    refs = empty_overlays(configs, 1)
    gaits = RunLayout.of(configs).stage_dir(1, "gaits")
    gaits.mkdir(parents=True)
    turns = {"ccw": CCW_TURN, "cw": CW_TURN_UNIT}  # full-range turns, as the gaits stage finds them
    found = {name: {"targets": targets.tolist()} for name, targets in turns.items()}
    (gaits / GAITS_FILE).write_text(json.dumps({"found": found}))
    refs["gaits"] = write_manifest(gaits, "gaits", complete=True, summary={})
    run_actions(configs, 1, refs["attach"], refs["sysid"], refs["gaits"])
    line = tmp_path / "line.yaml"  # from where the twin rests, where the tests' small camera sees well
    line.write_text("waypoints: [[0.0, 0.0], [0.5, 0.0]]\n")
    folder, summary = run_follow(configs, 1, str(line))
    assert summary["reached_end"] and summary["end_error_m"] <= 0.15, summary
    assert json.loads((folder / "manifest.json").read_text())["complete"] is True
    steps = pd.read_parquet(folder / STEPS_FILE)
    assert len(steps) == summary["actions"] >= 1
    errors = pd.read_parquet(folder / ACTION_ERRORS_FILE)
    assert errors["count"].sum() == len(steps) and set(errors["action"]) == set(steps["action"])
    truth = caps_array(read_trajectory(folder / "groundtruth.parquet")[0]).mean(axis=1)[-1, :2]
    last = steps.iloc[-1]
    gap = math.hypot(last["observed_x_m"] - truth[0], last["observed_y_m"] - truth[1])
    assert 0 < gap < 0.02
    from storage.mcap_export import export_stage

    (export,) = export_stage(RunLayout.of(configs), configs.robot, 1, "follow")  # the run for Foxglove
    tracked = read_trajectory(folder / "tracked.parquet")[0]
    assert export.path.name == f"{folder.name}.mcap" and export.messages["/robot/tracked"] == len(tracked)


def test_the_table_is_simulated_in_the_learned_engine_only_when_configured(tmp_path) -> None:
    """``engine.contact: analytic`` tabulates in the identified analytic engine at the gait search's
    step; ``learned`` in the hybrid engine with the learn stage's network; ``learned`` without a
    learn output is refused."""
    from pipeline.config import load_all
    from pipeline.learned.engine import LearnedEngine
    from tasks.actions import table_engine
    from tests.conftest import empty_overlays, write_test_pipeline

    configs = load_all(write_test_pipeline(tmp_path, campaign="table", n_targets=1))
    learn = empty_overlays(configs, 1)["learn"]
    analytic = table_engine(configs, configs.robot, learn)
    assert not isinstance(analytic, LearnedEngine) and analytic.dt == configs.pipeline.gaits.search.dt_s
    learned_configs = configs.updated({"pipeline.engine.contact": "learned"})
    assert isinstance(table_engine(learned_configs, configs.robot, learn), LearnedEngine)
    with pytest.raises(ValueError, match="no learn stage output"):
        table_engine(learned_configs, configs.robot, None)


def test_an_action_that_does_next_to_nothing_is_left_out_so_a_corner_is_turned() -> None:
    """At a 90 deg corner with a roll, a turn in place that shifts the robot 7 cm, and a creep
    that turns it 1 deg and does not move it: the search, blind to time, picks the creep (it
    costs nothing and spoils nothing) and would pick it again and again; with the creep below
    ``min_step_m`` and ``min_turn_deg`` (:func:`moving`) it turns in place."""
    from pipeline.follow.planner import Follower

    names = ("roll", "turn", "creep")
    motion = [(0.2, 0.0, -0.05, 1), (-0.07, 0.07, math.radians(15), 0), (0.0, 0.0, math.radians(1), 0)]
    shape = (3, 3, 2)
    columns = [np.zeros(shape) for _ in range(3)]
    next_face = np.zeros(shape, int)
    for a, (forward, lateral, rotation, rolls) in enumerate(motion):
        for face in range(3):
            for column, value in zip(columns, (forward, lateral, rotation), strict=True):
                column[a, face] = value
            next_face[a, face] = (face + rolls) % 3
    table = ActionTable(names, *columns, next_face)
    path = _path(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
    at_corner = Pose(1.0, 0.0, 0.0)
    blind = CONFIG.model_copy(update={"min_step_m": 0.0, "min_turn_deg": 0.0})
    assert names[Follower(table, path, blind, END_M).step(at_corner, 0).action] == "creep"
    assert names[Follower(table, path, CONFIG, END_M).step(at_corner, 0).action] == "turn"


def test_the_summed_cost_makes_progress_first_where_the_final_pose_alone_cannot_tell() -> None:
    """A roll 0.4 m forward (usable from face 0 only, so once per sequence here) and a shuffle 3 cm
    to the left, from 3 cm right of a line: they commute, so both orders end in the same pose,
    and costed by the final pose alone (the paper's ``final``) the search cannot tell them apart
    and takes the first it meets, the shuffle; the summed cost prefers the order that makes
    progress first, the roll. Near a path's end, the final pose alone let the robot put off
    rolling replan after replan."""
    names = ("shuffle", "roll")
    shape = (2, 3, 2)
    forward, lateral, rotation = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    forward[1], lateral[0] = 0.4, 0.03
    next_face = np.zeros(shape, int)
    next_face[1] = (np.arange(3)[:, None] + 1) % 3
    usable = np.ones(shape, bool)
    usable[1, 1:] = False
    table = ActionTable(names, forward, lateral, rotation, next_face, usable)
    segment = _path(line(2.0)).segments[0]
    pose = Pose(0.2, -0.03, 0.0)
    final = CONFIG.model_copy(update={"cost": "final"})
    assert names[plan(table, segment, pose, 0, FORWARD, final).action] == "shuffle"
    assert names[plan(table, segment, pose, 0, FORWARD, CONFIG).action] == "roll"
