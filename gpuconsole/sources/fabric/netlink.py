"""Netdevs over rtnetlink (pyroute2): 64-bit statistics polled, link changes subscribed to.

Statistics come from one RTM_GETLINK dump per poll (IFLA_STATS64). Link up/down arrives
as RTM_NEWLINK/RTM_DELLINK on the RTMGRP_LINK multicast group, read by a task on the
hub's loop: nothing is polled for it. Both can look into a named network namespace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from gpuconsole.readings.fabric import NetdevStats

log = logging.getLogger(__name__)

RTMGRP_LINK = 0x1
IFF_LOWER_UP = 0x10000

# (ifname, operstate before or None, operstate now or "GONE")
LinkChange = Callable[[str, str | None, str], None]


class NetlinkUnavailable(Exception):
    """rtnetlink cannot be opened here (no such namespace, no permission, no pyroute2)."""


# pyroute2 imports ipdb and ndb with it: a few hundred ms of CPU that, on the hub's loop,
# would hold a console's first frame. Imported once, in a thread of its own (a caller
# that comes meanwhile waits there, not in the pool that polls the other sources).
_IMPORTER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pyroute2 import")


def _import_pyroute2() -> None:
    import pyroute2  # noqa: F401 - imported here, off the loop


async def _open_async(netns: str | None, groups: int | None = None) -> Any:
    """_open, with pyroute2 imported off the loop first."""
    with contextlib.suppress(ImportError):  # _open says so
        await asyncio.get_running_loop().run_in_executor(_IMPORTER, _import_pyroute2)
    return _open(netns, groups)


def _open(netns: str | None, groups: int | None = None) -> Any:
    try:
        from pyroute2 import AsyncIPRoute
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise NetlinkUnavailable("pyroute2 is not installed") from exc
    kwargs: dict[str, Any] = {}
    if netns:
        kwargs.update(netns=netns, flags=0)  # flags=0: never create the namespace
    if groups is not None:
        kwargs["groups"] = groups
    try:
        return AsyncIPRoute(**kwargs)
    except OSError as exc:
        raise NetlinkUnavailable(_why(netns, exc)) from None


def _why(netns: str | None, exc: BaseException) -> str:
    if netns and isinstance(exc, FileNotFoundError):
        return f"no network namespace {netns!r}"
    return f"rtnetlink: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"


def stats_of(msg: Any) -> NetdevStats | None:
    """A NetdevStats from one RTM_NEWLINK message, or None when it carries no name."""
    name = msg.get("ifname")
    if not name:
        return None
    s = msg.get("stats64")
    flags = int(msg.get("flags") or 0)

    def get(field: str) -> int:
        return int(s.get(field) or 0) if s is not None else 0

    carrier = msg.get("carrier")
    return NetdevStats(
        ifname=str(name),
        operstate=str(msg.get("operstate") or "UNKNOWN"),
        carrier=bool(carrier) if carrier is not None else bool(flags & IFF_LOWER_UP),
        mtu=msg.get("mtu"),
        rx_bytes=get("rx_bytes"),
        tx_bytes=get("tx_bytes"),
        rx_packets=get("rx_packets"),
        tx_packets=get("tx_packets"),
        rx_errors=get("rx_errors"),
        tx_errors=get("tx_errors"),
        rx_dropped=get("rx_dropped"),
        tx_dropped=get("tx_dropped"),
        multicast=get("multicast"),
    )


class NetdevReader:
    """Netdev statistics by name, one dump per read, in one network namespace."""

    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns or None
        self._ipr: Any = None

    async def read(self) -> dict[str, NetdevStats]:
        """Every netdev's statistics now; NetlinkUnavailable says why not."""
        if self._ipr is None:
            self._ipr = await _open_async(self.netns)
        out: dict[str, NetdevStats] = {}
        try:
            async for msg in await self._ipr.link("dump"):
                stats = stats_of(msg)
                if stats is not None:
                    out[stats.ifname] = stats
        except OSError as exc:
            self.close()
            raise NetlinkUnavailable(_why(self.netns, exc)) from None
        return out

    def close(self) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            with contextlib.suppress(Exception):
                ipr.close()


class LinkWatcher:
    """Calls `on_change` when a netdev's operstate changes, from netlink notifications."""

    def __init__(self, on_change: LinkChange, netns: str | None = None) -> None:
        self.netns = netns or None
        self.on_change = on_change
        self.error: str | None = None
        self._states: dict[str, str] = {}
        self._ipr: Any = None
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    def seed(self, states: dict[str, str]) -> None:
        """Known states (from a dump), so the first notification is compared, not news."""
        for name, state in states.items():
            self._states.setdefault(name, state)

    async def start(self) -> None:
        """Subscribe; NetlinkUnavailable when that cannot be done here."""
        ipr = await _open_async(self.netns, RTMGRP_LINK)
        try:
            await ipr.bind()
        except OSError as exc:
            with contextlib.suppress(Exception):
                ipr.close()
            raise NetlinkUnavailable(_why(self.netns, exc)) from None
        self._ipr = ipr
        self._task = asyncio.create_task(self._run(), name=f"netlink links {self.netns or ''}")

    async def _run(self) -> None:
        self.ready.set()
        try:
            while True:  # each get() yields one batch of messages, then ends
                async for msg in self._ipr.get():
                    self._handle(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket broke: say so once, the poll still works
            self.error = f"link notifications stopped: {exc}"
            log.warning("%s (netns %s)", self.error, self.netns or "host")

    def _handle(self, msg: Any) -> None:
        event = msg.get("event")
        name = msg.get("ifname")
        if not name:
            return
        before = self._states.get(name)
        if event == "RTM_DELLINK":
            self._states.pop(name, None)
            self.on_change(name, before, "GONE")
            return
        if event != "RTM_NEWLINK":
            return
        now = str(msg.get("operstate") or "UNKNOWN")
        self._states[name] = now
        if before != now:
            self.on_change(name, before, now)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            with contextlib.suppress(Exception):
                ipr.close()
