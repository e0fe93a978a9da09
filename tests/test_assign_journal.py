"""The action journal opened by several processes at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from gpuconsole.actions.journal import Journal

PROCESSES = 4
ROUNDS = 30


def _open(path: Path, start: Any, results: Any) -> None:
    start.wait()
    try:
        Journal(path).close()
        results.put("ok")
    except Exception as exc:
        results.put(repr(exc))


def test_processes_opening_a_new_journal_at_once_all_get_it(tmp_path: Path) -> None:
    # The first open switches a new file to WAL; SQLite refuses a concurrent switch at once,
    # without waiting, so each opener must retry (about 3% of opens failed before it did).
    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for round_ in range(ROUNDS):
        path = tmp_path / str(round_) / "actions.db"
        start, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open, args=(path, start, results)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        start.set()
        answers = [results.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(10)
        failures += [a for a in answers if a != "ok"]
    assert failures == []
    assert Journal(tmp_path / "0" / "actions.db").plans() == []
