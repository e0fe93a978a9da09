"""Fixtures for tests that run programs against the fake libnvidia-ml.so.1.

conftest.py imports these (``from tests.fakenvml_fixtures import *``), or a test module can.

- ``fake_nvml_lib``: the library for the driver the DGX H100 profile names, built once per
  session (skips, or fails under GPUCONSOLE_REQUIRE_PEERS=1, when gcc is missing).
- ``fake_nvml_env``: a factory; ``fake_nvml_env("dgx-h100", scenarios=["thermal 3"])`` writes a
  profile into the test's tmp_path and returns a complete environment (os.environ plus the fake
  library's variables) for ``subprocess.run(..., env=...)``. ``driver="575"`` plays another
  driver branch (gpuconsole.sim.drivers.DRIVERS), with the library built for it.
- ``nvml_case``: one cell of the matrix the cheap NVML checks run over, every driver profile with
  MIG off and on (GPU 7 of a DGX H100 partitioned), read as root and, with MIG on, as an
  unprivileged user: a test that takes it runs once per cell and gets its environment from
  ``nvml_case.env(*scenarios)``.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from gpuconsole.sim.drivers import DRIVERS, DriverProfile
from gpuconsole.sim.fakenvml import build_library, driver_of, environment, write_profile
from gpuconsole.sim.profiles import DGX_H100, NodeProfile, get_profile
from tests.peers import require_peer

__all__ = [
    "MIG_GPU",
    "NVML_CASES",
    "FakeNvmlEnv",
    "FakeNvmlLibs",
    "NvmlCase",
    "fake_nvml_env",
    "fake_nvml_lib",
    "fake_nvml_libs",
    "nvml_case",
]

MIG_GPU = 7  # the GPU the matrix's MIG cells partition


class FakeNvmlEnv(Protocol):
    """The ``fake_nvml_env`` factory."""

    def __call__(
        self,
        profile: NodeProfile | str = "dgx-h100",
        *,
        driver: DriverProfile | str | None = None,
        scenarios: Sequence[str] = (),
        seed: int = 0,
        counts: Path | None = None,
        frozen_time: float | None = None,
        missing_fields: Sequence[int] = (),
        privileged: bool = True,
        profiling_admin_only: bool = True,
        open_errors: Mapping[int, int] | None = None,
        faults: Sequence[str] = (),
        recovery_actions: Mapping[int, int] | None = None,
        fabric_probes: Mapping[int, tuple[int, int]] | None = None,
        virtualization_mode: int = 0,
    ) -> dict[str, str]: ...


class FakeNvmlLibs:
    """The fake library for each driver branch, built on first use into one session folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, driver: DriverProfile | str) -> Path:
        return build_library(self.root, driver)


@pytest.fixture(scope="session")
def fake_nvml_libs(tmp_path_factory: pytest.TempPathFactory) -> FakeNvmlLibs:
    """Builds (once per branch and session) the fake library a driver profile needs."""
    require_peer("gcc", shutil.which("gcc") is not None, "apt-get install gcc")
    return FakeNvmlLibs(tmp_path_factory.mktemp("fakenvml"))


@pytest.fixture(scope="session")
def fake_nvml_lib(fake_nvml_libs: FakeNvmlLibs) -> Path:
    """The fake libnvidia-ml.so.1 for the driver the DGX H100 profile names."""
    return fake_nvml_libs(driver_of(DGX_H100))


@pytest.fixture
def fake_nvml_env(tmp_path: Path, fake_nvml_libs: FakeNvmlLibs) -> FakeNvmlEnv:
    """A factory of subprocess environments that load the fake library with a given profile."""
    serial = itertools.count()

    def make(
        profile: NodeProfile | str = "dgx-h100",
        *,
        driver: DriverProfile | str | None = None,
        scenarios: Sequence[str] = (),
        seed: int = 0,
        counts: Path | None = None,
        frozen_time: float | None = None,
        missing_fields: Sequence[int] = (),
        privileged: bool = True,
        profiling_admin_only: bool = True,
        open_errors: Mapping[int, int] | None = None,
        faults: Sequence[str] = (),
        recovery_actions: Mapping[int, int] | None = None,
        fabric_probes: Mapping[int, tuple[int, int]] | None = None,
        virtualization_mode: int = 0,
    ) -> dict[str, str]:
        node = get_profile(profile) if isinstance(profile, str) else profile
        plays = driver_of(node, driver)
        path = write_profile(
            node,
            tmp_path / f"{node.name}-{next(serial)}.profile",
            driver=plays,
            scenarios=scenarios,
            seed=seed,
            missing_fields=missing_fields,
            privileged=privileged,
            profiling_admin_only=profiling_admin_only,
            open_errors=open_errors,
            faults=faults,
            recovery_actions=recovery_actions,
            fabric_probes=fabric_probes,
            virtualization_mode=virtualization_mode,
        )
        library = fake_nvml_libs(plays)
        extra = environment(library.parent, path, counts, frozen_time=frozen_time)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCONSOLE_FAKE_NVML_")}
        env.update(extra)
        return env

    return make


@dataclass(frozen=True)
class NvmlCase:
    """One cell of the NVML matrix: a DGX H100 on one driver, GPU 7 in MIG mode or not, read
    by root or by an unprivileged user."""

    driver: DriverProfile
    mig: bool
    make_env: FakeNvmlEnv
    privileged: bool = True

    def env(self, *scenarios: str, frozen_time: float | None = None) -> dict[str, str]:
        """A subprocess environment for this cell, with more scenarios where asked."""
        own = (f"mig {MIG_GPU}",) if self.mig else ()
        return self.make_env(
            DGX_H100,
            driver=self.driver,
            scenarios=(*own, *scenarios),
            frozen_time=frozen_time,
            privileged=self.privileged,
        )


# An unprivileged user is refused most on a MIG-enabled node (the MIG GPU's memory, processes
# and instances, every GPU's GPM): that cell stands for the axis.
NVML_CASES = [
    pytest.param(
        (driver, mig, privileged),
        id=f"{driver.name}-{'mig' if mig else 'full'}{'' if privileged else '-user'}",
    )
    for driver, mig, privileged in itertools.product(DRIVERS, (False, True), (True, False))
    if privileged or mig
]


@pytest.fixture(params=NVML_CASES)
def nvml_case(request: pytest.FixtureRequest, fake_nvml_env: FakeNvmlEnv) -> NvmlCase:
    """A DGX H100 on each driver profile, with and without a MIG-partitioned GPU, as root and
    (MIG on) as an unprivileged user."""
    driver, mig, privileged = request.param
    return NvmlCase(driver, mig, fake_nvml_env, privileged)
