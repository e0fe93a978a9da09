"""Tenancy readings: who owns each GPU and MIG instance. Frozen dataclasses."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuconsole.readings.base import CounterSample, Key


@dataclass(frozen=True, slots=True)
class TenancyReading:
    """The tenancy source's partial reading of one node."""

    at: float
    simulated: bool = False

    def counters(self) -> Iterator[CounterSample]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        return iter(())
