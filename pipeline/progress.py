"""What a long stage shows while it runs: progress rows on stderr, and one closing line per stage.

Rows (:func:`progress`) appear where stderr is a terminal, or everywhere with ``R2S2R_PROGRESS=1``
(the command line's ``--progress``); ``R2S2R_PROGRESS=0`` hides them. Rows opened at once (the gait
search's shards, concurrent redeploy runs, each in its task runner's thread) share one live
display, which ends, its rows left on the terminal, when the last of them closes. An update
costs 1.6 µs drawn and 0.14 µs hidden (rich redraws from its own thread, ten times a second);
the most a stage makes is one per camera frame, each some 15 ms of tracking: under 0.1 %. The
closing line (:func:`stage_line`) is printed always: it is a stage's summary in a log as much as
on a terminal.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

T = TypeVar("T")

PROGRESS_ENV = "R2S2R_PROGRESS"
"""``1``: progress rows on stderr even where it is not a terminal; ``0``: none even where it is."""


def progress_shown() -> bool:
    """Whether :func:`progress` rows are drawn (:data:`PROGRESS_ENV`, else whether stderr is a terminal)."""
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced:
        return forced not in ("0", "false", "no")
    return sys.stderr.isatty()


class _Count(ProgressColumn):
    """``completed/total unit`` (``completed unit`` where the total is not known)."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        done = f"{task.completed:g}"
        return Text(f"{done}/{task.total:g} {unit}" if task.total is not None else f"{done} {unit}")


class _Detail(ProgressColumn):
    """The row's ``detail`` template, formatted with its fields (``"loss {loss:.3g}"``)."""

    def render(self, task: Task) -> Text:
        template = task.fields.get("detail", "")
        try:
            return Text(template.format(**task.fields))
        except (KeyError, ValueError, TypeError):  # a field not given yet
            return Text("")


class ProgressRow:
    """One row of the live display; every method does nothing where rows are not shown."""

    def __init__(self, live: Progress | None, task: int | None) -> None:
        self._live = live
        self._task = task

    def advance(self, steps: float = 1.0, **fields: object) -> None:
        """``steps`` more done; ``fields`` update the detail's values."""
        if self._live is not None:
            self._live.update(self._task, advance=steps, **fields)

    def update(
        self,
        completed: float | None = None,
        total: float | None = None,
        description: str | None = None,
        **fields: object,
    ) -> None:
        """Set how much is done, the total, the description or the detail's values."""
        if self._live is not None:
            self._live.update(self._task, completed=completed, total=total, description=description, **fields)

    def over(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, one step advanced after each."""
        for item in items:
            yield item
            self.advance()


_lock = threading.Lock()
_live: Progress | None = None
_rows_open = 0


@contextmanager
def progress(
    description: str, total: float | None, unit: str, detail: str = "", **fields: object
) -> Iterator[ProgressRow]:
    """A progress row for the block: ``description``, a bar of ``total`` (None: not known) ``unit``,
    the ``detail`` template (:meth:`str.format` over ``fields``) and the time elapsed. Yields the
    row to advance; where rows are not shown (:func:`progress_shown`) it draws nothing."""
    global _live, _rows_open
    if not progress_shown():
        yield ProgressRow(None, None)
        return
    with _lock:
        if _live is None:
            _live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                _Count(),
                _Detail(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            _live.start()
        live = _live
        _rows_open += 1
        task = live.add_task(description, total=total, unit=unit, detail=detail, **fields)
    try:
        yield ProgressRow(live, task)
    finally:
        with _lock:
            live.stop_task(task)
            _rows_open -= 1
            if _rows_open == 0:
                live.stop()
                _live = None


def stage_line(stage: str, outcome: str, figure: str = "") -> str:
    """The closing line of a stage: its name, its ``outcome`` (``done in 12.3 s``, ``cached``,
    ``skipped: ...``) and its key ``figure``; printed on stderr, and returned."""
    line = f"{stage}: {outcome}" + (f"; {figure}" if figure else "")
    Console(stderr=True, highlight=False, soft_wrap=True).print(line, markup=False)
    return line
