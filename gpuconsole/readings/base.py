"""The basic types every reading shares: keys, counters, events, source status."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

SCHEMA_VERSION = 1

# A counter or series is named by a path, e.g. ("gpu", "GPU-1234", "energy_mj").
Key = tuple[str, ...]


class Severity(enum.StrEnum):
    """How much an event or a state should worry an operator."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Health(enum.StrEnum):
    """Health at a glance for a node, a GPU or a source."""

    OK = "ok"
    WARNING = "warning"
    CRITICAL = "critical"
    STALE = "stale"
    UNKNOWN = "unknown"


class CounterSample(NamedTuple):
    """One raw, monotonically increasing counter as read, with its width in bits.

    `history` asks the hub to keep the derived rate in a sparkline ring as well; `delta`
    asks it to keep how far the counter moved over the interval (error counters).
    """

    key: Key
    value: int
    bits: int = 64
    history: bool = False
    delta: bool = False


# What the hub takes: CounterSample's five fields in a plain tuple (a CounterSample is one).
# A DGX's NVLinks alone are 288 counters a poll, and building a plain tuple costs a fifth
# of building a NamedTuple, so the NVML reading yields these.
RawCounter = tuple[Key, int, int, bool, bool]


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened: an XID, a source going stale, an action."""

    at: float
    node: str
    source: str
    kind: str
    severity: Severity
    message: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    code: int | None = None


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Whether a source's latest reading is fresh, and if not since when and why."""

    node: str
    source: str
    ok: bool
    last_ok_at: float | None = None
    stale_since: float | None = None
    error: str | None = None
    polls: int = 0
    failures: int = 0
    last_poll_s: float | None = None

    @property
    def stale(self) -> bool:
        return not self.ok
