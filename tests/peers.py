"""Real peers the tests talk to: skip when one is absent, fail under GPUCONSOLE_REQUIRE_PEERS=1."""

from __future__ import annotations

import os
import shutil
import sys

import pytest


def peers_required() -> bool:
    return os.environ.get("GPUCONSOLE_REQUIRE_PEERS", "") not in ("", "0")


def require_peer(name: str, available: bool, install_hint: str) -> None:
    """Skip (or, under GPUCONSOLE_REQUIRE_PEERS=1, fail) when a peer is missing."""
    if available:
        return
    message = f"peer {name} is missing: {install_hint}"
    if peers_required():
        pytest.fail(message + " (GPUCONSOLE_REQUIRE_PEERS=1)")
    pytest.skip(message)


def require_program(program: str, install_hint: str) -> str:
    """The path of a program (on PATH or beside this Python, as a venv installs them), or
    skip/fail naming the package that brings it."""
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    path = shutil.which(program, path=search)
    require_peer(program, path is not None, install_hint)
    assert path is not None
    return path
