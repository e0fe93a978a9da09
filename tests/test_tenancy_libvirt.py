"""Guests and their <hostdev> GPUs through libvirt's test driver (a real libvirt, no daemon)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuconsole.sources.tenancy.libvirt import LibvirtError, LibvirtReader, parse_domain_xml
from tests.tenancy_fixtures import DomainSpec, libvirt_node


def test_every_domain_running_or_defined_with_its_pci_addresses(tmp_path: Path) -> None:
    uri = libvirt_node(
        tmp_path / "node.xml",
        [
            DomainSpec("acme-train-vm", [f"0000:{b}:00.0" for b in ("1b", "43")], tenant="acme"),
            DomainSpec("tenant-c-vm2", ["0000:d1:00.0"], state="shut off"),
            DomainSpec("paused-vm", ["0000:df:00.0"], state="paused"),
            DomainSpec("no-gpus"),
        ],
    )
    reader = LibvirtReader(uri)
    try:
        guests = {g.name: g for g in reader.read()}
    finally:
        reader.close()
    assert guests["acme-train-vm"].bus_ids == ("0000:1b:00.0", "0000:43:00.0")
    assert guests["acme-train-vm"].tenant == "acme" and guests["acme-train-vm"].active
    assert guests["acme-train-vm"].uuid is not None and guests["acme-train-vm"].source == "libvirt"
    assert (guests["tenant-c-vm2"].state, guests["tenant-c-vm2"].active) == ("shut off", False)
    assert (guests["paused-vm"].state, guests["paused-vm"].active) == ("paused", True)
    assert guests["no-gpus"].bus_ids == () and guests["no-gpus"].tenant is None


def test_a_redefined_guest_shows_its_new_device_on_the_next_read(tmp_path: Path) -> None:
    """attach/detach are unsupported by the test driver: redefine and restart instead."""
    import libvirt  # type: ignore[import-not-found,unused-ignore]

    uri = libvirt_node(tmp_path / "node.xml", [DomainSpec("vm7", ["0000:1b:00.0"])])
    # each test:// connection is its own world: share one, as libvirtd's clients share it
    conn = libvirt.open(uri)
    reader = LibvirtReader(uri, connect=lambda _uri: conn)
    try:
        assert [g.bus_ids for g in reader.read()] == [("0000:1b:00.0",)]
        domain = conn.lookupByName("vm7")
        domain.destroy()
        domain.undefine()
        conn.defineXML(DomainSpec("vm7", ["0000:43:00.0"]).xml())
        assert [(g.bus_ids, g.state) for g in reader.read()] == [(("0000:43:00.0",), "shut off")]
        conn.lookupByName("vm7").create()
        assert [(g.bus_ids, g.state) for g in reader.read()] == [(("0000:43:00.0",), "running")]
    finally:
        conn.close()


def test_a_hostdev_without_an_address_is_a_problem_of_that_guest_not_a_crash() -> None:
    parsed = parse_domain_xml(
        "<domain><name>bad</name><devices>"
        "<hostdev mode='subsystem' type='pci'><source/></hostdev>"
        "<hostdev mode='subsystem' type='pci'><source><address bus='0x1b' slot='0' "
        "function='0'/></source></hostdev>"
        "<hostdev mode='subsystem' type='usb'><source><vendor id='0x1'/></source></hostdev>"
        "</devices></domain>"
    )
    assert parsed.bus_ids == ("0000:1b:00.0",)
    assert parsed.problems == ("hostdev #1 has no PCI source address",)


def test_openstack_nova_project_names_the_tenant() -> None:
    parsed = parse_domain_xml(
        "<domain><name>instance-0000002a</name><metadata>"
        "<nova:instance xmlns:nova='http://openstack.org/xmlns/libvirt/nova/1.1'>"
        "<nova:owner><nova:user uuid='u'>bob</nova:user>"
        "<nova:project uuid='p'>genomics</nova:project></nova:owner></nova:instance>"
        "</metadata></domain>"
    )
    assert parsed.tenant == "genomics"


def test_an_unreachable_libvirt_says_where_it_looked() -> None:
    pytest.importorskip("libvirt")
    reader = LibvirtReader("qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    with pytest.raises(LibvirtError, match=r"cannot connect to qemu\+unix:///system"):
        reader.read()


def test_without_libvirt_python_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_libvirt(name: str, *args: object, **kwargs: object) -> object:
        if name == "libvirt":
            raise ImportError("No module named 'libvirt'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_libvirt)
    with pytest.raises(LibvirtError, match="libvirt-python not installed"):
        LibvirtReader("qemu:///system").read()
