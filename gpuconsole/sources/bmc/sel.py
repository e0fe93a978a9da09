"""SEL records become hub events once: deduplicated by record id, remembered across restarts.

The cursor (the last record announced) is kept in one small JSON file per BMC under
the state folder. On first contact with a BMC nothing old is announced: the existing
log is taken as history. A log that was cleared (every id now at or below the cursor,
the cursor's own record gone) starts over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuconsole import paths
from gpuconsole.readings.bmc import SelEntry

log = logging.getLogger(__name__)

MAX_CURSOR_BYTES = 4096  # {"last_record_id": N}: a file past this is none gpuconsole wrote


@dataclass
class SelCursor:
    """The last SEL record announced for one BMC, optionally persisted in `path`."""

    path: Path | None = None
    last_record_id: int | None = None
    loaded: bool = False

    @classmethod
    def for_bmc(cls, folder: Path, label: str) -> SelCursor:
        """The cursor file of a BMC, named from its label ("ipmi://10.0.0.17:623")."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
        return cls(folder / f"sel-{safe}.json")

    def load(self) -> None:
        self.loaded = True
        if self.path is None:
            return
        try:
            data = json.loads(paths.read_own_file(self.path, MAX_CURSOR_BYTES))
        except FileNotFoundError:
            return
        except (OSError, ValueError, RecursionError, paths.NotOwnFile) as exc:
            # RecursionError: nested deep; NotOwnFile: a link, a FIFO, a file that goes on
            log.warning("%s: unreadable SEL cursor, starting over: %s", self.path, exc)
            return
        value = data.get("last_record_id") if isinstance(data, dict) else None
        valid = isinstance(value, int) and not isinstance(value, bool)
        self.last_record_id = value if valid else None

    def save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".sel-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"last_record_id": self.last_record_id}, f)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("%s: cannot save SEL cursor: %s", self.path, exc)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)

    def new_entries(self, entries: Sequence[SelEntry]) -> list[SelEntry]:
        """The entries not announced before, oldest first; moves (and saves) the cursor."""
        if not self.loaded:
            self.load()
        if not entries:
            if self.last_record_id is None:  # first contact with an empty log
                self.last_record_id = 0
                self.save()
            return []
        ids = [e.record_id for e in entries]
        newest = max(ids)
        last = self.last_record_id
        if last is None:
            fresh: list[SelEntry] = []  # first contact: the existing log is history
        elif last not in ids and newest <= last:
            fresh = list(entries)  # cleared and refilled: everything is new
        else:
            fresh = [e for e in entries if e.record_id > last]
        if newest != last:
            self.last_record_id = newest
            self.save()
        return sorted(fresh, key=lambda e: e.record_id)
