"""Alerts as consumers see them in a snapshot: what fires (or waits out its `for`), since
when, how bad, and whether an Alertmanager silence covers it."""

from __future__ import annotations

import enum

import msgspec

from gpuconsole.readings.base import Severity


class AlertState(enum.StrEnum):
    """Prometheus's words: pending while the condition waits out `for`, then firing."""

    PENDING = "pending"
    FIRING = "firing"


class ActiveAlert(msgspec.Struct, frozen=True):
    """One alert of one series: a rule's name and the labels that tell it from the others."""

    name: str
    severity: Severity
    state: AlertState
    labels: tuple[tuple[str, str], ...]
    summary: str
    since: float  # when it fired; while pending, when its condition started to hold
    value: float
    node: str | None = None
    gpu_bus_id: str | None = None  # sysfs form, for an alert about one GPU
    silenced_by: str | None = None  # who silenced it in Alertmanager, and why
