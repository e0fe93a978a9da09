"""Themes as data: `themes/*.toml` (shipped, then the user's XDG folder) → Textual themes.

A theme file holds Textual's colours plus gpuconsole's own: the cool-to-hot scale for
heat cells, health colours, the SIMULATED marker and the passed-through GPU's mark. Those travel as theme variables
(`scale-0`…, `health-ok`…) so code never carries a colour literal; `Palette` turns the
current theme's variables into Rich styles for the widgets that paint cells.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rich.color import Color as RichColor
from rich.style import Style
from textual.color import Color
from textual.theme import Theme

from gpuconsole.readings.base import Health

log = logging.getLogger(__name__)

DEFAULT_THEME = "gpuconsole-dark"
_COLOR_KEYS = (
    "primary", "secondary", "warning", "error", "success", "accent",
    "foreground", "background", "surface", "panel", "boost",
)  # fmt: skip
_HEALTH_KEYS = tuple(h.value for h in Health)


class ThemeError(ValueError):
    """A theme file that cannot be used; the message names the file and the key."""


def theme_from_toml(text: str, origin: str) -> Theme:
    """Parse one theme file's text into a Textual Theme."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ThemeError(f"{origin}: {exc}") from None
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ThemeError(f"{origin}: key 'name' is required")
    colors = data.get("colors", {})
    if "primary" not in colors:
        raise ThemeError(f"{origin}: key 'colors.primary' is required")
    unknown = set(colors) - set(_COLOR_KEYS)
    if unknown:
        raise ThemeError(f"{origin}: unknown key 'colors.{sorted(unknown)[0]}'")
    variables: dict[str, str] = {}
    scale = data.get("scale", {}).get("colors", [])
    if not isinstance(scale, list) or len(scale) < 2:
        raise ThemeError(f"{origin}: key 'scale.colors' needs at least two colours")
    for i, value in enumerate(scale):
        variables[f"scale-{i}"] = str(value)
    variables["scale-steps"] = str(len(scale))
    # the scale as text colours (sparklines, bars): its own list where the cell colours are
    # too pale or dark to read as text on the theme's ground
    ink = data["scale"].get("foreground", scale)
    if not isinstance(ink, list) or len(ink) != len(scale):
        raise ThemeError(f"{origin}: key 'scale.foreground' needs one colour per scale colour")
    for i, value in enumerate(ink):
        variables[f"scale-fg-{i}"] = str(value)
    variables["scale-text"] = str(data["scale"].get("text", colors.get("foreground", "black")))
    variables["scale-text-cool"] = str(data["scale"].get("text-on-cool", variables["scale-text"]))
    for i, value in enumerate(data.get("instances", {}).get("colors", scale)):
        variables[f"instance-{i}"] = str(value)
    health = data.get("health", {})
    for key in _HEALTH_KEYS:
        if key not in health:
            raise ThemeError(f"{origin}: key 'health.{key}' is required")
        variables[f"health-{key}"] = str(health[key])
    marker = data.get("marker", {})
    variables["simulated"] = str(marker.get("simulated", colors.get("accent")))
    variables["passthrough"] = str(
        marker.get("passthrough", colors.get("secondary", colors["primary"]))
    )
    for key, value in data.get("variables", {}).items():
        variables[str(key)] = str(value)
    for key, value in [*colors.items(), *variables.items()]:
        if key == "scale-steps":
            continue
        try:
            Color.parse(str(value))
        except Exception:
            raise ThemeError(f"{origin}: {key} = {value!r} is not a colour") from None
    kwargs: dict[str, Any] = {key: str(value) for key, value in colors.items()}
    return Theme(
        name=name,
        dark=bool(data.get("dark", True)),
        ansi=bool(data.get("ansi", False)),
        variables=variables,
        **kwargs,
    )


def shipped_theme_files() -> list[tuple[str, str]]:
    """(origin, text) of every theme shipped in the package."""
    folder = resources.files("gpuconsole") / "themes"
    found = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            found.append((f"gpuconsole/themes/{entry.name}", entry.read_text("utf-8")))
    return found


def load_themes(extra_dirs: Iterable[Path] = ()) -> dict[str, Theme]:
    """Shipped themes, then user themes (which may replace one by name)."""
    themes: dict[str, Theme] = {}
    sources = shipped_theme_files()
    for folder in extra_dirs:
        if folder.is_dir():
            for path in sorted(folder.glob("*.toml")):
                sources.append((str(path), path.read_text("utf-8")))
    for origin, text in sources:
        try:
            theme = theme_from_toml(text, origin)
        except ThemeError as exc:
            log.warning("skipping theme: %s", exc)
            continue
        themes[theme.name] = theme
    return themes


def find_theme(requested: str, known: Iterable[str]) -> str | None:
    """The theme `requested` names: itself, or a shipped one without its prefix ("dark")."""
    names = set(known)
    return next((c for c in (requested, f"gpuconsole-{requested}") if c in names), None)


def resolve_theme_name(requested: str | None, known: Sequence[str]) -> str:
    """The theme to start with: the requested one (also without its prefix) or the default."""
    if requested:
        found = find_theme(requested, known)
        if found is not None:
            return found
        log.warning("unknown theme %r; using %s", requested, DEFAULT_THEME)
    return DEFAULT_THEME if DEFAULT_THEME in known else known[0]


@dataclass(frozen=True)
class Palette:
    """Rich styles from the current theme's variables, for widgets that paint cells."""

    scale: tuple[Style, ...]
    instances: tuple[Style, ...]
    health: dict[Health, Style]
    simulated: Style
    dim: Style
    passthrough: Style  # a cell for a GPU a guest holds through vfio-pci
    ink: tuple[Style, ...] = ()  # the scale as text colours (heat_fg); empty: the scale's own

    @classmethod
    def from_variables(cls, variables: dict[str, str]) -> Palette:
        def color(name: str) -> RichColor:
            return Color.parse(variables[name]).rich_color

        steps = int(variables.get("scale-steps", "0"))
        text, cool = color("scale-text"), color("scale-text-cool")
        half = steps // 3
        scale = tuple(
            Style(bgcolor=color(f"scale-{i}"), color=cool if i < half else text)
            for i in range(steps)
        )
        health = {h: Style(color=color(f"health-{h.value}"), bold=h is Health.CRITICAL)
                  for h in Health}  # fmt: skip
        simulated = Style(color=text, bgcolor=color("simulated"), bold=True)
        instances = tuple(
            Style(color=color(f"instance-{i}"))
            for i in range(len(variables))
            if f"instance-{i}" in variables
        )
        dim = Style(color=color("health-unknown"))
        mark = color("passthrough" if "passthrough" in variables else "simulated")
        passthrough = Style(color=text, bgcolor=mark)
        ink = tuple(
            Style(color=color(f"scale-fg-{i}"))
            for i in range(steps)
            if f"scale-fg-{i}" in variables
        )
        return cls(scale, instances, health, simulated, dim, passthrough, ink)

    @property
    def passthrough_fg(self) -> Style:
        """The passthrough colour as a foreground, for a mark in running text."""
        return Style(color=self.passthrough.bgcolor)

    def heat(self, fraction: float | None) -> Style:
        """The scale step for a value between 0 (cool) and 1 (hot); None is dim."""
        if fraction is None:
            return self.dim
        step = int(max(0.0, min(1.0, fraction)) * (len(self.scale) - 1) + 0.5)
        return self.scale[step]

    def heat_fg(self, fraction: float | None) -> Style:
        """Like `heat`, as a foreground colour (for sparklines and bars)."""
        if fraction is not None and len(self.ink) == len(self.scale):
            return self.ink[int(max(0.0, min(1.0, fraction)) * (len(self.ink) - 1) + 0.5)]
        style = self.heat(fraction)
        return Style(color=style.bgcolor) if style.bgcolor is not None else style
