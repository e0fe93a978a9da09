"""Alertmanager's silences (`GET /api/v2/silences`), to say in the console who silenced an
alert and why. What Alertmanager sends is read defensively: a silence that does not fit is
left out, and every word shown is escaped."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuconsole.readings.base import safe_text


@dataclass(frozen=True, slots=True)
class SilenceMatcher:
    name: str
    value: str
    regex: bool
    equal: bool

    def holds(self, labels: Mapping[str, str]) -> bool:
        found = labels.get(self.name, "")
        if self.regex:
            try:
                # ASCII: Alertmanager matches with Go's RE2, whose \d, \w and \s are
                matched = re.fullmatch(self.value, found, re.ASCII) is not None
            except re.error:
                return False
        else:
            matched = found == self.value
        return matched == self.equal


@dataclass(frozen=True, slots=True)
class Silence:
    """An active silence: who made it, why, until when, and what it covers."""

    id: str
    created_by: str
    comment: str
    ends_at: str
    matchers: tuple[SilenceMatcher, ...]

    def covers(self, labels: Mapping[str, str]) -> bool:
        return bool(self.matchers) and all(m.holds(labels) for m in self.matchers)

    def said(self) -> str:
        """'alice (maintenance) until 2026-12-04T20:00:00Z'"""
        why = f" ({self.comment})" if self.comment else ""
        return f"{self.created_by}{why} until {self.ends_at}"


def parse_silences(data: Any) -> tuple[Silence, ...]:
    """The active silences in Alertmanager's answer."""
    found = []
    for item in data if isinstance(data, list) else ():
        if not isinstance(item, dict):
            continue
        status = item.get("status")
        if not isinstance(status, dict) or status.get("state") != "active":
            continue
        matchers = []
        for m in item.get("matchers") or ():
            if not isinstance(m, dict):
                break
            name, value = m.get("name"), m.get("value")
            if not isinstance(name, str) or not isinstance(value, str):
                break
            matchers.append(
                SilenceMatcher(
                    name, value, m.get("isRegex") is True, m.get("isEqual", True) is not False
                )
            )
        else:
            found.append(
                Silence(
                    safe_text(str(item.get("id", ""))),
                    safe_text(str(item.get("createdBy", ""))),
                    safe_text(str(item.get("comment", ""))),
                    safe_text(str(item.get("endsAt", ""))),
                    tuple(matchers),
                )
            )
    return tuple(found)
