"""The demo's fabric: the real parser over a simulated sysfs tree, moving with GPU load."""

from __future__ import annotations

from typing import ClassVar

from gpuconsole import codec
from gpuconsole.hub import Hub
from gpuconsole.readings.agents import AgentReading
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.fabric import (
    AffinityFlag,
    FabricPort,
    PortProblem,
    port_deltas,
    port_problems,
    port_rates,
    port_traffic,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sim.cluster import demo_hub
from gpuconsole.sim.fabric import SimFabricSource
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.profiles import DGX_A100, DGX_H100, NodeProfile
from gpuconsole.sources.base import EmitEvent


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

    def problems(self, node: NodeSnapshot, port: FabricPort) -> tuple[PortProblem, ...]:
        return port_problems(port, port_rates(node.rate, port), port_deltas(node.delta, port))

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
        assert not w.problems(node, port)
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
    # the counters count the flap too, as deltas over the poll that saw it, and the hub
    # turns them into events with their severity
    assert down.delta("fabric", "mlx5_4", "1", "link_downed") == 1
    problems = w.problems(down, during)
    assert [(p.severity, p.what) for p in problems] == [
        (Severity.CRITICAL, "link down (Polling)"),
        (Severity.CRITICAL, "link downed +1 (0.25/s)"),
        (Severity.WARNING, "link error recovery +2 (0.5/s)"),
        (Severity.WARNING, "symbol errors +37 (9.25/s)"),
    ]
    counted = [(e.severity, e.message) for e in w.hub.events() if e.kind == "port_errors"]
    assert counted == [
        (Severity.CRITICAL, "mlx5_4/1 (compute) link downed +1 in 4 s"),
        (Severity.WARNING, "mlx5_4/1 (compute) link error recovery +2 in 4 s"),
        (Severity.WARNING, "mlx5_4/1 (compute) symbol errors +37 in 4 s"),
    ]
    assert not w.problems(back, after)  # up again, and the counters stood still since
    gpu = down.fabric.gpu(DGX_H100.gpus[2].bus_id)  # type: ignore[union-attr]
    assert gpu is not None and AffinityFlag.RAIL_DOWN in gpu.flags
    assert during.xmit_bytes_total == before.xmit_bytes_total  # nothing moves on a down link


async def test_a_port_that_flapped_for_hours_has_its_error_counters_pegged_at_their_widths() -> (
    None
):
    """mlx5_4 flaps every 90 s from 20 s on: each outage counts link_downed 1 and
    link_error_recovery 2. Both are 8-bit PortCounters, which saturate (never wrap): after
    128 outages link_error_recovery reads 255, after 255 link_downed does, and neither
    moves after (a port that reads 256 would be taken for a wider counter, never pegged).
    The source sees them pegged and says so once; the 64-bit data counters run on."""
    async with World("dgx-002", DGX_H100) as w:
        half = await w.at(20.0 + 127 * 90 + 30)  # 128 outages, up again
        full = await w.at(20.0 + 254 * 90 + 30)  # 255
        later = await w.at(20.0 + 299 * 90 + 30)  # 300
    ports = [n.fabric.port("mlx5_4") for n in (half, full, later)]  # type: ignore[union-attr]
    assert all(p is not None for p in ports)
    counted = [(p.counter("link_downed"), p.counter("link_error_recovery")) for p in ports]  # type: ignore[union-attr]
    assert counted == [(128, 255), (255, 255), (255, 255)]
    assert [p.pegged for p in ports] == [  # type: ignore[union-attr]
        (("link_error_recovery", 255),),
        (("link_downed", 255), ("link_error_recovery", 255)),
        (("link_downed", 255), ("link_error_recovery", 255)),
    ]
    assert ports[2].counter("symbol_error") == 37 * 300  # type: ignore[union-attr]  # 16 bits
    assert later.delta("fabric", "mlx5_4", "1", "link_downed") == 0
    assert [e.message.split(" counter")[0] for e in w.events if e.kind == "counter_pegged"] == [
        "mlx5_4/1 (compute) link error recovery",
        "mlx5_4/1 (compute) link downed",
    ]
    data = [p.xmit_bytes_total for p in ports]  # type: ignore[union-attr]
    assert data[0] is not None and data[0] > 1 << 32 and data == sorted(set(data))  # type: ignore[type-var]


async def test_a_congested_rail_shows_transmit_wait_and_its_roce_port_cnps_rising() -> None:
    async with World("dgx-004", DGX_H100) as w:  # mlx5_9 and mlx5_7 congested from 10 s on
        await w.at(60.0)
        first = await w.at(62.0)
        later = await w.at(64.0)
    worried = {
        p.device: [q.what for q in w.problems(first, p)]
        for p in first.fabric.ports  # type: ignore[union-attr]
    }
    assert sorted(worried.pop("mlx5_9")) == [
        "congestion: transmit wait 3e+06/s",
        "out-of-sequence packets +80 (40/s)",
    ]
    roce = worried.pop("mlx5_7")  # the storage port, RoCE: ECN marks and CNPs
    assert [what.split(" 2.")[0] for what in roce if "ECN" in what or "CNP" in what] == [
        "congestion: ECN-marked packets",
        "congestion: CNPs sent",
        "congestion: CNPs handled",
    ]
    assert all(not what for what in worried.values())
    for counter in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled"):
        key = ("fabric", "mlx5_7", "1", counter)
        rising = [first.delta(*key), later.delta(*key)]
        assert all(d is not None and 4500 < d < 5500 for d in rising), (counter, rising)
    wait = ("fabric", "mlx5_9", "1", "port_xmit_wait")
    for node in (first, later):  # 3e6 ticks a second of congestion, and a little load
        assert 6_000_000 <= (node.delta(*wait) or 0) < 6_100_000
    # the out-of-sequence packets that came with it started once: one event per port
    assert [e.message for e in w.hub.events()] == [
        "mlx5_7/1 (storage) out-of-sequence packets +80 in 2 s",
        "mlx5_9/1 (compute) out-of-sequence packets +80 in 2 s",
    ]


async def test_roce_ports_mark_a_little_ecn_with_load_and_stay_healthy() -> None:
    async with World("dgx-001", DGX_H100) as w:
        await w.at(100.0)
        node = await w.at(102.0)
    port = node.fabric.port("mlx5_1")  # type: ignore[union-attr]
    assert port is not None and port.link_layer == "Ethernet"
    for counter in ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled"):
        per_s = node.rate("fabric", "mlx5_1", "1", counter)
        assert per_s is not None and 0 < per_s < 100, (counter, per_s)  # below any alarm
    assert not w.problems(node, port)


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


class AgentAnswer:
    """A remote source that answers with one agent snapshot, as the head's AgentSource does."""

    kind: ClassVar[str] = "remote"
    interval_s = 1.0
    timeout_s = 1.0

    def __init__(self, node: NodeSnapshot) -> None:
        self.node = node.node
        self.far = node

    async def start(self, emit: EmitEvent) -> None:
        pass

    async def poll(self) -> AgentReading:
        return AgentReading(0.0, "http://agent", self.far)

    async def close(self) -> None:
        pass


async def test_an_agents_error_deltas_reach_the_head_through_its_json() -> None:
    async with World("dgx-002", DGX_H100) as w:  # mlx5_4 flaps
        await w.at(108.0)
        agent = await w.at(112.0)
    sent = codec.loads(codec.dumps(FleetSnapshot(1, 112.0, (agent,)))).nodes[0]
    assert sent.deltas == agent.deltas and sent.delta("fabric", "mlx5_4", "1", "link_downed") == 1
    head = Hub()
    head.add_source(AgentAnswer(sent))
    seen = (await head.poll_once()).node("dgx-002")
    assert seen is not None and seen.delta("fabric", "mlx5_4", "1", "symbol_error") == 37
    assert seen.delta("fabric", "mlx5_0", "1", "symbol_error") == 0


def test_trees_left_by_killed_demo_processes_are_swept() -> None:
    import os
    import shutil
    import subprocess
    import tempfile

    from gpuconsole.sim.fabric import TREE_PREFIX
    from gpuconsole.sim.trees import sweep_orphan_trees, tree_base

    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    # where trees go now, and the temporary folder, where they went before
    orphans = [
        tempfile.mkdtemp(prefix=f"{TREE_PREFIX}{gone_pid.pid}-dgx-009-", dir=base)
        for base in (tree_base(), tempfile.gettempdir())
    ]
    mine = tempfile.mkdtemp(prefix=f"{TREE_PREFIX}{os.getpid()}-dgx-010-", dir=tree_base())
    try:
        sweep_orphan_trees(TREE_PREFIX)
        assert not any(os.path.exists(orphan) for orphan in orphans) and os.path.isdir(mine)
    finally:
        os.rmdir(mine)
        for orphan in orphans:
            shutil.rmtree(orphan, ignore_errors=True)


def test_simulated_trees_are_laid_out_in_memory_where_there_is_room() -> None:
    import os

    from gpuconsole.sim.fabric import TREE_PREFIX
    from gpuconsole.sim.trees import MIN_FREE_BYTES, new_tree, tree_base

    root = new_tree(TREE_PREFIX, "dgx-011")
    try:
        assert os.path.dirname(root) == tree_base()
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            room = os.statvfs("/dev/shm")
            if room.f_bavail * room.f_frsize >= MIN_FREE_BYTES:
                assert tree_base() in ("/dev/shm", os.environ.get("XDG_RUNTIME_DIR"))
    finally:
        os.rmdir(root)
