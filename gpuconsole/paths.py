"""Where gpuconsole keeps things on disk (XDG base directories)."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable, "")
    return Path(value) if value and os.path.isabs(value) else Path.home() / fallback


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "gpuconsole"


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / "gpuconsole"


def default_config_file() -> Path:
    return config_dir() / "config.toml"


def user_themes_dir() -> Path:
    return config_dir() / "themes"
