"""The core (readings, hub, sources, simulator) runs without Textual in memory."""

from __future__ import annotations

import subprocess
import sys


def test_the_core_and_a_snapshot_never_load_textual() -> None:
    code = (
        "import sys, asyncio\n"
        "from gpuconsole import codec, config, hub, wiring\n"
        "from gpuconsole.cli import main\n"
        "from gpuconsole.readings import snapshot\n"
        "from gpuconsole.sim.cluster import demo_hub\n"
        "asyncio.run(demo_hub(events=False).poll_once())\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
