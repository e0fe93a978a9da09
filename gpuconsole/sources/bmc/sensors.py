"""Sensor normalisation shared by every BMC protocol: kinds, units, places, node totals."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuconsole.readings.bmc import BmcSensor, SensorHealth, SensorKind

# pyghmi.constants.Health: a bitmask
HEALTH_WARNING = 1
HEALTH_CRITICAL = 2
HEALTH_FAILED = 4

_HGX_GPU = re.compile(r"HGX[_ ]GPU[_ ]SXM[_ ]?([0-9]+)", re.IGNORECASE | re.ASCII)
_MAX_MODULE_DIGITS = 4  # a board has 8 modules; a longer number is no module id
_PSU = re.compile(r"\b(psu|power[ _]?supply|ps\d)", re.IGNORECASE)
_FAN = re.compile(r"\bfan", re.IGNORECASE)
_TOTAL_POWER = re.compile(
    r"(total|system|sys|node|chassis)[ _]?(power|pwr)|pwr[ _]?consumption", re.I
)

# Units as they are shown, from what pyghmi and Redfish call them.
UNITS = {
    "°C": "C",
    "C": "C",
    "Cel": "C",
    "degrees C": "C",
    "RPM": "RPM",
    "W": "W",
    "Watts": "W",
    "V": "V",
    "Volts": "V",
    "A": "A",
    "Amps": "A",
    "%": "%",
    "Percent": "%",
    "J": "J",
}


# A power supply's discrete states (IPMI 2.0 table 42-3, sensor type 08h, offsets 00h-07h,
# in pyghmi's words), rated as the DMTF Power registry rates the same conditions of a
# Redfish PowerSupply: a PSU that predicts its failure still delivers power, a warning
# (PowerSupplyPredictiveFailure), as a configuration error is; one that lost its input
# (03h-05h) is a warning too (LossOfInputPower: check the power source and cable, the PSU
# itself may be fine), a PSU that delivers no power, not a failed one (`PSU_NO_INPUT`);
# one that failed delivers none and is critical. pyghmi rates the prediction critical:
# the same PSU would be a warning over Redfish and a failed PSU over IPMI.
PSU_STATES = {
    "present": SensorHealth.OK,
    "failure": SensorHealth.CRITICAL,
    "predictive failure": SensorHealth.WARNING,
    "power input lost": SensorHealth.WARNING,
    "power input out of range or lost": SensorHealth.WARNING,
    "power input out of range": SensorHealth.WARNING,
    "configuration error": SensorHealth.WARNING,
    "standby": SensorHealth.OK,
}
# The states of a PSU whose input is lost or out of range (as Redfish's LineInputStatus
# LossOfInput and OutOfRange)
PSU_NO_INPUT = ("power input lost", "power input out of range or lost", "power input out of range")
PSU_SENSOR_TYPE = "power supply"  # pyghmi's name of sensor type 08h
_ORDER = (SensorHealth.OK, SensorHealth.WARNING, SensorHealth.CRITICAL, SensorHealth.FAILED)


def discrete_health(type_name: str, states: Iterable[str], mask: int) -> SensorHealth:
    """A sensor's health: a power supply's from the states it asserts (PSU_STATES), where
    every one is known; any other sensor's from pyghmi's Health bitmask."""
    if type_name.lower() == PSU_SENSOR_TYPE:
        rated = [PSU_STATES.get(state.lower()) for state in states]
        if rated and None not in rated:
            return max((r for r in rated if r is not None), key=_ORDER.index)
    return health_from_mask(mask)


def health_from_mask(mask: int) -> SensorHealth:
    """pyghmi's Health bitmask (Ok=0, Warning=1, Critical=2, Failed=4) to one word."""
    if mask & HEALTH_FAILED:
        return SensorHealth.FAILED
    if mask & HEALTH_CRITICAL:
        return SensorHealth.CRITICAL
    if mask & HEALTH_WARNING:
        return SensorHealth.WARNING
    return SensorHealth.OK


def kind_of(type_name: str, unit: str) -> SensorKind:
    """The kind of a sensor from the BMC's type word and its unit."""
    word = type_name.lower()
    if unit == "C" or "temp" in word:
        return SensorKind.TEMPERATURE
    if unit == "RPM" or "fan" in word or word == "rotational":
        return SensorKind.FAN
    if unit == "W" or word == "power":
        return SensorKind.POWER
    if unit == "V" or "volt" in word:
        return SensorKind.VOLTAGE
    if unit == "A" or word in ("current", "amperage"):
        return SensorKind.CURRENT
    return SensorKind.OTHER


def context_of(name: str, kind: SensorKind, hint: str | None = None) -> str | None:
    """Where a sensor sits: from a Redfish PhysicalContext (`hint`) where the BMC gives
    one, else from its name (IPMI has no such field).

    A PhysicalContext is taken at its word: "Room" or "Ambient" air is not the intake,
    whatever the sensor is called."""
    if hint:
        place = hint.lower()
        if place in ("intake", "exhaust"):
            return place
        if place == "gpu" or _HGX_GPU.search(name):
            return "gpu"
        if place == "powersupply":
            return "psu"
        if kind is SensorKind.FAN or place == "fan":
            return "fan"
        if kind is SensorKind.POWER and (place == "chassis" or _TOTAL_POWER.search(name)):
            return "total"
        return place
    lowered = name.lower()
    if any(w in lowered for w in ("inlet", "intake", "ambient")):
        return "intake"
    if any(w in lowered for w in ("exhaust", "outlet")):
        return "exhaust"
    if _HGX_GPU.search(name):
        return "gpu"
    if _PSU.search(name):
        return "psu"
    if kind is SensorKind.FAN or _FAN.search(name):
        return "fan"
    if kind is SensorKind.POWER and _TOTAL_POWER.search(name):
        return "total"
    if "cpu" in lowered:
        return "cpu"
    if "dimm" in lowered or "dram" in lowered:
        return "memory"
    return None


def gpu_module_of(*names: str) -> int | None:
    """The HGX module number in a name like HGX_GPU_SXM_5_TEMP_0 (SXM n = module id n);
    None where no name has one of at most a few ASCII digits."""
    for name in names:
        match = _HGX_GPU.search(name)
        if match and len(match.group(1)) <= _MAX_MODULE_DIGITS:  # int() refuses 4300
            return int(match.group(1))
    return None


def unit_of(raw: str | None) -> str:
    if not raw:
        return ""
    return UNITS.get(raw.strip(), raw.strip())


@dataclass(frozen=True, slots=True)
class NodeTotals:
    """What a node's sensors add up to."""

    power_w: float | None
    inlet_c: float | None
    exhaust_c: float | None
    fans_present: int
    fans_failed: int
    psus_present: int
    psus_failed: int
    # which failed, by the names the BMC gives them; the fans and PSUs whose own status is
    # a warning, with the BMC's words for it (a PSU predicting its failure)
    failed_fans: tuple[str, ...] = ()
    failed_psus: tuple[str, ...] = ()
    warned_units: tuple[tuple[str, str], ...] = ()
    # the PSUs there, not failed, whose input power is lost or out of range
    no_input_psus: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UnitStatus:
    """Presence and failure of a PSU or fan, where the BMC reports them apart from readings;
    a unit whose status is a warning (not failed) says so, with the BMC's words (`why`)."""

    name: str
    present: bool
    failed: bool
    warning: bool = False
    why: str = ""
    no_input: bool = False  # not failed: its input power is lost or out of range


# The states of a PSU that failed (not one that predicts its failure, nor lost its input)
_PSU_FAILED_STATES = tuple(
    state for state, health in PSU_STATES.items() if health is SensorHealth.CRITICAL
)


def summarise(
    sensors: Sequence[BmcSensor],
    *,
    psus: Iterable[UnitStatus] = (),
    fans: Iterable[UnitStatus] = (),
) -> NodeTotals:
    """Node totals: power in watts, inlet and exhaust temperature, fans and PSUs."""
    power = _first(s for s in sensors if s.kind is SensorKind.POWER and s.context == "total")
    if power is None:
        psu_power = [
            s.value
            for s in sensors
            if s.kind is SensorKind.POWER and s.context == "psu" and s.value is not None
        ]
        power = sum(psu_power) if psu_power else None
    inlet = _first(s for s in sensors if s.kind is SensorKind.TEMPERATURE and s.context == "intake")
    exhaust = _first(
        s for s in sensors if s.kind is SensorKind.TEMPERATURE and s.context == "exhaust"
    )

    fan_units = list(fans)
    fan_sensors = [s for s in sensors if s.kind is SensorKind.FAN and s.available]
    failed_fans = [s.name for s in fan_sensors if _bad(s) or s.value == 0]
    failed_fan_units = [f.name for f in fan_units if f.present and f.failed]
    fans_present = sum(1 for f in fan_units if f.present) if fan_units else len(fan_sensors)
    if len(failed_fan_units) > len(failed_fans):  # the count that says more, with its names
        failed_fans = failed_fan_units

    psu_units = list(psus)
    status_sensors = [s for s in sensors if s.type.lower() == PSU_SENSOR_TYPE and s.states]
    if psu_units:
        psus_present = sum(1 for p in psu_units if p.present)
        failed_psus = [p.name for p in psu_units if p.present and p.failed]
        no_input = [p.name for p in psu_units if p.present and p.no_input and not p.failed]
    elif status_sensors:
        failing = [s for s in status_sensors if _says(s, *_PSU_FAILED_STATES)]
        unfed = [s for s in status_sensors if _says(s, *PSU_NO_INPUT) and s not in failing]
        # a PSU that asserts a failure or a lost input is there, whether or not it asserts
        # its presence too
        psus_present = sum(
            1 for s in status_sensors if _says(s, "present") or s in failing or s in unfed
        )
        failed_psus = [s.name for s in failing]
        no_input = [s.name for s in unfed]
    else:
        psu_power_sensors = [  # a pulled PSU's sensor has no reading: it is not counted
            s for s in sensors if s.kind is SensorKind.POWER and s.context == "psu" and s.available
        ]
        psus_present = len(psu_power_sensors)
        failed_psus = [s.name for s in psu_power_sensors if _bad(s)]
        no_input = []
    said = {s.name for s in sensors if s.health is not SensorHealth.OK}  # a sensor says it
    warned = tuple(
        (u.name, u.why)
        for u in (*fan_units, *psu_units)
        if u.present and u.warning and not u.failed and not u.no_input and u.name not in said
    )
    return NodeTotals(
        power,
        inlet,
        exhaust,
        fans_present,
        len(failed_fans),
        psus_present,
        len(failed_psus),
        tuple(failed_fans),
        tuple(failed_psus),
        warned,
        tuple(no_input),
    )


def _first(sensors: Iterable[BmcSensor]) -> float | None:
    for sensor in sensors:
        if sensor.value is not None:
            return sensor.value
    return None


def _bad(sensor: BmcSensor) -> bool:
    return sensor.health in (SensorHealth.CRITICAL, SensorHealth.FAILED)


def _says(sensor: BmcSensor, *states: str) -> bool:
    """Whether the sensor asserts one of `states` (whole words: "failure" is not
    "predictive failure")."""
    return any(state.lower() in states for state in sensor.states)
