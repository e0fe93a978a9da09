"""Fuzzing what sysfs says about RDMA ports: state and rate strings, link layer,
LIDs and counters, read through the fabric source into the hub, the JSON snapshot and
/metrics. No crash: a reading (odd values become "unknown"), never a stale source.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import strategies as st
from prometheus_client.samples import Sample

from gpuconsole import codec
from gpuconsole.export.collector import MetricsCache
from gpuconsole.hub import Hub
from gpuconsole.readings.fabric import FabricPort
from gpuconsole.sources.fabric import FabricSource
from gpuconsole.sources.fabric.infiniband import parse_rate, parse_state
from tests.export_fixtures import one, parse, pick, render
from tests.fabric_fixtures import dgx_h100_slice
from tests.fuzz_fixtures import fuzz_settings

FUZZ = fuzz_settings(120, HealthCheck.function_scoped_fixture)


def as_sysfs_text(raw: bytes) -> str:
    """How the reader turns a small sysfs file into text."""
    return raw.decode("ascii", "replace")


@FUZZ
@given(st.binary(max_size=40).map(as_sysfs_text) | st.text(max_size=40))
@example("4: ACTIVE\n")
@example(": \n")
@example("99999999999999999999999: X")
@example("²: X")  # isdigit(), yet int() refuses it
@example("٤: ACTIVE")  # an Arabic-Indic 4, which int() takes
@example("-1: X")
@example("7" * 5000 + ": X")
def test_any_state_text_parses_to_an_id_or_none_and_a_name(text: str) -> None:
    state_id, name = parse_state(text)
    assert state_id is None or 0 <= state_id < 1000  # 3 digits at most: the ids are a u8
    assert isinstance(name, str)


@pytest.mark.parametrize("text", ["²: X", "٤: ACTIVE", "-1: X", " +4: ACTIVE", "4_0: X"])
def test_a_state_id_not_in_the_kernels_form_is_unknown(text: str) -> None:
    assert parse_state(text) == (None, text.strip())


RATE_LIKE = st.from_regex(r"\A[0-9.]{1,6} ?Gb/sec ?\([0-9]{1,3}X ?[A-Z]{0,4}\)\n?\Z")


@FUZZ
@given(RATE_LIKE | st.binary(max_size=40).map(as_sysfs_text))
@example("1.2.3 Gb/sec (4X NDR)")
def test_any_rate_text_parses_or_is_unknown(text: str) -> None:
    gbps, width, _speed = parse_rate(text)
    assert width is None or width >= 0
    assert gbps is None or (math.isfinite(gbps) and gbps >= 0)


# Files of one port, as a driver could leave them.
TEXT = st.binary(max_size=24)
NUMBERS = st.integers(0, 2**70).map(lambda n: f"{n}\n".encode())
COUNTER = NUMBERS | st.just(b"N/A (no PMA)\n") | st.just(b"") | TEXT
RATE = RATE_LIKE.map(str.encode) | TEXT
LID = st.integers(-(2**33), 2**33).map(lambda n: f"{n:#x}\n".encode())
PORT_FILES = st.fixed_dictionaries(
    {
        "state": st.sampled_from([b"4: ACTIVE\n", b"1: DOWN\n", b"2: INIT\n"]) | TEXT,
        "phys_state": st.sampled_from([b"5: LinkUp\n", b"3: Disabled\n"]) | TEXT,
        "rate": RATE,
        "link_layer": st.sampled_from([b"InfiniBand\n", b"Ethernet\n"]) | TEXT,
        "lid": st.sampled_from([b"0x1a\n", b"0x0\n"]) | LID | TEXT,
        "sm_lid": LID | TEXT,
    }
)
COUNTERS = ("port_xmit_data", "symbol_error", "link_downed")


@FUZZ
@given(
    PORT_FILES,
    st.fixed_dictionaries({name: COUNTER for name in COUNTERS}),
    st.fixed_dictionaries({name: COUNTER for name in COUNTERS}),
    st.sampled_from([b"10\n", b"N/A (no PMA)\n", b"-1\n", b"\xff\n", b""])
    | st.integers(-(2**40), 2**40).map(lambda n: f"{n}\n".encode()),
)
def test_odd_port_files_read_as_unknowns_through_hub_json_and_metrics(
    tmp_path_factory: pytest.TempPathFactory,
    files: dict[str, bytes],
    first: dict[str, bytes],
    second: dict[str, bytes],
    lifespan: bytes,
) -> None:
    root = tmp_path_factory.mktemp("sys")
    dgx_h100_slice(root)
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for name, content in files.items():
        (port / name).write_bytes(content)
    (port / "hw_counters" / "lifespan").write_bytes(lifespan)

    def counters(values: dict[str, bytes]) -> None:
        for name, content in values.items():
            (port / "counters" / name).write_bytes(content)

    counters(first)
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False))
    snapshot = asyncio.run(hub.poll_once(2, between=lambda: counters(second)))
    node = snapshot.nodes[0]
    status = node.status("fabric")
    assert status is not None and status.ok, status
    assert node.fabric is not None and node.fabric.port("mlx5_6") is not None  # the others
    for key, value in node.rates.items():
        assert math.isfinite(value) and value >= 0, (key, value)
    mine = node.fabric.port("mlx5_0")
    if mine is not None:
        values = [v for _n, v, _b in (*mine.counters, *mine.hw_counters)]
        assert all(0 <= v < 2**64 for v in values), mine.counters
        for lid in (mine.lid, mine.sm_lid):
            assert lid is None or 0 <= lid < 2**32
        lifespan_ms = mine.hw_counters_lifespan_ms
        assert lifespan_ms is None or 0 <= lifespan_ms < 2**31
    json.loads(codec.dumps(snapshot))
    body = MetricsCache(lambda: snapshot).render()
    assert b"gpuconsole" in body if isinstance(body, bytes) else "gpuconsole" in body


def test_a_port_folder_of_empty_files_still_reads(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    dgx_h100_slice(root)
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for file in [*port.iterdir(), *(port / "counters").iterdir()]:
        if file.is_file():
            file.write_bytes(b"")
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False))
    node = asyncio.run(hub.poll_once()).nodes[0]
    assert node.status("fabric").ok  # type: ignore[union-attr]
    reading = node.fabric.port("mlx5_0")  # type: ignore[union-attr]
    assert reading is not None and reading.rate_gbps is None and reading.counters == ()


def test_a_signed_counter_is_not_taken_for_a_count(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    dgx_h100_slice(root)
    counter = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error"
    counter.write_bytes(b"-5\n")
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False))
    snapshot = asyncio.run(hub.poll_once(2, between=lambda: counter.write_bytes(b"-2\n")))
    port = snapshot.nodes[0].fabric.port("mlx5_0")  # type: ignore[union-attr]
    assert port is not None and port.counter("symbol_error") is None


def one_port_read(
    tmp_path: Path, files: dict[str, bytes]
) -> tuple[FabricPort, dict[str, list[Sample]]]:
    """mlx5_0's port 1 with `files` (paths under the port folder) written, read through the
    hub: the port, and the /metrics samples by name."""
    root = tmp_path / "sys"
    dgx_h100_slice(root)
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for name, content in files.items():
        (port / name).write_bytes(content)
    hub = Hub()
    hub.add_source(FabricSource("dgx-017", sysfs_root=str(root), netlink=False))
    snapshot = asyncio.run(hub.poll_once())
    node = snapshot.nodes[0]
    assert node.status("fabric").ok  # type: ignore[union-attr]
    mine = node.fabric.port("mlx5_0")  # type: ignore[union-attr]
    assert mine is not None
    return mine, parse(render(snapshot))


@pytest.mark.parametrize(
    "text", [b"-1\n", b"+10\n", b" 10\n", b"1_0\n", "\u0661\u0660\n".encode(), b"2147483648\n"]
)
def test_a_lifespan_not_in_the_kernels_form_is_unknown_and_not_exported(
    tmp_path: Path, text: bytes
) -> None:
    port, metrics = one_port_read(tmp_path, {"hw_counters/lifespan": text})
    assert port.hw_counters_lifespan_ms is None
    lifespans = metrics["node_infiniband_lifespan_seconds"]
    assert pick(lifespans, device="mlx5_0") == []
    assert one(lifespans, device="mlx5_6").value == 0.0  # the others: 10 ms, 0 whole s


@pytest.mark.parametrize("text", [b"-0x1a\n", b"-26\n", b"1a\n", b"0x100000000\n", b"0x_1a\n"])
def test_a_lid_not_in_the_kernels_form_is_unknown(tmp_path: Path, text: bytes) -> None:
    port, _metrics = one_port_read(tmp_path, {"lid": text, "sm_lid": text})
    assert (port.lid, port.sm_lid) == (None, None)


def test_a_counter_past_a_u64_is_unknown(tmp_path: Path) -> None:
    port, metrics = one_port_read(
        tmp_path,
        {
            "counters/symbol_error": f"{2**64}\n".encode(),
            "counters/link_downed": f"{2**64 - 1}\n".encode(),  # the most the kernel prints
        },
    )
    assert port.counter("symbol_error") is None
    assert port.counter("link_downed") == 2**64 - 1
    assert pick(metrics["node_infiniband_symbol_error_total"], device="mlx5_0") == []
