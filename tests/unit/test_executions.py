"""Execution counting: every run counted, a request id run twice caught, the journal written as it runs."""

from __future__ import annotations

from collections import Counter

from mcp_worker.executions import Executions


def test_counts_and_catches_a_request_run_twice(tmp_path) -> None:
    runs: Counter[str] = Counter()
    dups: list[str] = []
    ex = Executions(
        window=3,
        journal=str(tmp_path / "journal"),
        on_execution=lambda model, n: runs.update({model: n}),
        on_duplicate=dups.append,
    )
    ex.record("m", ["a", "b"])
    ex.record("m", ["b"])  # b again: a duplicate
    ex.record("n", ["c", "d", "e"])  # the window of 3 forgets a
    ex.record("m", ["a"])  # ... so this is not caught (the window is the bound on memory)
    assert runs == {"m": 4, "n": 3} and dups == ["m"] and (ex.total, ex.duplicates) == (7, 1)
    ex.close()
    lines = (tmp_path / "journal").read_text().splitlines()
    assert lines == ["m a", "m b", "m b", "n c", "n d", "n e", "m a"]


def test_without_a_journal_nothing_is_written(tmp_path) -> None:
    ex = Executions()
    ex.record("m", ["a"])
    assert ex.total == 1 and list(tmp_path.iterdir()) == []
