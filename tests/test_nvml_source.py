"""The NVML source over the in-process simulator: the same code that reads a real GPU."""

from __future__ import annotations

import asyncio
import ctypes.util

import msgspec
import pytest

from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Health, Severity, normal_bus_id
from gpuconsole.readings.nvml import GpuReading, GpuState, PcieReading, RemoteKind
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100, NodeProfile
from gpuconsole.sources.base import SourceUnavailable
from gpuconsole.sources.nvml.source import NvmlSource, cpulist


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_796_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(  # type: ignore[no-untyped-def]
    profile: NodeProfile,
    *scenarios: str,
    clock: Clock | None = None,
    driver: str | None = None,
    privileged: bool = True,
    **kw: object,
):
    clock = clock or Clock()
    node = SimNode("dgx-test", profile, scenarios=scenarios, clock=clock, start=clock.now)
    lib = SimNvml(node, driver, privileged=privileged)
    source = NvmlSource("dgx-test", lib=lib, events=False, clock=clock, **kw)  # type: ignore[arg-type]
    return source, lib, clock


def test_a_dgx_h100_reads_as_eight_h100s_on_nvswitch() -> None:
    source, _lib, _ = make(DGX_H100)
    reading = source.collect()
    assert [g.name for g in reading.gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert [g.pci_bus_id for g in reading.gpus] == [normal_bus_id(s.bus_id) for s in DGX_H100.gpus]
    gpu = reading.gpus[0]
    assert gpu.sm_count == 132 and gpu.architecture == "hopper"
    assert gpu.mem_total_bytes == 80 * 1024**3
    assert gpu.power_limit_w == 700.0
    assert gpu.nvlinks_active == 18
    assert {link.remote_kind for link in gpu.nvlinks} == {RemoteKind.NVSWITCH}
    assert {link.remote_pci_bus_id for link in gpu.nvlinks} == {
        normal_bus_id(s.bus_id) for s in DGX_H100.nvswitches
    }
    assert gpu.numa_node == 0 and gpu.cpu_affinity == "0-55,112-167"
    assert reading.gpus[4].cpu_affinity == "56-111,168-223"
    assert gpu.fabric_state == "completed"
    assert gpu.pcie.gen_max == 5 and gpu.pcie.width_current == 16 and not gpu.pcie.downtrained
    assert reading.gpu_topology == DGX_H100.gpu_topology()
    assert reading.gpu_topology[0][1] == "NV18"
    assert reading.driver_version == DGX_H100.driver_version
    assert reading.cuda_driver_version == "12.4"


def test_gpm_figures_appear_from_the_second_detail_poll_on_hopper() -> None:
    source, _lib, clock = make(DGX_H100, detail_every=1)
    assert source.collect().gpus[0].gpm is None  # one sample is not a rate
    clock.now += 1.0
    gpm = source.collect().gpus[0].gpm
    assert gpm is not None and gpm.sm_util_pct is not None and 0 <= gpm.sm_util_pct <= 100
    assert gpm.nvlink_tx_bytes_per_s is not None and gpm.nvlink_tx_bytes_per_s > 0


def test_an_a100_has_no_gpm_and_follows_the_published_topology() -> None:
    source, _lib, clock = make(DGX_A100, detail_every=1)
    source.collect()
    clock.now += 1.0
    reading = source.collect()
    assert all(g.gpm is None for g in reading.gpus)
    assert reading.gpus[0].numa_node == 3 and reading.gpus[0].cpu_affinity == "48-63,176-191"
    assert reading.gpu_topology[0][7] == "NV12"
    assert reading.gpus[0].sm_count == 108


def test_a_pcie_server_has_no_nvlink_and_pci_levels_between_gpus() -> None:
    source, _lib, _ = make(APOLLO_PCIE)
    reading = source.collect()
    assert all(not g.nvlinks for g in reading.gpus)
    assert reading.gpu_topology[0][1] == "PIX" and reading.gpu_topology[0][4] == "SYS"
    assert reading.gpus[0].fabric_state is None
    assert "fabric_info" in reading.gpus[0].unsupported


def test_the_table_costs_four_nvml_calls_per_gpu_per_steady_poll() -> None:
    source, lib, clock = make(DGX_H100, detail_every=1000, inventory_every=1000)
    source.collect()  # first poll reads everything
    clock.now += 1.0
    source.collect()
    before = sum(lib.calls.values())
    for _ in range(5):
        clock.now += 1.0
        source.collect()
    per_gpu_per_poll = (sum(lib.calls.values()) - before) / 5 / 8
    assert per_gpu_per_poll == 4


def test_not_supported_is_remembered_per_gpu_and_not_asked_again() -> None:
    # asked again once per inventory round (a fault can pass), so none falls in this test
    source, lib, clock = make(DGX_H100, "notsupported:1", detail_every=1, inventory_every=30)
    first = source.collect()
    assert first.gpus[1].temp_gpu_c is None and first.gpus[1].state is GpuState.OK
    assert "utilization" in first.gpus[1].unsupported
    asked_before = lib.device_calls[1]
    clock.now += 1.0
    second = source.collect()
    assert lib.device_calls[1] - asked_before <= 2  # only NVLink probes by link number remain
    assert second.gpus[0].temp_gpu_c is not None


def test_a_lost_gpu_is_marked_and_the_others_keep_polling() -> None:
    source, _lib, clock = make(DGX_H100, "xid79:5@10")
    events = []
    source._emit = events.append  # what the hub would pass to start()
    assert source.collect().gpus[5].state is GpuState.OK
    clock.now += 11
    reading = source.collect()
    assert reading.gpus[5].state is GpuState.LOST
    assert reading.gpus[5].uuid == source.collect().gpus[5].uuid  # identity kept
    assert all(
        g.state is GpuState.OK and g.util_gpu_pct is not None for g in reading.gpus if g.index != 5
    )
    assert [e.kind for e in events] == ["gpu_lost"]
    assert events[0].gpu_index == 5


def test_a_thermal_throttle_shows_its_reason_clock_and_heat() -> None:
    source, _lib, _ = make(DGX_H100, "thermal:3")
    gpu = source.collect().gpus[3]
    assert "hw_thermal_slowdown" in gpu.throttle_reasons
    assert gpu.sm_clock_mhz == 1410
    assert gpu.temp_hbm_c == 95.0
    assert gpu.temp_gpu_c is not None and gpu.temp_gpu_c > 87


def test_ecc_errors_with_a_pending_remap() -> None:
    source, _lib, _ = make(DGX_H100, "ecc:2")
    ecc = source.collect().gpus[2].ecc
    assert ecc.remap_pending is True and (ecc.volatile_corrected or 0) > 0
    assert ecc.aggregate_uncorrected == 1


def test_a_mig_partitioned_gpu_lists_its_instances() -> None:
    source, _lib, clock = make(DGX_H100, "mig:7", detail_every=1)
    source.collect()
    clock.now += 1.0
    gpu = source.collect().gpus[7]
    assert gpu.mig_enabled is True
    assert [(m.profile_name, m.sm_count) for m in gpu.mig_instances] == [
        ("3g.40gb", 60),
        ("2g.20gb", 32),
        ("1g.10gb", 16),
        ("1g.10gb", 16),
    ]
    assert all(m.uuid.startswith("MIG-") for m in gpu.mig_instances)
    assert all(m.gpm is not None for m in gpu.mig_instances)
    assert gpu.util_gpu_pct is None  # NVML has no utilization for a GPU in MIG mode
    assert {p.gpu_instance_id for p in gpu.processes} <= {
        m.gpu_instance_id for m in gpu.mig_instances
    }


def test_a_missing_library_gives_one_clear_message() -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml")
    source = NvmlSource("n1", events=False)
    with pytest.raises(SourceUnavailable, match=r"libnvidia-ml\.so\.1 not found"):
        source.collect()


async def test_xid_events_reach_the_hub_from_the_event_thread() -> None:
    clock = Clock()
    node = SimNode("dgx-test", DGX_H100, scenarios=["xid79:5@30"], clock=clock, start=clock.now)
    hub = Hub()
    hub.add_source(NvmlSource("dgx-test", lib=SimNvml(node), interval_s=0.1, clock=clock))
    await hub.start()
    clock.now += 31  # the GPU falls off the bus while the event thread waits
    try:
        for _ in range(100):
            if any(e.kind == "xid" and e.code == 79 for e in hub.events()):
                break
            await asyncio.sleep(0.05)
    finally:
        await hub.stop()
    xids = [e for e in hub.events() if e.kind == "xid"]
    assert xids and xids[0].gpu_index == 5 and "fallen off the bus" in xids[0].message


@pytest.mark.parametrize(
    ("words", "expected"),
    [([0], ""), ([1], "0"), ([0b1011], "0-1,3"), ([0, 1], "64"), ([2**64 - 1, 1], "0-64")],
)
def test_cpu_masks_become_cpulists(words: list[int], expected: str) -> None:
    assert cpulist(words) == expected


def test_a_throttle_that_starts_is_an_event_and_idle_is_not() -> None:
    source, _lib, _ = make(DGX_H100, "thermal:3", detail_every=1)
    events: list[Event] = []
    source._emit = events.append
    source.collect()
    assert [(e.kind, e.gpu_index, e.severity) for e in events] == [
        ("throttle", 3, Severity.WARNING)
    ]
    assert "HW thermal slowdown" in events[0].message
    source.collect()
    assert len(events) == 1  # no change, no new event


def test_a_throttle_that_starts_between_bitmask_reads_shows_at_the_next_poll() -> None:
    # The bitmask is read every 10th poll; the driver's time counters (from R575) ride in
    # every batch.
    source, lib, clock = make(
        DGX_H100, "thermal:3@5", driver="580.82", detail_every=10, inventory_every=100
    )
    events: list[Event] = []
    source._emit = events.append
    assert source.collect().gpus[3].throttle_reasons == ()
    clock.now += 6.0
    lib_calls = sum(lib.calls.values())
    gpu = source.collect().gpus[3]
    assert "hw_thermal_slowdown" in gpu.throttle_reasons
    assert "sw_thermal_slowdown" in gpu.throttle_reasons
    assert (sum(lib.calls.values()) - lib_calls) / 8 == 4  # still a table-only poll
    assert [(e.kind, e.gpu_index, e.severity) for e in events] == [
        ("throttle", 3, Severity.WARNING)
    ]
    assert source.collect().gpus[0].throttle_reasons == ()  # the others were never held


def test_gpm_sample_buffers_go_back_to_nvml_on_close() -> None:
    source, lib, clock = make(DGX_H100, "mig:7", detail_every=1)
    for _ in range(3):
        source.collect()
        clock.now += 1.0
    assert lib._samples  # the GPU's and each MIG instance's two buffers
    asyncio.run(source.close())
    assert lib._samples == {}
    assert lib.calls["nvmlGpmSampleFree"] == lib.calls["nvmlGpmSampleAlloc"] == 2 * (8 + 4)


async def test_ecc_events_reach_the_hub_from_the_event_thread() -> None:
    node = SimNode("dgx-test", DGX_H100, scenarios=["ecc:2"])
    hub = Hub()
    hub.add_source(NvmlSource("dgx-test", lib=SimNvml(node), interval_s=0.2, simulated=True))
    await hub.start()
    try:
        for _ in range(100):
            if any(e.kind == "ecc" for e in hub.events()):
                break
            await asyncio.sleep(0.05)
    finally:
        await hub.stop()
    ecc = [e for e in hub.events() if e.kind == "ecc"]
    assert [(e.gpu_index, e.severity) for e in ecc] == [(2, Severity.INFO)]
    assert ecc[0].gpu_uuid == node.uuids[2]
    assert "single-bit ECC error on GPU 2" in ecc[0].message


def test_after_a_gpu_is_rebound_nvml_is_restarted_and_numbers_the_gpus_again() -> None:
    source, lib, clock = make(DGX_H100, detail_every=1)
    node = source._lib.node
    assert len(source.collect().gpus) == 8
    # GPU 2 goes to a guest (vfio-pci): NVML keeps its old numbering until it restarts.
    node.retenant(passthrough=frozenset({2}), idle=frozenset())
    clock.now += 1.0
    assert len(source.collect().gpus) == 8
    source.rediscover()
    clock.now += 1.0
    gpus = source.collect().gpus
    assert [g.pci_bus_id for g in gpus] == [
        normal_bus_id(s.bus_id) for s in DGX_H100.gpus if s.index != 2
    ]
    assert [g.index for g in gpus] == list(range(7))  # renumbered, as a real host does
    assert lib.calls["nvmlInit"] == 2 and lib.calls["nvmlShutdown"] == 1


@pytest.mark.parametrize(
    ("profile", "lost_gpu", "to_guest", "renumbered"),
    [(DGX_H100, 5, 3, 4), (DGX_A100, 6, 4, 5)],  # a DGX A100 numbers 87:00.0 after bd:00.0
    ids=["h100", "a100"],
)
def test_a_lost_gpu_keeps_its_identity_and_its_one_lost_event_when_nvml_renumbers(
    profile: NodeProfile, lost_gpu: int, to_guest: int, renumbered: int
) -> None:
    source, lib, clock = make(profile, f"xid79:{lost_gpu}@10", detail_every=1)
    events: list[Event] = []
    source._emit = events.append  # what the hub would pass to start()
    seen = source.collect().gpus[lost_gpu]
    clock.now += 11
    lost = source.collect().gpus[lost_gpu]
    assert lost.state is GpuState.LOST and lost.lost_since == clock.now
    # a GPU goes to a guest: NVML restarts, numbers the others again, and the lost GPU
    # cannot even name itself any more
    lib.node.retenant(passthrough=frozenset({to_guest}), idle=frozenset())
    source.rediscover()
    clock.now += 30
    again = source.collect().gpus[renumbered]
    assert again.state is GpuState.LOST
    assert (again.pci_bus_id, again.uuid) == (seen.pci_bus_id, seen.uuid)
    assert again.serial == seen.serial and again.module_id == seen.module_id
    assert again.lost_since == lost.lost_since  # lost since then, not since the restart
    assert [e.kind for e in events] == ["gpu_lost"]
    assert events[0].gpu_uuid == seen.uuid


def test_a_gpu_event_names_its_gpu_by_bus_id_which_nvml_renumbering_does_not_change() -> None:
    source, lib, clock = make(DGX_H100, "thermal:3", "xid79:5@10", detail_every=1)
    events: list[Event] = []
    source._emit = events.append
    gpus = source.collect().gpus
    clock.now += 11
    source.collect()
    hot, lost = gpus[3].pci_bus_id, gpus[5].pci_bus_id
    assert [(e.kind, e.gpu_index, e.gpu_bus_id) for e in events] == [
        ("throttle", 3, hot),
        ("gpu_lost", 5, lost),
    ]
    assert events[1].message.startswith("GPU 5 (c3:00.0) is lost")  # the number it had then
    lib.node.retenant(passthrough=frozenset({2}), idle=frozenset())
    source.rediscover()
    clock.now += 30
    assert source.collect().gpus[4].pci_bus_id == lost  # GPU 4 now, and still lost
    assert [e.kind for e in events] == ["throttle", "gpu_lost"]


def test_a_gpu_lost_before_nvml_read_it_is_told_without_a_uuid_it_never_said() -> None:
    source, _lib, _clock = make(DGX_H100, "xid79:5", detail_every=1)
    events: list[Event] = []
    source._emit = events.append
    assert source.collect().gpus[5].uuid == "unknown-5"  # NVML's reading keeps its place
    assert [(e.kind, e.gpu_index, e.gpu_uuid, e.gpu_bus_id) for e in events] == [
        ("gpu_lost", 5, None, None)
    ]


def test_a_gpu_lost_before_nvml_first_read_it_stays_lost_since_then_when_nvml_renumbers() -> None:
    source, lib, clock = make(DGX_H100, "xid79:5", detail_every=1)
    events: list[Event] = []
    source._emit = events.append
    lost = source.collect().gpus[5]
    assert lost.state is GpuState.LOST and lost.uuid == "unknown-5"  # it never said
    lib.node.retenant(passthrough=frozenset({3}), idle=frozenset())
    source.rediscover()
    clock.now += 30
    again = source.collect().gpus[4]
    assert again.state is GpuState.LOST and again.lost_since == lost.lost_since
    assert [e.kind for e in events] == ["gpu_lost"]


def test_a_link_below_its_generation_is_downtrained_only_while_the_gpu_works() -> None:
    idle = PcieReading(gen_current=1, gen_max=5, width_current=16, width_max=16, busy=False)
    assert not idle.downtrained  # an idle GPU trains its link down: power saving
    assert not msgspec.structs.replace(
        idle, busy=None
    ).downtrained  # load unknown (MIG mode): no alarm
    assert msgspec.structs.replace(idle, busy=True).downtrained
    assert msgspec.structs.replace(
        idle, gen_current=5, width_current=8
    ).downtrained  # narrower: always
    gpu = GpuReading(index=0, uuid="GPU-x", name="NVIDIA H100 80GB HBM3", pci_bus_id="x")
    assert reading_verdict(msgspec.structs.replace(gpu, pcie=idle)).health is Health.OK
    assert (
        reading_verdict(
            msgspec.structs.replace(gpu, pcie=msgspec.structs.replace(idle, busy=True))
        ).health
        is Health.WARNING
    )


def test_the_simulator_plays_the_driver_its_node_names() -> None:
    """A DGX A100 on 535: no nvmlDeviceGetTemperatureV, no PCIe byte counters, attributes for
    MIG devices only, NVLink 3.0 as nvmlNvlinkVersion_t 4; the reading is whole all the same."""
    source, lib, _ = make(DGX_A100, "mig:1", detail_every=1)
    gpus = source.collect().gpus
    assert lib.driver.name == "535"
    assert lib.calls["nvmlDeviceGetTemperatureV"] == 8 and lib.calls["nvmlDeviceGetTemperature"]
    assert all(g.temp_gpu_c is not None for g in gpus)
    assert {g.sm_count for g in gpus} == {108}
    assert sorted(m.sm_count for m in gpus[1].mig_instances) == [14, 14, 28, 42]
    assert {link.version for g in gpus for link in g.nvlinks} == {3}
    assert all(g.pcie.tx_bytes_total is None for g in gpus)
    assert all(g.pcie.tx_bytes_per_s is not None for g in gpus)
    assert all(g.unsupported == () for g in gpus if g.index != 1)


def test_as_an_unprivileged_user_every_gpu_stays_ok_and_mig_devices_tell_their_own() -> None:
    source, _lib, clock = make(
        DGX_H100, "mig:7", privileged=False, detail_every=1, inventory_every=3
    )
    for _ in range(5):
        reading = source.collect()
        assert all(g.state is GpuState.OK for g in reading.gpus), [g.error for g in reading.gpus]
        clock.now += 1.0
    mig, plain = reading.gpus[7], reading.gpus[0]
    assert mig.denied == ("gpm", "memory", "mig_placement", "processes")
    assert plain.denied == ("gpm",) and plain.gpm is None and plain.mem_used_bytes is not None
    assert sorted(m.profile_name for m in mig.mig_instances) == sorted(
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    )
    assert all(m.placement_start is None for m in mig.mig_instances)  # root's to read
    assert {p.gpu_instance_id for p in mig.processes} <= {1, 2, 3, 4} and mig.processes
    assert sum(m.mem_used_bytes or 0 for m in mig.mig_instances) == sum(
        p.used_mem_bytes or 0 for p in mig.processes
    )


def test_a_gpu_that_falls_off_the_bus_while_it_is_discovered_leaves_the_others() -> None:
    clock = Clock()
    node = SimNode("dgx-test", DGX_H100, scenarios=("xid79:5@10",), clock=clock, start=clock.now)

    class FallsOffOnceOpened(SimNvml):
        """GPU 5 falls off the bus just after NVML opened it and read its bus id."""

        def nvmlDeviceGetPciInfo(self, h):  # type: ignore[no-untyped-def]
            info = super().nvmlDeviceGetPciInfo(h)
            if h.index == 5:
                clock.now += 20
            return info

    source = NvmlSource("dgx-test", lib=FallsOffOnceOpened(node), events=False, clock=clock)
    events: list[Event] = []
    source._emit = events.append  # what the hub would pass to start()
    reading = source.collect()
    lost = reading.gpus[5]
    assert lost.state is GpuState.LOST
    assert lost.pci_bus_id == normal_bus_id(DGX_H100.gpus[5].bus_id)  # known before it fell
    assert all(g.state is GpuState.OK for g in reading.gpus if g.index != 5)
    assert [(e.kind, e.gpu_index) for e in events] == [("gpu_lost", 5)]


def test_a_gpu_lost_at_start_is_said_once_however_often_the_node_is_read_afresh(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`remediate` on a lost GPU reads its node afresh while it waits, a new source each
    time: the GPU NVML cannot open is said once, not once a reading."""
    clock = Clock()
    node = SimNode("dgx-once", DGX_H100, scenarios=["xid79:5@0"], clock=clock, start=clock.now)
    clock.now += 5
    with caplog.at_level("WARNING", logger="gpuconsole.sources.nvml.source"):
        for _ in range(3):
            source = NvmlSource("dgx-once", lib=SimNvml(node), events=False, clock=clock)
            assert source.collect().gpus[5].state is GpuState.LOST
            source.close_blocking()
    said = [r.getMessage() for r in caplog.records if "GPU 5" in r.getMessage()]
    assert said == ["dgx-once: GPU 5 unreadable at start: GPU is lost"], said
