"""An IPMI BMC that fails one command keeps what the others read (ipmi_sim, against ipmitool).

Each BMC here is the test BMC with one thing changed the way ipmi_sim offers, so that one
command fails while ipmitool still reads the rest from the same BMC: a chassis control that
cannot tell the power state (completion code 0xFF), a controller that is no chassis device
(0xC1: blades, satellite controllers), one without a SEL, and a sensor in the SDR that
cannot be read.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuconsole.hub import Hub
from gpuconsole.readings.base import Event, PartStatus, Severity
from gpuconsole.readings.bmc import BmcReading, PowerState
from gpuconsole.readings.snapshot import FleetSnapshot
from gpuconsole.sources.bmc import BmcError, BmcSource, BmcTarget, PowerAction, open_link
from tests.bmc_fixtures import IpmiSim, SimFiles, running_ipmi_sim
from tests.export_fixtures import one, parse, render

NODE = "blade-07"


def target(sim: IpmiSim) -> BmcTarget:
    return BmcTarget(NODE, "127.0.0.1", "ipmi", sim.port, sim.username, sim.password)


def number(text: str) -> float:
    match = re.match(r"-?[0-9.]+", text)
    assert match, text
    return float(match.group(0))


def device_support(mask: int) -> SimFiles:
    """The test BMC whose Get Device ID offers only the device classes in `mask`."""
    files = SimFiles.default()
    line = "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr"
    assert line in files.emu
    changed = line.replace(" 0x9f ", f" {mask:#04x} ")
    return SimFiles(files.emu.replace(line, changed), files.sdrs, files.chassis_control)


def chassis_control_that_fails_while(flag: str) -> SimFiles:
    """The test BMC whose chassis control cannot read the power state while file `flag`
    (beside the script) exists: ipmi_sim then answers Get Chassis Status with 0xFF."""
    files = SimFiles.default()
    script = files.chassis_control.replace(
        'state="$(dirname "$0")/power.state"\n',
        f'state="$(dirname "$0")/power.state"\n[ -f "$(dirname "$0")/{flag}" ] && exit 1\n',
    )
    assert script != files.chassis_control
    return SimFiles(files.emu, files.sdrs, script)


def ipmitool_fails(sim: IpmiSim, *args: str) -> str:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        sim.ipmitool(*args)
    return str(failed.value.stderr)


def poll(sim: IpmiSim, rounds: int = 1, between: Callable[[], None] = lambda: None) -> Hub:
    hub = Hub()
    hub.add_source(BmcSource(NODE, open_link(target(sim)), timeout_s=10))

    async def run() -> None:
        for i in range(rounds):
            if i:
                between()
            await hub.poll_once()

    asyncio.run(run())
    return hub


def fresh_reading(snapshot: FleetSnapshot) -> BmcReading:
    node = snapshot.node(NODE)
    assert node is not None
    status = node.status("bmc")
    assert status is not None and status.ok, status
    assert node.bmc is not None
    return node.bmc


def assert_sensors_as_ipmitool_reads(reading: BmcReading, sim: IpmiSim) -> None:
    sdr = sim.sdr_list()
    assert {s.name for s in reading.sensors} == set(sdr)
    numeric = [s for s in reading.sensors if s.value is not None]
    assert len(numeric) == 8
    for sensor in numeric:
        assert sensor.value == pytest.approx(number(sdr[sensor.name])), sensor.name
    assert reading.power_w == 6000.0
    assert (reading.inlet_c, reading.exhaust_c) == (24.0, 41.0)
    assert (reading.fans_present, reading.fans_failed) == (2, 0)
    assert (reading.psus_present, reading.psus_failed) == (1, 0)


def part_events(events: tuple[Event, ...]) -> list[tuple[str, Severity, str]]:
    return [(e.kind, e.severity, e.message) for e in events if e.kind.startswith("part_")]


def test_chassis_status_failing_costs_the_power_state_only(tmp_path: Path) -> None:
    with running_ipmi_sim(tmp_path / "sim", chassis_control_that_fails_while("broken")) as sim:
        flag = sim.workdir / "broken"
        flag.touch()
        assert "Chassis Status command: Unspecified error" in ipmitool_fails(
            sim, "chassis", "status"
        )
        hub = poll(sim)
        snapshot = hub.publish()
        reading = fresh_reading(snapshot)
        assert_sensors_as_ipmitool_reads(reading, sim)  # ipmitool reads all of them
        assert reading.power_state is PowerState.UNKNOWN
        [error] = reading.unread
        assert error.part == "power"
        assert error.detail == "Get Chassis Status failed: completion code 0xFF (Unspecified)"
        read = {p.part: p.detail for p in reading.parts if p.ok}
        assert read == {"sensors": "10 sensors", "thresholds": "9 sensors", "sel": "0 records"}

        metrics = parse(render(snapshot))
        assert one(metrics["ipmi_up"], node=NODE, collector="ipmi").value == 1.0
        assert one(metrics["ipmi_up"], node=NODE, collector="chassis").value == 0.0
        assert "ipmi_chassis_power_state" not in metrics
        fan = one(metrics["ipmi_fan_speed_rpm"], node=NODE, name="FAN 1")
        assert fan.value == 9600.0
        psu = one(metrics["ipmi_sensor_state"], node=NODE, name="PSU1 Status")
        assert psu.value == 0.0

        # once the chassis control answers again, so does the power state
        recovered = poll(sim, rounds=2, between=flag.unlink)
        reading = fresh_reading(recovered.publish())
        assert reading.power_state is PowerState.ON and reading.unread == ()
        assert part_events(recovered.events()) == [
            ("part_stale", Severity.WARNING, f"bmc power not read: {error.detail}"),
            ("part_recovered", Severity.INFO, "bmc power read again"),
        ]
        assert not [e for e in recovered.events() if e.kind == "power"]


def test_a_controller_that_is_no_chassis_device_still_gives_its_sensors(tmp_path: Path) -> None:
    # Additional Device Support without bit 7 (chassis device): ipmi_sim then answers the
    # chassis commands "Invalid command", as a blade or satellite controller does.
    with running_ipmi_sim(tmp_path / "sim", device_support(0x1F)) as sim:
        assert "Invalid command" in ipmitool_fails(sim, "chassis", "power", "status")
        reading = fresh_reading(poll(sim).publish())
        assert_sensors_as_ipmitool_reads(reading, sim)
        assert reading.power_state is PowerState.UNKNOWN
        assert [(p.part, p.detail) for p in reading.unread] == [
            ("power", "Get Chassis Status failed: completion code 0xC1 (Invalid command)")
        ]

        async def power_off() -> None:
            source = BmcSource(NODE, open_link(target(sim)), timeout_s=10)
            await source.start(lambda _e: None)
            try:
                await source.set_power(PowerAction.OFF)
            finally:
                await source.close()

        with pytest.raises(BmcError) as refused:
            asyncio.run(power_off())
        assert str(refused.value) == (
            f"ipmi://127.0.0.1:{sim.port}: power off refused: Get Chassis Status failed: "
            "completion code 0xC1 (Invalid command)"
        )


def test_a_bmc_without_a_sel_keeps_its_sensors_and_power(tmp_path: Path) -> None:
    # Additional Device Support without bit 2 (SEL device): the SEL commands are refused.
    with running_ipmi_sim(tmp_path / "sim", device_support(0x9B)) as sim:
        assert "Get SEL Info command failed: Invalid command" in ipmitool_fails(sim, "sel", "list")
        reading = fresh_reading(poll(sim).publish())
        assert_sensors_as_ipmitool_reads(reading, sim)
        assert reading.power_state is PowerState.ON
        assert reading.sel_recent == ()
        assert reading.part("sel") == PartStatus(
            "sel", False, "Get SEL Info failed: completion code 0xC1 (Invalid command)"
        )
        assert [(p.part, p.detail) for p in reading.unread] == [
            ("sel", "Get SEL Info failed: completion code 0xC1 (Invalid command)")
        ]


def unreadable_sensor() -> SimFiles:
    """The test BMC plus "GPU Tray Temp" (sensor 11): in the SDR, but ipmi_sim can only
    send its events, so Get Sensor Reading for it fails."""
    files = SimFiles.default()
    start = files.sdrs.index("# Inlet Temp\n")
    block = files.sdrs[start : files.sdrs.index("endsdr\n", start) + len("endsdr\n")]
    extra = (
        block.replace("# Inlet Temp", "# GPU Tray Temp")
        .replace("sensor_number          \t1\n", "sensor_number          \t11\n")
        .replace('"Inlet Temp"', '"GPU Tray Temp"')
    )
    assert extra.count("11\n") == 1 and "GPU Tray Temp" in extra
    emu = files.emu.replace(
        "mc_enable 0x20", "sensor_add 0x20 0 11 0x01 0x01 event-only\nmc_enable 0x20"
    )
    # Another product id: pyghmi shares one SDR among the BMCs of a process that report
    # the same model, firmware and SDR time, as the other test BMCs here may.
    assert " 0x1291 " in emu
    emu = emu.replace(" 0x1291 ", " 0x1292 ")
    return SimFiles(emu, files.sdrs + "\n" + extra, files.chassis_control)


def test_one_sensor_that_cannot_be_read_leaves_the_others(tmp_path: Path) -> None:
    with running_ipmi_sim(tmp_path / "sim", unreadable_sensor()) as sim:
        sdr = sim.sdr_list()
        assert sdr.pop("GPU Tray Temp") in ("no reading", "disabled")
        reading = fresh_reading(poll(sim).publish())
        tray = reading.sensor("GPU Tray Temp")
        assert tray is not None and tray.value is None and tray.sensor_id == "11"
        others = [s for s in reading.sensors if s.name != "GPU Tray Temp"]
        assert {s.name for s in others} == set(sdr)
        for sensor in others:
            if sensor.value is not None:
                assert sensor.value == pytest.approx(number(sdr[sensor.name])), sensor.name
        assert reading.power_w == 6000.0 and reading.power_state is PowerState.ON
        assert [(p.part, p.detail) for p in reading.unread] == [
            (
                "sensor GPU Tray Temp",
                "Get Sensor Reading (sensor 11) failed: completion code 0xCC "
                "(Invalid data field in request)",
            )
        ]
