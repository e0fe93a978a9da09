"""libvirt's own hostdev test domains, and its expected QEMU command lines for them, read in
place from ../shared/fixtures/libvirt-hostdev (see its README): the domains through the libvirt
test driver, the command lines through the QEMU reader, and both through the tenancy source."""

from __future__ import annotations

import asyncio
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuconsole.facts.ownership import OwnerKind, resolve_owners
from gpuconsole.readings.tenancy import TenancyReading
from gpuconsole.sources.tenancy import TenancySource
from gpuconsole.sources.tenancy.libvirt import LibvirtReader
from gpuconsole.sources.tenancy.qemu import parse_qemu_command
from tests.peers import require_peer
from tests.tenancy_fixtures import DomainSpec, FakeHost, libvirt_node, require_libvirt

FIXTURES = Path(__file__).parents[1].parent / "shared" / "fixtures" / "libvirt-hostdev"
UUID = "c7a5fdbd-edaf-9466-926a-d65c16db1809"
# domain file, its command line, and the host PCI functions its <hostdev>s hand over
CASES = {
    "hostdev-vfio": (
        "hostdev-vfio.xml",
        "hostdev-vfio.x86_64-latest.args.excerpt",
        ("0000:06:12.1", "0000:06:12.2", "0000:06:12.3", "0000:06:12.4"),
    ),
    "multidomain": (
        "hostdev-vfio-multidomain.x86_64-latest.xml",
        "hostdev-vfio-multidomain.x86_64-latest.args.excerpt",
        ("0021:de:1f.1",),
    ),
}


def fixture(name: str) -> Path:
    require_peer(
        "libvirt's hostdev test domains",
        FIXTURES.is_dir(),
        f"{FIXTURES} (real fixtures from other projects; see ../shared/fixtures/README.md)",
    )
    return FIXTURES / name


def node_of(domain_xml: Path, node: Path) -> str:
    """The domain, as it is, inside a test-driver <node>; the URI that opens it."""
    require_libvirt()
    node.write_text("<node>" + domain_xml.read_text() + "</node>")
    return f"test://{node.resolve()}"


def qemu_argv(domain_xml: Path, args: Path) -> tuple[str, ...]:
    """libvirt's expected command line: the domain's <emulator>, then the excerpt's lines."""
    emulator = ET.parse(domain_xml).findtext("devices/emulator")
    assert emulator
    return (emulator, *shlex.split(args.read_text().replace("\\\n", " ")))


@pytest.mark.parametrize("case", CASES)
def test_libvirt_reads_every_vfio_hostdev_by_its_host_address(case: str, tmp_path: Path) -> None:
    domain, _args, expected = CASES[case]
    path = fixture(domain)
    reader = LibvirtReader(node_of(path, tmp_path / "node.xml"))
    try:
        (guest,) = reader.read()
    finally:
        reader.close()
    assert (guest.name, guest.uuid, guest.state) == ("QEMUGuest2", UUID, "running")
    assert guest.bus_ids == expected and guest.problems == ()
    hostdevs = ET.parse(path).findall("devices/hostdev")
    if case == "hostdev-vfio":  # each <driver> form libvirt accepts for a vfio hostdev
        forms = [h.find("driver") for h in hostdevs]
        assert [None if d is None else dict(d.attrib) for d in forms] == [
            None,
            {"name": "vfio"},
            {"model": "vfio-pci-igb"},
            {"name": "vfio", "model": "vfio-pci-igb"},
        ]
    else:  # the GPU is the host's address, not the one the guest sees
        guest_side = hostdevs[0].find("address")
        assert guest_side is not None and guest_side.get("domain") == "0x0000"
        assert guest_side.get("bus") == "0x00" and guest_side.get("slot") == "0x02"


@pytest.mark.parametrize("case", CASES)
def test_the_qemu_command_line_says_what_libvirt_says(case: str) -> None:
    domain, args, expected = CASES[case]
    name, uuid, bus_ids = parse_qemu_command(qemu_argv(fixture(domain), fixture(args)))
    assert (name, uuid, bus_ids) == ("QEMUGuest2", UUID, expected)


@pytest.mark.parametrize("case", CASES)
def test_the_tenancy_source_gives_each_gpu_to_the_one_guest(case: str, tmp_path: Path) -> None:
    domain, args, expected = CASES[case]
    path = fixture(domain)
    host = FakeHost(tmp_path / "host")
    for group, bus_id in enumerate(expected, start=40):
        host.pci(bus_id, driver="vfio-pci", group=group)
    argv = qemu_argv(path, fixture(args))
    host.process(4242, cgroup="/machine.slice/machine-qemu.scope", argv=argv, fds=())
    source = TenancySource(
        "kvm-01",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri=node_of(path, tmp_path / "node.xml"),
        kubelet_socket="",
        processes=False,
        passwd_file=str(host.passwd),
    )
    reading = _poll(source)
    # libvirt's guest and its QEMU process are one guest: libvirt's, with the process's pid
    assert [(g.name, g.source, g.bus_ids, g.pid) for g in reading.guests] == [
        ("QEMUGuest2", "libvirt", expected, 4242)
    ]
    libvirt = reading.part("libvirt")
    assert libvirt is not None and libvirt.detail.endswith(": 1 domain, 1 holding PCI devices")
    owners = resolve_owners(None, reading)
    assert [(g.bus_id, g.owner.kind, g.owner.name) for g in owners.gpus] == [
        (bus_id, OwnerKind.VM, "QEMUGuest2") for bus_id in expected
    ]
    assert owners.all_problems == ()


def test_a_guest_named_with_a_comma_is_one_guest(tmp_path: Path) -> None:
    # libvirt doubles a comma in -name (its name-escape test writes a domain "foo=1,bar=2"
    # as `-name guest=foo=1,,bar=2,debug-threads=on`): QEMU's escape, one comma.
    host = FakeHost(tmp_path / "host")
    host.pci("0000:1b:00.0", driver="vfio-pci", group=40)
    argv = (
        "/usr/bin/qemu-system-x86_64",
        "-name",
        "guest=foo=1,,bar=2,debug-threads=on",
        "-device",
        "vfio-pci,host=0000:1b:00.0,id=hostdev0,bus=pci.0,addr=0x2",
    )
    assert parse_qemu_command(argv)[0] == "foo=1,bar=2"
    host.process(4242, cgroup="/machine.slice/machine-qemu.scope", argv=argv, fds=())
    uri = libvirt_node(tmp_path / "node.xml", [DomainSpec("foo=1,bar=2", ["0000:1b:00.0"])])
    source = TenancySource(
        "kvm-01",
        sysfs_root=host.sysfs_root,
        proc_root=host.proc_root,
        libvirt_uri=uri,
        kubelet_socket="",
        processes=False,
        passwd_file=str(host.passwd),
    )
    reading = _poll(source)
    assert [(g.name, g.source, g.pid) for g in reading.guests] == [("foo=1,bar=2", "libvirt", 4242)]


def _poll(source: TenancySource) -> TenancyReading:
    async def once() -> TenancyReading:
        await source.start(lambda _e: None)
        try:
            return await source.poll()
        finally:
            await source.close()

    return asyncio.run(once())
