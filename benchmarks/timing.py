"""The one way benchmarks time things (CPU time per call, in microseconds), and the one way
they hand their headline figures to the summary `python -m benchmarks` prints at the end."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def cpu_us(fn: Callable[[], Any], rounds: int) -> list[float]:
    """CPU time of each of `rounds` calls of `fn`, in microseconds."""
    samples = []
    for _ in range(rounds):
        began = time.process_time_ns()
        fn()
        samples.append((time.process_time_ns() - began) / 1000.0)
    return samples


@dataclass(frozen=True)
class Figure:
    """One headline figure of a benchmark, for the summary `python -m benchmarks` ends with."""

    what: str  # "demo: first frame with data"
    value: float
    unit: str  # "s", "ms", "cores", "MB", "KiB"
    at_most: float | None = None  # the target, where there is one (lower is better)
    peer: str = ""  # what it was measured beside in the same run ("nvitop -1")
    peer_value: float | None = None
    ratio_at_most: float | None = None  # the target as ours over the peer's

    @property
    def ratio(self) -> float | None:
        """Ours over the peer's, measured in one run."""
        if self.peer_value is None or not self.peer_value:
            return None
        return self.value / self.peer_value

    @property
    def met(self) -> bool | None:
        checks = []
        if self.at_most is not None:
            checks.append(self.value <= self.at_most)
        if self.ratio_at_most is not None and self.ratio is not None:
            checks.append(self.ratio <= self.ratio_at_most)
        return all(checks) if checks else None


FIGURES: list[Figure] = []


def record(
    what: str,
    value: float,
    unit: str,
    *,
    at_most: float | None = None,
    peer: str = "",
    peer_value: float | None = None,
    ratio_at_most: float | None = None,
) -> Figure:
    """Keep a headline figure (a median) for the summary table; returns it."""
    figure = Figure(what, value, unit, at_most, peer, peer_value, ratio_at_most)
    FIGURES.append(figure)
    return figure


def _number(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _target(f: Figure) -> str:
    said = [] if f.at_most is None else [f"≤ {_number(f.at_most)}"]
    if f.ratio_at_most is not None:
        said.append(f"≤ {f.ratio_at_most:g}x {f.peer or 'peer'}")
    return ", ".join(said)


def summary(figures: list[Figure] | None = None) -> str:
    """The headline figures as a table: value, target and whether it is met, peer and ratio."""
    rows = [("figure", "value", "unit", "target", "met", "peer", "peer's", "ours/peer's")]
    for f in FIGURES if figures is None else figures:
        rows.append(
            (
                f.what,
                _number(f.value),
                f.unit,
                _target(f),
                "" if f.met is None else ("met" if f.met else "MISSED"),
                f.peer,
                "" if f.peer_value is None else _number(f.peer_value),
                "" if f.ratio is None else f"{f.ratio:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 6, 7}
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
