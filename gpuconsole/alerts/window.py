"""The samples an `increase(metric[window])` term reads: each series' values over its window,
kept by the evaluator from one evaluation to the next (as Prometheus keeps scrapes), and
the increase reckoned from them as Prometheus reckons it."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from gpuconsole.alerts.condition import Labels, Sample, increase_key


def increase(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """A counter's growth over [start, end] from its (time, value) points in that range:
    Prometheus's extrapolatedRate (a drop is a reset, its value added back; the growth is
    stretched to the window's edges where the points come near them). None with fewer
    than two points."""
    if len(points) < 2:
        return None
    grown = points[-1][1] - points[0][1]
    previous = 0.0
    for _t, value in points:
        if value < previous:
            grown += previous
        previous = value
    return _stretched(points[0], points[-1], len(points), grown, start, end)


def _stretched(
    first: tuple[float, float],
    last: tuple[float, float],
    count: int,
    grown: float,
    start: float,
    end: float,
) -> float | None:
    (first_t, first_v), (last_t, _last_v) = first, last
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    to_start, to_end = first_t - start, end - last_t
    average = sampled / (count - 1)
    if grown > 0 and first_v >= 0:
        # a counter does not run below zero: stretch back no further than to where it was 0
        to_start = min(to_start, sampled * (first_v / grown))
    threshold = average * 1.1
    stretched = sampled
    stretched += to_start if to_start < threshold else average / 2
    stretched += to_end if to_end < threshold else average / 2
    return grown * (stretched / sampled)


class _Series:
    """One series' points (times and values in two arrays: 16 bytes a point)."""

    __slots__ = ("flat", "reset_at", "times", "values")

    def __init__(self) -> None:
        self.times = array("d")
        self.values = array("d")
        self.reset_at = -math.inf  # the last time the value fell (a counter reset)
        self.flat: Sample | None = None  # its increase of 0, made once: most are 0

    def increase(self, start: float, end: float) -> float | None:
        times, values = self.times, self.values
        first = bisect_left(times, start)
        count = len(times) - first
        if count < 2:
            return None
        if self.reset_at < start:  # no reset in the window: no point needs a look
            grown = values[-1] - values[first]
            return _stretched((times[first], values[first]), (times[-1], values[-1]), count, grown, start, end)  # fmt: skip
        return increase(list(zip(times[first:], values[first:], strict=True)), start, end)


class Windows:
    """The points of every series an increase term reads, each kept for its window."""

    def __init__(self, ranges: Iterable[tuple[str, float]]) -> None:
        self.ranges = frozenset(ranges)  # (metric, window) of every increase term
        self.longest: dict[str, float] = {}  # metric -> its longest window
        for metric, range_s in self.ranges:
            self.longest[metric] = max(range_s, self.longest.get(metric, 0.0))
        self.series: dict[str, dict[Labels, _Series]] = {m: {} for m in self.longest}

    def points(self, metric: str, labels: Labels) -> list[tuple[float, float]]:
        """The points kept of one series, oldest first."""
        found = self.series[metric].get(labels)
        return [] if found is None else list(zip(found.times, found.values, strict=True))

    def observe(self, by_name: dict[str, list[Sample]], now: float) -> None:
        """Keep `now`'s samples of the metrics increases read, forget what fell out of
        their windows, and file each increase in `by_name` under its term's key.

        Runs once per series per evaluation (a large fleet has hundreds of thousands of
        NVLink counters): _Series.add and forget_before written out, not called."""
        for metric, longest in self.longest.items():
            kept = self.series[metric]
            for sample in by_name.get(metric, ()):
                series = kept.get(sample.labels)
                if series is None:
                    series = kept[sample.labels] = _Series()
                    times = series.times
                else:
                    times = series.times
                    if times and times[-1] >= now:
                        continue  # an evaluation at this instant kept it already
                values, value = series.values, sample.value
                if values and value < values[-1]:
                    series.reset_at = now
                times.append(now)
                values.append(value)
            start = now - longest
            gone = []
            for labels, series in kept.items():
                times = series.times
                if times[0] < start:
                    cut = bisect_left(times, start)
                    del times[:cut]
                    del series.values[:cut]
                    if not times:
                        gone.append(labels)
            for labels in gone:
                del kept[labels]
        for metric, range_s in self.ranges:
            found = []
            start = now - range_s
            for labels, series in self.series[metric].items():
                times = series.times
                if len(times) < 2:
                    continue
                if series.reset_at < start and times[0] >= start:
                    # the common case, written out: every point in the window, no reset
                    values = series.values
                    if values[-1] - values[0] == 0.0:  # flat: grown 0, however stretched
                        flat = series.flat
                        if flat is None:
                            flat = series.flat = Sample(metric, labels, 0.0)
                        found.append(flat)
                        continue
                grown = series.increase(start, now)
                if grown is not None:
                    found.append(Sample(metric, labels, grown))
            by_name[increase_key(metric, range_s)] = found
