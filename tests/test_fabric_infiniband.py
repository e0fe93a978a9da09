"""The fabric source over fake sysfs trees laid out like real mlx5 devices (IB and RoCE)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.fabric import (
    FabricPort,
    FabricReading,
    PortRole,
    port_deltas,
    port_problems,
    port_rates,
    port_traffic,
)
from gpuconsole.sources.base import SourceUnavailable
from gpuconsole.sources.fabric import FabricSource
from gpuconsole.sources.fabric.infiniband import parse_rate, parse_state
from tests.fabric_fixtures import dgx_h100_slice, set_value, ttar_sysfs


class Ticker:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def source(root: Path, **kw: object) -> FabricSource:
    return FabricSource("node-a", sysfs_root=str(root), netlink=False, **kw)  # type: ignore[arg-type]


async def read(src: FabricSource, events: list[Event] | None = None) -> FabricReading:
    await src.start((events if events is not None else []).append)
    try:
        return await src.poll()
    finally:
        await src.close()


def hub_with(src: FabricSource) -> tuple[Hub, Ticker]:
    ticker = Ticker()
    hub = Hub(clock=lambda: 1_796_000_000.0, monotonic=ticker)
    hub.add_source(src)
    return hub, ticker


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", (400.0, 4, "NDR")),
        ("200 Gb/sec (4X HDR)\n", (200.0, 4, "HDR")),
        ("2.5 Gb/sec (1X SDR)", (2.5, 1, "SDR")),
        ("10 Gb/sec (4X)", (10.0, 4, None)),
        ("", (None, None, None)),
        ("fast", (None, None, None)),
    ],
)
def test_rates_parse_like_the_kernel_prints_them(text: str, expected: tuple[object, ...]) -> None:
    assert parse_rate(text) == expected


def test_states_parse_to_id_and_name() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("5: LinkUp") == (5, "LinkUp")
    assert parse_state("garbage") == (None, "garbage")


async def test_an_ndr_port_reads_its_identity_state_rate_and_counters(tmp_path: Path) -> None:
    dgx_h100_slice(tmp_path)
    reading = await read(source(tmp_path))
    assert [d.name for d in reading.devices] == ["mlx5_0", "mlx5_1", "mlx5_6"]
    dev = reading.device("mlx5_0")
    assert dev is not None
    assert dev.pci_bus_id == "0000:18:00.0" and dev.numa_node == 0 and dev.socket == 0
    assert (dev.fw_ver, dev.board_id, dev.hca_type) == ("28.39.1002", "MT_0000000838", "MT4129")
    assert dev.node_guid == "b83f:d203:0011:2233"
    port = reading.port("mlx5_0")
    assert port is not None
    assert (port.state, port.state_id, port.phys_state, port.phys_state_id) == (
        "ACTIVE",
        4,
        "LinkUp",
        5,
    )
    assert (port.rate_gbps, port.width, port.speed) == (400.0, 4, "NDR")
    assert port.link_layer == "InfiniBand" and port.lid == 0x1A and port.sm_lid == 1
    assert port.netdev == "ibp24s0" and port.netdev_error is None
    assert port.counter("symbol_error") == 0 and port.counter("out_of_sequence") == 0
    assert port.counter("lifespan") is None  # a setting, not a counter
    assert port.hw_counters_lifespan_ms == 10  # the mlx5 default
    assert not port_problems(port, lambda name: None)


async def test_data_counters_are_octets_divided_by_four(tmp_path: Path) -> None:
    port_dir = dgx_h100_slice(tmp_path).root / "class/infiniband/mlx5_0/ports/1"
    set_value(port_dir, "port_xmit_data", 1_000_000)
    hub, ticker = hub_with(source(tmp_path))
    await hub.poll_once()
    set_value(port_dir, "port_xmit_data", 1_000_000 + 2_500_000_000)  # 10 GB more
    set_value(port_dir, "port_rcv_data", 250)
    ticker.now += 2.0
    node = (await hub.poll_once()).nodes[0]
    assert node.fabric is not None
    port = node.fabric.port("mlx5_0")
    assert port is not None and port.xmit_bytes_total == 4 * 2_501_000_000
    tx, rx = port_traffic(port, port_rates(node.rate, port))
    assert tx == pytest.approx(5e9)  # bytes per second
    assert rx == pytest.approx(500.0)
    assert node.history is not None
    assert node.history.series("fabric", "mlx5_0", "1", "port_xmit_data")


async def test_a_32_bit_hw_counter_that_wraps_keeps_its_rate(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    roce = fs.root / "class/infiniband/mlx5_1/ports/1"
    set_value(roce, "np_cnp_sent", 2**32 - 100, "hw_counters")
    hub, ticker = hub_with(source(tmp_path))
    await hub.poll_once()
    set_value(roce, "np_cnp_sent", 400, "hw_counters")  # wrapped past 2^32
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert node.rate("fabric", "mlx5_1", "1", "np_cnp_sent") == pytest.approx(500.0)


async def test_port_counters_are_as_wide_as_the_kernel_reads_them_and_peg_at_their_maximum(
    tmp_path: Path,
) -> None:
    # drivers/infiniband/core/sysfs.c: link_downed 8 bits, symbol_error 16, local link
    # integrity errors 4, transmit wait 32; PortCounters saturate there, never wrap
    fs = dgx_h100_slice(tmp_path)
    rail = fs.root / "class/infiniband/mlx5_0/ports/1"
    for name, value in (("link_downed", 250), ("symbol_error", 65_000)):
        set_value(rail, name, value)
    hub, ticker = hub_with(source(tmp_path))
    await hub.poll_once()
    set_value(rail, "link_downed", 255)  # five more flaps, and its last one
    set_value(rail, "symbol_error", 65_535)
    set_value(rail, "local_link_integrity_errors", 15)
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert node.delta("fabric", "mlx5_0", "1", "link_downed") == 5
    assert node.fabric is not None
    port = node.fabric.port("mlx5_0")
    assert port is not None
    widths = {name: bits for name, _value, bits in port.counters}
    assert [widths[n] for n in ("link_downed", "symbol_error", "local_link_integrity_errors")] == [
        8,
        16,
        4,
    ]
    assert (widths["port_xmit_wait"], widths["port_xmit_data"]) == (32, 64)  # extended PMA
    assert port.pegged == (
        ("link_downed", 255),
        ("local_link_integrity_errors", 15),
        ("symbol_error", 65_535),
    )
    assert [e.message for e in hub.events() if e.kind == "counter_pegged"] == [
        f"mlx5_0/1 (compute) {words} counter pegged at {value}, its maximum: it counts no "
        "more until it is cleared (perfquery -R)"
        for words, value in (
            ("link downed", 255),
            ("link integrity errors", 15),
            ("symbol errors", 65_535),
        )
    ]
    # Cleared (perfquery -R), then down three times: a clear, not a wrap of 8 bits (+4)
    set_value(rail, "link_downed", 3)
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert node.delta("fabric", "mlx5_0", "1", "link_downed") is None
    assert node.fabric.port("mlx5_0").pegged[0][0] == "local_link_integrity_errors"  # type: ignore[union-attr]
    assert hub.events()[-1].message == "mlx5_0/1 (compute) link downed counts again"
    # A value past a counter's width (a driver of its own) proves it wide: never pegged
    set_value(rail, "link_downed", 300)
    set_value(rail, "symbol_error", 0)
    set_value(rail, "local_link_integrity_errors", 0)
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    port = node.fabric.port("mlx5_0")  # type: ignore[union-attr]
    assert port is not None and port.pegged == ()
    assert dict((n, b) for n, _v, b in port.counters)["link_downed"] == 64


async def test_a_reset_counter_gives_no_rate_rather_than_a_bogus_one(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    ib = fs.root / "class/infiniband/mlx5_0/ports/1"
    set_value(ib, "port_xmit_data", 7 * 2**40)  # 64-bit, extended PMA
    set_value(ib, "link_downed", 200)
    hub, ticker = hub_with(source(tmp_path))
    await hub.poll_once()
    set_value(ib, "port_xmit_data", 12)  # `perfquery -x -R` or a driver reload
    set_value(ib, "link_downed", 0)
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert node.rate("fabric", "mlx5_0", "1", "port_xmit_data") is None
    assert node.rate("fabric", "mlx5_0", "1", "link_downed") is None
    assert node.delta("fabric", "mlx5_0", "1", "link_downed") is None  # unknown, not 0
    set_value(ib, "port_xmit_data", 1012)
    ticker.now += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert node.rate("fabric", "mlx5_0", "1", "port_xmit_data") == pytest.approx(1000.0)


async def test_errors_are_deltas_per_interval_with_a_severity_and_an_event_as_they_start(
    tmp_path: Path,
) -> None:
    fs = dgx_h100_slice(tmp_path)
    rail = fs.root / "class/infiniband/mlx5_6/ports/1"
    hub, ticker = hub_with(source(tmp_path))
    await hub.poll_once()
    climbed = {
        "link_downed": 1,
        "link_error_recovery": 2,
        "symbol_error": 37,
        "port_rcv_errors": 5,
        "port_xmit_discards": 3,
        "port_xmit_wait": 900_000,  # congestion, not an error: a rate decides how bad
    }
    for name, value in climbed.items():
        set_value(rail, name, value)
    ticker.now += 2.0
    node = (await hub.poll_once()).nodes[0]
    assert {name: node.delta("fabric", "mlx5_6", "1", name) for name in climbed} == climbed
    assert node.delta("fabric", "mlx5_0", "1", "symbol_error") == 0  # a clean rail
    assert node.fabric is not None
    port = node.fabric.port("mlx5_6")
    assert port is not None
    problems = port_problems(port, port_rates(node.rate, port), port_deltas(node.delta, port))
    assert [(p.severity, p.what) for p in problems] == [
        (Severity.CRITICAL, "link downed +1 (0.5/s)"),
        (Severity.WARNING, "link error recovery +2 (1/s)"),
        (Severity.WARNING, "symbol errors +37 (18.5/s)"),
        (Severity.WARNING, "receive errors +5 (2.5/s)"),
        (Severity.WARNING, "transmit discards +3 (1.5/s)"),
        (Severity.WARNING, "congestion: transmit wait 4.5e+05/s"),
    ]
    assert [(e.kind, e.severity, e.message) for e in hub.events()] == [
        ("port_errors", Severity.CRITICAL, "mlx5_6/1 (compute) link downed +1 in 2 s"),
        ("port_errors", Severity.WARNING, "mlx5_6/1 (compute) link error recovery +2 in 2 s"),
        ("port_errors", Severity.WARNING, "mlx5_6/1 (compute) symbol errors +37 in 2 s"),
        ("port_errors", Severity.WARNING, "mlx5_6/1 (compute) receive errors +5 in 2 s"),
        ("port_errors", Severity.WARNING, "mlx5_6/1 (compute) transmit discards +3 in 2 s"),
    ]
    # Still climbing: still problems, but no second round of events.
    set_value(rail, "symbol_error", 37 + 40)
    ticker.now += 2.0
    node = (await hub.poll_once()).nodes[0]
    assert node.delta("fabric", "mlx5_6", "1", "symbol_error") == 40
    assert len(hub.events()) == 5
    # Quiet again: a delta of 0, a healthy port; the next climb is news again.
    ticker.now += 2.0
    node = (await hub.poll_once()).nodes[0]
    assert node.delta("fabric", "mlx5_6", "1", "symbol_error") == 0
    port = node.fabric.port("mlx5_6")  # type: ignore[union-attr]
    assert port is not None
    assert not port_problems(port, port_rates(node.rate, port), port_deltas(node.delta, port))
    set_value(rail, "symbol_error", 80)
    ticker.now += 2.0
    await hub.poll_once()
    assert hub.events()[-1].message == "mlx5_6/1 (compute) symbol errors +3 in 2 s"


async def test_a_value_past_32_bits_makes_a_hw_counter_64_bit_for_good(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    roce = fs.root / "class/infiniband/mlx5_1/ports/1"
    set_value(roce, "rp_cnp_handled", 2**33, "hw_counters")
    src = source(tmp_path)
    first = await src.poll()
    set_value(roce, "rp_cnp_handled", 5, "hw_counters")
    second = await src.poll()
    await src.close()
    bits = [
        dict((n, b) for n, _v, b in r.ports[1].hw_counters)["rp_cnp_handled"]
        for r in (first, second)
    ]
    assert bits == [64, 64]


async def test_counters_without_a_pma_are_skipped_not_fatal(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    port_dir = fs.hca(
        "mlx5_4",
        ("pci0000:50", "0000:50:01.0", "0000:4f:00.0"),
        numa=0,
        counters={"port_xmit_data": "N/A (no PMA)", "symbol_error": "N/A (no PMA)"},
    )
    (port_dir / "hw_counters" / "lifespan").write_text("N/A (no PMA)\n")
    reading = await read(source(tmp_path))
    port = reading.port("mlx5_4")
    assert port is not None and port.no_pma and port.counters == ()
    assert port.hw_counters_lifespan_ms is None
    assert port.counter("out_of_sequence") == 0  # hw_counters still read
    assert reading.port("mlx5_0") is not None and not reading.port("mlx5_0").no_pma  # type: ignore[union-attr]


async def test_files_and_devices_vanishing_mid_read_drop_only_what_vanished(
    tmp_path: Path,
) -> None:
    fs = dgx_h100_slice(tmp_path)
    events: list[Event] = []
    src = source(tmp_path)
    await src.start(events.append)
    first = await src.poll()
    assert first.port("mlx5_6") is not None
    # one counter goes away after the layout was listed, then a whole HCA (unbound)
    (fs.root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").unlink()
    device = (fs.root / "class/infiniband/mlx5_6").resolve()
    shutil.rmtree(device)
    second = await src.poll()
    await src.close()
    port = second.port("mlx5_0")
    assert port is not None and port.counter("symbol_error") is None
    assert port.counter("port_xmit_data") == 0
    assert second.port("mlx5_6") is None
    assert [(e.kind, e.severity) for e in events] == [("port_gone", Severity.WARNING)]
    assert "mlx5_6/1 (compute) is gone" in events[0].message


async def test_no_infiniband_class_is_a_clear_unavailable(tmp_path: Path) -> None:
    src = source(tmp_path)
    with pytest.raises(SourceUnavailable, match=r"no RDMA devices: .*class/infiniband is absent"):
        await read(src)
    hub, _ = hub_with(source(tmp_path))
    status = (await hub.poll_once()).nodes[0].status("fabric")
    assert status is not None and not status.ok
    assert status.error is not None and "class/infiniband is absent" in status.error


async def test_an_ib_port_going_down_is_an_event_and_a_critical_problem(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    port_dir = fs.root / "class/infiniband/mlx5_6/ports/1"
    events: list[Event] = []
    src = source(tmp_path)
    await src.start(events.append)
    await src.poll()
    (port_dir / "state").write_text("1: DOWN\n")
    (port_dir / "phys_state").write_text("3: Disabled\n")
    reading = await src.poll()
    (port_dir / "state").write_text("4: ACTIVE\n")
    await src.poll()
    await src.close()
    assert [(e.kind, e.severity) for e in events] == [
        ("link_down", Severity.CRITICAL),
        ("link_up", Severity.INFO),
    ]
    assert events[0].message == "mlx5_6/1 (compute) link down (sysfs)"
    port = reading.port("mlx5_6")
    assert port is not None
    problems = port_problems(port, lambda name: None)
    assert [(p.severity, p.what) for p in problems] == [(Severity.CRITICAL, "link down (Disabled)")]
    gpu = reading.gpu("00000000:9D:00.0")
    assert gpu is not None and "its rail is down" in gpu.flags


def port_like(**kw: object) -> FabricPort:
    base: dict[str, object] = dict(
        device="mlx5_0",
        port=1,
        state="ACTIVE",
        state_id=4,
        phys_state="LinkUp",
        phys_state_id=5,
        link_layer="InfiniBand",
        role=PortRole.COMPUTE,
        role_from="config",
        rate_gbps=400.0,
        rate_text="400 Gb/sec (4X NDR)",
        width=4,
        expected_rate_gbps=400.0,
    )
    base.update(kw)
    return FabricPort(**base)  # type: ignore[arg-type]


def test_problems_are_classified_worst_first() -> None:
    rates = {
        "link_downed": 0.5,
        "port_xmit_discards": 3.0,
        "port_xmit_wait": 2e6,
        "np_cnp_sent": 50.0,  # below the congestion floor
        "port_rcv_errors": 0.0,  # did not move
        "out_of_sequence": 0.5,  # below its floor: a little is normal under load
    }
    deltas = dict(link_downed=1, port_xmit_discards=6, port_xmit_wait=4_000_000,
                  np_cnp_sent=100, port_rcv_errors=0, out_of_sequence=1)  # fmt: skip
    problems = port_problems(port_like(), rates.get, deltas.get)
    assert [(p.severity, p.counter, p.delta) for p in problems] == [
        (Severity.CRITICAL, "link_downed", 1),
        (Severity.WARNING, "port_xmit_discards", 6),
        (Severity.WARNING, "port_xmit_wait", 4_000_000),
    ]
    assert [p.what for p in problems] == [
        "link downed +1 (0.5/s)",
        "transmit discards +6 (3/s)",
        "congestion: transmit wait 2e+06/s",
    ]
    # without deltas (a reader that only has rates) the same worries, said as rates
    assert [p.what for p in port_problems(port_like(), rates.get)][:2] == [
        "link downed 0.5/s",
        "transmit discards 3/s",
    ]
    assert port_problems(port_like(), {"rp_cnp_handled": 50_000.0}.get)[0].severity is (
        Severity.CRITICAL
    )


def test_a_down_management_port_is_a_warning_and_a_narrow_link_is_downtrained() -> None:
    down = port_like(state="DOWN", phys_state="Polling", role=PortRole.MANAGEMENT)
    assert [(p.severity, p.what) for p in port_problems(down, lambda n: None)] == [
        (Severity.WARNING, "link down (Polling)")
    ]
    narrow = port_like(rate_gbps=200.0, rate_text="200 Gb/sec (2X NDR)", width=2)
    assert narrow.downtrained
    assert port_problems(narrow, lambda n: None)[0].what == (
        "downtrained: 200 Gb/sec (2X NDR) (expected 400)"
    )
    assert not port_like().downtrained


async def test_a_port_is_downtrained_against_its_own_hca_model_not_the_nodes_fastest_port(
    tmp_path: Path,
) -> None:
    # procfs's tree: an Omni-Path HFI at 100 Gb/s, a dual-port ConnectX-3 at 40 and a
    # ConnectX-4 Lx at 25 (1X EDR), each as fast as its kind runs
    root = ttar_sysfs("procfs-ib", tmp_path)
    reading = await read(source(root))
    rates = {p.name: (p.rate_gbps, p.expected_rate_gbps, p.downtrained) for p in reading.ports}
    assert rates == {
        "hfi1_0/1": (100.0, 100.0, False),
        "mlx4_0/1": (40.0, 40.0, False),
        "mlx4_0/2": (40.0, 40.0, False),
        "mlx5_0/1": (25.0, 25.0, False),
    }
    assert [p.name for p in reading.ports if port_problems(p, lambda name: None)] == []
    # one ConnectX-3 port trains at DDR: slower than its sibling, so downtrained
    (root / "class/infiniband/mlx4_0/ports/2/rate").write_text("20 Gb/sec (4X DDR)\n")
    reading = await read(source(root))
    slow = [p for p in reading.ports if p.downtrained]
    assert [(p.name, p.expected_rate_gbps) for p in slow] == [("mlx4_0/2", 40.0)]
    assert [p.what for p in port_problems(slow[0], lambda name: None)] == [
        "downtrained: 20 Gb/sec (4X DDR) (expected 40)"
    ]


async def test_a_transmit_wait_counter_pegged_in_node_exporters_own_tree_is_seen_as_such(
    tmp_path: Path,
) -> None:
    # node_exporter's mlx4_0 port 1 reads port_xmit_wait 4294967295: a 32-bit PortCounter
    # at its maximum, counting no more congestion; procfs's tree has none pegged
    events: list[Event] = []
    reading = await read(source(ttar_sysfs("node-exporter-ib", tmp_path / "ne")), events)
    assert {p.name: p.pegged for p in reading.ports} == {
        "i40iw0/1": (),
        "mlx4_0/1": (("port_xmit_wait", 4_294_967_295),),
        "mlx4_0/2": (),
    }
    port = reading.port("mlx4_0")
    assert port is not None
    widths = {name: bits for name, _value, bits in port.counters}
    assert (widths["link_downed"], widths["port_xmit_wait"], widths["port_xmit_discards"]) == (
        8,
        32,
        16,
    )
    assert [e.message for e in events if e.kind == "counter_pegged"] == [
        "mlx4_0/1 (compute) transmit wait counter pegged at 4294967295, its maximum: it counts "
        "no more until it is cleared (perfquery -R)"
    ]
    procfs = await read(source(ttar_sysfs("procfs-ib", tmp_path / "procfs")))
    assert [p.pegged for p in procfs.ports] == [(), (), (), ()]
