"""BMC readings: the server around the GPUs, as its baseboard management controller sees it.

Sensors are normalised (kind, unit, health) whatever the protocol (IPMI or Redfish); the
node totals (power, inlet, exhaust, fans, PSUs) are worked out once, by the source. Each
sensor keeps what ipmi_exporter's metrics need: name, id, type, state, value and unit.
A BMC is read in parts (Redfish resources, the system chosen for power): one that fails
costs its own readings, said in `parts`, not the whole BMC.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import msgspec

from gpuconsole.readings.base import CounterSample, Health, Key, PartStatus, Severity


class SensorKind(enum.StrEnum):
    """What a sensor measures."""

    TEMPERATURE = "temperature"
    FAN = "fan"
    POWER = "power"
    VOLTAGE = "voltage"
    CURRENT = "current"
    OTHER = "other"


class SensorHealth(enum.StrEnum):
    """A sensor's state, from the thresholds it crossed or the states it asserts."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    FAILED = "failed"


class PowerState(enum.StrEnum):
    """The server's power, as its BMC reports it."""

    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


class Thresholds(msgspec.Struct, frozen=True):
    """The limits a BMC gives for a sensor, in the sensor's unit (None: not given)."""

    lower_non_recoverable: float | None = None
    lower_critical: float | None = None
    lower_non_critical: float | None = None
    upper_non_critical: float | None = None
    upper_critical: float | None = None
    upper_non_recoverable: float | None = None


class BmcSensor(msgspec.Struct, frozen=True):
    """One sensor, normalised.

    `sensor_id` is the IPMI sensor number, or for Redfish the Chassis Id and the sensor's
    Id within it ("1U/CPU1Temp", "1U/Temperatures/0": Ids are unique within a Chassis
    only); `type` is the BMC's own word ("Temperature", "Power Supply", "Rotational").
    `value` is None when the BMC has no reading for it. `context` places it: "intake",
    "exhaust", "cpu", "gpu", "memory", "psu", "fan", "total" or None. `gpu_module_id` is
    the HGX module (SXM n) the sensor belongs to, where the BMC names it.
    """

    name: str
    sensor_id: str
    kind: SensorKind
    type: str
    value: float | None
    unit: str
    health: SensorHealth = SensorHealth.OK
    states: tuple[str, ...] = ()
    thresholds: Thresholds | None = None
    context: str | None = None
    gpu_module_id: int | None = None

    @property
    def available(self) -> bool:
        return self.value is not None


class SelEntry(msgspec.Struct, frozen=True):
    """One system event log record."""

    record_id: int
    at: float | None  # Unix time, when the BMC gave a usable timestamp
    sensor: str
    sensor_type: str
    event: str
    severity: Severity
    deassertion: bool = False
    reading: float | None = None  # the value that triggered it, in `unit`
    threshold: float | None = None  # the threshold it crossed, in `unit`
    unit: str = ""

    @property
    def message(self) -> str:
        """'FAN 3 at 0 RPM: Lower critical', 'PSU 2: Failure (deasserted)'."""
        where = self.sensor
        if where and self.reading is not None:
            where += f" at {self.reading:g}" + (f" {self.unit}" if self.unit else "")
        text = f"{where}: {self.event}" if where else self.event
        return text + (" (deasserted)" if self.deassertion else "")


class BmcReading(msgspec.Struct, frozen=True):
    """The bmc source's partial reading of one node."""

    at: float
    bmc: str = ""  # "redfish://10.0.0.17:443", never with credentials
    power_state: PowerState = PowerState.UNKNOWN
    sensors: tuple[BmcSensor, ...] = ()
    power_w: float | None = None
    inlet_c: float | None = None
    exhaust_c: float | None = None
    fans_present: int = 0
    fans_failed: int = 0
    psus_present: int = 0
    psus_failed: int = 0
    # which failed, as the BMC names them (fans_failed and psus_failed of them); the fans
    # and PSUs whose own status is a warning, with the BMC's words (a PSU that predicts its
    # failure), where no sensor carries it
    failed_fans: tuple[str, ...] = ()
    failed_psus: tuple[str, ...] = ()
    warned_units: tuple[tuple[str, str], ...] = ()
    # the PSUs there, not failed, whose input power is lost or out of range (IPMI's "Power
    # input lost", Redfish's LineInputStatus LossOfInput): they deliver no power, and the
    # PSU itself may be fine (a cable, a PDU, a feed); not counted in psus_failed
    psus_no_input: int = 0
    no_input_psus: tuple[str, ...] = ()
    # How many PSUs the node needs to run, where its BMC says (Redfish's redundancy
    # groups: MinNeededInGroup, the older MinNumNeeded); None where it does not (IPMI)
    psus_needed: int | None = None
    sel_recent: tuple[SelEntry, ...] = ()  # the newest records, oldest first
    # How far the BMC's clock is ahead of the reader's, in seconds (negative: behind), as
    # measured when the SEL was read; None where not measured. The SEL times are already
    # on the reader's clock: corrected by it (Redfish), or by pyghmi from Get SEL Time.
    clock_skew_s: float | None = None
    simulated: bool = False
    # What was read and what was not: a part that failed (ok False) costs its readings
    # only; one left out on purpose (enabled False) is there to say why.
    parts: tuple[PartStatus, ...] = ()

    def counters(self) -> Iterator[CounterSample]:
        return iter(())

    def series(self) -> Iterator[tuple[Key, float]]:
        """Gauges worth a sparkline."""
        if self.power_w is not None:
            yield ("bmc", "power_w"), self.power_w
        if self.inlet_c is not None:
            yield ("bmc", "inlet_c"), self.inlet_c
        if self.exhaust_c is not None:
            yield ("bmc", "exhaust_c"), self.exhaust_c

    def sensor(self, name: str) -> BmcSensor | None:
        for sensor in self.sensors:
            if sensor.name == name:
                return sensor
        return None

    def part(self, name: str) -> PartStatus | None:
        for part in self.parts:
            if part.part == name:
                return part
        return None

    @property
    def unread(self) -> tuple[PartStatus, ...]:
        """The parts that failed in the last poll; the rest of the reading stands."""
        return tuple(p for p in self.parts if p.enabled and not p.ok)

    def of_kind(self, kind: SensorKind) -> tuple[BmcSensor, ...]:
        return tuple(s for s in self.sensors if s.kind is kind)

    def gpu_sensors(self, module_id: int | None) -> tuple[BmcSensor, ...]:
        """The sensors of the GPU in HGX module `module_id` (GpuReading.module_id)."""
        if module_id is None:
            return ()
        return tuple(s for s in self.sensors if s.gpu_module_id == module_id)

    @property
    def psus_delivering(self) -> int:
        """The PSUs there that neither failed nor lost their input."""
        return max(0, self.psus_present - self.psus_failed - self.psus_no_input)

    @property
    def psu_words(self) -> str:
        """'PSUs 5/6 ok'; those without input power are not ok, and said: 'PSUs 4/6 ok, 1
        without input'."""
        unfed = f", {self.psus_no_input} without input" if self.psus_no_input else ""
        return f"PSUs {self.psus_delivering}/{self.psus_present} ok{unfed}"

    @property
    def psu_redundancy_left(self) -> bool:
        """Whether the node would still have power if one more PSU stopped: more PSUs
        delivering than it needs, where the BMC says how many (`psus_needed`), else more
        than one (all the reading knows)."""
        return self.psus_delivering > (self.psus_needed or 1)

    @property
    def health(self) -> Health:
        """Failed PSUs or fans, a PSU without input power and none left to spare, or a
        sensor past a critical limit: critical; a PSU without input power, a sensor past a
        warning limit, or a fan or PSU whose own status is a warning: a warning."""
        if self.psus_failed or self.fans_failed:
            return Health.CRITICAL
        if self.psus_no_input and not self.psu_redundancy_left:
            return Health.CRITICAL
        worst = Health.WARNING if self.warned_units or self.psus_no_input else Health.OK
        for sensor in self.sensors:
            if sensor.context == "psu" and sensor.name in self.no_input_psus:
                continue  # its PSU's state, counted above (the older Power resource's)
            if sensor.health in (SensorHealth.CRITICAL, SensorHealth.FAILED):
                return Health.CRITICAL
            if sensor.health is SensorHealth.WARNING:
                worst = Health.WARNING
        return worst
