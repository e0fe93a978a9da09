"""What every measurement shares: the fake library, the DGX H100 profile, the commands."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.compare.procs import ToolFailed
from gpuconsole.sim.fakenvml import build_library, driver_of, environment, write_profile
from gpuconsole.sim.profiles import DGX_H100

NODE = "dgx-h100-fake"
BYTECODE_OFF = "PYTHONDONTWRITEBYTECODE"
INTERVAL_S = 1.0
# gpuconsole reads NVML only, at its defaults (1 s, XID/ECC event thread on), as gpustat and
# nvitop do: this node has no RDMA port, BMC or tenant for the other sources to read.
CONFIG = f"""\
# gpuconsole for `make bench-compare`: NVML only, every [nvml] key at its default
[host]
name = "{NODE}"
[fabric]
enabled = false
[tenancy]
enabled = false
"""


@dataclass(frozen=True)
class Setup:
    """The files and commands of one comparison run."""

    tmp: Path
    library: Path
    gpus: int
    env: dict[str, str]  # for subprocesses: this environment plus the fake library's
    fake_env: dict[str, str]  # the fake library's variables alone (for tmux sessions)
    gpuconsole: tuple[str, ...]
    config: Path
    tools: Path  # bin/ of the venv with gpustat, nvitop, nvitop-exporter and py-spy

    def tool(self, name: str) -> str:
        return str(self.tools / name)


def _gpuconsole() -> tuple[str, ...]:
    script = Path(sys.executable).with_name("gpuconsole")
    return (str(script),) if script.exists() else (sys.executable, "-m", "gpuconsole")


def prepare(tmp: Path, venv: Path) -> Setup:
    """Build the fake library and the profile under `tmp`; check the other tools are there."""
    tools = venv / "bin"
    wanted = ("gpustat", "nvitop", "nvitop-exporter", "py-spy")
    missing = [name for name in wanted if not (tools / name).exists()]
    if missing:
        raise ToolFailed(
            f"{', '.join(missing)} not in {tools}: `make bench-compare` installs them "
            "(benchmarks/compare/requirements.txt)"
        )
    if shutil.which("tmux") is None:
        raise ToolFailed("tmux is needed for the TUI rows: apt-get install tmux")
    library = build_library(tmp / "lib", driver_of(DGX_H100))
    profile = write_profile(DGX_H100, tmp / "dgx-h100.profile")
    config = tmp / "gpuconsole.toml"
    config.write_text(CONFIG)
    state = {
        # gpuconsole's log, state and config folders: private to this run
        "XDG_STATE_HOME": str(tmp / "state"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
        "XDG_CACHE_HOME": str(tmp / "cache"),
    }
    fake_env = {**environment(library.parent, profile), **state}
    # Every tool runs from compiled bytecode, as installed: pip compiled the other tools' at
    # install, and gpuconsole's is written by its first (untimed) run. A shell that says
    # PYTHONDONTWRITEBYTECODE would have each gpuconsole start compile it from source again,
    # a tenth of a second and more of CPU that no installed copy pays.
    env = {k: v for k, v in os.environ.items() if k != BYTECODE_OFF}
    return Setup(
        tmp=tmp,
        library=library,
        gpus=len(DGX_H100.gpus),
        env={**env, **fake_env},
        fake_env=fake_env,
        gpuconsole=_gpuconsole(),
        config=config,
        tools=tools,
    )


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
