"""The demo's data as a GPU expert reads it: what differs on real hardware differs here."""

from __future__ import annotations

from gpuconsole.readings.nvml import NvmlReading
from gpuconsole.sim.cluster import DEMO_CLUSTER, build_sim_nodes
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sources.nvml.source import NvmlSource

T0 = 1000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def demo_nodes(clock: Clock) -> dict[str, SimNode]:
    return {n.name: n for n in build_sim_nodes(DEMO_CLUSTER, clock=clock, start=T0)}


async def read_twice(node: SimNode, clock: Clock) -> NvmlReading:
    """What the NVML source reads of `node` on its second poll, a second after its first
    (GPM and rates need two samples)."""
    source = NvmlSource(node.name, lib=SimNvml(node), events=False, clock=clock)
    await source.start(lambda _e: None)
    try:
        await source.poll()
        clock.now += 1.0
        return await source.poll()
    finally:
        await source.close()


async def test_free_mig_instances_are_idle_and_the_held_ones_work() -> None:
    """dgx-004's GPU 7 (NVML's 6): pods hold MIG instances 1 and 2; 3 and 4 are free."""
    clock = Clock(T0 + 90.0)
    reading = await read_twice(demo_nodes(clock)["dgx-004"], clock)
    instances = {m.gpu_instance_id: m for m in reading.gpu(6).mig_instances}
    assert sorted(instances) == [1, 2, 3, 4]
    for gi, mig in instances.items():
        assert mig.gpm is not None and mig.gpm.sm_util_pct is not None
        if gi in (1, 2):
            assert mig.gpm.sm_util_pct > 10 and (mig.mem_used_bytes or 0) > 0, gi
        else:
            assert mig.gpm.sm_util_pct == 0 and mig.mem_used_bytes == 0, gi
            assert mig.gpm.tensor_util_pct == 0 and mig.gpm.dram_bw_util_pct == 0, gi


async def test_memory_in_use_differs_from_node_to_node() -> None:
    """dgx-002's Slurm job and dgx-003's pods are other programs: their GPUs hold other
    amounts of memory, not the same figures GPU by GPU."""
    clock = Clock(T0 + 90.0)
    nodes = demo_nodes(clock)
    a = await read_twice(nodes["dgx-002"], clock)
    b = await read_twice(nodes["dgx-003"], clock)
    busy = [
        (x.mem_used_bytes, y.mem_used_bytes)
        for x, y in zip(a.gpus, b.gpus, strict=True)
        if (x.util_gpu_pct or 0) > 50 and (y.util_gpu_pct or 0) > 50
    ]
    assert len(busy) >= 4
    assert all(x != y for x, y in busy)
    assert all(abs(x - y) > 2**30 for x, y in busy[:1])  # by gigabytes, not a rounding


async def test_nvlink_carries_about_as_much_each_way_but_never_exactly() -> None:
    clock = Clock(T0 + 90.0)
    reading = await read_twice(demo_nodes(clock)["dgx-002"], clock)
    links = [link for gpu in reading.gpus for link in gpu.nvlinks if link.tx_kib_total]
    assert len(links) == 8 * 18
    ratios = [link.rx_kib_total / link.tx_kib_total for link in links if link.rx_kib_total]
    assert len(ratios) == len(links)
    assert all(0.8 < r < 1.0 for r in ratios) and len({round(r, 3) for r in ratios}) > 1
    gpm = reading.gpus[0].gpm
    assert gpm is not None and gpm.nvlink_tx_bytes_per_s and gpm.nvlink_rx_bytes_per_s
    assert gpm.nvlink_rx_bytes_per_s != gpm.nvlink_tx_bytes_per_s


async def test_every_process_works_for_one_of_its_gpus_owners() -> None:
    """dgxa-002's GPU 0 is time-sliced among pods: each process there is one of theirs,
    named, not a bare pod UID; no process anywhere belongs to someone its GPU does not."""
    from gpuconsole.facts.ownership import node_ownership
    from gpuconsole.sim.cluster import demo_hub

    hub = demo_hub(clock=lambda: T0 + 30.0, start=T0, events=False, bmc=False, fabric=False)
    snapshot = await hub.poll_once(say_stale=False)
    checked = 0
    for node in snapshot.nodes:
        ownership = node_ownership(node)
        assert ownership is not None, node.node
        for gpu in ownership.gpus:
            held = {o.label for o in gpu.owners} | {o.label for m in gpu.migs for o in m.owners}
            for process in gpu.processes:
                assert process.owner.label in held, (node.node, gpu.bus_id, process)
                checked += 1
    assert checked >= 20


async def test_a_reset_puts_the_spare_row_in_and_the_row_stays_remapped() -> None:
    """dgx-005's GPU 2, two minutes in: its double-bit error (XID 48) remapped a row for an
    uncorrectable error, none for correctable ones, and the remap waits for a reset. After
    the reset nothing waits and the row is still remapped: NVIDIA's counts are the InfoROM's,
    kept across resets; only the volatile count of the driver's run starts over. dgx-004's
    GPU 3 (NVML's 2) likewise."""
    clock = Clock(T0 + 120.0)
    nodes = demo_nodes(clock)

    async def ecc(node: SimNode, index: int) -> tuple[int | None, ...]:
        e = (await read_twice(node, clock)).gpu(index).ecc
        assert e is not None
        return (e.remapped_corrected, e.remapped_uncorrected, e.remap_pending,
                e.volatile_uncorrected, e.aggregate_uncorrected)  # fmt: skip

    assert await ecc(nodes["dgx-005"], 2) == (0, 1, True, 1, 1)
    assert await ecc(nodes["dgx-004"], 2) == (2, 1, True, 0, 1)
    assert nodes["dgx-005"].reset_gpu(2) and nodes["dgx-004"].reset_gpu(3)
    assert await ecc(nodes["dgx-005"], 2) == (0, 1, False, 0, 1)
    assert await ecc(nodes["dgx-004"], 2) == (2, 1, False, 0, 1)
