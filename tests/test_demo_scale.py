"""A large demo is the head at that scale: agents' summaries decoded and merged by the head's
own code, the node an operator opens simulated in full; and a one-shot snapshot that did not
hear from every source in time says so."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuconsole.cli.main import main
from gpuconsole.codec import dumps
from gpuconsole.config import Config, DemoConfig
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import DEMO_CLUSTER
from gpuconsole.sources.agents import AgentClient, AgentSource
from gpuconsole.wiring import sim_hub

# Generous: a shared two-core machine; the figures are benchmarks/bench_demo_scale.py's.
SANITY_S = 120.0


def test_a_thousand_node_demo_is_read_as_a_head_reads_a_thousand_agents() -> None:
    hub = sim_hub(Config(), 1000, None)
    assert len(hub.sources) == 1000
    assert all(isinstance(s, AgentSource) for s in hub.sources)

    fleet = asyncio.run(hub.poll_once())

    assert len(fleet.nodes) == 1000
    assert all(n.simulated for n in fleet.nodes)
    gpus = [g for n in fleet.nodes for g in (n.nvml.gpus if n.nvml else ())]
    assert len(gpus) == 8000
    assert len({g.uuid for g in gpus}) == 8000  # each node's GPUs are its own
    assert all(n.bmc is not None and n.tenancy is not None for n in fleet.nodes)
    assert all(s.ok for n in fleet.nodes for s in n.statuses)


def test_the_small_demo_still_simulates_every_node_in_full() -> None:
    hub = sim_hub(Config(), None, None)
    assert not any(isinstance(s, AgentSource) for s in hub.sources)
    assert {s.kind for s in hub.sources} >= {"nvml", "bmc", "fabric", "tenancy"}


def test_a_fleet_of_ten_thousand_refreshes_slower_and_says_so() -> None:
    hub = sim_hub(Config(demo=DemoConfig(nodes=10_000)), None, None)
    assert {s.interval_s for s in hub.sources} == {10.0}
    said = [e.message for e in hub.events()]
    assert any("every 10 s" in m and "10,000" in m for m in said), said

    hub.focus("dgx-002", viewer="console")  # the node a console shows is read every second
    assert {s.node for s in hub.sources if s.interval_s == 1.0} == {"dgx-002"}


def test_a_fleet_past_one_heads_second_is_drawn_as_its_agents_come_up() -> None:
    nodes = 1500
    hub = sim_hub(Config(), nodes, None)
    with_gpus: list[int] = []  # per snapshot published: the nodes it shows with their GPUs
    hub.subscribe(lambda shot: with_gpus.append(sum(1 for n in shot.nodes if n.gpus)))

    async def run() -> None:
        await hub.start()
        try:
            await _until(lambda: bool(with_gpus) and with_gpus[-1] == nodes, SANITY_S)
        finally:
            await hub.stop()

    asyncio.run(run())
    # the first rows come before the last agent's first answer, not after every one
    first = next(count for count in with_gpus if count)
    assert 0 < first < nodes, with_gpus


async def _until(check: Callable[[], bool], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("not within the sanity bound")


def test_a_node_an_operator_opens_shows_every_detail_and_then_its_summary_again() -> None:
    async def scenario() -> None:
        hub = sim_hub(Config(), 30, None)
        await hub.start()
        try:

            def node(name: str) -> NodeSnapshot | None:
                return hub.latest.node(name) if hub.latest is not None else None

            def summary_of(name: str) -> bool:
                found = node(name)
                return found is not None and found.nvml is not None and bool(found.nvml.gpus)

            await _until(lambda: summary_of("dgx-003"), SANITY_S)
            found = node("dgx-003")
            assert found is not None and found.nvml is not None
            assert all(not g.nvlinks for g in found.nvml.gpus)  # the summary leaves them out

            hub.focus("dgx-003", viewer="console")

            def detailed() -> bool:
                found = node("dgx-003")
                return (
                    found is not None
                    and found.nvml is not None
                    and bool(found.nvml.gpus)
                    and all(g.nvlinks for g in found.nvml.gpus)
                )

            await _until(detailed, SANITY_S)
            found = node("dgx-003")
            assert found is not None and found.bmc is not None
            assert any(s.health.value == "ok" for s in found.bmc.sensors)  # nominal ones too
            source = next(s for s in hub.sources if s.node == "dgx-003")
            assert isinstance(source, AgentSource) and source.detail

            hub.focus(None, viewer="console")
            await _until(
                lambda: (
                    (found := node("dgx-003")) is not None
                    and found.nvml is not None
                    and all(not g.nvlinks for g in found.nvml.gpus)
                ),
                SANITY_S,
            )
        finally:
            await hub.stop()

    asyncio.run(scenario())


def test_snapshot_of_a_thousand_node_demo_returns_every_node_with_its_gpus(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--demo", "--json", "--nodes", "1000"],
        capture_output=True,
        text=True,
        timeout=SANITY_S,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert len(nodes) == 1000
    assert all(len(n["nvml"]["gpus"]) == 8 for n in nodes)


# --- a one-shot snapshot whose sources did not all answer in time -------------------------


@pytest.fixture
def agents() -> Iterator[dict[str, int]]:
    """Three agents on 127.0.0.1: one that answers at once, one that answers after 1.5 s
    and one that never answers."""
    loop = asyncio.new_event_loop()
    ports: dict[str, int] = {}
    hold = asyncio.Event()

    def body(node: str) -> bytes:
        shot = FleetSnapshot(1, time.time(), (NodeSnapshot(node),), (), ())
        return dumps(shot).encode()

    async def snapshot(request: web.Request) -> web.Response:
        node = request.query["node"]
        if node == "late":
            await asyncio.sleep(1.5)
        elif node == "silent":
            await hold.wait()
        return web.Response(body=body(node), content_type="application/json")

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/api/v1/snapshot", snapshot)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        for name in ("quick", "late", "silent"):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            ports[name] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)

    async def stop() -> None:
        hold.set()
        await runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    try:
        yield ports
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _fleet_config(tmp_path: Path, ports: dict[str, int], names: tuple[str, ...]) -> Path:
    agents = ", ".join(f'"{n}=http://127.0.0.1:{ports[n]}"' for n in names)
    path = tmp_path / "head.toml"
    path.write_text(f"[fleet]\nagents = [{agents}]\ntimeout_s = 0.5\n")
    return path


def test_a_snapshot_that_timed_out_on_a_node_says_which_and_fails(
    tmp_path: Path,
    agents: dict[str, int],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _fleet_config(tmp_path, agents, ("quick", "silent"))

    with caplog.at_level("WARNING", logger="gpuconsole.hub"):
        code = main(["snapshot", "--json", "-c", str(config)])
    # the counted line stands for the hub's own line per stale node
    assert not [r for r in caplog.records if "stale:" in r.getMessage()]

    out, err = capsys.readouterr()
    assert code == 3
    assert "remote timed out on 1 of 2 nodes: silent" in err
    assert "--wait" in err
    assert {n["node"] for n in json.loads(out)["nodes"]} == {"quick", "silent"}


def test_wait_trades_time_for_a_complete_snapshot(
    tmp_path: Path, agents: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    config = _fleet_config(tmp_path, agents, ("quick", "late"))

    assert main(["snapshot", "--json", "-c", str(config)]) == 3
    assert "remote timed out on 1 of 2 nodes: late" in capsys.readouterr().err

    assert main(["snapshot", "--json", "-c", str(config), "--wait", "10"]) == 0
    out, err = capsys.readouterr()
    assert "timed out" not in err
    late = next(n for n in json.loads(out)["nodes"] if n["node"] == "late")
    assert all(s["ok"] for s in late["statuses"])


def test_wait_takes_only_a_positive_number_of_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["snapshot", "--demo", "--wait", "soon"])
    assert exited.value.code == 2
    assert "not a positive number of seconds" in capsys.readouterr().err


def test_an_agent_reading_of_the_simulated_fleet_is_marked_simulated() -> None:
    hub = sim_hub(Config(), len(DEMO_CLUSTER) + 1, None)  # past the demo: through agents
    fleet = asyncio.run(hub.poll_once())
    assert all(n.simulated for n in fleet.nodes)
    source = hub.sources[0]
    assert isinstance(source, AgentSource) and source.url.startswith("sim://")


def test_the_console_shows_a_thousand_nodes_and_opens_one_in_full() -> None:
    pytest.importorskip("textual")
    from gpuconsole.tui.app import ConsoleApp
    from gpuconsole.tui.screens.node import NodeScreen
    from gpuconsole.tui.widgets.row_table import RowTable

    async def scenario() -> None:
        hub = sim_hub(Config(), 1000, None)
        app = ConsoleApp(hub, freeze_heap=True)
        async with app.run_test(size=(120, 40)) as pilot:

            def every_node_listed() -> bool:
                table = app.screen.query_one("#fleet-table", RowTable)
                shot = hub.latest
                gpus = sum(len(n.nvml.gpus) for n in shot.nodes if n.nvml) if shot else 0
                return table.row_count == 1000 and gpus == 8000

            await _until(every_node_listed, SANITY_S)
            await pilot.press("enter")

            def opened_in_full() -> bool:
                screen = app.screen
                if not isinstance(screen, NodeScreen) or hub.latest is None:
                    return False
                node = hub.latest.node(screen.node_name)
                return bool(
                    node and node.bmc and any(s.health.value == "ok" for s in node.bmc.sensors)
                )

            await _until(opened_in_full, SANITY_S)

    asyncio.run(scenario())


def test_an_opened_node_whose_simulation_died_is_simulated_again() -> None:
    from gpuconsole.sim.fleet import SimAgentClient

    async def scenario() -> None:
        hub = sim_hub(Config(), 30, None)
        await hub.start()
        try:
            hub.focus("dgx-003", viewer="console")
            source = next(s for s in hub.sources if s.node == "dgx-003")
            assert isinstance(source, AgentSource)
            client = source._client
            assert isinstance(client, SimAgentClient)

            def polls() -> int:
                found = hub.latest.node("dgx-003") if hub.latest is not None else None
                status = found.status("remote") if found is not None else None
                return status.polls - status.failures if status is not None else 0

            await _until(lambda: client.fleet._worker is not None and polls() > 1, SANITY_S)
            worker = await client.fleet._worker  # type: ignore[misc]
            worker.kill()
            await worker.wait()
            landed = polls()

            await _until(lambda: polls() > landed + 1, SANITY_S)
            assert client.fleet._worker is not None
            assert (await client.fleet._worker).pid != worker.pid
        finally:
            await hub.stop()

    asyncio.run(scenario())


def test_a_node_opened_and_read_at_once_is_asked_of_its_simulation_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuconsole.sim.cluster import demo_cluster
    from gpuconsole.sim.fleet import FleetSim

    asked: list[str] = []
    ask = FleetSim._ask

    async def counted(self: FleetSim, node: str, timeout_s: float) -> tuple[int, bytes]:
        asked.append(node)
        return await ask(self, node, timeout_s)

    monkeypatch.setattr(FleetSim, "_ask", counted)

    async def scenario() -> None:
        fleet = FleetSim(demo_cluster(30))
        try:  # a console opens the node, and its source reads it: one body comes back
            opened, read = await asyncio.gather(
                fleet.detail("dgx-002", SANITY_S), fleet.detail("dgx-002", SANITY_S)
            )
        finally:
            await fleet.close()
        assert opened == read and b'"dgx-002"' in read[1]
        assert asked == ["dgx-002"]

    asyncio.run(scenario())


def test_an_owners_since_is_the_same_in_the_fleets_summary_and_in_the_full_node() -> None:
    """A head's fleet shows dgx-002's Slurm job held since the moment the node, simulated
    in full when opened, says it began; and a minute later still that moment."""
    from gpuconsole.facts.ownership import resolve_owners
    from gpuconsole.sim.cluster import demo_cluster, demo_hub
    from gpuconsole.sim.fleet import FleetSim

    async def both() -> tuple[list[float | None], list[float | None], list[float | None]]:
        fleet = FleetSim(demo_cluster(20))
        await fleet.prepare()
        spec = next(s for s in demo_cluster(20) if s.name == "dgx-002")
        full = await demo_hub(specs=[spec], start=fleet.started).poll_once(say_stale=False)
        ages = []
        for at in (fleet.started + 5.0, fleet.started + 65.0):
            body = AgentSource("dgx-002", "http://sim", AgentClient()).parse(
                fleet.summary("dgx-002", at)
            )
            ages.append(sinces(body.node))
        return ages[0], ages[1], sinces(full.nodes[0])

    def sinces(node: NodeSnapshot) -> list[float | None]:
        owners = resolve_owners(node.nvml, node.tenancy)
        return [o.since for g in owners.gpus for o in g.owners]

    first, later, full = asyncio.run(both())
    assert first and all(s is not None for s in first)
    assert first == later  # the job began when it began, however late one looks
    # /proc/stat's btime is whole seconds: a process's start is known to the second
    assert len(first) == len(full)
    assert all(abs((a or 0) - (b or 0)) <= 1.0 for a, b in zip(first, full, strict=True))


def test_the_fleets_nodes_hold_their_own_memory_steadily() -> None:
    """Nodes of one profile come from one template: each still holds its own memory, the
    same from one second to the next, never more than its GPUs have."""
    from gpuconsole.sim.cluster import demo_cluster
    from gpuconsole.sim.fleet import FleetSim

    async def used() -> dict[tuple[str, float], list[tuple[int, int]]]:
        fleet = FleetSim(demo_cluster(20))
        await fleet.prepare()
        out = {}
        for name in ("dgx-002", "dgx-003", "dgx-004"):
            for at in (fleet.started + 5.0, fleet.started + 6.0):
                gpus = json.loads(fleet.summary(name, at))["nodes"][0]["nvml"]["gpus"]
                out[name, at - fleet.started] = [
                    (g["mem_used_bytes"], g["mem_total_bytes"]) for g in gpus
                ]
        return out

    seen = asyncio.run(used())
    for name in ("dgx-002", "dgx-003", "dgx-004"):
        assert seen[name, 5.0] == seen[name, 6.0]
        assert all(0 < u <= total for u, total in seen[name, 5.0])
    assert seen["dgx-002", 5.0] != seen["dgx-003", 5.0] != seen["dgx-004", 5.0]


def test_what_a_fleets_node_was_first_seen_doing_dates_from_the_heads_start() -> None:
    """A free GPU's driver was bound before anyone looked: the head says "first seen" when it
    started, not a moment that moves along with each reading."""
    from gpuconsole.sim.cluster import demo_cluster
    from gpuconsole.sim.fleet import FleetSim

    async def bound() -> tuple[float, list[float]]:
        fleet = FleetSim(demo_cluster(20))
        await fleet.prepare()
        out = []
        for at in (fleet.started + 5.0, fleet.started + 300.0):
            body = json.loads(fleet.summary("dgx-002", at))["nodes"][0]
            out += [g["bound_since"] for g in body["tenancy"]["gpus"]]
        return fleet.started, out

    started, seen = asyncio.run(bound())
    assert len(seen) == 16 and all(abs(s - started) < 0.01 for s in seen)
