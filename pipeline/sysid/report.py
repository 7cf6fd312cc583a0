"""The sysid report: per identified parameter, how well this recording determines it.

For each parameter the search identified (``sysid.search.parameters``) the report gives its start
(the robot config's value), the bounds the search kept to, the identified value, an **interval**
and the **held-out sensitivity**, and a verdict:

* the interval (:func:`intervals`) is the answer plus and minus two standard errors where gait
  shooting refined the parameter: from the curvature of its cost at the answer (Gauss-Newton,
  the gaits' start states marginalised out, the residuals in their noise, widened by the cost
  per residual where that is above 1; :meth:`~pipeline.sysid.shooting.GaitShooting.parameter_covariance`).
  Otherwise it is the search's profile range (:func:`~pipeline.sysid.evolution.profiles_through`):
  the values that, the others held at the answer, score within ``sysid.search.profile_tolerance``
  of the profile's best. Either says how far the fitted data let the value move; neither covers
  what the engine cannot express of the twin, so the data's optimum is not the truth's
  (``docs/sysid.md`` measures how often the interval holds the twin's truth);
* the held-out sensitivity is how much the held-out gaits' mean key-frame error changes (mm) with
  the parameter 10 % below and above the answer, the others at the answer: what the value is worth
  for predicting gaits the search did not see;
* the verdict: ``determined`` where the interval is within 10 % of the value on either side,
  ``loosely determined`` within 30 %, ``not determined`` beyond (or where the search kept no
  profile); with ``held-out gaits hardly depend on it`` where 10 % either way changes their error
  by under 0.5 mm.

On the twin the report also gives the twin's true value and whether the interval holds it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import markdown

from pipeline.sysid.result import Identification

STANDARD_ERRORS = 2.0
"""The interval's half-width in standard errors, where there are standard errors."""
DETERMINED_HALF_WIDTH = 0.10
"""A parameter whose interval lies within this share of its value on either side is ``determined``."""
LOOSE_HALF_WIDTH = 0.30
"""... within this share, ``loosely determined``; beyond, ``not determined``."""
SENSITIVITY_STEP = 0.10
"""The relative change of a parameter for its held-out sensitivity."""
FLAT_MM = 0.5
"""A held-out error change under this (mm) at either step: the held-out gaits hardly depend on it."""


def intervals(result: Identification) -> dict[str, tuple[float, float]]:
    """Each identified parameter's interval (low, high; SI): ``STANDARD_ERRORS`` standard errors
    either side of the value where the result has them, else its profile range (none for a
    parameter with neither)."""
    out = dict(result.profile)
    for name, error in result.standard_error.items():
        value = result.values[name]
        out[name] = (value - STANDARD_ERRORS * error, value + STANDARD_ERRORS * error)
    return out


@dataclass(frozen=True)
class ParameterRow:
    """One identified parameter (SI units throughout; the error changes in mm)."""

    name: str
    start: float
    bounds: tuple[float, float]
    value: float
    interval: tuple[float, float] | None
    heldout_change_mm: tuple[float, float] | None
    truth: float | None = None

    @property
    def half_width(self) -> float | None:
        """The interval's larger reach from the value, relative to the value (None: no interval)."""
        if self.interval is None or self.value == 0:
            return None
        low, high = self.interval
        return max(self.value - low, high - self.value) / abs(self.value)

    @property
    def verdict(self) -> str:
        reach = self.half_width
        if reach is None or reach > LOOSE_HALF_WIDTH:
            verdict = "not determined"
        elif reach > DETERMINED_HALF_WIDTH:
            verdict = "loosely determined"
        else:
            verdict = "determined"
        change = self.heldout_change_mm
        if change is not None and max(abs(c) for c in change) < FLAT_MM:
            verdict += "; held-out gaits hardly depend on it"
        return verdict

    @property
    def truth_inside(self) -> bool | None:
        """Whether the interval holds the twin's true value (None: no truth or no interval)."""
        if self.truth is None or self.interval is None:
            return None
        return self.interval[0] <= self.truth <= self.interval[1]


def _number(value: float) -> str:
    return f"{value:.4g}"


def report_markdown(
    title: str,
    rows: list[ParameterRow],
    heldout_mm: tuple[float, float] | None,
    replay_plots: list[str],
) -> str:
    """The report as Markdown: ``title``, the parameter table, the held-out key-frame error
    (robot config's values, identified; mm) and the held-out replays' plots (paths relative to the
    report)."""
    truth = any(row.truth is not None for row in rows)
    header = ["parameter", "start", "bounds", "identified", "interval", "held-out error change at -10 % / +10 % (mm)"]
    header += ["verdict"] + (["twin's truth", "inside"] if truth else [])
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        interval = "-" if row.interval is None else f"{_number(row.interval[0])} to {_number(row.interval[1])}"
        change = "-" if row.heldout_change_mm is None else " / ".join(f"{c:+.2f}" for c in row.heldout_change_mm)
        cells = [
            row.name,
            _number(row.start),
            f"{_number(row.bounds[0])} to {_number(row.bounds[1])}",
            _number(row.value),
            interval,
            change,
            row.verdict,
        ]
        if truth:
            inside = row.truth_inside
            cells += ["-" if row.truth is None else _number(row.truth), "-" if inside is None else str(inside).lower()]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "The interval is the answer plus and minus two standard errors from the curvature of gait shooting's cost "
        "at the answer (the gaits' start states marginalised out), or, for a parameter only the search fitted, its "
        "profile range: how firmly the data pin the engine's best value. It measures the data's noise, not what "
        "the engine cannot express: on the twin it has not held the twin's values (`docs/sysid.md`, *Figures*). "
        "The held-out error change is that of the held-out gaits' mean key-frame error with the parameter 10 % "
        "below and above the answer.",
    ]
    if heldout_mm is not None:
        lines += ["", f"Held-out key-frame error: {heldout_mm[0]:.1f} mm with the robot config's values, "
                  f"{heldout_mm[1]:.1f} mm identified."]  # fmt: skip
    if replay_plots:
        lines += ["", "## Held-out replays", ""]
        lines += [f"![{plot}]({plot})" for plot in replay_plots]
    return "\n".join(lines) + "\n"


def report_html(text: str, title: str) -> str:
    """The Markdown report ``text`` as a standalone HTML page."""
    body = markdown.markdown(text, extensions=["tables"])
    style = "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
    style += "td,th{border:1px solid #bbb;padding:.3em .6em}img{max-width:48%}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{body}</body></html>\n"
    )
