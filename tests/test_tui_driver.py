"""The console's terminal driver on a real pseudo-terminal: its input thread sleeps while
nobody types, and keys (a lone Escape too) and the app's end still come at once."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import termios
import time
from fcntl import ioctl
from pathlib import Path
from struct import pack

import pytest
from textual.drivers.headless_driver import HeadlessDriver

from gpuconsole.tui.app import ConsoleApp
from gpuconsole.tui.driver import QuietLinuxDriver, terminal_driver
from gpuconsole.tui.wallboard import WallboardApp

ROOT = Path(__file__).resolve().parent.parent

# An app on the console's driver that counts its input thread's looks at the parser (one per
# wake-up), writes the count after 1.5 s of nobody typing, and ends on a lone Escape.
PROBE = """
import sys
from pathlib import Path
from textual.app import App
from textual._xterm_parser import XTermParser
from gpuconsole.tui.driver import terminal_driver

out = Path(sys.argv[1])
looks = 0
tick = XTermParser.tick

def counted(self):
    global looks
    looks += 1
    return tick(self)

XTermParser.tick = counted

class Probe(App[None]):
    def get_driver_class(self):
        return terminal_driver(super().get_driver_class())

    def on_mount(self):
        self.set_timer(1.5, self.idle)

    def idle(self):
        out.write_text(f"{type(self._driver).__name__} {looks}")

    def on_key(self, event):
        if event.key == "escape":
            self.exit()

Probe().run()
"""


def test_the_input_thread_sleeps_while_idle_and_a_lone_escape_still_arrives(
    tmp_path: Path,
) -> None:
    out = tmp_path / "looks"
    master, slave = pty.openpty()
    ioctl(slave, termios.TIOCSWINSZ, pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    env.pop("TEXTUAL_DRIVER", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, str(out)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    try:
        os.set_blocking(master, False)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
            try:
                os.read(master, 65536)
            except BlockingIOError:
                time.sleep(0.02)
            except OSError:
                break
        assert out.exists(), "the probe app never came up"
        driver, looks = out.read_text().split()
        assert driver == "QuietLinuxDriver"
        # Textual's own driver looks ten times a second: fifteen here
        assert int(looks) <= 3
        os.set_blocking(master, True)
        os.write(master, b"\x1b")  # a lone Escape: told apart by waiting, then delivered
        began = time.monotonic()
        while proc.poll() is None and time.monotonic() - began < 10:
            _drain_some(master)
        assert proc.returncode == 0, "the lone Escape never reached the app"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def _drain_some(fd: int) -> None:
    os.set_blocking(fd, False)
    try:
        os.read(fd, 65536)
    except BlockingIOError:
        time.sleep(0.02)
    except OSError:
        time.sleep(0.02)


def test_the_console_and_the_wallboard_run_on_it_in_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TEXTUAL_DRIVER", raising=False)
    assert ConsoleApp(None, start_hub=False).driver_class is QuietLinuxDriver
    assert WallboardApp(None).driver_class is QuietLinuxDriver


def test_other_drivers_stay_as_textual_chose() -> None:
    assert terminal_driver(HeadlessDriver) is HeadlessDriver
