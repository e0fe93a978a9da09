"""The samples an `increase(metric[window])` term reads: each series' values over its window,
kept by the evaluator from one evaluation to the next (as Prometheus keeps scrapes), and
the increase reckoned from them as Prometheus reckons it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gpuconsole.alerts.condition import Labels, Sample, increase_key


def increase(points: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """A counter's growth over [start, end] from its (time, value) points in that range:
    Prometheus's extrapolatedRate (a drop is a reset, its value added back; the growth is
    stretched to the window's edges where the points come near them). None with fewer
    than two points."""
    kept = list(points)
    if len(kept) < 2:
        return None
    (first_t, first_v), (last_t, last_v) = kept[0], kept[-1]
    grown = last_v - first_v
    previous = 0.0
    for _t, value in kept:
        if value < previous:
            grown += previous
        previous = value
    to_start, to_end = first_t - start, end - last_t
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    average = sampled / (len(kept) - 1)
    if grown > 0 and first_v >= 0:
        # a counter does not run below zero: stretch back no further than to where it was 0
        to_start = min(to_start, sampled * (first_v / grown))
    threshold = average * 1.1
    stretched = sampled
    stretched += to_start if to_start < threshold else average / 2
    stretched += to_end if to_end < threshold else average / 2
    return grown * (stretched / sampled)


class Windows:
    """The points of every series an increase term reads, each kept for its window."""

    def __init__(self, ranges: Iterable[tuple[str, float]]) -> None:
        self.ranges = frozenset(ranges)  # (metric, window) of every increase term
        self.longest: dict[str, float] = {}  # metric -> its longest window
        for metric, range_s in self.ranges:
            self.longest[metric] = max(range_s, self.longest.get(metric, 0.0))
        self.points: dict[tuple[str, Labels], deque[tuple[float, float]]] = {}

    def observe(self, by_name: dict[str, list[Sample]], now: float) -> None:
        """Keep `now`'s samples of the metrics increases read, forget what fell out of
        their windows, and file each increase in `by_name` under its term's key."""
        for metric in self.longest:
            for sample in by_name.get(metric, ()):
                points = self.points.setdefault((metric, sample.labels), deque())
                if points and points[-1][0] >= now:
                    continue  # an evaluation at this instant kept it already
                points.append((now, sample.value))
        for key, points in list(self.points.items()):
            while points and points[0][0] < now - self.longest[key[0]]:
                points.popleft()
            if not points:
                del self.points[key]
        for metric, range_s in self.ranges:
            found = []
            for (name, labels), points in self.points.items():
                if name == metric:
                    inside = [p for p in points if p[0] >= now - range_s]
                    grown = increase(inside, now - range_s, now)
                    if grown is not None:
                        found.append(Sample(metric, labels, grown))
            by_name[increase_key(metric, range_s)] = found
