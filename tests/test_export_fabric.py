"""Fabric metrics under node_exporter's node_infiniband_* names, port roles and problems,
and which NIC each GPU should pair with for GPUDirect RDMA."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from gpuconsole.hub import Hub
from gpuconsole.readings.base import SourceStatus
from gpuconsole.readings.fabric import (
    AffinityFlag,
    FabricDevice,
    FabricPort,
    FabricReading,
    GpuAffinity,
    NetdevStats,
    NicLevel,
    PortRole,
)
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.fabric import FabricSource
from tests.export_fixtures import (
    FIXED,
    frozen_body,
    frozen_fleet,
    label_names,
    one,
    parse,
    pick,
    render,
)
from tests.fabric_fixtures import dgx_h100_slice, set_value, ttar_sysfs

PORT_LABELS = frozenset({"node", "device", "port"})


def test_every_port_counter_carries_node_exporters_name_labels_and_value() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    node = snapshot.node("dgx-002")
    assert node is not None and node.fabric is not None
    checked = 0
    for device in node.fabric.devices:
        for port in device.ports:
            where = {"node": "dgx-002", "device": device.name, "port": str(port.port)}
            rcv, xmit = port.counter("port_rcv_data"), port.counter("port_xmit_data")
            assert rcv is not None and xmit is not None
            received = one(metrics["node_infiniband_port_data_received_bytes_total"], **where)
            sent = one(metrics["node_infiniband_port_data_transmitted_bytes_total"], **where)
            assert received.value == 4 * rcv and sent.value == 4 * xmit  # sysfs counts octets/4
            symbol = one(metrics["node_infiniband_symbol_error_total"], **where)
            assert symbol.value == port.counter("symbol_error")
            wait = one(metrics["node_infiniband_port_transmit_wait_total"], **where)
            assert wait.value == port.counter("port_xmit_wait")
            assert one(metrics["node_infiniband_state_id"], **where).value == port.state_id == 4
            physical = one(metrics["node_infiniband_physical_state_id"], **where)
            assert physical.value == port.phys_state_id == 5
            rate = one(metrics["node_infiniband_rate_bytes_per_second"], **where)
            assert port.rate_gbps is not None and rate.value == port.rate_gbps * 125_000_000
            checked += 1
        info = one(metrics["node_infiniband_info"], node="dgx-002", device=device.name)
        assert info.labels["board_id"] == device.board_id
        assert info.labels["firmware_version"] == device.fw_ver
        assert info.labels["hca_type"] == device.hca_type
    assert checked == len(node.fabric.ports) >= 8
    for name, samples in metrics.items():
        if name.startswith("node_infiniband_") and name != "node_infiniband_info":
            assert label_names(samples) == {PORT_LABELS}, name


def test_roce_hw_counters_get_node_exporters_names() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    node = snapshot.node("dgx-001")
    assert node is not None and node.fabric is not None
    roce = [p for p in node.fabric.ports if p.link_layer == "Ethernet"]
    assert roce
    for port in roce:
        where = {"node": "dgx-001", "device": port.device, "port": str(port.port)}
        for file, name in (
            ("np_cnp_sent", "node_infiniband_np_cnp_packets_sent_total"),
            ("rp_cnp_handled", "node_infiniband_rp_cnp_packets_handled_total"),
            ("out_of_sequence", "node_infiniband_out_of_sequence_packets_received_total"),
            ("packet_seq_err", "node_infiniband_packet_sequence_errors_total"),
        ):
            value = port.counter(file)
            if value is not None:
                assert one(metrics[name], **where).value == value
    # a hw_counters file node_exporter has no name for is kept, raw, by its sysfs name
    ib = next(
        p for p in node.fabric.ports if p.counter("req_transport_retries_exceeded") is not None
    )
    extra = one(
        metrics["gpuconsole_fabric_port_hw_stat_total"],
        node="dgx-001",
        device=ib.device,
        stat="req_transport_retries_exceeded",
    )
    assert extra.value == ib.counter("req_transport_retries_exceeded")


def test_ports_have_roles_and_every_gpu_its_nearest_nic() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    node = snapshot.node("dgx-002")
    assert node is not None and node.fabric is not None
    roles = {
        s.labels["device"]: s.labels["role"]
        for s in pick(metrics["gpuconsole_fabric_port_info"], node="dgx-002")
    }
    assert roles == {p.device: p.role.value for p in node.fabric.ports}
    assert sorted(set(roles.values())) == ["compute", "management", "storage"]
    pairs = pick(metrics["gpuconsole_gpu_nic_affinity_info"], node="dgx-002")
    assert len(pairs) == len(node.gpus) == 8
    for gpu in node.gpus:
        pair = one(pairs, gpu=str(gpu.index))
        assert pair.labels["uuid"] == gpu.uuid and pair.labels["level"] == "PIX"
        assert pair.labels["numa"] == str(gpu.numa_node)
    assert one(metrics["gpuconsole_fabric_peermem_loaded"], node="dgx-002").value == 1.0


def _port(device: str, **changes: object) -> FabricPort:
    fields: dict[str, object] = {
        "device": device,
        "port": 1,
        "state": "ACTIVE",
        "state_id": 4,
        "phys_state": "LinkUp",
        "phys_state_id": 5,
        "link_layer": "InfiniBand",
        "role": PortRole.COMPUTE,
        "role_from": "config",
        "rate_gbps": 400.0,
        "width": 4,
        "counters": (("port_rcv_data", 10, 64), ("symbol_error", 7, 32)),
    }
    fields.update(changes)
    return FabricPort(**fields)  # type: ignore[arg-type]


def _snapshot(
    fabric: FabricReading,
    *,
    fresh: bool = True,
    rates: dict[tuple[str, ...], float],
    deltas: dict[tuple[str, ...], int] | None = None,
) -> FleetSnapshot:
    status = SourceStatus(
        node="n1",
        source="fabric",
        ok=fresh,
        last_ok_at=FIXED - 30,
        stale_since=None if fresh else FIXED - 20,
        error=None if fresh else "timeout",
        polls=3,
    )
    node = NodeSnapshot(
        node="n1",
        fabric=fabric,
        statuses=(status,),
        rates=MappingProxyType(rates),
        deltas=MappingProxyType(deltas or {}),
    )
    return FleetSnapshot(seq=1, at=FIXED, nodes=(node,))


HAND_MADE = FabricReading(
    at=FIXED,
    devices=(
        FabricDevice("mlx5_0", "0000:18:00.0", 0, ports=(_port("mlx5_0"),)),
        FabricDevice(
            "mlx5_1",
            "0000:29:00.0",
            0,
            ports=(
                _port(
                    "mlx5_1",
                    state="DOWN",
                    state_id=1,
                    phys_state="Disabled",
                    phys_state_id=3,
                    link_layer="Ethernet",
                    role=PortRole.STORAGE,
                    netdev="enp41s0f0np0",
                    netdev_stats=NetdevStats("enp41s0f0np0", "DOWN", carrier=False),
                ),
            ),
        ),
    ),
    gpus=(
        GpuAffinity(
            "0000:1b:00.0",
            numa_node=0,
            levels=(NicLevel("mlx5_0", "PIX"),),
            best_device="mlx5_0",
            best_level="PIX",
            flags=(AffinityFlag.NO_PEERMEM,),
        ),
    ),
    peermem_loaded=False,
)


def test_a_down_rail_is_critical_and_a_moving_error_counter_a_warning() -> None:
    key = ("fabric", "mlx5_0", "1", "symbol_error")
    metrics = parse(render(_snapshot(HAND_MADE, rates={key: 3.0}, deltas={key: 6})))
    severity = metrics["gpuconsole_fabric_port_severity"]
    assert one(severity, device="mlx5_1").value == 2.0
    assert one(severity, device="mlx5_0").value == 1.0
    problems = metrics["gpuconsole_fabric_port_problem"]
    assert one(problems, device="mlx5_1", problem="link_down").labels["severity"] == "critical"
    assert one(problems, device="mlx5_0", problem="symbol_error").labels["severity"] == "warning"
    assert one(metrics["gpuconsole_fabric_port_netdev_up"], netdev="enp41s0f0np0").value == 0.0
    assert one(metrics["gpuconsole_fabric_port_netdev_carrier"], device="mlx5_1").value == 0.0
    assert one(metrics["node_infiniband_state_id"], device="mlx5_1").value == 1.0
    flag = one(metrics["gpuconsole_gpu_gpudirect_flag"], pci_bus_id="0000:1b:00.0")
    assert flag.labels["flag"] == "no_peermem" and flag.labels["gpu"] == ""  # NVML: no GPUs
    assert one(metrics["gpuconsole_fabric_peermem_loaded"], node="n1").value == 0.0


def test_an_error_counter_that_did_not_move_this_interval_is_no_problem() -> None:
    key = ("fabric", "mlx5_0", "1", "symbol_error")
    metrics = parse(render(_snapshot(HAND_MADE, rates={key: 0.0})))  # rate 0, no delta
    assert one(metrics["gpuconsole_fabric_port_severity"], device="mlx5_0").value == 0.0
    assert not pick(metrics["gpuconsole_fabric_port_problem"], device="mlx5_0")


async def test_the_counter_cache_lifespan_is_read_from_sysfs_and_exported_in_seconds(
    tmp_path: Path,
) -> None:
    fs = dgx_h100_slice(tmp_path)
    ports = fs.root / "class" / "infiniband"
    # mlx5_6 keeps the driver's default of 10 ms, which node_exporter's integer division
    # exports as 0 s; mlx5_1's firmware does not say.
    set_value(ports / "mlx5_0" / "ports" / "1", "lifespan", 2000, "hw_counters")
    set_value(ports / "mlx5_1" / "ports" / "1", "lifespan", "N/A (no PMA)", "hw_counters")
    hub = Hub(clock=lambda: FIXED)
    hub.add_source(FabricSource("n1", sysfs_root=str(tmp_path), netlink=False))
    metrics = parse(render(await hub.poll_once()))
    lifespan = metrics["node_infiniband_lifespan_seconds"]
    assert {s.labels["device"]: s.value for s in lifespan} == {"mlx5_0": 2.0, "mlx5_6": 0.0}
    assert label_names(lifespan) == {PORT_LABELS}


def test_a_stale_fabric_source_drops_node_exporters_series_but_keeps_its_own() -> None:
    metrics = parse(render(_snapshot(HAND_MADE, fresh=False, rates={})))
    assert not [name for name in metrics if name.startswith("node_infiniband_")]
    assert len(metrics["gpuconsole_fabric_port_info"]) == 2
    assert one(metrics["gpuconsole_source_up"], source="fabric").value == 0.0


async def test_a_pegged_port_counter_is_a_series_of_its_own_named_by_its_counter(
    tmp_path: Path,
) -> None:
    """node_exporter's own tree: mlx4_0 port 1's port_xmit_wait reads 4294967295, a 32-bit
    PortCounter at its maximum (its node_infiniband_* counter reads that and no more);
    then link_downed (8 bits) reaches 255 there too. One gauge a pegged counter, with the
    port's labels and the counter's sysfs name; none for a port with none pegged; kept
    with the last reading while the source is stale, as every gpuconsole_* series."""
    root = ttar_sysfs("node-exporter-ib", tmp_path / "ne")
    hub = Hub(clock=lambda: FIXED)
    hub.add_source(FabricSource("n1", sysfs_root=str(root), netlink=False))

    def pegged(snapshot: FleetSnapshot) -> set[tuple[str, str, str, float]]:
        found = parse(render(snapshot)).get("gpuconsole_fabric_port_counter_pegged", [])
        assert label_names(found) <= {PORT_LABELS | {"counter"}}
        return {(s.labels["device"], s.labels["port"], s.labels["counter"], s.value) for s in found}

    assert pegged(await hub.poll_once()) == {("mlx4_0", "1", "port_xmit_wait", 1.0)}
    set_value(root / "class/infiniband/mlx4_0/ports/1", "link_downed", 255)
    snapshot = await hub.poll_once()
    assert pegged(snapshot) == {
        ("mlx4_0", "1", "port_xmit_wait", 1.0),
        ("mlx4_0", "1", "link_downed", 1.0),
    }
    node = snapshot.nodes[0]
    stale = SourceStatus("n1", "fabric", False, last_ok_at=FIXED - 60, polls=3)
    kept = FleetSnapshot(1, FIXED, (NodeSnapshot("n1", fabric=node.fabric, statuses=(stale,)),))
    assert pegged(kept) == pegged(snapshot)
