"""RoCE netdevs through real rtnetlink: a veth pair in two network namespaces this test makes.

The RoCE port itself is a fake sysfs tree whose GID 0 names the veth, so the source joins
sysfs and netlink exactly as on a node; traffic and link changes are the kernel's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Severity
from gpuconsole.readings.fabric import port_problems
from gpuconsole.sources.fabric import FabricSource
from tests.fabric_fixtures import FakeSysfs
from tests.peers import require_peer, require_program
from tests.waiting import until

SUBNET = "10.213.7"


@dataclass(frozen=True)
class VethPair:
    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str

    def ip(self, *args: str) -> str:
        return subprocess.run(
            ["ip", *args], check=True, capture_output=True, text=True, timeout=10
        ).stdout

    def kernel_stats(self) -> dict[str, int]:
        """What the kernel itself reports for dev_a, via `ip -s -j link show`."""
        (link,) = json.loads(self.ip("-n", self.ns_a, "-s", "-j", "link", "show", self.dev_a))
        stats = link["stats64"]
        return {
            "tx_bytes": stats["tx"]["bytes"],
            "tx_packets": stats["tx"]["packets"],
            "rx_bytes": stats["rx"]["bytes"],
            "rx_packets": stats["rx"]["packets"],
        }

    async def settled(self) -> dict[str, int]:
        """dev_a's statistics once two reads a quarter second apart agree: the peer's ICMP
        replies to the test's datagrams have landed, and nothing else talks here."""
        loop = asyncio.get_running_loop()
        stats, at = self.kernel_stats(), loop.time()

        def quiet() -> bool:
            nonlocal stats, at
            if loop.time() - at < 0.25:
                return False
            now = self.kernel_stats()
            same, stats, at = now == stats, now, loop.time()
            return same

        await until(quiet)
        return stats

    def send_udp(self, count: int, size: int) -> None:
        code = (
            "import socket\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"for _ in range({count}): s.sendto(b'x' * {size}, ('{SUBNET}.2', 9))\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", self.ns_a, sys.executable, "-c", code], check=True, timeout=20
        )


@pytest.fixture
def veth() -> Iterator[VethPair]:
    require_program("ip", "apt-get install iproute2")
    require_peer(
        "root (network namespaces)", os.geteuid() == 0, "run as root: `ip netns add` needs it"
    )
    tag = uuid.uuid4().hex[:6]
    pair = VethPair(f"gcfab-{tag}-a", f"gcfab-{tag}-b", f"gcf{tag}a", f"gcf{tag}b")
    made: list[str] = []
    try:
        for ns in (pair.ns_a, pair.ns_b):
            pair.ip("netns", "add", ns)
            made.append(ns)
            # No IPv6: no router solicitations or DAD, so the only traffic is the test's.
            subprocess.run(
                ["ip", "netns", "exec", ns, "sh", "-c",
                 "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6;"
                 "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"],
                check=True, timeout=10,
            )  # fmt: skip
        pair.ip("-n", pair.ns_a, "link", "add", pair.dev_a, "type", "veth",
                "peer", "name", pair.dev_b, "netns", pair.ns_b)  # fmt: skip
        pair.ip("-n", pair.ns_a, "addr", "add", f"{SUBNET}.1/24", "dev", pair.dev_a)
        pair.ip("-n", pair.ns_b, "addr", "add", f"{SUBNET}.2/24", "dev", pair.dev_b)
        pair.ip("-n", pair.ns_a, "link", "set", pair.dev_a, "up")
        pair.ip("-n", pair.ns_b, "link", "set", pair.dev_b, "up")
        yield pair
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def roce_tree(root: Path, netdev: str) -> None:
    FakeSysfs(root).hca(
        "mlx5_1",
        ("pci0000:27", "0000:27:01.0", "0000:29:00.0"),
        numa=0,
        link_layer="Ethernet",
        rate="200 Gb/sec (4X HDR)",
        netdev=netdev,
    )


async def wait_for(events: list[Event], kind: str) -> Event:
    """The first event of `kind`, once the netlink notification has arrived."""
    await until(lambda: any(e.kind == kind for e in events))
    return next(e for e in events if e.kind == kind)


async def test_traffic_over_the_veth_shows_up_as_the_kernel_counts_it(
    veth: VethPair, tmp_path: Path
) -> None:
    roce_tree(tmp_path, veth.dev_a)
    ticks = [10.0]
    hub = Hub(monotonic=lambda: ticks[0])
    hub.add_source(FabricSource("node-a", sysfs_root=str(tmp_path), netns=veth.ns_a))
    first = (await hub.poll_once()).nodes[0].fabric
    assert first is not None
    before = first.port("mlx5_1")
    assert before is not None and before.netdev_stats is not None, before
    veth.send_udp(200, 1000)
    kernel = await veth.settled()
    ticks[0] += 1.0
    node = (await hub.poll_once()).nodes[0]
    assert veth.kernel_stats() == kernel  # nothing moved while the source read
    assert node.fabric is not None
    port = node.fabric.port("mlx5_1")
    assert port is not None and port.netdev_stats is not None
    stats = port.netdev_stats
    assert stats.ifname == veth.dev_a and stats.operstate == "UP"
    assert {k: getattr(stats, k) for k in kernel} == kernel
    sent = stats.tx_bytes - before.netdev_stats.tx_bytes
    assert sent >= 200 * (1000 + 8 + 20 + 14)  # UDP, IP and Ethernet headers
    assert node.rate("fabric", "mlx5_1", "1", "netdev", "tx_bytes") == pytest.approx(sent)


async def test_setting_the_link_down_is_a_link_event_from_netlink(
    veth: VethPair, tmp_path: Path
) -> None:
    roce_tree(tmp_path, veth.dev_a)
    events: list[Event] = []
    src = FabricSource("node-a", sysfs_root=str(tmp_path), netns=veth.ns_a)
    await src.start(events.append)
    try:
        await src.poll()
        veth.ip("-n", veth.ns_a, "link", "set", veth.dev_a, "down")
        down = await wait_for(events, "link_down")
        assert down.severity is Severity.CRITICAL and down.source == "fabric"
        assert down.message == f"mlx5_1/1 ({veth.dev_a}, storage) link down (netlink)"
        reading = await src.poll()
        port = reading.port("mlx5_1")
        assert port is not None and port.netdev_stats is not None
        assert port.netdev_stats.operstate == "DOWN"
        assert [p.what for p in port_problems(port, lambda n: None)] == [
            f"netdev {veth.dev_a} DOWN"
        ]
        veth.ip("-n", veth.ns_a, "link", "set", veth.dev_a, "up")
        up = await wait_for(events, "link_up")
        assert up.severity is Severity.INFO
    finally:
        await src.close()
    assert [e.kind for e in events] == ["link_down", "link_up"]


async def test_a_missing_namespace_or_netdev_is_said_per_port(tmp_path: Path) -> None:
    roce_tree(tmp_path, "enp41s0f0np0")
    src = FabricSource("node-a", sysfs_root=str(tmp_path), netns="gcfab-no-such-ns")
    await src.start(lambda e: None)
    try:
        reading = await src.poll()
    finally:
        await src.close()
    port = reading.port("mlx5_1")
    assert port is not None and port.netdev_stats is None
    assert port.netdev_error == (
        "netdev stats unavailable: no network namespace 'gcfab-no-such-ns'"
    )
    assert reading.link_events_error == (
        "link notifications unavailable: no network namespace 'gcfab-no-such-ns'"
    )
    assert port.state == "ACTIVE"  # sysfs still read
