"""The BMC source: one long-lived session per BMC, on a thread of its own.

pyghmi blocks, and a dead BMC blocks for seconds. Each source therefore owns one worker
thread (never the shared default executor, which NVML's polls use), so a stuck BMC only
ever holds up itself; a `BmcPool` bounds how many BMCs are polled at once. The hub
gives each source its own interval, timeout and backoff.
"""

from __future__ import annotations

import asyncio
import logging
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.bmc import BmcReading, PowerState
from gpuconsole.sources.base import EmitEvent
from gpuconsole.sources.bmc.link import BmcError, BmcLink, PowerAction
from gpuconsole.sources.bmc.sel import SelCursor
from gpuconsole.sources.bmc.sensors import summarise

log = logging.getLogger(__name__)

DEFAULT_PORTS = {"ipmi": 623, "redfish": 443}


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
    timeout_s: float = 10.0

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS.get(self.protocol, 623)

    @property
    def label(self) -> str:
        return f"{self.protocol}://{self.host}:{self.effective_port}"


def read_password(path: str, label: str) -> str:
    """A password from a file (first line); warns when others may read the file."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise BmcError(f"{label}: cannot read password_file {file}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning(
            "%s: password_file %s is readable by others (mode %s); run chmod 600 on it",
            label,
            file,
            oct(stat.S_IMODE(mode)),
        )
    return text.splitlines()[0] if text else ""


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
        timeout = target.timeout_s
        return RedfishLink(
            target.label, lambda: PyghmiRedfish(host, port, user, password, verify, timeout)
        )
    raise BmcError(f"{target.label}: unknown protocol {target.protocol!r}")


class BmcPool:
    """A bound on how many BMCs are polled at once, shared by the sources of one hub."""

    def __init__(self, limit: int = 32) -> None:
        self.limit = max(1, limit)
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:
            self._semaphore, self._loop = asyncio.Semaphore(self.limit), loop
        return self._semaphore


class BmcSource:
    """Reads one node's BMC: sensors, totals, power state and new SEL records."""

    kind: ClassVar[str] = "bmc"

    def __init__(
        self,
        node: str,
        link: BmcLink,
        *,
        interval_s: float = 10.0,
        timeout_s: float = 20.0,
        pool: BmcPool | None = None,
        sel_cursor: SelCursor | None = None,
        sel: bool = True,
        sel_recent: int = 20,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.link = link
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.simulated = simulated
        self._pool = pool or BmcPool()
        self._cursor = sel_cursor or SelCursor()
        self._sel = sel
        self._sel_recent = sel_recent
        self._clock = clock
        self._emit: EmitEvent | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._power: PowerState | None = None

    @property
    def label(self) -> str:
        return self.link.label

    async def start(self, emit: EmitEvent) -> None:
        self._emit = emit
        self._worker()

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            name = f"bmc-{self.node}"
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        return self._executor

    async def poll(self) -> BmcReading:
        async with self._pool.semaphore():
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._worker(), self.collect)

    async def set_power(self, action: PowerAction) -> str:
        """Ask the BMC for a power change (not waiting for it), between two polls."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker(), self.link.set_power, action)

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            self.link.close()
            return
        # The close queues behind a poll that may still be stuck on a silent BMC: wait for
        # both, but no longer than a poll may take, so no thread outlives the source.
        future = asyncio.get_running_loop().run_in_executor(executor, self.link.close)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout_s + 5.0)
        except (TimeoutError, Exception) as exc:
            log.warning("%s: close did not finish: %s", self.label, exc or "timeout")
        executor.shutdown(wait=False)

    def collect(self) -> BmcReading:
        """One blocking round: read the BMC, announce new SEL records, add up the totals."""
        raw = self.link.read(sel=self._sel)
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
        if self._power is not None and raw.power_state is not self._power:
            severity = Severity.WARNING if raw.power_state is PowerState.OFF else Severity.INFO
            self._post(
                Event(now, self.node, self.kind, "power", severity, f"power {raw.power_state}")
            )
        self._power = raw.power_state
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
            sel_recent=raw.sel[-self._sel_recent :] if self._sel_recent else (),
            simulated=self.simulated,
        )

    def _post(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)


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
