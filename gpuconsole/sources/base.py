"""What every source looks like to the hub."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, ClassVar, ParamSpec, Protocol, TypeVar, runtime_checkable

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
class Blocking(Protocol):
    """A source that can also be read with no event loop: its start, poll and close are
    calls that block, the first two run on a thread of the source's and handed back as
    futures. A one-shot reading of such sources (Hub.read_once) then needs no loop, nor
    asyncio, whose import is a tenth of its start."""

    node: str
    timeout_s: float

    def start_blocking(self, emit: EmitEvent) -> Future[None]:
        """start(), begun on the source's thread."""

    def poll_blocking(self) -> Future[Reading]:
        """poll(), begun on the source's thread; its reading or its error in the future."""

    def close_blocking(self) -> None:
        """close(), waited for (bounded, as close() is)."""


@runtime_checkable
class Focusable(Protocol):
    """A source that reads an overview of its node (an agent's summary, Prometheus) until a
    viewer drills into the node; then `detail` asks it for everything."""

    node: str
    detail: bool


@runtime_checkable
class Viewable(Protocol):
    """A source that reads some of its node (Prometheus: its GPU gauges) every round only
    while a viewer sees the node; `in_view` says so (False while no viewer says)."""

    node: str
    in_view: bool


class SourceUnavailable(Exception):
    """The thing a source reads is absent (no driver, no socket): a clear, final message."""


P = ParamSpec("P")
T = TypeVar("T")


class DaemonThread(Executor):
    """One daemon thread that runs calls in turn, for a library that can block for ever: a
    BMC that stops answering in the middle of a login leaves pyghmi waiting on a lock that
    nothing releases. A ThreadPoolExecutor's threads are joined when the interpreter exits,
    so one such call would hold the process (a console's quit, a service's stop) for ever;
    a daemon thread is let go with it."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._calls.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller's to see, as an executor hands it
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:  # the calls not begun yet are let go
                while True:
                    try:
                        call = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if call is not None:
                        call[0].cancel()
            self._calls.put(None)  # after every call still queued
        if wait:
            self._thread.join()
