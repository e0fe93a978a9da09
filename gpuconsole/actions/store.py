"""Where the action journal, the GPU locks and the audit log live.

One folder per machine ([actions] state_dir, /var/lib/gpuconsole by default), so that every
operator sees the same locks and writes one audit log, whichever Unix user, ssh session or
console they come through. A folder this process cannot use falls back to the user's own
state folder and says so: locks kept there bind only that user's processes. The demo keeps
its own store beside its simulated worlds, out of the machine's audit log.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole import paths
from gpuconsole.actions.roles import OPERATOR_GROUP, login_name
from gpuconsole.config import ActionsConfig, ConfigError

if TYPE_CHECKING:  # opened where used: a one-shot asks only where the journal is
    from gpuconsole.actions.audit import AuditLog
    from gpuconsole.actions.journal import Journal

__all__ = ["ActionStore", "action_store", "demo_store"]

log = logging.getLogger(__name__)

JOURNAL_FILE = paths.JOURNAL_FILE
AUDIT_FILE = "audit.jsonl"
SHARED_FILE_MODE = 0o660  # the journal: the group (gpuconsole-operator) reads and writes
PRIVATE_FILE_MODE = 0o600
SHARED_DIR_MODE = 0o3770  # setgid: files take the folder's group; sticky: and stay their owner's


@dataclass(frozen=True, slots=True)
class ActionStore:
    """The journal (with the locks) and the audit log that actions use, and whether every
    user of the machine shares them."""

    journal_path: Path
    audit_path: Path
    shared: bool
    warning: str = ""  # why the machine's folder is not used, for the person to read

    @property
    def file_mode(self) -> int:
        return SHARED_FILE_MODE if self.shared else PRIVATE_FILE_MODE

    def journal(self, *, dry_run: bool = False, proc_root: str = "/proc") -> Journal:
        """The journal; for a dry run an empty one in memory, so that nothing is written.
        `proc_root`: where the node's boot id is read, journaled with each step."""
        from gpuconsole.actions.journal import Journal

        return Journal(
            self.journal_path, mode=self.file_mode, in_memory=dry_run, proc_root=proc_root
        )

    def audit(self) -> AuditLog:
        from gpuconsole.actions.audit import AuditLog

        return AuditLog(self.audit_path, shared=self.shared)


def _make_shared_dir(folder: Path) -> None:
    """Create the machine's folder as the install line would: setgid, sticky, group-writable,
    owned by the operators' group where it exists (only root gets this far on /var/lib)."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return  # another operator's process made it at the same moment: it set it up
    os.chmod(folder, SHARED_DIR_MODE)  # mkdir's mode passes through the umask
    with contextlib.suppress(KeyError, PermissionError):
        os.chown(folder, -1, grp.getgrnam(OPERATOR_GROUP).gr_gid)


def _unusable(folder: Path, journal: Path | None) -> str | None:
    """Why this process cannot keep `journal` and its own audit file in `folder`; None if it
    can. The audit files of others need not be writable: each user appends to their own."""
    try:
        if not folder.exists():
            _make_shared_dir(folder)
    except OSError as exc:
        return f"cannot create it: {exc.strerror}"
    if not folder.is_dir():
        return "not a folder"
    user = login_name()
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"not writable by {user}"
    if journal is None:
        return None
    # SQLite's -wal and -shm files are written by every reader too
    wal = [journal.with_name(journal.name + s) for s in ("-wal", "-shm")]
    for path in (journal, *wal):
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            return f"{path.name} is not writable by {user}"
    return None


def action_store(cfg: ActionsConfig) -> ActionStore:
    """The store [actions] names; the user's own state folder, with a warning, when this
    process cannot use the machine's folder. A journal or audit log named explicitly must
    be usable: falling back from it would split the locks without anyone choosing to."""
    folder = Path(cfg.state_dir) if cfg.state_dir else Path(paths.SYSTEM_STATE_DIR)
    journal = cfg.journal_path
    audit = Path(cfg.audit_log) if cfg.audit_log else folder / AUDIT_FILE
    for key, path in (("journal", cfg.journal), ("audit_log", cfg.audit_log)):
        if path:
            why = _unusable(Path(path).parent, Path(path) if key == "journal" else None)
            if why is not None:
                raise ConfigError(f"[actions] {key} {path}: its folder {why}")
    why = None if cfg.journal and cfg.audit_log else _unusable(folder, journal)
    if why is None:
        return ActionStore(journal, audit, shared=True)
    own = paths.state_dir()
    warning = (
        f"{folder} is unusable ({why}): the action journal, GPU locks and audit log are kept "
        f"in {own}, where other users and sessions do not see them. To share them, run "
        f"`install -d -m 3770 -g {OPERATOR_GROUP} {folder}` as root, or set [actions] "
        "state_dir to a folder every operator can write"
    )
    log.warning("%s", warning)
    return ActionStore(
        Path(cfg.journal) if cfg.journal else own / JOURNAL_FILE,
        Path(cfg.audit_log) if cfg.audit_log else own / AUDIT_FILE,
        shared=False,
        warning=warning,
    )


def demo_store() -> ActionStore:
    """The simulated cluster's journal and audit log, beside its worlds in the user's own
    state folder: a demo never writes to the machine's audit log."""
    folder = paths.state_dir() / "demo"
    return ActionStore(folder / JOURNAL_FILE, folder / AUDIT_FILE, shared=False)
