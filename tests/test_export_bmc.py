"""BMC metrics under ipmi_exporter's names, node totals and HGX board sensors, no passwords."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import msgspec

from gpuconsole.alerts.rules import DEFAULT_RULES
from gpuconsole.export.bmc import without_credentials
from gpuconsole.facts.summaries import source_facet
from gpuconsole.hub import Hub
from gpuconsole.readings.base import SourceStatus
from gpuconsole.readings.bmc import BmcReading, SensorKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.bmc import BmcSource, BmcTarget, open_link
from tests.alert_fixtures import fired_as_promtool_fires
from tests.bmc_fixtures import IPMI_PASSWORD, running_ipmi_sim
from tests.export_fixtures import (
    frozen_body,
    frozen_demo_hub,
    frozen_fleet,
    label_names,
    one,
    parse,
    pick,
    poll_twice,
    render,
)

TYPED = {
    SensorKind.TEMPERATURE: ("ipmi_temperature_celsius", "ipmi_temperature_state"),
    SensorKind.FAN: ("ipmi_fan_speed_rpm", "ipmi_fan_speed_state"),
    SensorKind.POWER: ("ipmi_power_watts", "ipmi_power_state"),
    SensorKind.VOLTAGE: ("ipmi_voltage_volts", "ipmi_voltage_state"),
    SensorKind.CURRENT: ("ipmi_current_amperes", "ipmi_current_state"),
}


def test_a_stopped_fan_reads_zero_rpm_in_critical_state() -> None:
    metrics = parse(frozen_body())
    rpm = one(metrics["ipmi_fan_speed_rpm"], node="dgx-002", name="FAN 3")
    state = one(metrics["ipmi_fan_speed_state"], node="dgx-002", name="FAN 3")
    assert rpm.value == 0.0 and state.value == 2.0
    assert one(metrics["ipmi_fan_speed_state"], node="dgx-002", name="FAN 1").value == 0.0
    assert one(metrics["gpuconsole_bmc_fans_failed"], node="dgx-002").value == 1.0


def test_every_sensor_is_exported_with_ipmi_exporters_labels_and_its_reading() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    node = snapshot.node("dgx-001")
    assert node is not None and node.bmc is not None
    for sensor in node.bmc.sensors:
        if sensor.kind in TYPED and sensor.unit in ("C", "RPM", "W", "V", "A"):
            value_name, state_name = TYPED[sensor.kind]
            where = {"node": "dgx-001", "id": sensor.sensor_id, "name": sensor.name}
            value = one(metrics[value_name], **where)
            assert set(value.labels) == {"node", "id", "name"}
            assert value.value == sensor.value
            assert one(metrics[state_name], **where).value in (0.0, 1.0, 2.0)
        else:  # discrete sensors (PSU status): ipmi_sensor_* with the BMC's type
            where = {"node": "dgx-001", "id": sensor.sensor_id, "type": sensor.type}
            value = one(metrics["ipmi_sensor_value"], **where)
            assert set(value.labels) == {"node", "id", "name", "type"}
            assert sensor.value is None and math.isnan(value.value)
            assert one(metrics["ipmi_sensor_state"], **where).value == 0.0
    assert one(metrics["ipmi_up"], node="dgx-001", collector="ipmi").value == 1.0
    assert one(metrics["ipmi_chassis_power_state"], node="dgx-001").value == 1.0
    assert one(metrics["gpuconsole_bmc_power_watts"], node="dgx-001").value == node.bmc.power_w
    inlet = one(metrics["gpuconsole_bmc_inlet_temperature_celsius"], node="dgx-001")
    assert inlet.value == node.bmc.inlet_c


def test_a_failed_psu_is_critical_and_counted() -> None:
    metrics = parse(frozen_body())
    state = one(metrics["ipmi_sensor_state"], node="dgxa-001", name="PSU2 Status")
    assert state.value == 2.0 and state.labels["type"] == "Power Supply"
    assert one(metrics["gpuconsole_bmc_psus_failed"], node="dgxa-001").value == 1.0
    assert one(metrics["gpuconsole_bmc_health"], node="dgxa-001", state="critical").value == 1.0


def test_the_bmc_health_series_is_the_bmc_light_every_console_shows() -> None:
    """dgx-003's BMC logged a PCIe Bus Fatal Error on GPU 5's bus while every sensor reads
    nominal: the verdict's evidence makes its BMC light critical, and the series with it."""
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    for node in snapshot.nodes:
        light = source_facet(node, "bmc")
        if light is None or node.bmc is None:
            continue
        [state] = [s for s in pick(metrics["gpuconsole_bmc_health"], node=node.node) if s.value]
        assert state.labels["state"] == light.value, node.node
    assert one(metrics["gpuconsole_bmc_health"], node="dgx-003", state="critical").value == 1.0


def test_a_silent_bmc_is_down_and_its_sensors_vanish_as_with_ipmi_exporter() -> None:
    metrics = parse(frozen_body())
    assert one(metrics["ipmi_up"], node="dgxa-002", collector="ipmi").value == 0.0
    assert one(metrics["ipmi_up"], node="dgxa-002", collector="chassis").value == 0.0
    for name, samples in metrics.items():
        if name.startswith("ipmi_") and name != "ipmi_up":
            assert not pick(samples, node="dgxa-002"), name
    assert pick(metrics["ipmi_temperature_celsius"], node="dgxa-001")


def test_hgx_board_sensors_are_matched_to_nvmls_gpus_by_module() -> None:
    snapshot, metrics = frozen_fleet(), parse(frozen_body())
    node = snapshot.node("dgx-002")
    assert node is not None and node.bmc is not None
    temps = pick(metrics["gpuconsole_gpu_board_temperature_celsius"], node="dgx-002")
    assert label_names(temps) == {frozenset({"node", "gpu", "uuid", "module", "sensor"})}
    matched = 0
    for gpu in node.gpus:
        sensors = [
            s for s in node.bmc.gpu_sensors(gpu.module_id) if s.kind is SensorKind.TEMPERATURE
        ]
        for sensor in sensors:
            sample = one(temps, sensor=sensor.name)
            assert sample.labels["gpu"] == str(gpu.index) and sample.labels["uuid"] == gpu.uuid
            assert sample.value == sensor.value
            matched += 1
    assert matched == len(node.gpus) == 8
    # the thermal GPU 3 is the hottest on the baseboard too
    hottest = max(temps, key=lambda s: s.value)
    assert hottest.labels["gpu"] == "3"


def test_credentials_never_reach_a_label() -> None:
    assert without_credentials("redfish://root:hunter2@10.0.0.7:443") == "redfish://10.0.0.7:443"
    assert without_credentials("ipmi://10.0.0.7:623") == "ipmi://10.0.0.7:623"


def test_no_bmc_password_appears_anywhere_in_the_metrics(tmp_path: Path) -> None:
    wrong = "WrongPass-71zk"
    with running_ipmi_sim(tmp_path / "ipmi_sim") as bmc:

        def target(node: str, password: str) -> BmcTarget:
            return BmcTarget(
                node=node,
                host="127.0.0.1",
                port=bmc.port,
                username=bmc.username,
                password=password,
            )

        async def poll() -> str:
            hub, clock = frozen_demo_hub()
            hub.add_source(BmcSource("peer-ok", open_link(target("peer-ok", IPMI_PASSWORD))))
            hub.add_source(BmcSource("peer-bad", open_link(target("peer-bad", wrong))))
            snapshot = await poll_twice(hub, clock)
            for _ in range(5):  # ipmi_sim on a loaded machine can miss a poll's timeout
                peer = snapshot.node("peer-ok")
                status = peer.status("bmc") if peer is not None else None
                if status is not None and status.ok:
                    break
                snapshot = await poll_twice(hub, clock)
            return render(snapshot)

        body = asyncio.run(poll())
    metrics = parse(body)
    assert pick(metrics["ipmi_temperature_celsius"], node="peer-ok")  # the peer was read
    assert one(metrics["ipmi_up"], node="peer-bad", collector="ipmi").value == 0.0
    assert one(metrics["gpuconsole_bmc_info"], node="peer-ok").labels["bmc"] == (
        f"ipmi://127.0.0.1:{bmc.port}"
    )
    assert IPMI_PASSWORD not in body and wrong not in body
    assert IPMI_PASSWORD.lower() not in body.lower() and wrong.lower() not in body.lower()


def test_a_psu_that_lost_its_input_is_exported_and_alerted_apart_from_a_failed_one(
    tmp_path: Path,
) -> None:
    """ipmi_sim's PSU1 Status asserts Power input lost (sensor type 08h, offset 03h): a
    warning on its sensor, as the Power registry rates LossOfInputPower; no failed PSU, one
    without input. PowerSupplyInputLost fires (a warning: check its cable and power) and
    PowerSupplyFailed does not, in the engine and in promtool alike; then it fails."""
    with running_ipmi_sim(tmp_path / "ipmi_sim") as bmc:
        link = open_link(
            BmcTarget(node="dgx-017", host="127.0.0.1", port=bmc.port,
                      username=bmc.username, password=IPMI_PASSWORD)
        )  # fmt: skip
        src = BmcSource("dgx-017", link)

        async def read() -> BmcReading:
            await src.start(lambda _event: None)
            try:
                return await src.poll()
            finally:
                await src.close()

        bmc.command("sensor_set_bit 0x20 0 10 3 1 0")
        unfed = asyncio.run(read())
        bmc.command("sensor_set_bit 0x20 0 10 1 1 0")
        failed = asyncio.run(read())

    def at(k: int, reading: BmcReading) -> FleetSnapshot:
        status = SourceStatus("dgx-017", "bmc", True, last_ok_at=k * 60.0, polls=1)
        return FleetSnapshot(
            k, k * 60.0, (NodeSnapshot("dgx-017", bmc=reading, statuses=(status,)),)
        )

    metrics = parse(render(at(0, unfed)))
    state = one(metrics["ipmi_sensor_state"], node="dgx-017", name="PSU1 Status")
    assert state.value == 1.0
    assert one(metrics["gpuconsole_bmc_psus_failed"], node="dgx-017").value == 0.0
    assert one(metrics["gpuconsole_bmc_psus_no_input"], node="dgx-017").value == 1.0
    metrics = parse(render(at(0, failed)))  # failed and without input: failed
    assert one(metrics["ipmi_sensor_state"], node="dgx-017", name="PSU1 Status").value == 2.0
    assert one(metrics["gpuconsole_bmc_psus_failed"], node="dgx-017").value == 1.0
    assert one(metrics["gpuconsole_bmc_psus_no_input"], node="dgx-017").value == 0.0

    rules = [r for r in DEFAULT_RULES if r.name in ("PowerSupplyFailed", "PowerSupplyInputLost")]
    steps = [at(k, unfed if k < 4 else failed) for k in range(8)]
    fired = fired_as_promtool_fires(tmp_path, rules, steps, 60.0)
    firing = [sorted(name for name, found in now.items() if found) for now in fired]
    assert firing == [[], ["PowerSupplyInputLost"], ["PowerSupplyInputLost"],
                      ["PowerSupplyInputLost"], [], ["PowerSupplyFailed"],
                      ["PowerSupplyFailed"], ["PowerSupplyFailed"]]  # fmt: skip
    [lost] = fired[1]["PowerSupplyInputLost"]
    assert lost["exp_labels"]["severity"] == "warning"  # type: ignore[index]


def test_the_bmc_clock_skew_is_exported_where_it_was_measured(tmp_path: Path) -> None:
    """ipmi_sim's SEL clock set 50 hours behind this host's (Set SEL Time): the skew the
    source measures is gpuconsole_bmc_clock_skew_seconds, negative (behind); a reading that
    measured none has no such series (not a 0 that says "in step")."""
    with running_ipmi_sim(tmp_path / "ipmi_sim") as bmc:
        behind = int(time.time()) - 50 * 3600
        bmc.ipmitool("raw", "0x0a", "0x49", *(f"0x{b:02x}" for b in behind.to_bytes(4, "little")))
        hub = Hub()
        link = open_link(
            BmcTarget(node="dgx-017", host="127.0.0.1", port=bmc.port,
                      username=bmc.username, password=IPMI_PASSWORD)
        )  # fmt: skip
        hub.add_source(BmcSource("dgx-017", link))
        snapshot = asyncio.run(hub.poll_once())
    node = snapshot.node("dgx-017")
    assert node is not None and node.bmc is not None and node.bmc.clock_skew_s is not None
    [skew] = parse(render(snapshot))["gpuconsole_bmc_clock_skew_seconds"]
    assert skew.labels == {"node": "dgx-017"} and skew.value == node.bmc.clock_skew_s
    assert abs(skew.value + 50 * 3600) < 5
    unmeasured = msgspec.structs.replace(node.bmc, clock_skew_s=None)
    again = FleetSnapshot(1, snapshot.at, (msgspec.structs.replace(node, bmc=unmeasured),))
    assert "gpuconsole_bmc_clock_skew_seconds" not in parse(render(again))
