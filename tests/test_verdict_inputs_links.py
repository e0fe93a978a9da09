"""The verdict's link inputs against real data: fabric ports (procfs's sysfs tree, read in
place from ../shared/fixtures and changed in a copy), counted over a window as the issue
asks ("link flaps counted over a window"), not over one poll."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import msgspec

from gpuconsole.facts.verdict import (
    Action,
    Finding,
    fabric_findings,
    forget_verdicts,
    node_verdict,
    reading_verdict,
)
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Severity
from gpuconsole.readings.fabric import FABRIC_ERROR_WINDOW_S
from gpuconsole.readings.nvml import GpuReading, NvLinkErrors
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.node import SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.profiles import DGX_H100
from gpuconsole.sources.climb import ClimbWindow
from gpuconsole.sources.fabric import FabricSource
from gpuconsole.sources.nvml.lib import FI_PCIE_REPLAY
from gpuconsole.sources.nvml.source import NvmlSource
from tests.fabric_fixtures import dgx_h100_slice, set_value, ttar_sysfs

NODE = "ib-node"


class Ticker:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_796_000_000.0

    def __call__(self) -> float:
        return self.now


class RealTree:
    """procfs's InfiniBand tree, polled through a hub with a clock the test moves."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = ttar_sysfs("procfs-ib", tmp_path)
        self.ticker = Ticker()
        source = FabricSource(NODE, sysfs_root=str(self.root), netlink=False, clock=self.ticker)
        self.hub = Hub(clock=self.ticker, monotonic=self.ticker)
        self.hub.add_source(source)

    def port(self, device: str, port: int = 1) -> Path:
        return self.root / "class" / "infiniband" / device / "ports" / str(port)

    async def poll(self, after_s: float = 5.0) -> NodeSnapshot:
        self.ticker.now += after_s
        node = (await self.hub.poll_once()).node(NODE)
        assert node is not None
        return node


def fabric_findings_of(node: NodeSnapshot, port: str) -> list[Finding]:
    forget_verdicts()
    return [f for f in node_verdict(node).findings if f.subject.startswith(port)]


async def test_a_flap_that_stopped_stays_counted_for_the_window_then_ages_out(
    tmp_path: Path,
) -> None:
    tree = RealTree(tmp_path)
    rail = tree.port("mlx4_0")
    assert fabric_findings_of(await tree.poll(), "mlx4_0/1") == []
    set_value(rail, "link_downed", 1)  # it went down and came back between two polls
    flapped = fabric_findings_of(await tree.poll(), "mlx4_0/1")
    assert [(f.code, f.severity, f.action) for f in flapped] == [
        ("link_flap", Severity.WARNING, Action.WATCH)
    ]
    assert flapped[0].text.startswith("link went down once in the last 5 s: watch it")
    # the polls after it, the port up and its counter still: the flap is still news
    for _ in range(3):
        still = fabric_findings_of(await tree.poll(), "mlx4_0/1")
        assert [f.code for f in still] == ["link_flap"]
    # down twice more within the window: it flaps, its cable is reseated
    set_value(rail, "link_downed", 3)
    flapping = fabric_findings_of(await tree.poll(), "mlx4_0/1")
    assert [(f.code, f.severity, f.action) for f in flapping] == [
        ("link_flap", Severity.CRITICAL, Action.RESEAT)
    ]
    assert "went down 3 times in the last" in flapping[0].text
    # the window passes with the port quiet: the flaps are history
    waited = 0.0
    while waited <= FABRIC_ERROR_WINDOW_S * 1.2:
        node = await tree.poll(30.0)
        waited += 30.0
    assert fabric_findings_of(node, "mlx4_0/1") == []


async def test_symbol_errors_that_climb_slowly_keep_the_rail_watched_between_polls(
    tmp_path: Path,
) -> None:
    # Story 2: a rail with symbol errors climbing, one a minute, read every 5 seconds: the
    # verdict says so at every poll, not at the one poll in twelve that sees it move.
    tree = RealTree(tmp_path)
    rail = tree.port("mlx4_0", 2)
    await tree.poll()
    seen = []
    for minute in range(1, 4):
        set_value(rail, "symbol_error", minute)
        for _ in range(12):
            found = fabric_findings_of(await tree.poll(), "mlx4_0/2")
            seen.append([(f.code, f.severity, f.action) for f in found])
    assert all(s == [("link_errors", Severity.WARNING, Action.WATCH)] for s in seen), seen
    assert found[0].text.startswith("symbol errors +3 in the last")


async def test_a_counter_reset_is_not_a_climb_and_a_port_read_without_a_window_is_judged_by_delta(
    tmp_path: Path,
) -> None:
    tree = RealTree(tmp_path)
    rail = tree.port("mlx4_0")
    set_value(rail, "link_downed", 40)
    await tree.poll()
    set_value(rail, "link_downed", 0)  # `perfquery -R`: counters cleared, nothing went down
    assert fabric_findings_of(await tree.poll(), "mlx4_0/1") == []
    set_value(rail, "link_downed", 1)
    assert [f.code for f in fabric_findings_of(await tree.poll(), "mlx4_0/1")] == ["link_flap"]


# --- PCIe replays, per minute as dcgm counts them -----------------------------------------


class Replaying(SimNvml):
    """The simulator, its GPU 0's PCIe replay counter (field 94) set by the test."""

    replays = 0

    def nvmlDeviceGetFieldValues(self, h: Any, fields: list[Any]) -> Any:
        values = super().nvmlDeviceGetFieldValues(h, fields)
        if self.nvmlDeviceGetIndex(h) == 0:
            for entry in values:
                if entry.fieldId == FI_PCIE_REPLAY:
                    entry.value.uiVal = self.replays  # valueType 1, as the simulator answers
        return values


def replay_findings(node: NodeSnapshot, gpu: GpuReading) -> list[Finding]:
    return [f for f in reading_verdict(gpu, node).findings if f.code == "pcie_replays"]


def test_pcie_replays_are_judged_per_minute_not_by_one_polls_burst() -> None:
    ticker = Ticker()
    lib = Replaying(SimNode("sim", DGX_H100))
    hub = Hub(clock=ticker, monotonic=ticker)  # its rates: what a reading without a window has
    hub.add_source(NvmlSource("sim", lib=lib, events=False, clock=ticker))
    # a burst of two in one second ("120 a minute" by that poll's rate), quiet for a few
    # seconds, then one every 3 seconds: 20 a minute, past dcgm's 8
    replays = iter([2, 2, 2, *range(3, 30)])
    seen: list[list[Finding]] = []

    def judged() -> None:
        node = hub.publish().node("sim")
        assert node is not None and node.nvml is not None
        seen.append(replay_findings(node, node.nvml.gpus[0]))

    def between() -> None:
        if ticker.now > 1_796_000_000.0:
            judged()
        lib.replays = next(replays)
        ticker.now += 1.0 if lib.replays == 2 else 3.0

    asyncio.run(hub.poll_once(rounds=30, between=between))
    judged()
    assert seen[1:4] == [[], [], []]  # two replays are no fault
    assert seen[6] == []  # nor are five
    assert all(len(found) == 1 for found in seen[12:]), seen  # nine within the minute are
    # the window holds a minute of samples, one step (a tenth of it) apart
    assert seen[-1][0].text == "PCIe link replayed 21 times in the last 63 s: more than 8 a minute"


async def test_a_rail_with_its_link_up_and_no_subnet_manager_is_drained_not_reseated(
    tmp_path: Path,
) -> None:
    tree = RealTree(tmp_path)
    (tree.port("mlx4_0") / "state").write_text("2: INIT\n")  # LinkUp, waiting for an SM
    (tree.port("mlx4_0", 2) / "state").write_text("1: DOWN\n")
    (tree.port("mlx4_0", 2) / "phys_state").write_text("3: Disabled\n")
    node = await tree.poll()
    found = {f.subject: f for f in fabric_findings_of(node, "mlx4_0/")}
    waiting, down = found["mlx4_0/1 (compute)"], found["mlx4_0/2 (compute)"]
    assert (waiting.code, waiting.severity, waiting.action) == (
        "rail_not_active",
        Severity.CRITICAL,
        Action.DRAIN,
    )
    assert waiting.text == (
        "link init (LinkUp): its link is up, no subnet manager has made it active"
    )
    assert (down.code, down.severity, down.action) == (
        "rail_down",
        Severity.CRITICAL,
        Action.RESEAT,
    )


def test_a_counter_missing_from_one_poll_costs_the_others_their_climb_nothing() -> None:
    window: ClimbWindow[str] = ClimbWindow(600.0)
    assert window.add(0.0, "mlx5_0/1", (0, 7)) is None
    assert window.add(60.0, "mlx5_0/1", (1, 7)) == ((1, 0), 60.0)  # link_downed +1
    # the netdev's statistics not read this poll: the link's flap is still counted
    assert window.add(120.0, "mlx5_0/1", (1, None)) == ((1, 0), 120.0)
    # back, lower than before (reset meanwhile): no climb is made of it
    assert window.add(180.0, "mlx5_0/1", (1, 2)) == ((1, 0), 180.0)
    # every counter cleared (`perfquery -R`): the window starts again
    assert window.add(240.0, "mlx5_0/1", (0, 2)) is None
    assert window.add(300.0, "mlx5_0/1", (0, 3)) == ((0, 1), 60.0)


async def test_how_long_an_agent_says_its_counts_cover_is_said_within_the_window(
    tmp_path: Path,
) -> None:
    # an agent's reading, decoded as sent: spans no source of ours writes
    node = await RealTree(tmp_path).poll()
    assert node.fabric is not None
    port = node.fabric.ports[0]
    for span in (1e300, float("nan"), -3.0):
        told = msgspec.structs.replace(
            port, errors_climbed=(("symbol_error", 4),), errors_climbed_s=span
        )
        device = msgspec.structs.replace(node.fabric.devices[0], ports=(told,))
        (found,) = fabric_findings(node, msgspec.structs.replace(node.fabric, devices=(device,)))
        assert found.text == "symbol errors +4 in the last 11 min", span
    gpu = GpuReading(0, "GPU-1", "H100", "0000:1b:00.0",
                     nvlink_errors=(NvLinkErrors(3, crc=2, window_s=1e300),))  # fmt: skip
    (link,) = reading_verdict(gpu).findings
    assert link.text.startswith("NVLink 3: 2 CRC errors in the last 11 min")


async def test_a_counter_that_climbs_a_little_under_load_is_judged_by_its_rate_over_the_window(
    tmp_path: Path,
) -> None:
    # mlx5_0's out_of_sequence (hw_counters, 1 in procfs's tree): RoCE sees a few under
    # healthy load; past 1 a second it is a fault
    tree = RealTree(tmp_path)
    rail = tree.port("mlx5_0")
    await tree.poll()
    for seen in (11, 21, 31):  # 10 a minute
        set_value(rail, "out_of_sequence", seen, "hw_counters")
        assert fabric_findings_of(await tree.poll(60.0), "mlx5_0/1") == []
    set_value(rail, "out_of_sequence", 31 + 600, "hw_counters")  # 10 a second
    (found,) = fabric_findings_of(await tree.poll(60.0), "mlx5_0/1")
    assert (found.code, found.severity, found.action) == (
        "port_errors",
        Severity.WARNING,
        Action.WATCH,
    )
    assert found.text == "out-of-sequence packets +630 (2.62/s)"  # over the 4 minutes seen


# --- PCIe link training ----------------------------------------------------------------


class Trained(SimNvml):
    """The simulator, GPU 0's PCIe link trained as the test says, at the work it says."""

    gen, width, util = 5, 16, 90

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self.gen if h.index == 0 else super().nvmlDeviceGetCurrPcieLinkGeneration(h)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self.width if h.index == 0 else super().nvmlDeviceGetCurrPcieLinkWidth(h)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        rates = super().nvmlDeviceGetUtilizationRates(h)
        if h.index == 0:
            rates.gpu = self.util
        return rates


def test_a_link_trained_narrow_is_reseated_and_a_slow_generation_counts_only_at_work() -> None:
    def judged(gen: int, width: int, util: int) -> list[tuple[str, str, Action]]:
        lib = Trained(SimNode("sim", DGX_H100))
        lib.gen, lib.width, lib.util = gen, width, util
        gpu = NvmlSource("sim", lib=lib, events=False).collect().gpus[0]
        found = reading_verdict(gpu).findings
        return [(f.code, f.text, f.action) for f in found if f.code.startswith("pcie")]

    assert judged(5, 16, 90) == []
    assert judged(5, 8, 90) == [("pcie_narrow", "PCIe link x8 of x16", Action.RESEAT)]
    assert judged(5, 8, 0) == [("pcie_narrow", "PCIe link x8 of x16", Action.RESEAT)]
    # an idle GPU trains its link down to save power: no fault
    assert judged(1, 16, 0) == []
    assert judged(3, 16, 90) == [
        ("pcie_downtrained", "PCIe link Gen3 of Gen5 while it works", Action.WATCH)
    ]


# --- a rail that is gone ------------------------------------------------------------------


async def test_an_hca_that_left_the_bus_is_a_rail_gone_not_a_healthy_node(tmp_path: Path) -> None:
    tree = RealTree(tmp_path)
    await tree.poll()
    shutil.rmtree(tree.root / "class" / "infiniband" / "mlx4_0")  # fell off the bus
    for _ in range(2):
        found = fabric_findings_of(await tree.poll(), "mlx4_0/")
        assert [(f.code, f.subject, f.severity, f.action) for f in found] == [
            ("rail_gone", "mlx4_0/1 (compute)", Severity.CRITICAL, Action.REBOOT_NODE),
            ("rail_gone", "mlx4_0/2 (compute)", Severity.CRITICAL, Action.REBOOT_NODE),
        ]
    assert found[0].text.startswith("gone from sysfs since ")


async def test_an_hca_renamed_at_the_same_pci_address_is_not_gone(tmp_path: Path) -> None:
    fs = dgx_h100_slice(tmp_path)
    ticker = Ticker()
    hub = Hub(clock=ticker, monotonic=ticker)
    hub.add_source(
        FabricSource(NODE, sysfs_root=str(fs.root), netlink=False, clock=ticker, rescan_every=1)
    )
    await hub.poll_once()
    link = fs.root / "class" / "infiniband" / "mlx5_6"
    device = link.resolve()
    link.unlink()  # the driver came back and numbered it mlx5_12
    device.rename(device.with_name("mlx5_12"))
    link.with_name("mlx5_12").symlink_to(device.with_name("mlx5_12"))
    ticker.now += 5.0
    node = (await hub.poll_once()).node(NODE)
    assert node is not None and node.fabric is not None
    assert node.fabric.port("mlx5_12") is not None and node.fabric.missing == ()
    link.with_name("mlx5_12").unlink()
    ticker.now += 5.0
    node = (await hub.poll_once()).node(NODE)
    assert node is not None and node.fabric is not None
    assert [(m.name, m.pci_bus_id) for m in node.fabric.missing] == [("mlx5_12/1", "0000:9a:00.0")]


async def test_an_error_counter_pegged_at_its_maximum_is_watched_and_named(
    tmp_path: Path,
) -> None:
    """link_downed is 8 bits wide and stops at 255: every later flap goes uncounted, so a
    rail up and quiet with it pegged is watched, the counter named, until it is cleared. A
    pegged transmit wait is congestion's, not a fault: no finding of its own."""
    tree = RealTree(tmp_path)
    counters = tree.port("mlx4_0") / "counters"
    (counters / "link_downed").write_text("255\n")
    (counters / "port_xmit_wait").write_text(f"{(1 << 32) - 1}\n")
    await tree.poll()
    node = await tree.poll()
    found = [f for f in fabric_findings_of(node, "mlx4_0/1 ") if f.code == "counter_pegged"]
    assert [(f.text, f.severity, f.action) for f in found] == [
        (
            "link downed counter pegged at 255, its maximum: further ones are not counted "
            "until it is cleared (perfquery -R)",
            Severity.WARNING,
            Action.WATCH,
        )
    ]
    (counters / "link_downed").write_text("0\n")  # perfquery -R
    node = await tree.poll()
    assert not [f for f in fabric_findings_of(node, "mlx4_0/1 ") if f.code == "counter_pegged"]
