"""The demo's simulated BMCs: physics that follow the GPUs, and the BMC scenarios."""

from __future__ import annotations

import asyncio

import pytest

from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event
from gpuconsole.readings.bmc import BmcReading, SensorHealth
from gpuconsole.sim.bmc import sim_link
from gpuconsole.sim.cluster import (
    SimNodeSpec,
    add_sim_bmc_sources,
    add_sim_sources,
    build_sim_nodes,
    demo_hub,
)
from gpuconsole.sim.node import Scenario, SimNode
from gpuconsole.sim.profiles import get_profile
from gpuconsole.sources.bmc import BmcSource
from gpuconsole.sources.bmc.sel import SelCursor

T0 = 1_700_000_000.0


def node(*scenarios: str, at: float = 120.0, profile: str = "dgx-h100") -> SimNode:
    clock = lambda: T0 + at  # noqa: E731
    return SimNode("dgx-900", get_profile(profile), scenarios=scenarios, clock=clock, start=T0)


def read(sim: SimNode, events: list[Event] | None = None) -> BmcReading:
    src = BmcSource(sim.name, sim_link(sim), sel_cursor=SelCursor(last_record_id=0, loaded=True))

    async def once() -> BmcReading:
        await src.start((events if events is not None else []).append)
        try:
            return await src.poll()
        finally:
            await src.close()

    return asyncio.run(once())


def test_power_is_the_gpus_plus_the_rest_of_the_server_and_heat_follows() -> None:
    sim = node()
    reading = read(sim)
    gpu_w = sum(sim.gpu(i).power_w for i in range(8))
    assert reading.power_w is not None
    assert gpu_w + 1700 < reading.power_w < gpu_w + 2600
    assert reading.power_w <= 10200
    assert reading.inlet_c == pytest.approx(24.0, abs=0.5)
    assert reading.exhaust_c is not None and reading.exhaust_c > reading.inlet_c + 8
    assert (reading.fans_present, reading.psus_present) == (12, 6)
    assert (reading.fans_failed, reading.psus_failed) == (0, 0)
    for i, slot in enumerate(sim.profile.gpus):  # HGX sensors join the GPU by module id
        power = {s.name: s.value for s in reading.gpu_sensors(slot.module_id)}
        assert power[f"HGX_GPU_SXM_{slot.module_id}_Power_0"] == pytest.approx(
            sim.gpu(i).power_w, abs=0.1
        )


def test_a_fan_fault_is_critical_and_told_once_as_fan_3_at_0_rpm() -> None:
    events: list[Event] = []
    reading = read(node("fan:3"), events)
    fan = reading.sensor("FAN 3")
    assert fan is not None and fan.value == 0.0 and fan.health is SensorHealth.CRITICAL
    assert reading.fans_failed == 1
    assert [e.message for e in events if e.severity.value == "critical"] == [
        "SEL: FAN 3 at 0 RPM: Lower critical"
    ]


def test_a_failed_psu_shares_the_load_out() -> None:
    reading = read(node("psu:2"))
    assert (reading.psus_present, reading.psus_failed) == (6, 1)
    assert reading.sensor("PSU2 Power").value == 0.0  # type: ignore[union-attr]
    assert reading.health.value == "critical"


def test_a_bmc_that_goes_silent_makes_the_source_stale_and_the_gpus_stay_fresh() -> None:
    now = [T0 + 30.0]
    spec = SimNodeSpec("dgx-001", "dgx-h100", (Scenario("bmcsilent", 0, 60.0),))
    sims = build_sim_nodes([spec], clock=lambda: now[0], start=T0)
    hub = Hub(clock=lambda: now[0])
    add_sim_sources(hub, sims, events=False, clock=lambda: now[0])
    add_sim_bmc_sources(hub, sims, clock=lambda: now[0])
    before = asyncio.run(hub.poll_once()).nodes[0]
    now[0] = T0 + 61.0
    after = asyncio.run(hub.poll_once()).nodes[0]
    assert before.status("bmc").ok  # type: ignore[union-attr]
    status = after.status("bmc")
    assert status is not None and not status.ok and "no answer" in (status.error or "")
    assert after.status("nvml").ok  # type: ignore[union-attr]


def test_the_demo_cluster_has_a_bmc_per_node_and_the_stories() -> None:
    hub = demo_hub(clock=lambda: T0 + 30, start=T0, events=False, bmc=True)
    snapshot = asyncio.run(hub.poll_once())
    assert all(n.bmc is not None for n in snapshot.nodes)
    assert snapshot.node("dgx-002").bmc.fans_failed == 1  # type: ignore[union-attr]
    assert snapshot.node("dgxa-001").bmc.psus_failed == 1  # type: ignore[union-attr]
    assert "SEL: FAN 3 at 0 RPM: Lower critical" in [e.message for e in snapshot.events]


def test_a_node_level_scenario_names_a_fan_or_psu_the_server_has() -> None:
    assert Scenario.parse("fan:3") == Scenario("fan", 3)
    assert Scenario.parse("bmcsilent:0@60") == Scenario("bmcsilent", 0, 60.0)
    with pytest.raises(ValueError, match="no FAN 13"):
        sim_link(node("fan:13"))


def test_the_lost_gpu_of_story_one_has_its_pcie_error_in_the_sel_at_the_same_time() -> None:
    """dgx-003's GPU 5 (bus c3) falls off the bus 45 s in: NVML calls it lost, and the BMC
    logs a fatal PCIe bus error at its slot in the same second."""
    hub = demo_hub(clock=lambda: T0 + 45.5, start=T0, events=False, bmc=True)
    snapshot = asyncio.run(hub.poll_once())
    node = snapshot.node("dgx-003")
    assert node is not None and node.bmc is not None and node.nvml is not None
    (lost,) = [g for g in node.nvml.gpus if g.lost_since is not None]
    assert lost.index == 5 and get_profile("dgx-h100").gpus[5].bus_id.endswith("C3:00.0")
    (entry,) = [e for e in node.bmc.sel_recent if e.sensor_type == "Critical Interrupt"]
    assert entry.severity.value == "critical" and "Bus Fatal Error (bus c3 dev 00 fn 0)" in (
        entry.event
    )
    assert entry.sensor == "PCIe SXM5" and entry.at is not None
    assert abs(entry.at - lost.lost_since) <= 1.0
    quiet = asyncio.run(demo_hub(clock=lambda: T0 + 30, start=T0, events=False).poll_once())
    calm = quiet.node("dgx-003")
    assert calm is not None and calm.bmc is not None
    assert not [e for e in calm.bmc.sel_recent if e.severity.value == "critical"]


def test_a_gpu_off_the_bus_for_good_has_its_pcie_error_in_the_sel_too() -> None:
    """xid79hard (dgx-006's GPU 1 in the demo) falls off the bus as xid79 does, and stays
    off: its BMC logs the same fatal PCIe error at its slot."""
    sel = read(node("xid79hard:1@75")).sel_recent
    (entry,) = [e for e in sel if e.sensor_type == "Critical Interrupt"]
    slot = get_profile("dgx-h100").gpus[1]  # module 4 of the baseboard, on bus 43
    assert entry.sensor == f"PCIe SXM{slot.module_id}" and slot.bus_id.endswith("43:00.0")
    assert "Bus Fatal Error (bus 43 dev 00 fn 0)" in entry.event
    assert entry.at == T0 + 75
