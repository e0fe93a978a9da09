"""Fixtures for the console's tests: a frozen simulated world, and snapshots in snapshots/.

Import from tests/conftest.py: `from tests.conftest_tui import *  # noqa: F403`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuconsole.readings.fabric import FabricReading
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sim.cluster import demo_hub

# A fixed instant (2026-11-29 00:53:20 UTC): a frozen clock gives a frozen world.
FIXED = 1_796_000_000.0
SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"


def _point_snapshots_at_top_level() -> None:
    """pytest-textual-snapshot keeps SVGs beside the tests; this project keeps them in snapshots/."""
    try:
        from pytest_textual_snapshot import SVGImageExtension
    except ImportError:  # the plugin is a test extra
        return

    def dirname(cls: type, *, test_location: Any) -> str:
        return str(SNAPSHOT_DIR / test_location.basename)

    SVGImageExtension.dirname = classmethod(dirname)  # type: ignore[method-assign, assignment]


_point_snapshots_at_top_level()


class _Clock:
    """Stands still, except when the fixture moves it between the two polls."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += 1.0


async def _frozen_fleet() -> FleetSnapshot:
    # Two polls one second apart, ending at FIXED: GPM and rates need two samples.
    clock = _Clock(FIXED - 1.0)
    hub = demo_hub(clock=clock, start=FIXED - 120, events=False)
    return await hub.poll_once(rounds=2, between=clock.step)


_FROZEN: list[FleetSnapshot] = []


def frozen_fleet() -> FleetSnapshot:
    """The demo cluster polled once at FIXED (built once per session; it is immutable)."""
    if not _FROZEN:
        # A thread of its own, so that async tests (already inside a loop) can call it too.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            _FROZEN.append(pool.submit(asyncio.run, _frozen_fleet()).result())
    return _FROZEN[0]


async def _rail_down_reading(node_name: str, nic: str) -> FabricReading:
    from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster
    from gpuconsole.sim.fabric import FabricScenario, SimFabricSource

    sims = build_sim_nodes(demo_cluster(), clock=lambda: FIXED, start=FIXED - 120)
    sim = next(s for s in sims if s.name == node_name)
    # A rail that flaps from 115 s on is 5 s into its first outage at FIXED (120 s).
    flap = FabricScenario("flap", nic, at_s=115.0)
    source = SimFabricSource(sim, scenarios=(flap,), netlink=False, clock=lambda: FIXED)
    try:
        return await source.poll()
    finally:
        await source.close()


_RAIL_DOWN: dict[tuple[str, str], FleetSnapshot] = {}


def fleet_with_rail_down(node_name: str = "dgx-002", nic: str = "mlx5_9") -> FleetSnapshot:
    """The frozen fleet with one compute rail of a node down, as the real fabric source reads
    it (its pairing and flags computed from the simulator's sysfs): story 6."""
    key = (node_name, nic)
    if key not in _RAIL_DOWN:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(asyncio.run, _rail_down_reading(node_name, nic)).result()
        fleet = frozen_fleet()
        nodes = tuple(
            msgspec.structs.replace(n, fabric=reading) if n.node == node_name else n
            for n in fleet.nodes
        )
        _RAIL_DOWN[key] = msgspec.structs.replace(fleet, nodes=nodes)
    return _RAIL_DOWN[key]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Clock times print in UTC whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def fleet_snapshot() -> FleetSnapshot:
    return frozen_fleet()


@pytest.fixture
def console_app(utc: None) -> Callable[..., Any]:
    """Build a ConsoleApp over frozen data: no hub started, clock at FIXED, no blink."""
    from gpuconsole.actions.roles import Actor, Role
    from gpuconsole.tui.app import ConsoleApp

    def build(snapshot: FleetSnapshot | None = None, **kwargs: Any) -> ConsoleApp:
        kwargs.setdefault("theme_dirs", [])
        # the same name on every machine (the status bar shows who is at the console)
        kwargs.setdefault("actor", Actor("alice", Role.VIEWER))
        return ConsoleApp(
            None,
            start_hub=False,
            snapshot=snapshot if snapshot is not None else frozen_fleet(),
            clock=lambda: FIXED,
            cursor_blink=False,
            **kwargs,
        )

    return build
