"""Fixtures for tests that run programs against the fake libnvidia-ml.so.1.

conftest.py imports these (``from tests.fakenvml_fixtures import *``), or a test module can.

- ``fake_nvml_lib``: the library, built once per session (skips, or fails under
  GPUCONSOLE_REQUIRE_PEERS=1, when gcc is missing).
- ``fake_nvml_env``: a factory; ``fake_nvml_env("dgx-h100", scenarios=["thermal 3"])`` writes a
  profile into the test's tmp_path and returns a complete environment (os.environ plus the fake
  library's variables) for ``subprocess.run(..., env=...)``.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import pytest

from gpuconsole.sim.fakenvml import build_library, environment, write_profile
from gpuconsole.sim.profiles import NodeProfile, get_profile
from tests.peers import require_peer

__all__ = ["FakeNvmlEnv", "fake_nvml_env", "fake_nvml_lib"]


class FakeNvmlEnv(Protocol):
    """The ``fake_nvml_env`` factory."""

    def __call__(
        self,
        profile: NodeProfile | str = "dgx-h100",
        *,
        scenarios: Sequence[str] = (),
        seed: int = 0,
        counts: Path | None = None,
        frozen_time: float | None = None,
        missing_fields: Sequence[int] = (),
    ) -> dict[str, str]: ...


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1, compiled once for the session."""
    require_peer("gcc", shutil.which("gcc") is not None, "apt-get install gcc")
    return build_library(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture
def fake_nvml_env(tmp_path: Path, fake_nvml_lib: Path) -> FakeNvmlEnv:
    """A factory of subprocess environments that load the fake library with a given profile."""
    serial = itertools.count()

    def make(
        profile: NodeProfile | str = "dgx-h100",
        *,
        scenarios: Sequence[str] = (),
        seed: int = 0,
        counts: Path | None = None,
        frozen_time: float | None = None,
        missing_fields: Sequence[int] = (),
    ) -> dict[str, str]:
        node = get_profile(profile) if isinstance(profile, str) else profile
        path = write_profile(
            node,
            tmp_path / f"{node.name}-{next(serial)}.profile",
            scenarios=scenarios,
            seed=seed,
            missing_fields=missing_fields,
        )
        extra = environment(fake_nvml_lib.parent, path, counts, frozen_time=frozen_time)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCONSOLE_FAKE_NVML_")}
        env.update(extra)
        return env

    return make
