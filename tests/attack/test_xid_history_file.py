"""The XID history an agent keeps across its restarts (state_dir/xids-NODE.json) is a file
anyone with the state folder can plant: the NVML poller's thread reads it at its first XID,
and what it cannot read never hangs it, never follows a link, and is kept aside, not
written over."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuconsole.sources.nvml.xids import XidHistory

BUS = "0000:18:00.0"


def _first_xid_in_time(history: XidHistory) -> bool:
    """Whether the poller's first XID (which loads the file) returns within 5 s."""
    done = threading.Event()

    def add() -> None:
        history.add(BUS, 48, at=1000.0)
        done.set()

    threading.Thread(target=add, daemon=True).start()
    return done.wait(5.0)


def test_a_fifo_planted_as_the_history_is_not_waited_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "xids-n.json"
    os.mkfifo(path)
    history = XidHistory(window_s=3600, path=path, boot="boot-a")
    assert _first_xid_in_time(history), "the poller waited on a FIFO for a writer"
    assert [x.code for x in history.counts(BUS, 1100.0)] == [48]
    assert "not a regular file" in caplog.text and "xids-n.json.corrupt" in caplog.text


def test_a_link_planted_as_the_history_is_not_followed_nor_its_target_written(
    tmp_path: Path,
) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"the operator's own file\n")
    path = tmp_path / "xids-n.json"
    path.symlink_to(target)
    history = XidHistory(window_s=3600, path=path, boot="boot-a")
    assert _first_xid_in_time(history)
    history.flush()
    assert target.read_bytes() == b"the operator's own file\n"
    assert path.is_file() and not path.is_symlink()  # the history written in its place


def test_a_history_that_cannot_be_read_is_kept_aside_not_written_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "xids-n.json"
    for n, junk in enumerate((b"\xff\xfe\x1b[2J", b'{"boot_id": "boot-a", "gpus": 5}')):
        path.write_bytes(junk)
        history = XidHistory(window_s=3600, path=path, boot="boot-a")
        assert _first_xid_in_time(history)
        history.flush()
        aside = tmp_path / ("xids-n.json.corrupt" + (f".{n}" if n else ""))
        assert aside.read_bytes() == junk
        assert [x.code for x in XidHistory(3600, path, "boot-a").counts(BUS, 1100.0)] == [48]
    assert "\x1b" not in caplog.text
