"""[[alert]] tables with values no one means: each is a config error naming its key and
line, never a traceback out of `gpuconsole rules` (or the engine) later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuconsole import config


@pytest.mark.parametrize("key", ["for_s", "keep_firing_for_s"])
@pytest.mark.parametrize("value", ["1e308", "1e12"])
def test_a_duration_past_any_prometheus_takes_is_a_config_error(
    tmp_path: Path, key: str, value: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[[alert]]\nname = "Slow"\nexpr = "gpuconsole_gpu_verdict >= 3"\n{key} = {value}\n'
    )
    with pytest.raises(
        config.ConfigError, match=rf"config.toml:4: \[\[alert\]\] #1 {key} must be at most"
    ):
        config.load(path)
    done = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "rules", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{key} must be at most" in done.stderr
