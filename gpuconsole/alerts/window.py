"""The samples an `increase(metric[window])` term reads: each series' values over its window,
kept by the evaluator from one evaluation to the next (as Prometheus keeps scrapes), and
the increase reckoned from them as Prometheus reckons it."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
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
    """One series' points, as runs: evaluations (their places in the Windows' timeline) at
    which it was read at one value, one after the other. A counter that does not move is
    one run however long its window (a large fleet's NVLink counters, most of them), where
    a point each was 16 bytes an evaluation, and a point appended and one cut each time."""

    __slots__ = ("end", "flat", "older", "start", "value")

    def __init__(self, at: int, value: float) -> None:
        self.start = self.end = at  # its last run: evaluations start..end
        self.value = value  # of the last run, as the sample held it (an int stays one)
        self.older: list[tuple[int, int, float]] = []  # earlier runs, oldest first
        self.flat: Sample | None = None  # its increase of 0, made once: most are 0

    def runs(self, first: int) -> list[tuple[int, int, float]]:
        """Its runs from evaluation `first` on, cut to begin there."""
        found = [(max(s, first), e, v) for s, e, v in self.older if e >= first]
        if self.end >= first:
            found.append((max(self.start, first), self.end, self.value))
        return found


class Windows:
    """The points of every series an increase term reads, each kept for its window: the
    times of the evaluations once (every series read at one is read at its time), and
    each series' values as runs of them."""

    def __init__(self, ranges: Iterable[tuple[str, float]]) -> None:
        self.ranges = frozenset(ranges)  # (metric, window) of every increase term
        self.longest: dict[str, float] = {}  # metric -> its longest window
        self.windows: dict[str, list[float]] = {}  # metric -> its windows, longest first
        for metric, range_s in sorted(self.ranges, key=lambda r: -r[1]):
            self.longest[metric] = max(range_s, self.longest.get(metric, 0.0))
            self.windows.setdefault(metric, []).append(range_s)
        self.series: dict[str, dict[Labels, _Series]] = {m: {} for m in self.longest}
        self.times: list[float] = []  # of the evaluations kept, oldest first
        self.first = 0  # the place of times[0] among every evaluation kept since the start

    def points(self, metric: str, labels: Labels) -> list[tuple[float, float]]:
        """The points kept of one series, oldest first."""
        found = self.series[metric].get(labels)
        if found is None:
            return []
        times, first = self.times, self.first
        return [
            (times[at - first], float(value))
            for start, end, value in found.runs(first)
            for at in range(start, end + 1)
        ]

    def observe(self, by_name: dict[str, list[Sample]], now: float) -> None:
        """Keep `now`'s samples of the metrics increases read, forget what fell out of
        their windows, and file each increase in `by_name` under its term's key (an
        evaluation before the last one kept, the clock stepped back, adds no points and
        reckons from those up to `now`).

        Runs once per series per evaluation (a large fleet has hundreds of thousands of
        NVLink counters): written out, not called."""
        times = self.times
        if times and now < times[-1]:
            self._reckon_back(by_name, now)
            return
        if not times or now > times[-1]:
            times.append(now)
        at = self.first + len(times) - 1  # the place of this evaluation
        if now >= times[-1]:
            for metric in self.longest:
                self._keep(self.series[metric], by_name.get(metric, ()), at)
        for metric, windows in self.windows.items():
            self._reckon(metric, windows, by_name, now)
        # the times no window reaches back to any longer
        cut = bisect_left(times, now - max(self.longest.values(), default=0.0))
        if cut:
            del times[:cut]
            self.first += cut

    def _reckon_back(self, by_name: dict[str, list[Sample]], now: float) -> None:
        """Each increase after the clock stepped back to `now`, before the last evaluation
        kept: from the points in [now - window, now] only, as Prometheus selects them (those
        kept at later times are not in it), and none kept."""
        times, first = self.times, self.first
        last = bisect_right(times, now) - 1 + first  # the last evaluation at `now` or before
        for metric, windows in self.windows.items():
            kept = self.series[metric]
            for window in windows:
                begin = bisect_left(times, now - window) + first
                into = by_name[increase_key(metric, window)] = []
                for labels, series in kept.items():
                    runs = [(s, min(e, last), v) for s, e, v in series.runs(begin) if s <= last]
                    grown = _grown(runs, times, first, now - window, now)
                    if grown is not None:
                        into.append(Sample(metric, labels, grown))

    @staticmethod
    def _keep(kept: dict[Labels, _Series], samples: Iterable[Sample], at: int) -> None:
        copysign = math.copysign
        for sample in samples:
            series = kept.get(sample.labels)
            value = sample.value
            if series is None:
                kept[sample.labels] = _Series(at, value)
                continue
            end = series.end
            if end >= at:
                continue  # an evaluation at this instant kept it already
            last = series.value
            if end == at - 1 and (
                value is last
                or (value == last and (value != 0 or copysign(1.0, value) == copysign(1.0, last)))
            ):  # read at the last evaluation, at the value it had (of its sign, 0 too)
                series.end = at
                continue
            series.older.append((series.start, end, last))
            series.start = series.end = at
            series.value = value

    def _reckon(
        self, metric: str, windows: list[float], by_name: dict[str, list[Sample]], now: float
    ) -> None:
        """Each series' increase over each of `windows` (longest first), filed in
        `by_name`; a series with no point left in the longest is forgotten, and runs
        that ended before it are."""
        times, first = self.times, self.first
        kept = self.series[metric]
        begin = bisect_left(times, now - windows[0]) + first
        found: list[Sample] = []
        gone = []
        for labels, series in kept.items():
            end = series.end
            if end < begin:
                gone.append(labels)
                continue
            older = series.older
            if older and older[0][1] < begin:
                older[:] = [run for run in older if run[1] >= begin]
            if end - begin < 1:
                continue  # one point in the window at most: no increase
            if not older:
                # one run in the window: the common case, written out
                start = series.start
                if end - (start if start > begin else begin) < 1:
                    continue
                value = series.value
                if value - value == 0.0:  # flat: grown 0, however stretched
                    flat = series.flat
                    if flat is None:
                        flat = series.flat = Sample(metric, labels, 0.0)
                    found.append(flat)
                    continue
            grown = _grown(series.runs(begin), times, first, now - windows[0], now)
            if grown is not None:
                found.append(Sample(metric, labels, grown))
        for labels in gone:
            del kept[labels]
        by_name[increase_key(metric, windows[0])] = found
        for window in windows[1:]:  # shorter ones (rules seldom differ): from the runs
            begin = bisect_left(times, now - window) + first
            into = by_name[increase_key(metric, window)] = []
            for labels, series in kept.items():
                grown = _grown(series.runs(begin), times, first, now - window, now)
                if grown is not None:
                    into.append(Sample(metric, labels, grown))


def _grown(
    runs: list[tuple[int, int, float]], times: list[float], first: int, start: float, end: float
) -> float | None:
    """increase() of the points these runs make, reckoned run by run: a run's points
    after its first add nothing (the same value, no reset)."""
    count = sum(e - s + 1 for s, e, _v in runs)
    if count < 2:
        return None
    first_v, last_v = float(runs[0][2]), float(runs[-1][2])
    grown = last_v - first_v
    previous = 0.0
    for _s, _e, value in runs:
        point = float(value)
        if point < previous:
            grown += previous
        previous = point
    first_point = (times[runs[0][0] - first], first_v)
    last_point = (times[runs[-1][1] - first], last_v)
    return _stretched(first_point, last_point, count, grown, start, end)
