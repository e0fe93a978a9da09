"""An alert as the engine keeps it, and the file that keeps the engine's alerts and what each
receiver was told across restarts: written whole and atomically; a file that cannot be
read is moved aside (never over an earlier one) with a clear message, never a traceback."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpuconsole import paths
from gpuconsole.readings.base import Severity, safe_text

log = logging.getLogger(__name__)

VERSION = 1
PENDING, FIRING, RESOLVED = "pending", "firing", "resolved"
_STATES = (PENDING, FIRING, RESOLVED)


@dataclass
class Alert:
    """One alert of one series, from its condition first holding until every receiver
    has been told it resolved."""

    rule: str
    labels: dict[str, str]  # alertname, the rule's labels and the series'
    annotations: dict[str, str]
    severity: Severity
    state: str  # pending, firing, resolved
    active_at: float  # when the condition started to hold
    last_held_at: float
    value: float = 0.0
    fired_at: float | None = None
    resolved_at: float | None = None
    # the first evaluation its condition no longer held at while it fired (what
    # keep_firing_for counts from, as Prometheus's KeepFiringSince); None while it holds
    unheld_at: float | None = None
    fingerprint: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.labels)


def fingerprint(labels: dict[str, str]) -> str:
    """What tells one alert from every other: its whole label set."""
    text = "\0".join(f"{k}\0{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Saved:
    """What the state file holds: the alerts, and per receiver what it acknowledged of each
    (fingerprint -> the state it was told, and when)."""

    alerts: dict[str, Alert] = field(default_factory=dict)
    told: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)


# A state file holds every alert and what each receiver was told of it: a few MiB for a
# large fleet; one past this is none gpuconsole wrote.
MAX_STATE_BYTES = 64 * 1024 * 1024


class StateFile:
    """The engine's alerts on disk, at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[Saved, str | None]:
        """What the file holds, and a sentence for the operator when it could not be read
        (it is then moved aside, to PATH.corrupt or the first PATH.corrupt.N not taken, and
        the engine starts empty). A link is not followed, nor a FIFO waited on, nor a file
        past MAX_STATE_BYTES read."""
        try:
            raw = paths.read_own_file(self.path, MAX_STATE_BYTES)
        except FileNotFoundError:
            return Saved(), None
        except paths.NotOwnFile as exc:
            return Saved(), self._aside(f"is {exc}")
        except OSError as exc:
            return Saved(), self._aside(f"cannot be read ({exc.strerror})")
        try:
            return _decode(orjson.loads(raw)), None
        except (ValueError, TypeError, KeyError) as exc:
            return Saved(), self._aside(f"is not a file gpuconsole wrote ({exc})")

    def _aside(self, why: str) -> str:
        """Move the file aside, to a name no earlier one took; what to tell the operator."""
        kept = paths.put_aside(self.path)
        return safe_text(
            f"alert state {self.path} {why}; {kept}, starting with no alerts (firing ones "
            "fire again at the next evaluation)"
        )

    def save(self, saved: Saved) -> None:
        """Write the whole state, atomically: a crash leaves the old file or the new one."""
        body = orjson.dumps(_encode(saved))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _encode(saved: Saved) -> dict[str, Any]:
    return {
        "version": VERSION,
        "alerts": [
            {
                "rule": a.rule,
                "labels": a.labels,
                "annotations": a.annotations,
                "severity": a.severity.value,
                "state": a.state,
                "active_at": a.active_at,
                "last_held_at": a.last_held_at,
                "value": a.value,
                "fired_at": a.fired_at,
                "resolved_at": a.resolved_at,
                "unheld_at": a.unheld_at,
            }
            for a in saved.alerts.values()
        ],
        "told": {name: {fp: list(v) for fp, v in t.items()} for name, t in saved.told.items()},
    }


def _strings(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(f"{what} must map strings to strings")
    return dict(value)


def _number(value: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number")
    return float(value)


def _decode(data: Any) -> Saved:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"expected an object with version {VERSION}")
    saved = Saved()
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise TypeError("alerts must be a list")
    for i, item in enumerate(alerts):
        if not isinstance(item, dict):
            raise TypeError(f"alerts[{i}] must be an object")
        state = item.get("state")
        if state not in _STATES:
            raise ValueError(f"alerts[{i}].state must be one of {', '.join(_STATES)}")
        rule = item.get("rule")
        if not isinstance(rule, str):
            raise TypeError(f"alerts[{i}].rule must be a string")
        alert = Alert(
            rule=rule,
            labels=_strings(item.get("labels"), f"alerts[{i}].labels"),
            annotations=_strings(item.get("annotations"), f"alerts[{i}].annotations"),
            severity=Severity(str(item.get("severity"))),
            state=state,
            active_at=_number(item.get("active_at"), f"alerts[{i}].active_at"),
            last_held_at=_number(item.get("last_held_at"), f"alerts[{i}].last_held_at"),
            value=_number(item.get("value"), f"alerts[{i}].value"),
            fired_at=_number(item.get("fired_at"), f"alerts[{i}].fired_at", optional=True),
            resolved_at=_number(item.get("resolved_at"), f"alerts[{i}].resolved_at", optional=True),
            unheld_at=_number(item.get("unheld_at"), f"alerts[{i}].unheld_at", optional=True),
        )
        saved.alerts[alert.fingerprint] = alert
    told = data.get("told")
    if not isinstance(told, dict):
        raise TypeError("told must be an object")
    for name, acks in told.items():
        if not isinstance(acks, dict):
            raise TypeError(f"told[{name!r}] must be an object")
        found: dict[str, tuple[str, float]] = {}
        for fp, pair in acks.items():
            if not (isinstance(pair, list) and len(pair) == 2 and pair[0] in _STATES):
                raise TypeError(f"told[{name!r}][{fp!r}] must be [state, time]")
            found[fp] = (pair[0], _number(pair[1], f"told[{name!r}][{fp!r}]"))
        saved.told[name] = found
    return saved
