"""Where gpuconsole keeps things on disk: XDG base directories per user, and one system
folder for what every user and session on a machine must share (the action journal,
GPU locks and audit log)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# Shared by every operator of a machine, whichever Unix user or ssh session they come
# through: one action per GPU at a time only holds if they all see the same locks.
SYSTEM_STATE_DIR = "/var/lib/gpuconsole"
# The action journal's name in its folder
JOURNAL_FILE = "actions.db"


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable, "")
    return Path(value) if value and os.path.isabs(value) else Path.home() / fallback


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "gpuconsole"


def state_dir() -> Path:
    """This user's own state (logs, host keys, the demo's worlds); no other user sees it."""
    return _xdg("XDG_STATE_HOME", ".local/state") / "gpuconsole"


def default_config_file() -> Path:
    return config_dir() / "config.toml"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


def create_file(path: Path, mode: int) -> None:
    """Create `path` with exactly `mode` (the umask would strip a group's write bit), or
    leave an existing file as its owner made it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


class NotOwnFile(Exception):
    """A state file that is not read: why ("a symbolic link, which is not followed")."""


def read_own_file(path: Path, limit: int) -> bytes:
    """A state file gpuconsole wrote, whole: NotOwnFile where it is a link (not followed),
    not a regular file (a FIFO is not waited on) or past `limit` bytes; OSError where it
    cannot be read (FileNotFoundError where there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotOwnFile("a symbolic link, which is not followed") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotOwnFile("not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotOwnFile(f"larger than {limit} bytes")
    return data


def put_aside(path: Path) -> str:
    """Move a state file gpuconsole cannot read out of the way of the next write, to
    PATH.corrupt or the first PATH.corrupt.N not taken, so that nothing the user had is
    written over; words for the operator that say where it went."""
    aside = path.with_name(path.name + ".corrupt")
    n = 0
    while os.path.lexists(aside):
        n += 1
        aside = path.with_name(f"{path.name}.corrupt.{n}")
    try:
        os.rename(path, aside)
    except OSError as exc:
        return f"it could not be moved aside ({exc.strerror}): it is written over next"
    return f"moved to {aside.name}"
