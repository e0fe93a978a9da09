"""Passthrough GPUs read from inside their guests: a real `gpuconsole agent --guest` on the fake
NVML library answers a host TenancySource that found it through libvirt's test driver.

The kernel here has no vsock loopback transport (PEERS.md), so a unix socket carries the
same bytes where a host would connect to the guest's vsock context id: the stand-in sits at
the lowest layer, the connect call; everything above it is the real code.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gpuconsole.codec import encode
from gpuconsole.config import GUEST_SHAREABLE
from gpuconsole.export.collector import build
from gpuconsole.facts.inventory import node_gpus
from gpuconsole.readings.base import SourceStatus, record_fields
from gpuconsole.readings.nvml import GpuReading, NvmlReading, ProcessReading, XidCount
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.tenancy import Guest
from gpuconsole.sim.profiles import APOLLO_PCIE, guest_bus_id, guest_profile
from gpuconsole.sources.tenancy import TenancySource
from gpuconsole.sources.tenancy.guest_agent import (
    REQUEST,
    SHAREABLE,
    GuestRefused,
    guest_answer,
    read_answer,
)
from gpuconsole.sources.tenancy.libvirt import parse_domain_xml
from tests.fabric_fixtures import shared_fixture
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.tenancy_fixtures import DomainSpec, FakeHost, libvirt_node

HOST = ["0000:41:00.0", "0000:42:00.0", "0000:c1:00.0"]
INSIDE = [guest_bus_id(0), guest_bus_id(1)]  # as the fake library's guest profile has them
INSIDE_SYSFS = ["0000:06:00.0", "0000:07:00.0"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gcg-"))  # unix socket paths stop at 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_every_word_a_guest_config_takes_stands_for_reading_fields() -> None:
    assert set(SHAREABLE) == set(GUEST_SHAREABLE)
    fields = {f for names in SHAREABLE.values() for f in names}
    assert fields <= {f.name for f in record_fields(GpuReading)}


def test_libvirt_says_where_the_guest_sees_each_hostdev() -> None:
    """libvirt's own test data: the guest address beside each <hostdev>'s source."""
    text = shared_fixture("libvirt-hostdev", "hostdev-vfio-multidomain.x86_64-latest.xml")
    parsed = parse_domain_xml(text.read_text())
    assert parsed.addresses[-1] == ("0021:de:1f.1", "0000:00:02.0")
    assert len(parsed.addresses) == len(parsed.bus_ids)
    assert parsed.vsock_cid is None  # it has no vsock device
    with_vsock = text.read_text().replace(
        "</devices>", "<vsock model='virtio'><cid auto='yes' address='7'/></vsock></devices>"
    )
    assert parse_domain_xml(with_vsock).vsock_cid == 7


def _guest(addresses: list[tuple[str, str]], cid: int = 3) -> Guest:
    return Guest("vm7", "running", tuple(h for h, _ in addresses), "libvirt", vsock_cid=cid,
                 addresses=tuple(addresses), tenant="tenant-b")  # fmt: skip


def _reading(*bus_ids: str) -> NvmlReading:
    gpus = tuple(
        GpuReading(
            index=k,
            uuid=f"GPU-{k}0000000-aaaa-bbbb-cccc-dddddddddddd",
            name="NVIDIA A100-PCIE-40GB",
            pci_bus_id=bus,
            util_gpu_pct=40.0 + k,
            mem_used_bytes=1 << 30,
            mem_total_bytes=40 << 30,
            processes=(ProcessReading(4242, 1 << 30),),
        )
        for k, bus in enumerate(bus_ids)
    )
    return NvmlReading(0.0, "550.90.07", "12.550", "12.4", gpus)


def test_the_guest_shares_what_it_chose_and_the_host_names_each_gpu_by_its_own_bus_id() -> None:
    answer = guest_answer(_reading(*INSIDE), share=("util", "memory"))
    gpus = read_answer(answer, _guest([(HOST[0], INSIDE_SYSFS[0]), (HOST[1], INSIDE_SYSFS[1])]))
    assert [g.pci_bus_id for g in gpus] == [HOST[0], HOST[1]]
    assert [g.util_gpu_pct for g in gpus] == [40.0, 41.0]
    assert all(g.processes == () for g in gpus)  # not shared: unknown on the host
    assert all(g.temp_gpu_c is None for g in gpus)
    default = read_answer(guest_answer(_reading(INSIDE[0])), _guest([(HOST[0], INSIDE_SYSFS[0])]))
    assert default[0].processes == ()  # processes only when the tenant names them


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        # more GPUs than the domain gives it
        (guest_answer(_reading(*INSIDE)), "reports 2 GPUs; its domain gives it 1 PCI devices"),
        # a GPU at an address the domain does not give it
        (guest_answer(_reading(guest_bus_id(4))), "reports a GPU at 0000:0a:00.0, which its"),
        (b"\x1b]0;pwned\x07" + b"x" * 10, "answered something that is not JSON"),
        (b" " * ((1 << 20) + 1), "answered more than 1024 KiB"),
        (b'{"protocol": "\\u001b[2J", "gpus": []}', "speaks protocol '"),
        (b'{"protocol": 1, "gpus": {}}', "answered no GPU list"),
        (
            json.dumps({"protocol": 1, "gpus": [{"index": "zero"}]}).encode(),
            "answered a GPU that does not decode",
        ),
    ],
)
def test_a_guest_that_lies_or_babbles_is_refused_with_a_reason(answer: bytes, says: str) -> None:
    with pytest.raises(GuestRefused) as refused:
        read_answer(answer, _guest([(HOST[0], INSIDE_SYSFS[0])]))
    assert says in str(refused.value)
    assert "\x1b" not in str(refused.value)


def test_a_guest_that_reports_thousands_of_xid_codes_is_refused_not_exported() -> None:
    flood = tuple(XidCount(code, 1, 1.0, 1.0) for code in range(1, 5001))
    reading = _reading(INSIDE[0])
    gpu = msgspec.structs.replace(reading.gpus[0], xids=flood)
    answer = guest_answer(msgspec.structs.replace(reading, gpus=(gpu,)))
    with pytest.raises(GuestRefused, match=r"reports 5000 XID codes for the GPU at 0000:06"):
        read_answer(answer, _guest([(HOST[0], INSIDE_SYSFS[0])]))
    few = msgspec.structs.replace(reading, gpus=(msgspec.structs.replace(gpu, xids=flood[:3]),))
    [read] = read_answer(guest_answer(few), _guest([(HOST[0], INSIDE_SYSFS[0])]))
    assert [x.code for x in read.xids] == [1, 2, 3]


def test_a_gpu_reported_twice_is_refused() -> None:
    body = json.loads(guest_answer(_reading(INSIDE[0])))
    body["gpus"] = body["gpus"] * 2
    two = _guest([(HOST[0], INSIDE_SYSFS[0]), (HOST[1], INSIDE_SYSFS[1])])
    with pytest.raises(GuestRefused, match=r"reports the GPU at 0000:06:00\.0 twice"):
        read_answer(json.dumps(body).encode(), two)


def _host(root: Path) -> FakeHost:
    host = FakeHost(root)
    for k, bus in enumerate(HOST):
        host.pci(bus, driver="vfio-pci", group=40 + k, override="vfio-pci")
    return host


def _start_guest_agent(env: dict[str, str], sock: Path, config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuconsole", "agent", "--guest", "--unix", str(sock),
         "-c", str(config)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def _ask_until_answered(sock: Path, deadline_s: float = 60.0) -> None:
    """The agent answers once its NVML hub has read (the fake library takes a moment)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(REQUEST)
            data = await reader.read()
            writer.close()
            if data:
                return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    pytest.fail(f"no guest agent answered on {sock}")


async def test_a_real_guest_agent_on_the_fake_driver_is_read_by_the_host(
    fake_nvml_env: FakeNvmlEnv, short_dir: Path
) -> None:
    """vm7 holds host GPUs 41:00.0 and 42:00.0 (at 06:00.0 and 07:00.0 inside) and runs the
    guest agent; vm9 has a vsock device but its agent is gone: its GPU goes stale alone."""
    inside = guest_profile(APOLLO_PCIE, [0, 1])
    env = fake_nvml_env(inside)
    config = short_dir / "guest.toml"
    config.write_text('[guest]\nshare = ["util", "memory", "temperature", "ecc", "xids"]\n')
    socks = {3: short_dir / "vm7.sock", 4: short_dir / "vm9.sock"}
    agent = _start_guest_agent(env, socks[3], config)
    try:
        await _ask_until_answered(socks[3])
        host = _host(short_dir / "node")
        uri = libvirt_node(
            short_dir / "libvirt.xml",
            [
                DomainSpec("vm7", HOST[:2], tenant="tenant-b", guest_bus_ids=INSIDE_SYSFS,
                           vsock_cid=3),
                DomainSpec("vm9", HOST[2:], guest_bus_ids=INSIDE_SYSFS[:1], vsock_cid=4),
            ],
        )  # fmt: skip

        async def connect(guest: Guest) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            assert guest.vsock_cid is not None
            return await asyncio.open_unix_connection(str(socks[guest.vsock_cid]))

        source = TenancySource(
            "kvm-host",
            sysfs_root=host.sysfs_root,
            proc_root=host.proc_root,
            libvirt_uri=uri,
            kubelet_socket="",
            passwd_file=str(host.passwd),
            guest_connect=connect,
            clock=lambda: 1000.0,
        )
        await source.start(lambda _e: None)
        try:
            reading = await source.poll()
        finally:
            await source.close()
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    part = reading.part("guests")
    assert part is not None and not part.ok
    assert part.detail.startswith("1 of 2 guest agents answered; vm9 cannot be reached: ")
    by_bus = {g.bus_id: g for g in reading.guest_gpus}
    assert sorted(by_bus) == HOST
    vm7 = [by_bus[b] for b in HOST[:2]]
    assert [(g.guest, g.guest_bus_id, g.tenant, g.error) for g in vm7] == [
        ("vm7", INSIDE_SYSFS[0], "tenant-b", None),
        ("vm7", INSIDE_SYSFS[1], "tenant-b", None),
    ]
    for g in vm7:
        gpu = g.reading
        assert gpu is not None and gpu.name == "NVIDIA A100-PCIE-40GB"
        assert gpu.pci_bus_id == g.bus_id
        assert gpu.util_gpu_pct is not None and gpu.mem_total_bytes == 40 << 30
        assert gpu.temp_gpu_c is not None
        assert gpu.power_w is None and gpu.processes == ()  # not shared by this tenant
    silent = by_bus[HOST[2]]
    assert silent.reading is None and silent.error is not None
    assert "cannot be reached" in silent.error

    # what the console and the exporter make of it
    node = NodeSnapshot(
        node="kvm-host",
        tenancy=reading,
        statuses=(SourceStatus(node="kvm-host", source="tenancy", ok=True, last_ok_at=1000.0),),
    )
    rows = {r.bus_id: r for r in node_gpus(node)}
    assert rows[HOST[0]].guest is not None and rows[HOST[0]].seen is not None
    assert rows[HOST[0]].label == "vm vm7"
    metrics = build(FleetSnapshot(seq=1, at=1000.0, nodes=(node,)), now=1003.0)
    util = next(m for m in metrics if m.name == "DCGM_FI_DEV_GPU_UTIL").samples
    assert {(s.labels["pci_bus_id"], s.labels["guest"], s.labels["tenant"]) for s in util} == {
        ("00000000:41:00.0", "vm7", "tenant-b"),
        ("00000000:42:00.0", "vm7", "tenant-b"),
    }
    up = {
        s.labels["guest"]: s.value
        for m in metrics
        if m.name == "gpuconsole_guest_up"
        for s in m.samples
    }
    assert up == {"vm7": 1.0, "vm9": 0.0}


async def test_a_guest_that_stops_answering_keeps_its_last_reading_marked_stale(
    short_dir: Path,
) -> None:
    """A hand-run guest end that answers once, then is gone: the host keeps what it heard,
    says since when and why, and never takes it for current."""
    host = _host(short_dir / "node")
    uri = libvirt_node(
        short_dir / "libvirt.xml",
        [DomainSpec("vm7", HOST[:1], guest_bus_ids=INSIDE_SYSFS[:1], vsock_cid=3)],
    )
    answers = [guest_answer(_reading(INSIDE[0]))]

    async def connect(guest: Guest) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if not answers:
            raise ConnectionRefusedError(111, "Connection refused")
        reader = asyncio.StreamReader()
        reader.feed_data(answers.pop())
        reader.feed_eof()
        _, writer = await asyncio.open_unix_connection(str(server_path))
        return reader, writer

    server_path = short_dir / "sink.sock"
    server = await asyncio.start_unix_server(lambda r, w: w.close(), str(server_path))
    now = [1000.0]
    source = TenancySource(
        "kvm-host",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri=uri,
        kubelet_socket="",
        passwd_file=str(host.passwd),
        guest_connect=connect,
        clock=lambda: now[0],
    )
    await source.start(lambda _e: None)
    try:
        first = await source.poll()
        now[0] = 1030.0
        second = await source.poll()
    finally:
        await source.close()
        server.close()
    assert first.guest_gpus[0].error is None and first.guest_gpus[0].seen_at == 1000.0
    stale = second.guest_gpus[0]
    assert stale.reading == first.guest_gpus[0].reading
    assert stale.seen_at == 1000.0
    assert stale.error == "cannot be reached: Connection refused"


def test_a_guest_agent_that_cannot_listen_says_where_and_why(short_dir: Path) -> None:
    """Before any NVML is read: one line naming the channel and the reason, exit 1."""
    config = short_dir / "empty.toml"
    config.write_text("")
    where = short_dir / "missing-dir" / "x.sock"
    done = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "agent", "--guest", "--unix", str(where),
         "-c", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"gpuconsole agent --guest: cannot listen on unix socket {where}: "
        "[Errno 2] No such file or directory"
    )
    assert "Traceback" not in done.stderr


def test_encoded_readings_round_trip_through_the_answer() -> None:
    reading = _reading(INSIDE[0])
    body = json.loads(guest_answer(reading, share=GUEST_SHAREABLE))
    assert body["gpus"][0] == encode(reading.gpus[0], sparse=True)
