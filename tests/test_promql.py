"""The fleet overview read from a real Prometheus scraping real agents, with PromQL."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuconsole.config import FleetConfig
from gpuconsole.export.agent import Agent, select
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.promql import Overview, parse_overview
from gpuconsole.wiring import AgentSettings, fleet_hub
from tests.bmc_fixtures import free_port
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.peers import require_program
from tests.waiting import until

# dgx-002: a fan stopped and GPU 3 throttles; dgx-003: GPU 5 fell off the bus; dgx-004: a
# GPU in MIG mode and one passed through; dgxa-002: its BMC stopped answering.
NODES = ("dgx-002", "dgx-003", "dgx-004", "dgxa-002")
NAMED = "gpu-a"  # the operator's name for the first, in the targets file


@dataclass
class NodeAgent:
    node: NodeSnapshot
    agent: Agent
    port: int


@pytest.fixture
async def agents() -> AsyncIterator[list[NodeAgent]]:
    fleet = frozen_fleet()
    started = []
    try:
        for name in NODES:
            agent = Agent(HeldHub(select(fleet, name, summary=False)), AgentSettings(port=0))
            await agent.start()
            assert agent.port is not None
            node = fleet.node(name)
            assert node is not None
            started.append(NodeAgent(node, agent, agent.port))
        yield started
    finally:
        for a in started:
            await a.agent.stop()


@dataclass
class Prometheus:
    url: str
    targets: Path


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture
def prometheus(agents: list[NodeAgent], tmp_path: Path) -> Iterator[Prometheus]:
    """A Prometheus scraping every agent each second, its targets in a file_sd file the
    console reads too: the first with a node label, the others together on one host."""
    binary = require_program("prometheus", "apt-get install prometheus")
    targets = tmp_path / "targets.json"
    first, *rest = (f"127.0.0.1:{a.port}" for a in agents)
    groups = [{"targets": [first], "labels": {"node": NAMED}}, {"targets": rest}]
    targets.write_text(json.dumps(groups))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        "scrape_configs: [{job_name: gpuconsole, "
        f"file_sd_configs: [{{files: ['{targets}']}}]}}]\n"
    )
    log = tmp_path / "prometheus.log"
    for _attempt in range(3):  # another process may take the free port before Prometheus
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=out,
            )
        try:
            deadline = time.monotonic() + 30
            while proc.poll() is None and not _ready(url) and time.monotonic() < deadline:
                time.sleep(0.1)
            if proc.poll() is None and _ready(url):
                yield Prometheus(url, targets)
                return
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    raise AssertionError(f"prometheus never started:\n{log.read_text()[-2000:]}")


def head(prom: Prometheus, **kw: Any) -> Hub:
    cfg = FleetConfig(
        targets_file=str(prom.targets), prometheus=prom.url, interval_s=0.5, timeout_s=3.0, **kw
    )
    return fleet_hub(cfg, HubSettings(publish_gap_s=0.05, max_backoff_s=1.0))


def names(agents: list[NodeAgent]) -> list[str]:
    """What the console calls each: the label's name, else host:port (one host for all)."""
    return [NAMED, *(f"127.0.0.1:{a.port}" for a in agents[1:])]


def fresh(hub: Hub, node: str) -> bool:
    found = hub.latest.node(node) if hub.latest is not None else None
    status = found.status("remote") if found is not None else None
    return status is not None and status.ok


def gpu_view(node: NodeSnapshot, g: GpuReading) -> tuple[Any, ...]:
    """What the fleet view, GPU health and the wallboard read of a GPU; its identity as the
    console has it (for a GPU NVML lost before reading it, what sysfs says, as exported)."""
    sm = None if g.gpm is None or g.gpm.sm_util_pct is None else round(g.gpm.sm_util_pct, 6)
    pcie = g.pcie
    row = next(r for r in node_gpus(node) if r.reading is g)
    return (
        g.index,
        row.uuid,
        row.model,
        row.bus_id,
        g.state,
        g.util_gpu_pct,
        g.util_mem_pct,
        g.mem_used_bytes,
        g.mem_total_bytes,
        g.temp_gpu_c,
        g.temp_hbm_c,
        g.power_w,
        g.power_limit_w,
        g.sm_clock_mhz,
        g.pstate,
        sorted(g.throttle_reasons),
        g.ecc,
        (pcie.gen_current, pcie.gen_max, pcie.width_current, pcie.width_max, pcie.replay_count),
        sorted(m.profile_name for m in g.mig_instances),
        sm,
        reading_verdict(g).health,
    )


def node_view(node: NodeSnapshot) -> dict[str, Any]:
    """A node as the console's overview shows it."""
    bmc = node.bmc
    fabric = node.fabric
    return {
        "gpus": [gpu_view(node, g) for g in node.gpus],
        "sources": {s.source: s.ok for s in node.statuses if s.source != "remote"},
        "bmc": None
        if bmc is None
        else (
            bmc.power_state,
            bmc.power_w,
            bmc.inlet_c,
            bmc.exhaust_c,
            bmc.fans_present,
            bmc.fans_failed,
            bmc.psus_present,
            bmc.psus_failed,
            bmc.psus_no_input,
        ),
        "ports": None
        if fabric is None
        else sorted(
            (p.name, p.state, p.phys_state, p.role, p.rate_gbps, p.expected_rate_gbps, p.netdev)
            for p in fabric.ports
        ),
        "peermem": None if fabric is None else fabric.peermem_loaded,
        "last_xid": dict(node.last_xid),
        "simulated": node.simulated,
    }


async def test_the_overview_from_prometheus_is_what_the_agents_report(
    agents: list[NodeAgent], prometheus: Prometheus
) -> None:
    hub = head(prometheus)
    members = names(agents)
    assert sorted(s.node for s in hub.sources) == sorted(members)
    await hub.start()
    try:
        await until(lambda: all(fresh(hub, m) for m in members), timeout=30)
        assert hub.latest is not None
        for member, agent in zip(members, agents, strict=True):
            ours = hub.latest.node(member)
            assert ours is not None
            assert node_view(ours) == node_view(agent.node), member
        lost = hub.latest.node(members[1])
        assert lost is not None and [g.index for g in lost.gpus if g.lost] == [5]
        hot = hub.latest.node(NAMED)
        assert hot is not None and hot.bmc is not None and hot.bmc.fans_failed == 1
        # the overview has no per-link NVLink readings; drilling in reads the agent for them
        assert all(g.nvlinks == () for g in hot.gpus)
        hub.focus(NAMED)
        await until(lambda: bool(hub.latest.node(NAMED).gpus[0].nvlinks))  # type: ignore[union-attr]
        drilled = hub.latest.node(NAMED)
        assert drilled is not None
        assert [g.nvlinks for g in drilled.gpus] == [g.nvlinks for g in agents[0].node.gpus]
        assert node_view(drilled) == node_view(agents[0].node)
        other = hub.latest.node(members[2])
        assert other is not None and all(g.nvlinks == () for g in other.gpus)
        hub.focus(None)
        await until(lambda: not hub.latest.node(NAMED).gpus[0].nvlinks)  # type: ignore[union-attr]
    finally:
        await hub.stop()


async def test_a_node_prometheus_cannot_scrape_goes_stale_alone_and_comes_back(
    agents: list[NodeAgent], prometheus: Prometheus
) -> None:
    hub = head(prometheus)
    members = names(agents)
    await hub.start()
    victim = agents[2]
    try:
        await until(lambda: all(fresh(hub, m) for m in members), timeout=30)
        await victim.agent.stop()
        await until(lambda: not fresh(hub, members[2]), timeout=15)
        gone = hub.latest.node(members[2])  # type: ignore[union-attr]
        status = gone.status("remote") if gone is not None else None
        assert status is not None and "cannot scrape" in (status.error or "")
        assert gone is not None and len(gone.gpus) == len(victim.node.gpus)  # kept
        assert all(fresh(hub, m) for m in members if m != members[2])
        victim.agent = Agent(victim.agent.hub, AgentSettings(port=victim.port))
        await victim.agent.start()
        await until(lambda: fresh(hub, members[2]), timeout=15)
        assert any(e.kind == "source_recovered" and e.node == members[2] for e in hub.events())
    finally:
        await hub.stop()


async def test_a_query_prometheus_refuses_is_why_every_node_is_stale(
    agents: list[NodeAgent], prometheus: Prometheus
) -> None:
    for selector, reason in (('job="', "Prometheus answered HTTP 400"),
                             ('job="elsewhere"', "does not scrape")):  # fmt: skip
        hub = head(prometheus, prometheus_selector=selector)
        snapshot = await hub.poll_once()
        for node in snapshot.nodes:
            status = node.status("remote")
            assert status is not None and not status.ok
            assert reason in (status.error or ""), status.error


def _sample(labels: dict[str, str], value: float) -> dict[str, Any]:
    return {"metric": labels, "value": [1796000000.5, str(value)]}


def test_an_agent_serving_several_nodes_is_picked_by_name() -> None:
    """A head re-exporting its fleet serves many nodes from one target: pick by name."""
    up = _sample({"__name__": "up", "instance": "head:9400"}, 1)
    util = [
        _sample({"__name__": "DCGM_FI_DEV_GPU_UTIL", "instance": "head:9400",
                 "Hostname": host, "gpu": "0"}, value)
        for host, value in (("dgx-001", 10.0), ("dgx-002", 20.0))
    ]  # fmt: skip
    info = [
        _sample({"__name__": "gpuconsole_gpu_info", "instance": "head:9400", "node": host,
                 "gpu": "0", "uuid": f"GPU-{host}", "model": "NVIDIA H100"}, 1)
        for host in ("dgx-001", "dgx-002")
    ]  # fmt: skip
    overview: Overview = parse_overview([up, *util], info)
    assert math.isclose(overview.at, 1796000000.5)
    name, series = overview.pick("head:9400", "dgx-002")
    assert name == "dgx-002" and series.gpus[0]["DCGM_FI_DEV_GPU_UTIL"] == 20.0
    with pytest.raises(ValueError, match="exports nodes dgx-001, dgx-002, not dgx-009"):
        overview.pick("head:9400", "dgx-009")
    with pytest.raises(ConnectionError, match="does not scrape other:9400"):
        overview.pick("other:9400", "dgx-001")
    with pytest.raises(ValueError, match="does not fit"):
        parse_overview([{"metric": {"__name__": "up"}}], [])
