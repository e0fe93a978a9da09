"""The BMC source against Redfish (sushy-static serving DGX-H100-like mockups) over HTTPS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuconsole.model import Event
from gpuconsole.readings.bmc import BmcReading, SensorHealth, SensorKind
from gpuconsole.sources.bmc import BmcError, BmcSource, BmcTarget, PowerAction, open_link
from gpuconsole.sources.bmc.sel import SelCursor
from tests.bmc_fixtures import Sushy, running_sushy, self_signed


@pytest.fixture
def modern(tmp_path: Path) -> Iterator[Sushy]:
    with running_sushy(tmp_path / "modern", "modern") as server:
        yield server


@pytest.fixture
def legacy(tmp_path: Path) -> Iterator[Sushy]:
    with running_sushy(tmp_path / "legacy", "legacy") as server:
        yield server


def source(server: Sushy, *, ca_file: str = "", verify: bool = True, **kw: object) -> BmcSource:
    target = BmcTarget(
        node="dgx-h100-01",
        host="127.0.0.1",
        protocol="redfish",
        port=server.port,
        username="admin",
        password="rf-secret",
        verify_tls=verify,
        ca_file=ca_file or str(server.cert),
    )
    return BmcSource(target.node, open_link(target), **kw)  # type: ignore[arg-type]


async def read(src: BmcSource, events: list[Event] | None = None, rounds: int = 1) -> BmcReading:
    await src.start((events if events is not None else []).append)
    try:
        for _ in range(rounds - 1):
            await src.poll()
        return await src.poll()
    finally:
        await src.close()


def test_the_newer_schema_sensors_totals_and_hgx_gpus(modern: Sushy) -> None:
    reading = asyncio.run(read(source(modern)))
    assert reading.power_w == 6120.0
    assert (reading.inlet_c, reading.exhaust_c) == (25.5, 44.0)
    assert (reading.fans_present, reading.fans_failed) == (12, 0)
    assert (reading.psus_present, reading.psus_failed) == (5, 0)  # PSU 6 is Absent
    inlet = reading.sensor("Inlet Temp")
    assert inlet is not None and inlet.kind is SensorKind.TEMPERATURE and inlet.unit == "C"
    assert inlet.thresholds is not None and inlet.thresholds.upper_critical == 40.0
    assert reading.sensor("FAN 4").kind is SensorKind.FAN  # type: ignore[union-attr]
    assert reading.sensor("CPU1 Temp").value is None  # type: ignore[union-attr]
    for module in range(1, 9):
        gpu = {s.kind: s.value for s in reading.gpu_sensors(module) if "DRAM" not in s.name}
        assert gpu == {SensorKind.TEMPERATURE: 40.0 + module, SensorKind.POWER: 600.0 + module}


def test_the_older_thermal_and_power_resources(legacy: Sushy) -> None:
    reading = asyncio.run(read(source(legacy)))
    assert reading.power_w == 5515.0  # PowerControl
    assert (reading.inlet_c, reading.exhaust_c) == (24.0, 43.0)
    assert (reading.fans_present, reading.fans_failed) == (12, 1)
    fan = reading.sensor("FAN 3")
    assert fan is not None and fan.value == 0.0 and fan.health is SensorHealth.CRITICAL
    assert (reading.psus_present, reading.psus_failed) == (6, 1)
    volts = reading.sensor("P12V")
    assert volts is not None and volts.kind is SensorKind.VOLTAGE and volts.value == 12.1
    assert reading.sensor("CPU1 Temp").value is None  # type: ignore[union-attr]


def test_a_changed_reading_and_a_new_log_entry_are_seen(modern: Sushy) -> None:
    events: list[Event] = []

    async def rounds() -> tuple[BmcReading, BmcReading]:
        src = source(modern, sel_cursor=SelCursor())
        await src.start(events.append)
        first = await src.poll()  # first contact: entries 1 and 2 are history
        path = modern.root / "Chassis/DGX/Sensors/Total_Power/index.json"
        doc = json.loads(path.read_text())
        doc["Reading"] = 7300.0
        path.write_text(json.dumps(doc))
        log = modern.root / "Systems/DGX/LogServices/EventLog/Entries/index.json"
        entries = json.loads(log.read_text())
        entries["Members"].append(
            {
                "Id": "3",
                "Created": "2024-05-01T12:00:00+00:00",
                "Severity": "Critical",
                "Message": "FAN 3 at 0 RPM",
            }
        )
        log.write_text(json.dumps(entries))
        second = await src.poll()
        await src.poll()
        await src.close()
        return first, second

    first, second = asyncio.run(rounds())
    assert (first.power_w, second.power_w) == (6120.0, 7300.0)
    assert [(e.code, e.message, e.severity.value) for e in events] == [
        (3, "SEL: FAN 3 at 0 RPM", "critical")
    ]


def test_power_control_posts_the_reset_type(modern: Sushy) -> None:
    async def soft() -> str:
        src = source(modern)
        await src.start(lambda _e: None)
        try:
            return await src.set_power(PowerAction.SOFT)
        finally:
            await src.close()

    assert asyncio.run(soft()) == "softoff"
    assert '"ResetType": "GracefulShutdown"' in modern.log.read_text()


def test_tls_is_checked_against_the_configured_ca_or_turned_off(
    modern: Sushy, tmp_path: Path
) -> None:
    other_ca, _key = self_signed(tmp_path / "other")
    with pytest.raises(BmcError, match=rf"redfish://127.0.0.1:{modern.port}: .*certificate"):
        asyncio.run(read(source(modern, ca_file=str(other_ca))))
    unchecked = asyncio.run(read(source(modern, ca_file=str(other_ca), verify=False)))
    assert unchecked.power_w == 6120.0
