"""Fixtures shared across the suite, gathered from their modules."""

import os
import shutil
import tempfile

import pytest

from tests.conftest_tui import *  # noqa: F403
from tests.fakenvml_fixtures import (
    FakeNvmlEnv,
    fake_nvml_env,
    fake_nvml_lib,
    fake_nvml_libs,
    nvml_case,
)
from tests.logging_fixtures import logging_as_it_was

__all__ = [
    "FakeNvmlEnv",
    "fake_nvml_env",
    "fake_nvml_lib",
    "fake_nvml_libs",
    "logging_as_it_was",
    "nvml_case",
]


_HOMES: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Every test, and every process a test starts, keeps its state and reads its config
    under a folder of this run's own, never the user's: an alert, a journal or an XID
    history one test left in ~/.local/state would be found by the next run's tests."""
    home = tempfile.mkdtemp(prefix="gpuconsole-tests-")
    _HOMES.append(home)
    for variable, folder in (("XDG_STATE_HOME", "state"), ("XDG_CONFIG_HOME", "config")):
        os.environ[variable] = os.path.join(home, folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    for home in _HOMES:
        shutil.rmtree(home, ignore_errors=True)
