"""Who may act: viewers look, operators and admins act."""

from __future__ import annotations

import dataclasses
import enum
import grp
import os
import pwd
from dataclasses import dataclass

from gpuconsole.readings.base import safe_text

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
    """Someone asking for an action: who they are as far as this process can tell, the role
    they hold, and how they came in. `user` is never a name the person typed or set: a local
    user is their process's real uid, an ssh-in session the authorized key's name (with its
    fingerprint) or the user its password was checked for."""

    user: str
    role: Role
    key_fingerprint: str | None = None  # the ssh key this process authenticated
    via: str = "local"  # "local" or "ssh"
    login: str = ""  # the user name an ssh client asked for: any it likes, so not `user`
    # what sshd's environment says of the login that started this command: the login could
    # have set it, so it is recorded beside the uid, as said, never as the key that asked
    ssh_login: str = ""

    @property
    def who(self) -> str:
        """'alice (operator, ssh key SHA256:...)' for logs and refusals."""
        key = f", {self.via} key {self.key_fingerprint}" if self.key_fingerprint else ""
        return f"{self.user} ({self.role.value}{key})"

    def audit_args(self) -> dict[str, str]:
        """How they came in, for an audit record's args."""
        said = {"ssh_login": self.ssh_login} if self.ssh_login else {}
        return {"via": self.via, **said}

    def for_demo(self) -> Actor:
        """This actor on the simulator: at least an operator, since no real GPU or server is
        at stake; the key that let them in stays on the record."""
        if self.role.may_act:
            return self
        return dataclasses.replace(self, role=Role.OPERATOR)


def login_name() -> str:
    """The Unix user this process runs as, by its real uid: the kernel's word, not USER or
    LOGNAME, which anyone can set."""
    return user_name(os.getuid())


def user_name(uid: int) -> str:
    """The user name of `uid`; its number where the passwd database has none (a container)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def local_actor() -> Actor:
    """The user running this process: root and gpuconsole-admin members are admins,
    gpuconsole-operator members operators, everyone else a viewer."""
    user = login_name()
    if os.geteuid() == 0:
        return Actor(user, Role.ADMIN)
    groups = {grp.getgrgid(g).gr_name for g in os.getgroups() if _known(g)}
    if ADMIN_GROUP in groups:
        return Actor(user, Role.ADMIN)
    if OPERATOR_GROUP in groups:
        return Actor(user, Role.OPERATOR)
    return Actor(user, Role.VIEWER)


def key_actor(role: Role, fingerprint: str, name: str, login: str) -> Actor:
    """An ssh-in session that logged in with an authorized key: it is the key, named as the
    keys file names it (its comment; the fingerprint where it has none), whatever user name
    the client asked for (kept as `login`)."""
    shown = safe_text(name).strip()
    return Actor(shown or fingerprint, role, fingerprint, "ssh", login=login)


def password_actor(role: Role, user: str) -> Actor:
    """An ssh-in session whose password was checked for `user`: that user."""
    return Actor(user, role, None, "ssh", login=user)


def _known(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


class ActionRefused(Exception):
    """The action was not carried out: the role may not act, the confirmation is wrong, or
    the state refuses the plan."""
