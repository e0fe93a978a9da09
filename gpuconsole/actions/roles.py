"""Who may act: viewers look, operators and admins act."""

from __future__ import annotations

import dataclasses
import enum
import getpass
import grp
import os
from dataclasses import dataclass

# Local users get a role from their Unix groups; root is an admin.
ADMIN_GROUP = "gpuconsole-admin"
OPERATOR_GROUP = "gpuconsole-operator"


class Role(enum.StrEnum):
    """What a user of the console may do."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def may_act(self) -> bool:
        return self is not Role.VIEWER


@dataclass(frozen=True, slots=True)
class Actor:
    """Someone asking for an action: a user name, the role it holds, and how they came in
    (an ssh session names the key's fingerprint; a local user has none)."""

    user: str
    role: Role
    key_fingerprint: str | None = None
    via: str = "local"  # "local" or "ssh"

    @property
    def who(self) -> str:
        """'alice (operator, ssh key SHA256:...)' for logs and refusals."""
        key = f", {self.via} key {self.key_fingerprint}" if self.key_fingerprint else ""
        return f"{self.user} ({self.role.value}{key})"

    def for_demo(self) -> Actor:
        """This actor on the simulator: at least an operator, since no real GPU or server is
        at stake; the key that let them in stays on the record."""
        if self.role.may_act:
            return self
        return dataclasses.replace(self, role=Role.OPERATOR)


def local_actor() -> Actor:
    """The user running this process: root and gpuconsole-admin members are admins,
    gpuconsole-operator members operators, everyone else a viewer."""
    user = getpass.getuser()
    if os.geteuid() == 0:
        return Actor(user, Role.ADMIN)
    groups = {grp.getgrgid(g).gr_name for g in os.getgroups() if _known(g)}
    if ADMIN_GROUP in groups:
        return Actor(user, Role.ADMIN)
    if OPERATOR_GROUP in groups:
        return Actor(user, Role.OPERATOR)
    return Actor(user, Role.VIEWER)


def _known(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


class ActionRefused(Exception):
    """The action was not carried out: the role may not act, the confirmation is wrong, or
    the state refuses the plan."""
