"""Fixtures shared across the suite, gathered from their modules."""

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
