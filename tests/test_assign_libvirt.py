"""The libvirt driver against libvirt's test driver (a real libvirt, no daemon): the guest is
redefined with the <hostdev> and, having no hotplug there, restarted."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.drivers.libvirt import LibvirtDriver
from gpuconsole.actions.plan import Layer, Step, StepKind
from gpuconsole.sources.tenancy.libvirt import LibvirtReader
from tests.tenancy_fixtures import DomainSpec, libvirt_node


def _step(kind: StepKind, guest: str, *functions: str) -> Step:
    return Step(kind, Layer.GUESTS, kind.value, functions=functions, guest=guest)


async def test_a_running_guest_is_redefined_with_the_hostdev_and_restarted(
    tmp_path: Path,
) -> None:
    import libvirt  # type: ignore[import-not-found,unused-ignore]

    uri = libvirt_node(
        tmp_path / "node.xml",
        [DomainSpec("vm7", ["0000:1b:00.0"]), DomainSpec("vm2", ["0000:43:00.0"], "shut off")],
    )
    conn = libvirt.open(uri)  # each test:// connection is its own world: share one
    driver = LibvirtDriver(uri, connect=lambda _uri: conn, shutdown_timeout_s=5)
    reader = LibvirtReader(uri, connect=lambda _uri: conn)
    try:
        boot_id = conn.lookupByName("vm7").ID()
        detail = await driver.run(_step(StepKind.ATTACH, "vm7", "0000:52:00.0", "0000:52:00.1"))
        assert "restarted vm7" in detail and "no hotplug" in detail
        guests = {g.name: g for g in reader.read()}
        assert guests["vm7"].state == "running"
        assert guests["vm7"].bus_ids == ("0000:1b:00.0", "0000:52:00.0", "0000:52:00.1")
        assert conn.lookupByName("vm7").ID() != boot_id  # a new run of the guest
        again = await driver.run(_step(StepKind.ATTACH, "vm7", "0000:52:00.0", "0000:52:00.1"))
        assert "already as planned" in again

        with pytest.raises(StepFailed, match="vm7 is running: shut it down"):
            await driver.run(_step(StepKind.DETACH, "vm7", "0000:1b:00.0"))
        await driver.run(_step(StepKind.DETACH, "vm2", "0000:43:00.0"))
        guests = {g.name: g for g in reader.read()}
        assert (guests["vm2"].bus_ids, guests["vm2"].state) == ((), "shut off")
        await driver.undo(_step(StepKind.DETACH, "vm2", "0000:43:00.0"))
        assert {g.name: g for g in reader.read()}["vm2"].bus_ids == ("0000:43:00.0",)
    finally:
        conn.close()


async def test_an_unknown_guest_says_so(tmp_path: Path) -> None:
    uri = libvirt_node(tmp_path / "node.xml", [DomainSpec("vm7")])
    with pytest.raises(StepFailed, match="no guest 'vm9'"):
        await LibvirtDriver(uri).run(_step(StepKind.ATTACH, "vm9", "0000:52:00.0"))
