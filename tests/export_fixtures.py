"""What the exporter tests share: the demo fleet polled twice on a frozen clock, rendered
and parsed back into samples with prometheus_client's own parser."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpuconsole.export.collector import MetricsCache
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub

FIXED = 1_796_000_000.0


class Clock:
    """Stands still, except when a test moves it between two polls."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += 1.0


def frozen_demo_hub() -> tuple[Hub, Clock]:
    """The demo cluster (BMC, fabric and tenancy on) on a clock that ends at FIXED."""
    clock = Clock(FIXED - 1.0)
    return demo_hub(clock=clock, start=FIXED - 120, events=False), clock


async def poll_twice(hub: Hub, clock: Clock) -> FleetSnapshot:
    """Two polls one second apart: rates and GPM need two samples."""
    return await hub.poll_once(rounds=2, between=clock.step)


@functools.cache
def frozen_twice_hub() -> Hub:
    """The demo hub after two polls, never started: what an agent over it serves stays put
    (built once per session; only read after)."""
    hub, clock = frozen_demo_hub()
    # a thread of its own, so that async tests (already inside a loop) can call it too
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, poll_twice(hub, clock)).result()
    return hub


def frozen_fleet() -> FleetSnapshot:
    """The demo fleet polled twice (snapshots are immutable)."""
    snapshot = frozen_twice_hub().latest
    assert snapshot is not None
    return snapshot


def render(snapshot: FleetSnapshot) -> str:
    return MetricsCache(lambda: snapshot).render().decode()


@functools.cache
def frozen_body() -> str:
    return render(frozen_fleet())


def parse(body: str) -> dict[str, list[Sample]]:
    """Samples by sample name (counters keep their _total)."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def pick(samples: list[Sample], **labels: str) -> list[Sample]:
    """The samples whose labels include all of `labels`."""
    return [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]


def one(samples: list[Sample], **labels: str) -> Sample:
    found = pick(samples, **labels)
    assert len(found) == 1, (labels, found)
    return found[0]


def label_names(samples: list[Sample]) -> set[frozenset[str]]:
    return {frozenset(s.labels) for s in samples}


class HeldHub(Hub):
    """A hub that holds the snapshot a test gives it (`held`, which a test may replace), so
    an agent over it serves just that."""

    def __init__(self, snapshot: FleetSnapshot) -> None:
        super().__init__()
        self.held = snapshot

    @property
    def latest(self) -> FleetSnapshot | None:
        return self.held
