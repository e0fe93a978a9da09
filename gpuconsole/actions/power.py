"""BMC power control as an action: checked, confirmed by the node's name, audited.

The check happens here, where the action executes, not only in a UI: a viewer is
refused, and so is a confirmation that does not spell the node's name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuconsole.actions.audit import AuditLog, AuditRecord
from gpuconsole.actions.roles import ActionRefused, Actor
from gpuconsole.sources.bmc.link import BmcError, PowerAction

log = logging.getLogger(__name__)


class PowerControl(Protocol):
    """What can change a node's power: a BmcSource."""

    @property
    def label(self) -> str: ...

    async def set_power(self, action: PowerAction) -> str: ...


@dataclass(frozen=True, slots=True)
class PowerRequest:
    """Power `action` on `node`, asked for by `actor`, confirmed by typing `confirm`."""

    node: str
    action: PowerAction
    actor: Actor
    confirm: str


async def power(
    request: PowerRequest,
    control: PowerControl,
    audit: AuditLog,
    *,
    clock: Callable[[], float] = time.time,
) -> str:
    """Carry out a power request (not waiting for the new state); every outcome is audited,
    and the request before it reaches the BMC.

    Raises ActionRefused before anything reaches the BMC (a power action the audit log cannot
    take is refused too), or BmcError when it fails.
    """

    def record(outcome: str, detail: str) -> None:
        audit.append(
            AuditRecord(
                at=clock(),
                user=request.actor.user,
                role=request.actor.role.value,
                action=f"power {request.action.value}",
                target=f"{request.node} ({control.label})",
                outcome=outcome,
                detail=detail,
                args={
                    "node": request.node,
                    "state": request.action.value,
                    **request.actor.audit_args(),
                },
                key_fingerprint=request.actor.key_fingerprint,
            )
        )

    def record_after(outcome: str, detail: str) -> str:
        """Audit what the BMC did; a note for the person when the log cannot take it."""
        try:
            record(outcome, detail)
        except OSError as exc:
            log.error(
                "power %s %s: %s not audited: %s", request.action.value, request.node, outcome, exc
            )
            return f"; its outcome is not audited: {audit.cannot_write(exc)}"
        return ""

    def refuse(reason: str) -> ActionRefused:
        try:
            record("refused", reason)
        except OSError as exc:
            log.error(
                "power %s %s: refusal not audited: %s", request.action.value, request.node, exc
            )
        return ActionRefused(reason)

    if not request.actor.role.may_act:
        raise refuse(f"role {request.actor.role.value} may not act; operators and admins may")
    if request.confirm != request.node:
        raise refuse(
            f"confirmation {request.confirm!r} does not match the node name {request.node!r}"
        )
    try:
        record("started", "")
    except OSError as exc:
        raise ActionRefused(
            f"{audit.cannot_write(exc)}, so power {request.action.value} {request.node} "
            "was not sent to the BMC"
        ) from None
    try:
        answer = await control.set_power(request.action)
    except BmcError as exc:
        record_after("failed", str(exc))
        raise
    return answer + record_after("ok", answer)
