"""The BMC source: one long-lived session per BMC, on a thread of its own.

pyghmi blocks, and a dead BMC blocks for seconds. Each source therefore owns one worker
thread (never the shared default executor, which NVML's polls use), so a stuck BMC only
ever holds up itself; a `BmcPool` bounds how many BMCs are polled at once. A poll's
timeout counts the BMC's own I/O, from the moment it holds a slot, never the wait for
one; at the timeout the slot is given back even if pyghmi is still blocked. BMCs that
answered their last poll take slots apart from the rest, so however many BMCs are dead,
the live ones never queue behind them. The hub gives each source its interval and backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from gpuconsole import format as fmt
from gpuconsole.config import DEFAULT_BMC
from gpuconsole.readings.base import Event, PartStatus, Severity, safe_strings
from gpuconsole.readings.bmc import BmcReading, PowerState
from gpuconsole.sources.base import DaemonThread, EmitEvent
from gpuconsole.sources.bmc.link import BmcError, BmcLink, PowerAction
from gpuconsole.sources.bmc.sel import SelCursor
from gpuconsole.sources.bmc.sensors import summarise

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"ipmi": 623, "redfish": 443}
# A BMC clock this far off the reader's is wrong (NTP keeps one within a second), and said
# so in an event: its event log's times were corrected, and anything else it stamps is off.
CLOCK_SKEW_SHOWN_S = 60.0
T = TypeVar("T")


@dataclass(frozen=True)
class BmcTarget:
    """Where a BMC is and how to log in; the password never shows in a repr."""

    node: str
    host: str
    protocol: str = "ipmi"
    port: int = 0
    username: str = ""
    password: str = field(default="", repr=False)
    verify_tls: bool = True
    ca_file: str = ""
    timeout_s: float = DEFAULT_BMC.timeout_s
    system: str = ""  # Redfish: the ComputerSystem power acts on, where there are several

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS.get(self.protocol, 623)

    @property
    def label(self) -> str:
        return f"{self.protocol}://{self.host}:{self.effective_port}"


def open_link(target: BmcTarget) -> BmcLink:
    """The link for a configured BMC (nothing is sent until its first read)."""
    user, password = target.username.encode(), target.password.encode()
    host, port = target.host, target.effective_port
    if target.protocol == "ipmi":
        from gpuconsole.sources.bmc.ipmi import IpmiLink, PyghmiSession

        return IpmiLink(target.label, lambda: PyghmiSession(host, port, user, password))
    if target.protocol == "redfish":
        from gpuconsole.sources.bmc.redfish import PyghmiRedfish, RedfishLink, verify_callback

        if not target.verify_tls:
            log.warning("%s: TLS certificate verification is off", target.label)
        verify = verify_callback(target.verify_tls, target.ca_file, host)
        timeout, system = target.timeout_s, target.system
        return RedfishLink(
            target.label,
            lambda: PyghmiRedfish(host, port, user, password, verify, timeout),
            system=system,
            timeout_s=timeout,
        )
    raise BmcError(f"{target.label}: unknown protocol {target.protocol!r}")


class BmcPool:
    """Bounds on how many BMCs are polled at once, shared by the sources of one hub.

    `limit` slots serve the BMCs that answered their last poll; the others (not polled
    yet, or failed last time: down, slow, refusing the password) share `silent_limit`
    slots of their own (`limit` unless given). A dead BMC holds a slot for its timeout at
    most, and only ever one of the silent ones.
    """

    def __init__(self, limit: int = 32, silent_limit: int | None = None) -> None:
        self.limit = max(1, limit)
        self.silent_limit = max(1, self.limit if silent_limit is None else silent_limit)
        self._slots: tuple[asyncio.Semaphore, asyncio.Semaphore] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def semaphore(self, *, answering: bool) -> asyncio.Semaphore:
        """The slots for a BMC that answered its last poll, or for one that did not."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop = loop
            self._slots = (asyncio.Semaphore(self.limit), asyncio.Semaphore(self.silent_limit))
        return self._slots[0 if answering else 1]


class BmcSource:
    """Reads one node's BMC: sensors, totals, power state and new SEL records."""

    kind: ClassVar[str] = "bmc"

    def __init__(
        self,
        node: str,
        link: BmcLink,
        *,
        interval_s: float = DEFAULT_BMC.interval_s,
        timeout_s: float = DEFAULT_BMC.timeout_s,
        queue_timeout_s: float | None = None,
        pool: BmcPool | None = None,
        sel_cursor: SelCursor | None = None,
        sel: bool = True,
        sel_recent: int = 20,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`timeout_s` bounds the BMC's own I/O in a poll, `queue_timeout_s` (default: the
        same) how long the poll waits for a slot before it reports that it is queued."""
        self.node = node
        self.link = link
        self.interval_s = interval_s
        self.io_timeout_s = timeout_s
        self.queue_timeout_s = timeout_s if queue_timeout_s is None else queue_timeout_s
        # What the hub allows a whole poll: only a backstop, since poll() ends itself
        # after the queue and I/O timeouts with an error that says which one ran out.
        self.timeout_s = self.queue_timeout_s + self.io_timeout_s + 1.0
        self.simulated = simulated
        self._pool = pool or BmcPool()
        self._cursor = sel_cursor or SelCursor()
        self._sel = sel
        self._sel_recent = sel_recent
        self._clock = clock
        self._emit: EmitEvent | None = None
        self._executor: DaemonThread | None = None
        self._power: PowerState | None = None
        self._failing: dict[str, str] = {}  # part -> why, as of the last reading
        self._skewed = False  # the BMC's clock was off by CLOCK_SKEW_SHOWN_S or more
        self._attempt: asyncio.Task[BmcReading] | None = None  # queue for a slot, then read
        self._claimed = True  # a poll has returned the attempt's outcome
        self._busy: asyncio.Future[Any] | None = None  # the last call on the worker thread
        self._reading: asyncio.Future[BmcReading] | None = None  # the last read among them
        self._answering = False  # the last poll got an answer: take the answering slots

    @property
    def label(self) -> str:
        return self.link.label

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        self._worker()

    def _worker(self) -> DaemonThread:
        if self._executor is None:
            self._executor = DaemonThread(f"bmc-{self.node}")
        return self._executor

    async def poll(self) -> BmcReading:
        attempt = self._attempt
        if attempt is None or (attempt.done() and not self._unclaimed(attempt)):
            attempt = self._attempt = asyncio.ensure_future(self._read())
            attempt.add_done_callback(_retrieve)
            self._claimed = False
        # A poll that gives up waiting leaves its attempt queued: the next poll takes it
        # over (or the reading it brought meanwhile), so a BMC never loses its place.
        done, _ = await asyncio.wait({attempt}, timeout=self.queue_timeout_s + self.io_timeout_s)
        if not done:  # the I/O ends itself within io_timeout_s: so it is still queued
            raise BmcError(
                f"{self.label}: no free polling slot within {self.queue_timeout_s:g} s "
                f"({self._pool.limit} for BMCs that answer, {self._pool.silent_limit} for "
                "the rest, all busy)"
            )
        self._claimed = True
        return attempt.result()

    def _unclaimed(self, attempt: asyncio.Task[BmcReading]) -> bool:
        """A reading no poll has returned yet (an old error is not kept: it is tried anew)."""
        return not self._claimed and not attempt.cancelled() and attempt.exception() is None

    async def _read(self) -> BmcReading:
        try:
            reading = await self._read_in_slot()
        except Exception:
            self._answering = False
            raise
        self._answering = True
        return reading

    async def _read_in_slot(self) -> BmcReading:
        stuck = self._stuck()
        if stuck is not None:
            # The last call is still blocked in pyghmi, past its timeout. Wait for it, with
            # no slot, instead of queueing another call behind it on this BMC's one thread;
            # a read brings this poll's reading, a power request only has to end first.
            if stuck is self._reading:
                return await self._outcome(self._reading)
            done, _ = await asyncio.wait({stuck}, timeout=self.io_timeout_s)
            if not done:
                raise BmcError(f"{self.label}: no answer within {self.io_timeout_s:g} s")
        async with self._pool.semaphore(answering=self._answering):
            # The timeout starts here: the BMC's own I/O, not the queue. At the timeout
            # the slot is given back, though the call may still be blocked.
            self._reading = self._submit(self.collect)
            return await self._outcome(self._reading)

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `fn` on this BMC's thread; its error is kept even if nobody waits any more."""
        future = asyncio.get_running_loop().run_in_executor(self._worker(), fn, *args)
        future.add_done_callback(_retrieve)
        self._busy = future
        return future

    def _stuck(self) -> asyncio.Future[Any] | None:
        busy = self._busy
        return busy if busy is not None and not busy.done() else None

    async def _outcome(self, future: asyncio.Future[T]) -> T:
        """The result of a call on the BMC's thread, or BmcError after `io_timeout_s`."""
        done, _ = await asyncio.wait({future}, timeout=self.io_timeout_s)
        if not done:
            raise BmcError(f"{self.label}: no answer within {self.io_timeout_s:g} s")
        return future.result()

    async def set_power(self, action: PowerAction) -> str:
        """Ask the BMC for a power change (not waiting for it), between two polls."""
        stuck = self._stuck()
        if stuck is not None:
            await asyncio.wait({stuck}, timeout=self.io_timeout_s)
            if not stuck.done():
                # Never queue it behind a stuck call: it would reach the BMC at some later,
                # unknown moment, after the caller was told it failed.
                raise BmcError(
                    f"{self.label}: BMC not answering; power {action.value} was not sent"
                )
        future = self._submit(self.link.set_power, action)
        done, _ = await asyncio.wait({future}, timeout=self.io_timeout_s)
        if not done:
            raise BmcError(
                f"{self.label}: no answer within {self.io_timeout_s:g} s to power "
                f"{action.value}; the BMC may still carry it out"
            )
        return future.result()

    async def close(self) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None and not attempt.done():
            attempt.cancel()  # gives back its slot, or its place in the queue
        executor, self._executor = self._executor, None
        if executor is None:
            self.link.close()
            return
        # The close queues behind a poll that may still be stuck on a silent BMC: wait for
        # both, but no longer than a poll may take, so no thread outlives the source.
        future = asyncio.get_running_loop().run_in_executor(executor, self.link.close)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.io_timeout_s + 5.0)
        except (TimeoutError, Exception) as exc:
            log.warning("%s: close did not finish: %s", self.label, exc or "timeout")
        executor.shutdown(wait=False)

    def collect(self) -> BmcReading:
        """One blocking round: read the BMC, announce new SEL records, add up the totals."""
        raw = safe_strings(self.link.read(sel=self._sel))  # the BMC's text, safe to show
        now = self._clock()
        if self._sel:
            for entry in self._cursor.new_entries(raw.sel):
                self._post(
                    Event(
                        entry.at or now,
                        self.node,
                        self.kind,
                        "sel",
                        entry.severity,
                        f"SEL: {entry.message}",
                        code=entry.record_id,
                    )
                )
        if raw.power_state is not PowerState.UNKNOWN:  # not read: a part error says why
            if self._power is not None and raw.power_state is not self._power:
                severity = Severity.WARNING if raw.power_state is PowerState.OFF else Severity.INFO
                message = f"power {raw.power_state}"
                self._post(Event(now, self.node, self.kind, "power", severity, message))
            self._power = raw.power_state
        self._announce_parts(raw.parts, now)
        self._announce_skew(raw.clock_skew_s, now)
        totals = summarise(raw.sensors, psus=raw.psus, fans=raw.fans)
        return BmcReading(
            at=now,
            bmc=self.label,
            power_state=raw.power_state,
            sensors=raw.sensors,
            power_w=totals.power_w,
            inlet_c=totals.inlet_c,
            exhaust_c=totals.exhaust_c,
            fans_present=totals.fans_present,
            fans_failed=totals.fans_failed,
            psus_present=totals.psus_present,
            psus_failed=totals.psus_failed,
            failed_fans=totals.failed_fans,
            failed_psus=totals.failed_psus,
            warned_units=totals.warned_units,
            psus_no_input=len(totals.no_input_psus),
            psus_needed=raw.psus_needed,
            no_input_psus=totals.no_input_psus,
            sel_recent=raw.sel[-self._sel_recent :] if self._sel_recent else (),
            # DateTime and SEL times have whole seconds: a millisecond says all there is
            clock_skew_s=None if raw.clock_skew_s is None else round(raw.clock_skew_s, 3),
            simulated=self.simulated,
            parts=raw.parts,
        )

    def _post(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)

    def _announce_skew(self, skew_s: float | None, now: float) -> None:
        """An event when the BMC's clock is found off by CLOCK_SKEW_SHOWN_S or more, and
        when it is back in step (not while it stays off, nor each time the figure moves)."""
        if skew_s is None:
            return  # not measured this poll: as it was
        skewed = abs(skew_s) >= CLOCK_SKEW_SHOWN_S
        if skewed == self._skewed:
            return
        self._skewed = skewed
        if skewed:
            way = "ahead of" if skew_s > 0 else "behind"
            message = (
                f"bmc clock {fmt.age(0.0, abs(skew_s))} {way} this host's: its event log "
                "times are corrected by it; set its time (NTP)"
            )
            log.warning("%s: %s", self.label, message)
            self._post(Event(now, self.node, self.kind, "clock_skew", Severity.WARNING, message))
        else:
            message = "bmc clock in step with this host's again"
            self._post(Event(now, self.node, self.kind, "clock_skew", Severity.INFO, message))

    def _announce_parts(self, parts: tuple[PartStatus, ...], now: float) -> None:
        """An event when a part of the reading fails, and when it reads again."""
        failing = {p.part: p.detail for p in parts if p.enabled and not p.ok}
        for part, message in failing.items():
            if part not in self._failing:  # once when it fails, not each time its text moves
                log.warning("%s: %s not read: %s", self.label, part, message)
                self._post(
                    Event(
                        now,
                        self.node,
                        self.kind,
                        "part_stale",
                        Severity.WARNING,
                        f"bmc {part} not read: {message}",
                    )
                )
        for part in self._failing.keys() - failing.keys():
            self._post(
                Event(
                    now,
                    self.node,
                    self.kind,
                    "part_recovered",
                    Severity.INFO,
                    f"bmc {part} read again",
                )
            )
        self._failing = failing


def source_for(
    target: BmcTarget,
    *,
    interval_s: float,
    pool: BmcPool | None = None,
    state_dir: Path | None = None,
) -> BmcSource:
    """A BmcSource for a configured BMC, its SEL cursor persisted under `state_dir`."""
    cursor = SelCursor.for_bmc(state_dir, target.label) if state_dir is not None else None
    return BmcSource(
        target.node,
        open_link(target),
        interval_s=interval_s,
        timeout_s=target.timeout_s,
        pool=pool,
        sel_cursor=cursor,
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a finished call's error as seen: a poll that timed out may fail much later."""
    if not future.cancelled():
        future.exception()
