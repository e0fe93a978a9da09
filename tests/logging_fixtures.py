"""Logging as each test found it: a command run in-process (`gpuconsole.cli.main.main`)
configures logging for its whole process, as a command should, and a later test must not
read the records that left behind."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for handler in list(root.handlers):
        # pytest's own capture handlers come and go with each phase: only a command's stay
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
            handler.close()
