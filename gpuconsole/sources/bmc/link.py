"""What the BMC source asks of a protocol: one blocking session to one BMC.

A link is used from one worker thread at a time (the source's own), so it may keep
state (a pyghmi session, discovered URLs, cached thresholds) without locks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from gpuconsole.readings.base import PartStatus
from gpuconsole.readings.bmc import BmcSensor, PowerState, SelEntry
from gpuconsole.sources.bmc.sensors import UnitStatus


class PowerAction(enum.StrEnum):
    """The power controls offered."""

    ON = "on"
    OFF = "off"
    SOFT = "soft"  # ask the OS to shut down (ACPI soft off)
    RESET = "reset"
    CYCLE = "cycle"  # off, then on again (IPMI chassis control 2, Redfish PowerCycle)


class BmcError(Exception):
    """A BMC that could not be read; the message names the BMC and never a password."""


class BmcAuthError(BmcError):
    """The BMC refused the user name or password."""


@dataclass(frozen=True, slots=True)
class LinkReading:
    """One round of what a link read, before SEL dedup and totals."""

    power_state: PowerState
    sensors: tuple[BmcSensor, ...]
    sel: tuple[SelEntry, ...] = ()
    psus: tuple[UnitStatus, ...] = ()
    fans: tuple[UnitStatus, ...] = ()
    parts: tuple[PartStatus, ...] = ()  # BmcReading.parts
    # how far the BMC's clock is ahead of the reader's (BmcReading.clock_skew_s); the SEL
    # times above are already corrected by it
    clock_skew_s: float | None = None
    # how many PSUs the node needs to run, where the BMC says (BmcReading.psus_needed)
    psus_needed: int | None = None


class BmcLink(Protocol):
    """A session to one BMC; every method blocks and may raise BmcError."""

    label: str  # "ipmi://10.0.0.17:623": what logs and screens call this BMC

    def read(self, *, sel: bool) -> LinkReading:
        """Sensors and power state; the event log too when `sel`."""

    def set_power(self, action: PowerAction) -> str:
        """Ask for a power change without waiting for it; returns the BMC's answer."""

    def close(self) -> None:
        """Log out and forget the session."""
