"""The BMC source against Redfish (sushy-static serving DGX-H100-like mockups) over HTTPS."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuconsole.codec import dumps
from gpuconsole.facts.summaries import bmc_panel
from gpuconsole.facts.verdict import Action, bmc_findings
from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, Health, PartStatus, Severity
from gpuconsole.readings.bmc import BmcReading, SensorHealth, SensorKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.bmc import BmcError, BmcSource, BmcTarget, PowerAction, open_link
from gpuconsole.sources.bmc.sel import SelCursor
from tests.bmc_fixtures import (
    Sushy,
    free_port,
    running_sushy,
    running_sushy_emulator,
    self_signed,
)


@pytest.fixture
def modern(tmp_path: Path) -> Iterator[Sushy]:
    with running_sushy(tmp_path / "modern", "modern") as server:
        yield server


@pytest.fixture
def legacy(tmp_path: Path) -> Iterator[Sushy]:
    with running_sushy(tmp_path / "legacy", "legacy") as server:
        yield server


def target(
    server: Sushy | int,
    *,
    node: str = "dgx-h100-01",
    ca_file: str = "",
    verify: bool = True,
    timeout_s: float = 10.0,
) -> BmcTarget:
    """The BMC `server` serves, or (a port number) a BMC that is not there."""
    port = server if isinstance(server, int) else server.port
    return BmcTarget(
        node=node,
        host="127.0.0.1",
        protocol="redfish",
        port=port,
        username="admin",
        password="rf-secret",
        verify_tls=verify,
        ca_file=ca_file or ("" if isinstance(server, int) else str(server.cert)),
        timeout_s=timeout_s,
    )


def source(
    server: Sushy | int,
    *,
    node: str = "dgx-h100-01",
    ca_file: str = "",
    verify: bool = True,
    timeout_s: float = 10.0,
    **kw: object,
) -> BmcSource:
    bmc = target(server, node=node, ca_file=ca_file, verify=verify, timeout_s=timeout_s)
    return BmcSource(bmc.node, open_link(bmc), timeout_s=timeout_s, **kw)  # type: ignore[arg-type]


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


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[Sushy]:
    """A BMC that hangs: sushy-static stopped (SIGSTOP). The kernel still accepts its
    connections; nothing answers until it is continued."""
    with running_sushy(tmp_path / "stopped", "modern") as server:
        server.proc.send_signal(signal.SIGSTOP)
        try:
            yield server
        finally:
            server.proc.send_signal(signal.SIGCONT)


def test_a_down_and_a_slow_bmc_go_stale_while_the_others_are_fine(
    modern: Sushy, stopped: Sushy
) -> None:
    down = free_port()  # nothing listens there
    hub = Hub()
    hub.add_source(source(modern, node="good"))
    hub.add_source(source(down, node="down", timeout_s=1.0))
    hub.add_source(source(stopped, node="slow", timeout_s=1.0))
    began = time.monotonic()
    snapshot = asyncio.run(hub.poll_once())
    took = time.monotonic() - began
    statuses = {n.node: n.status("bmc") for n in snapshot.nodes}
    assert statuses["good"].ok  # type: ignore[union-attr]
    assert snapshot.node("good").bmc.power_w == 6120.0  # type: ignore[union-attr]
    assert statuses["down"].error == (  # type: ignore[union-attr]
        f"BmcError: redfish://127.0.0.1:{down}: connection refused (BMC down or not serving HTTPS?)"
    )
    assert statuses["slow"].error == (  # type: ignore[union-attr]
        f"BmcError: redfish://127.0.0.1:{stopped.port}: no answer within 1 s"
    )
    assert took < 15  # pyghmi's own timeout is 60 s


def test_the_timeout_bounds_the_logon_and_every_request(modern: Sushy) -> None:
    # Straight on the link, below the source's own timeout: pyghmi itself must give up.
    open_session = open_link(target(modern, timeout_s=1.0))
    assert open_session.read(sel=False).sensors
    modern.proc.send_signal(signal.SIGSTOP)
    try:
        new_session = open_link(target(modern, timeout_s=1.0))
        for link in (new_session, open_session):  # a logon, then a request of a session
            began = time.monotonic()
            with pytest.raises(BmcError) as error:
                link.read(sel=False)
            assert time.monotonic() - began < 15  # pyghmi's own timeout is 60 s
            assert str(error.value) == f"redfish://127.0.0.1:{modern.port}: no answer within 1 s"
    finally:
        modern.proc.send_signal(signal.SIGCONT)
    # It answers again (late): the link logs on afresh and reads.
    assert open_session.read(sel=False).power_state.value == "on"


def test_a_wrong_password_is_a_clear_error_that_never_shows_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    right, wrong = "rf-right-7Kq", "rf-wrong-3Zp"
    with running_sushy_emulator(tmp_path / "emulator", "admin", right) as bmc:

        def login(node: str, password: str) -> BmcSource:
            at = BmcTarget(
                node, "127.0.0.1", "redfish", bmc.port, "admin", password, ca_file=str(bmc.cert)
            )
            return BmcSource(node, open_link(at))

        hub = Hub()
        hub.add_source(login("refused", wrong))
        hub.add_source(login("let-in", right))  # the same BMC takes the right password
        with caplog.at_level(logging.DEBUG):
            snapshot = asyncio.run(hub.poll_once())
    refused = snapshot.node("refused").status("bmc")  # type: ignore[union-attr]
    assert refused is not None and refused.error == (
        f"BmcAuthError: redfish://127.0.0.1:{bmc.port}: the BMC refused the user name or password"
    )
    assert snapshot.node("let-in").status("bmc").ok  # type: ignore[union-attr]
    text = dumps(snapshot) + caplog.text
    assert wrong not in text and right not in text


# --- documents a BMC should not send -------------------------------------------------


def edit(server: Sushy, resource: str, text: str) -> None:
    """Serve `text` as the body of /redfish/v1/`resource` from now on."""
    (server.root / resource / "index.json").write_text(text)


def with_field(server: Sushy, resource: str, key: str, raw_json: str) -> None:
    """Set one field of a served document to `raw_json`, written as is (1e400 stays 1e400)."""
    path = server.root / resource / "index.json"
    doc = json.loads(path.read_text())
    doc[key] = "@@"
    path.write_text(json.dumps(doc).replace('"@@"', raw_json))


def stale_after_one_good_poll(server: Sushy, break_it: Callable[[], None]) -> FleetSnapshot:
    hub = Hub()
    hub.add_source(source(server))
    return asyncio.run(hub.poll_once(2, between=break_it))


def test_a_body_that_is_not_an_object_costs_that_sensor_alone_and_names_it(modern: Sushy) -> None:
    snapshot = stale_after_one_good_poll(
        modern, lambda: edit(modern, "Chassis/DGX/Sensors/Total_Power", '"Total Power"')
    )
    node = snapshot.node("dgx-h100-01")
    assert node is not None and node.status("bmc").ok  # type: ignore[union-attr]
    assert node.bmc is not None and node.bmc.unread == (
        PartStatus(
            "Chassis/DGX/Sensors", False, "Total_Power: the body is a string, not an object"
        ),
    )
    assert node.bmc.sensor("Total Power") is None
    assert node.bmc.sensor("Inlet Temp").value == 25.5  # type: ignore[union-attr]
    assert node.bmc.power_w == 6120.0  # EnvironmentMetrics' own PowerWatts


def test_a_collection_whose_members_is_not_an_array_costs_that_collection_and_names_it(
    modern: Sushy,
) -> None:
    with_field(modern, "Chassis/DGX/Sensors", "Members", '{"@odata.id": "/redfish/v1/x"}')
    reading = asyncio.run(read(source(modern)))
    assert reading.unread == (
        PartStatus("Chassis/DGX/Sensors", False, "Members is an object, not an array"),
    )
    assert reading.sensor("Inlet Temp") is None  # a DGX Sensor
    gpu3 = [s.value for s in reading.gpu_sensors(3) if s.kind is SensorKind.TEMPERATURE]
    assert gpu3 == [43.0, 53.0]  # GPU and its DRAM: the HGX chassis's Sensors still read
    assert (reading.fans_present, reading.psus_present) == (12, 5)


def test_a_thermal_resource_answering_404_costs_the_temperatures_and_fans_alone(
    legacy: Sushy,
) -> None:
    (legacy.root / "Chassis/DGX/Thermal/index.json").unlink()
    hub = Hub()
    hub.add_source(source(legacy))
    node = asyncio.run(hub.poll_once()).node("dgx-h100-01")
    assert node is not None and node.status("bmc").ok  # type: ignore[union-attr]
    reading = node.bmc
    assert reading is not None
    assert reading.unread == (PartStatus("Chassis/DGX/Thermal", False, "HTTP 404"),)
    assert reading.power_w == 5515.0 and (reading.psus_present, reading.psus_failed) == (6, 1)
    assert reading.sensor("P12V").value == 12.1  # type: ignore[union-attr]
    assert reading.inlet_c is None and reading.sensor("FAN 3") is None


def test_a_sensor_whose_status_is_a_string_is_a_warning_and_the_rest_still_read(
    modern: Sushy,
) -> None:
    with_field(modern, "Chassis/DGX/Sensors/Exhaust_Temp", "Status", '"Enabled"')
    reading = asyncio.run(read(source(modern)))
    exhaust = reading.sensor("Exhaust Temp")
    assert exhaust is not None and exhaust.value == 44.0
    assert (exhaust.health, exhaust.states) == (SensorHealth.WARNING, ("unreadable Status",))
    inlet = reading.sensor("Inlet Temp")
    assert inlet is not None and (inlet.value, inlet.health) == (25.5, SensorHealth.OK)
    assert [s.name for s in reading.sensors if s.health is not SensorHealth.OK] == ["Exhaust Temp"]
    assert (reading.power_w, reading.exhaust_c) == (6120.0, 44.0)


def test_a_reading_too_large_for_a_float_is_no_reading_and_the_snapshot_still_writes(
    modern: Sushy,
) -> None:
    with_field(modern, "Chassis/DGX/Sensors/Exhaust_Temp", "Reading", "1e400")
    hub = Hub()
    hub.add_source(source(modern))
    snapshot = asyncio.run(hub.poll_once())
    node = snapshot.node("dgx-h100-01")
    assert node is not None and node.status("bmc").ok  # type: ignore[union-attr]
    exhaust = node.bmc.sensor("Exhaust Temp")  # type: ignore[union-attr]
    assert exhaust is not None and exhaust.value is None
    assert node.bmc.sensor("Inlet Temp").value == 25.5  # type: ignore[union-attr]
    json.loads(dumps(snapshot))  # allow_nan=False: an inf reading would raise here


def test_psus_that_lost_their_input_are_not_failed_and_the_verdict_says_check_their_power(
    modern: Sushy,
) -> None:
    # DGX: PSU 1-5 present, PSU 6 absent. PSU 2 loses its input (LineInputStatus
    # LossOfInput, its Health Critical as some BMCs rate it): it delivers nothing, yet the
    # PSU may be fine (the Power registry's LossOfInputPower is a Warning, its resolution
    # to check the power source and cable). Four PSUs still deliver: redundancy lost, a
    # warning, to reseat or check the cable and feed; not a PSU to return for service.
    supplies = modern.root / "Chassis/DGX/PowerSubsystem/PowerSupplies"

    def lose_input(*psus: int) -> BmcReading:
        for n in psus:
            path = supplies / f"PSU_{n}/index.json"
            doc = json.loads(path.read_text())
            doc["LineInputStatus"] = "LossOfInput"
            doc["Status"] = {"State": "Enabled", "Health": "Critical"}
            path.write_text(json.dumps(doc))
        return asyncio.run(read(source(modern)))

    def psu_findings(reading: BmcReading) -> list[tuple[str, str, Severity, Action]]:
        return [
            (f.code, f.text, f.severity, f.action)
            for f in bmc_findings(reading)
            if "PSU" in f.text + f.subject
        ]

    one = lose_input(2)
    assert (one.psus_present, one.psus_failed, one.psus_no_input) == (5, 0, 1)
    assert one.no_input_psus == ("PSU 2",) and one.health is Health.WARNING
    assert "PSUs 4/5 ok, 1 without input" in bmc_panel(NodeSnapshot("dgx-h100-01", bmc=one))
    assert psu_findings(one) == [
        (
            "psu_no_input",
            "1 of 5 PSUs has no input power: PSU 2; 4 deliver, PSU redundancy lost",
            Severity.WARNING,
            Action.RESEAT,
        )
    ]
    # three more: one PSU left delivering, none to spare
    four = lose_input(1, 3, 4)
    assert (four.psus_failed, four.psus_no_input, four.health) == (0, 4, Health.CRITICAL)
    assert psu_findings(four) == [
        (
            "psu_no_input",
            "4 of 5 PSUs have no input power: PSU 1, PSU 2, PSU 3, PSU 4; "
            "1 delivers, no PSU redundancy left",
            Severity.CRITICAL,
            Action.RESEAT,
        )
    ]


def test_a_psu_redundancy_group_says_how_many_psus_the_node_needs(modern: Sushy) -> None:
    # The DGX's PowerSubsystem says its PSUs are one group that needs 4 (an N+2 of six,
    # PSU 6 absent): two PSUs without input leave 3, below what it needs, critical, where
    # the count alone (3, more than one) would say redundancy lost, a warning. Figures no
    # count of PSUs (a string, a bool, a huge one) are not taken.
    subsystem = modern.root / "Chassis/DGX/PowerSubsystem/index.json"
    supplies = modern.root / "Chassis/DGX/PowerSubsystem/PowerSupplies"

    def read_with(*needed: object) -> BmcReading:
        doc = json.loads(subsystem.read_text())
        doc["PowerSupplyRedundancy"] = [
            {"RedundancyType": "NPlusM", "MinNeededInGroup": n} for n in needed
        ]
        subsystem.write_text(json.dumps(doc))
        return asyncio.run(read(source(modern)))

    for n in (1, 2):
        path = supplies / f"PSU_{n}/index.json"
        doc = json.loads(path.read_text())
        doc["LineInputStatus"] = "OutOfRange"
        path.write_text(json.dumps(doc))
    reading = read_with(4)
    assert (reading.psus_needed, reading.psus_delivering, reading.health) == (4, 3, Health.CRITICAL)
    [found] = [f for f in bmc_findings(reading) if f.code == "psu_no_input"]
    assert (found.text, found.severity, found.action) == (
        "2 of 5 PSUs have no input power: PSU 1, PSU 2; 3 deliver of the 4 it needs, "
        "no PSU redundancy left",
        Severity.CRITICAL,
        Action.RESEAT,
    )
    assert read_with(2).health is Health.WARNING  # 3 deliver, 2 needed: one to spare
    assert read_with(1, 1).psus_needed == 2  # two groups: each needs its own
    for odd in ("4", True, 10**9, -1, None):
        assert read_with(odd).psus_needed is None


def test_a_psu_without_input_in_the_older_power_resource_reads_as_in_the_newer(
    legacy: Sushy,
) -> None:
    # The deprecated Power resource carries each PSU's Status on its power sensor too: PSU 2
    # (Health Critical, 0 W) with LineInputStatus LossOfInput is a PSU without input, its
    # sensor's state counted there, not a failed PSU nor a critical sensor; FAN 3 mended,
    # so nothing else on the node is critical: a warning, as PowerSubsystem's reads
    power = legacy.root / "Chassis/DGX/Power/index.json"
    doc = json.loads(power.read_text())
    doc["PowerSupplies"][1]["LineInputStatus"] = "LossOfInput"
    doc["Redundancy"] = [{"MemberId": "0", "Mode": "N+m", "MinNumNeeded": 3}]
    power.write_text(json.dumps(doc))
    thermal = legacy.root / "Chassis/DGX/Thermal/index.json"
    doc = json.loads(thermal.read_text())
    doc["Fans"][2].update(Reading=9000, Status={"State": "Enabled", "Health": "OK"})
    thermal.write_text(json.dumps(doc))
    reading = asyncio.run(read(source(legacy)))
    assert (reading.psus_present, reading.psus_failed, reading.no_input_psus) == (6, 0, ("PSU 2",))
    assert (reading.psus_needed, reading.health) == (3, Health.WARNING)
    assert [(f.text, f.severity, f.action) for f in bmc_findings(reading)] == [
        (
            "1 of 6 PSUs has no input power: PSU 2 at 0 W; 5 deliver of the 3 it needs, "
            "PSU redundancy lost",
            Severity.WARNING,
            Action.RESEAT,
        )
    ]
