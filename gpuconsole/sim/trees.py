"""Temporary file trees the simulators lay out (sysfs, proc), and their cleanup."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

# A memory-backed folder is used only where it has this much room: a container's /dev/shm
# may be 64 MB, and a node's trees take a few MB of pages.
MIN_FREE_BYTES = 256 << 20


@functools.cache
def tree_base() -> str:
    """Where simulated trees go: a memory-backed folder, as sysfs and proc are, where one
    with room is writable ($XDG_RUNTIME_DIR, /dev/shm); else the temporary folder. A node's
    trees are ~1,000 small files: milliseconds in memory, up to a second on a busy disk,
    and a demo lays them out before its console shows them."""
    for base in (os.environ.get("XDG_RUNTIME_DIR", ""), "/dev/shm"):
        if not base or not os.path.isdir(base) or not os.access(base, os.W_OK | os.X_OK):
            continue
        try:
            room = os.statvfs(base)
        except OSError:
            continue
        if room.f_bavail * room.f_frsize >= MIN_FREE_BYTES:
            return base
    return tempfile.gettempdir()


def new_tree(prefix: str, node: str) -> str:
    """A fresh temporary folder named for this process and node; old orphans go first."""
    _sweep_once(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{node}-", dir=tree_base())


@functools.cache
def _sweep_once(prefix: str) -> None:
    sweep_orphan_trees(prefix)


def sweep_orphan_trees(prefix: str) -> None:
    """Remove trees with this prefix left behind by demo processes that were killed, where
    trees go and in the temporary folder (where they went before)."""
    for base in dict.fromkeys((tree_base(), tempfile.gettempdir())):
        _sweep(base, prefix)


def _sweep(base: str, prefix: str) -> None:
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except OSError:
            continue  # alive, someone else's
