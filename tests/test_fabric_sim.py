"""The demo's fabric: the real parser over a simulated sysfs tree, moving with GPU load."""

from __future__ import annotations

from gpuconsole import codec
from gpuconsole.hub import Hub
from gpuconsole.model import Event, NodeSnapshot, Severity
from gpuconsole.readings.fabric import AffinityFlag, port_problems, port_rates, port_traffic
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.sim.fabric import SimFabricSource
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import DGX_A100, DGX_H100, NodeProfile


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class World:
    """One simulated node with its fabric source in a hub, on a clock the test moves."""

    def __init__(self, name: str, profile: NodeProfile, netlink: bool = False) -> None:
        self.clock = Clock(0.0)
        self.sim = SimNode(name, profile, clock=self.clock, start=0.0)
        self.source = SimFabricSource(self.sim, netlink=netlink, clock=self.clock)
        self.hub = Hub(clock=self.clock, monotonic=self.clock)
        self.hub.add_source(self.source)
        self.events: list[Event] = []

    async def __aenter__(self) -> World:
        await self.source.start(self.events.append)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.hub.stop()

    async def at(self, t: float) -> NodeSnapshot:
        self.clock.now = t
        node = self.hub._nodes[self.sim.name]
        await self.hub._poll(node, node.sources[0])
        snapshot = self.hub.publish().node(self.sim.name)
        assert snapshot is not None and snapshot.fabric is not None
        return snapshot


async def test_a_dgx_h100_shows_eight_ndr_rails_and_two_storage_ports_moving_with_load() -> None:
    async with World("dgx-001", DGX_H100, netlink=True) as w:
        await w.at(100.0)
        node = await w.at(102.0)
    fabric = node.fabric
    assert fabric is not None and fabric.simulated
    compute = [p for p in fabric.ports if p.role.value == "compute"]
    storage = [p for p in fabric.ports if p.role.value == "storage"]
    assert len(compute) == 8 and len(storage) == 2
    assert {p.rate_text for p in compute} == {"400 Gb/sec (4X NDR)"}
    for port in compute:
        tx, rx = port_traffic(port, port_rates(node.rate, port))
        assert tx is not None and rx is not None
        assert 1e9 < tx < 50e9 and 0.9 * tx < rx < tx  # GB/s, below the 50 GB/s line rate
        assert not port_problems(port, port_rates(node.rate, port))
    assert storage[0].netdev_error == "netdev stats unavailable: no netdev enp41s0f0np0"
    assert [g.flags for g in fabric.gpus] == [()] * 8


async def test_a_flapping_port_goes_down_counts_it_and_comes_back() -> None:
    async with World("dgx-002", DGX_H100) as w:  # mlx5_4 flaps from 20 s on
        up = await w.at(108.0)
        down = await w.at(112.0)  # 92 s in: the second outage
        back = await w.at(125.0)
    before, during, after = (n.fabric.port("mlx5_4") for n in (up, down, back))  # type: ignore[union-attr]
    assert before is not None and during is not None and after is not None
    assert (before.state, during.state, after.state) == ("ACTIVE", "DOWN", "ACTIVE")
    assert during.phys_state == "Polling"
    assert [(e.kind, e.severity, e.message) for e in w.events] == [
        ("link_down", Severity.CRITICAL, "mlx5_4/1 (compute) link down (sysfs)"),
        ("link_up", Severity.INFO, "mlx5_4/1 (compute) link up (sysfs)"),
    ]
    problems = port_problems(during, port_rates(down.rate, during))
    assert [p.severity for p in problems][:2] == [Severity.CRITICAL, Severity.CRITICAL]
    assert {p.counter for p in problems} >= {None, "link_downed", "symbol_error"}
    gpu = down.fabric.gpu(DGX_H100.gpus[2].bus_id)  # type: ignore[union-attr]
    assert gpu is not None and AffinityFlag.RAIL_DOWN in gpu.flags
    assert during.xmit_bytes_total == before.xmit_bytes_total  # nothing moves on a down link


async def test_a_congested_rail_shows_transmit_wait_rising() -> None:
    async with World("dgx-004", DGX_H100) as w:  # mlx5_9 congested from 10 s on
        await w.at(60.0)
        node = await w.at(62.0)
    worried = {
        p.device: [q.what for q in port_problems(p, port_rates(node.rate, p))]
        for p in node.fabric.ports  # type: ignore[union-attr]
    }
    assert sorted(worried.pop("mlx5_9")) == [
        "congestion: transmit wait 3e+06/s",
        "out-of-sequence packets 40/s",
    ]
    assert all(not what for what in worried.values())


async def test_a_downtrained_rail_is_flagged_on_its_gpu() -> None:
    async with World("dgx-003", DGX_H100) as w:
        node = await w.at(30.0)
    port = node.fabric.port("mlx5_11")  # type: ignore[union-attr]
    assert port is not None and port.downtrained and port.rate_text == "200 Gb/sec (2X NDR)"
    gpu = node.fabric.gpu(DGX_H100.gpus[7].bus_id)  # type: ignore[union-attr]
    assert gpu is not None and gpu.flags == (AffinityFlag.RAIL_DOWNTRAINED,)


async def test_a_dgx_a100_runs_hdr_rails() -> None:
    async with World("dgxa-001", DGX_A100) as w:
        node = await w.at(10.0)
    rails = [p for p in node.fabric.ports if p.role.value == "compute"]  # type: ignore[union-attr]
    assert len(rails) == 8 and {p.rate_text for p in rails} == {"200 Gb/sec (4X HDR)"}


async def test_the_demo_snapshot_with_fabric_round_trips_through_json() -> None:
    hub = demo_hub(2, clock=lambda: 1_796_000_000.0, start=1_796_000_000.0 - 120, events=False,
                   fabric=True)  # fmt: skip
    snapshot = await hub.poll_once()
    assert all(n.fabric is not None for n in snapshot.nodes)
    back = codec.loads(codec.dumps(snapshot))
    assert [n.fabric for n in back.nodes] == [n.fabric for n in snapshot.nodes]


def test_trees_left_by_killed_demo_processes_are_swept() -> None:
    import os
    import subprocess
    import tempfile

    from gpuconsole.sim.fabric import TREE_PREFIX
    from gpuconsole.sim.trees import sweep_orphan_trees

    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    orphan = tempfile.mkdtemp(prefix=f"{TREE_PREFIX}{gone_pid.pid}-dgx-009-")
    mine = tempfile.mkdtemp(prefix=f"{TREE_PREFIX}{os.getpid()}-dgx-010-")
    try:
        sweep_orphan_trees(TREE_PREFIX)
        assert not os.path.exists(orphan) and os.path.isdir(mine)
    finally:
        os.rmdir(mine)
