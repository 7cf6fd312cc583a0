"""The sysid report's verdicts and its Markdown and HTML (:mod:`pipeline.sysid.report`)."""

from __future__ import annotations

import pytest

from pipeline.sysid.report import ParameterRow, intervals, report_html, report_markdown
from pipeline.sysid.result import Identification


def _row(interval: tuple[float, float] | None, change: tuple[float, float] | None = (-3.0, 4.0), truth=None):
    return ParameterRow("friction", 0.8, (0.05, 1.5), 0.5, interval, change, truth)


@pytest.mark.parametrize(
    ("interval", "verdict"),
    [
        ((0.46, 0.54), "determined"),  # within 10 % either side
        ((0.46, 0.6), "loosely determined"),  # 20 % above
        ((0.2, 0.52), "not determined"),  # 60 % below
        (None, "not determined"),  # no profile kept
    ],
)
def test_the_verdict_follows_the_intervals_reach(interval, verdict: str) -> None:
    assert _row(interval).verdict == verdict


def test_held_out_gaits_that_barely_move_are_said_so() -> None:
    assert _row((0.49, 0.51), (0.2, -0.4)).verdict == "determined; held-out gaits hardly depend on it"
    assert _row((0.49, 0.51), (0.2, -0.6)).verdict == "determined"


def test_the_truth_is_inside_or_not() -> None:
    assert _row((0.46, 0.54), truth=0.52).truth_inside is True
    assert _row((0.46, 0.54), truth=0.60).truth_inside is False
    assert _row((0.46, 0.54)).truth_inside is None and _row(None, truth=0.5).truth_inside is None


def test_the_report_has_a_row_per_parameter_and_the_truth_columns_only_on_the_twin() -> None:
    rows = [_row((0.46, 0.54), truth=0.6), ParameterRow("motor_speed", 0.99, (0.2, 1.5), 0.8, None, None, 0.81)]
    text = report_markdown("demo iteration 1: identification", rows, (14.4, 9.1), ["plots/replay_a.png"])
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].endswith("| twin's truth | inside |") and len(table) == 3
    assert table[1].startswith(
        "| friction | 0.8 | 0.05 to 1.5 | 0.5 | 0.46 to 0.54 | -3.00 / +4.00 | determined | 0.6 | false |"
    )
    assert table[2] == "| motor_speed | 0.99 | 0.2 to 1.5 | 0.8 | - | - | not determined | 0.81 | - |"
    assert "14.4 mm with the robot config's values, 9.1 mm identified" in text and "![plots/replay_a.png]" in text
    without = report_markdown("t", [_row((0.46, 0.54))], None, [])
    assert "truth" not in without.splitlines()[2]
    page = report_html(text, "demo")
    assert page.count("<tr>") == 3 and '<img alt="plots/replay_a.png" src="plots/replay_a.png"' in page


def test_intervals_are_two_standard_errors_where_shooting_gave_them_else_the_profile() -> None:
    result = Identification(
        values={"motor_speed": 0.8, "friction": 0.5, "restitution": 0.1},
        params=None,
        profile={"friction": (0.3, 0.7), "restitution": (0.0, 0.4)},
        standard_error={"friction": 0.02},
    )
    assert intervals(result) == {"friction": pytest.approx((0.46, 0.54)), "restitution": (0.0, 0.4)}
