"""The comparison report judges each figure by the issue's targets: the one-shot's wall and CPU at
most nvitop -1's, and at most 30 NVML calls per GPU whatever the anchor makes."""

from __future__ import annotations

from benchmarks.compare.measure import OneShot
from benchmarks.compare.report import OURS_ONE_SHOT, Row, one_shot_rows, verdicts


def judged(ours: OneShot, nvitop: OneShot) -> dict[str, Row]:
    return {r.measure: r for r in one_shot_rows({OURS_ONE_SHOT: ours, "nvitop -1": nvitop})}


def test_a_one_shot_slower_or_costlier_than_nvitop_is_not_met() -> None:
    nvitop = OneShot("nvitop -1", 7, wall_s=0.089, cpu_s=0.089, calls_per_gpu=25.6)
    slow = judged(OneShot(OURS_ONE_SHOT, 7, 0.091, 0.092, 31.0), nvitop)
    assert [slow[m].met for m in ("wall, ms", "CPU, ms", "NVML calls per GPU")] == [False] * 3
    lines = verdicts(list(slow.values()))
    assert (
        "- one-shot reading, CPU, ms: gpuconsole / nvitop -1 = 1.03 (target ≤ 1.00): NOT met"
        in (lines)
    )
    assert (
        "- one-shot reading, NVML calls per GPU: gpuconsole 31.0 (target ours ≤ 30): NOT met"
        in (lines)
    )


def test_a_one_shot_at_nvitop_cost_with_more_calls_than_nvitop_but_under_30_is_met() -> None:
    nvitop = OneShot("nvitop -1", 7, wall_s=0.089, cpu_s=0.089, calls_per_gpu=25.6)
    fast = judged(OneShot(OURS_ONE_SHOT, 7, 0.080, 0.085, 28.75), nvitop)
    assert all(fast[m].met for m in ("wall, ms", "CPU, ms", "NVML calls per GPU"))
    assert fast["NVML calls per GPU"].cells()[-1] == "ours ≤ 30: met"
