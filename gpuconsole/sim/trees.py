"""Temporary file trees the simulators lay out (sysfs, proc), and their cleanup."""

from __future__ import annotations

import os
import shutil
import tempfile


def new_tree(prefix: str, node: str) -> str:
    """A fresh temporary folder named for this process and node; old orphans go first."""
    sweep_orphan_trees(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{node}-")


def sweep_orphan_trees(prefix: str) -> None:
    """Remove trees with this prefix left behind by demo processes that were killed."""
    base = tempfile.gettempdir()
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
