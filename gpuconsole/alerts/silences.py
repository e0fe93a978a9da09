"""Alertmanager's silences (`GET /api/v2/silences`), to say in the console who silenced an
alert and why, and which of gpuconsole's alerts Alertmanager holds silenced (`GET
/api/v2/alerts`: each with the ids of the silences that cover it).

Which alert a silence covers is Alertmanager's to say, not worked out here: its matchers'
patterns are Go's RE2 (linear time, its own syntax), which Python's backtracking `re` reads
otherwise and, for some patterns ("(.*.*)*="), takes exponential time over. What
Alertmanager sends is read defensively: what does not fit is left out, and every word
shown is escaped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuconsole.alerts.state import fingerprint
from gpuconsole.readings.base import safe_text

__all__ = ["Silence", "held_key", "parse_silences", "silenced_alerts"]


@dataclass(frozen=True, slots=True)
class Silence:
    """An active silence: who made it, why, until when."""

    id: str
    created_by: str
    comment: str
    ends_at: str

    def said(self) -> str:
        """'alice (maintenance) until 2026-12-04T20:00:00Z'"""
        why = f" ({self.comment})" if self.comment else ""
        return f"{self.created_by}{why} until {self.ends_at}"


def parse_silences(data: Any) -> tuple[Silence, ...]:
    """The active silences in Alertmanager's answer."""
    found = []
    for item in data if isinstance(data, list) else ():
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        status = item.get("status")
        if not isinstance(status, dict) or status.get("state") != "active":
            continue
        found.append(
            Silence(
                item["id"],
                safe_text(str(item.get("createdBy", ""))),
                safe_text(str(item.get("comment", ""))),
                safe_text(str(item.get("endsAt", ""))),
            )
        )
    return tuple(found)


def held_key(labels: Mapping[str, str]) -> str:
    """An alert as Alertmanager holds it, by its labels: a label with an empty value is no
    label there."""
    return fingerprint({k: v for k, v in labels.items() if v})


def silenced_alerts(data: Any, silences: tuple[Silence, ...]) -> dict[str, Silence]:
    """held_key of each alert in Alertmanager's answer that a silence of `silences` holds
    silenced -> that silence (the first it names that is known)."""
    by_id = {s.id: s for s in silences}
    found: dict[str, Silence] = {}
    for item in data if isinstance(data, list) else ():
        if not isinstance(item, dict):
            continue
        labels, status = item.get("labels"), item.get("status")
        if not isinstance(labels, dict) or not isinstance(status, dict):
            continue
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            continue
        ids = status.get("silencedBy")
        named = (
            [by_id[i] for i in ids if isinstance(i, str) and i in by_id]
            if isinstance(ids, list)
            else []
        )
        if named:
            found[held_key(labels)] = named[0]
    return found
