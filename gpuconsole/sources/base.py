"""What every source looks like to the hub."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import ClassVar, Protocol, runtime_checkable

from gpuconsole.readings.base import Event, Key, RawCounter

EmitEvent = Callable[[Event], None]


class Reading(Protocol):
    """A partial reading: raw counters for rates, gauges for history."""

    def counters(self) -> Iterator[RawCounter]: ...

    def series(self) -> Iterator[tuple[Key, float]]: ...


@runtime_checkable
class Source(Protocol):
    """One kind of truth about one node, polled by the hub on its own interval.

    `kind` names the NodeSnapshot field the reading lands in ("nvml", ...).
    `poll` may block in a worker thread but must not block the event loop.
    """

    kind: ClassVar[str]
    node: str
    interval_s: float
    timeout_s: float

    async def start(self, emit: EmitEvent) -> None:
        """Open what the source needs; `emit` posts events (from any thread via the hub)."""

    async def poll(self) -> Reading:
        """One reading, or raise an exception whose message says what went wrong."""

    async def close(self) -> None:
        """Release what `start` opened. Called once, even after errors."""


@runtime_checkable
class Focusable(Protocol):
    """A source that reads an overview of its node (an agent's summary, Prometheus) until a
    viewer drills into the node; then `detail` asks it for everything."""

    node: str
    detail: bool


class SourceUnavailable(Exception):
    """The thing a source reads is absent (no driver, no socket): a clear, final message."""
