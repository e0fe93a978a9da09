"""BMC power control as an action: checked, confirmed by the node's name, audited.

The check happens here, where the action executes, not only in a UI: a viewer is
refused, and so is a confirmation that does not spell the node's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpuconsole.actions.audit import AuditLog, AuditRecord
from gpuconsole.actions.roles import Actor
from gpuconsole.sources.bmc.link import BmcError, PowerAction


class PowerControl(Protocol):
    """What can change a node's power: a BmcSource."""

    @property
    def label(self) -> str: ...

    async def set_power(self, action: PowerAction) -> str: ...


class ActionRefused(Exception):
    """The action was not carried out: the role may not act, or the confirmation is wrong."""


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
    """Carry out a power request (not waiting for the new state); every outcome is audited.

    Raises ActionRefused before anything reaches the BMC, or BmcError when it fails.
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
                args={"node": request.node, "state": request.action.value},
                key_fingerprint=request.actor.key_fingerprint,
            )
        )

    if not request.actor.role.may_act:
        reason = f"role {request.actor.role.value} may not act; operators and admins may"
        record("refused", reason)
        raise ActionRefused(reason)
    if request.confirm != request.node:
        reason = f"confirmation {request.confirm!r} does not match the node name {request.node!r}"
        record("refused", reason)
        raise ActionRefused(reason)
    try:
        answer = await control.set_power(request.action)
    except BmcError as exc:
        record("failed", str(exc))
        raise
    record("ok", answer)
    return answer
