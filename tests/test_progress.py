"""Progress rows and closing lines on stderr (:mod:`pipeline.progress`)."""

from __future__ import annotations

import io
import sys
import threading

import pytest

from pipeline.progress import PROGRESS_ENV, progress, progress_shown, stage_line


class _Stream(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize(
    ("value", "terminal", "shown"),
    [("1", False, True), ("0", True, False), ("", True, True), ("", False, False)],
)
def test_rows_are_shown_where_asked_or_on_a_terminal(monkeypatch, value: str, terminal: bool, shown: bool) -> None:
    """``R2S2R_PROGRESS`` decides; unset, whether stderr is a terminal does."""
    monkeypatch.setenv(PROGRESS_ENV, value)
    monkeypatch.setattr(sys, "stderr", _Stream(terminal))
    assert progress_shown() is shown


def test_a_row_shows_its_count_and_detail(monkeypatch, capsys) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "1")
    with progress("track run-a", 4, "frames", "loss {loss:.2f}", loss=float("nan")) as row:
        for _ in row.over(range(3)):
            pass
        row.advance(loss=0.25)
    err = capsys.readouterr().err
    assert "track run-a" in err and "4/4 frames" in err and "loss 0.25" in err


def test_hidden_rows_print_nothing_and_still_iterate(monkeypatch, capsys) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "0")
    with progress("gait search", 2, "levels") as row:
        seen = list(row.over("abc"))
        row.advance(nodes=3)
    assert seen == ["a", "b", "c"]
    assert capsys.readouterr().err == ""


def test_rows_opened_at_once_share_one_display(monkeypatch, capsys) -> None:
    """Shards and concurrent runs open rows from several threads: one live display holds them all
    (rich allows one at a time), and each row ends with its own count."""
    monkeypatch.setenv(PROGRESS_ENV, "1")
    started = threading.Barrier(3)
    failures: list[BaseException] = []

    def shard(k: int) -> None:
        try:
            with progress(f"gait search {k + 1}/3", 5, "levels") as row:
                started.wait(timeout=10)
                for _ in range(5):
                    row.advance()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=shard, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    err = capsys.readouterr().err
    assert all(f"gait search {k}/3" in err for k in (1, 2, 3)) and err.count("5/5 levels") >= 3


def test_a_closing_line_names_the_stage_its_outcome_and_figure(capsys) -> None:
    line = stage_line("sysid", "done in 12.3 s", "held-out key-frame error 4.2 mm")
    assert line == "sysid: done in 12.3 s; held-out key-frame error 4.2 mm"
    assert capsys.readouterr().err.strip() == line
