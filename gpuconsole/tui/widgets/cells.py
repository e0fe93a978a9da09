"""Rich renderables for the small things views repeat: heat cells, lights, sparklines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from gpuconsole import format as fmt
from gpuconsole.facts.inventory import GpuRow
from gpuconsole.facts.summaries import Facet, Metric, cell_text, metric_value, row_cell_text
from gpuconsole.readings.base import Health
from gpuconsole.readings.nvml import GpuReading
from gpuconsole.tui.themes import Palette

# A shape per health, so the state reads without colour too.
HEALTH_GLYPH = {
    Health.OK: "●",
    Health.WARNING: "▲",
    Health.CRITICAL: "✖",
    Health.STALE: "◌",
    Health.UNKNOWN: "?",
}


def looks_same(a: Text | str | None, b: Text | str | None) -> bool:
    """Whether two cells draw the same: Rich's Text == leaves out the Text's own style, so a
    sparkline that only changes colour would compare equal."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return type(a) is type(b) and a == b


def heat_cells(gpus: Sequence[GpuReading | GpuRow], metric: Metric, palette: Palette) -> Text:
    """One three-character cell per GPU, its background from the theme's scale; a GPU NVML
    cannot see (a guest's, from `gpu_rows`) gets the passthrough mark instead."""
    text = Text(no_wrap=True, overflow="crop")
    for item in gpus:
        if isinstance(item, GpuRow):
            if item.reading is None:
                style = palette.passthrough if item.passthrough else palette.dim
                text.append(row_cell_text(item, metric), style=style)
                continue
            gpu = item.reading
        else:
            gpu = item
        if gpu.lost:
            text.append(" ✖ ", style=palette.health[Health.CRITICAL] + Style(reverse=True))
            continue
        _, fraction = metric_value(gpu, metric)
        text.append(cell_text(gpu, metric), style=palette.heat(fraction))
    return text


def health_light(health: Health, palette: Palette, *, word: bool = False) -> Text:
    label = HEALTH_GLYPH[health] + (f" {health.value}" if word else "")
    return Text(label, style=palette.health[health])


def facet_lights(facets: Sequence[Facet], palette: Palette) -> Text:
    """'GBFT': each letter in its source's health colour; dim when not configured."""
    text = Text(no_wrap=True)
    for facet in facets:
        if facet.health is None:
            text.append("·", style=palette.dim)
        else:
            text.append(facet.letter, style=palette.health[facet.health])
    return text


def spark(
    values: Sequence[float], width: int, palette: Palette, *, hi: float | None = None
) -> Text:
    """A sparkline coloured by its latest value against `hi`."""
    line = fmt.sparkline(tuple(values), width, hi=hi)
    last = values[-1] if values else None
    top = hi if hi else (max(values) if values else None)
    fraction = None if last is None or not top else last / top
    return Text(line, style=palette.heat_fg(fraction), no_wrap=True)


def bar(fraction: float | None, width: int, palette: Palette) -> Text:
    """A horizontal bar filled to `fraction`, in the scale's colour for that level."""
    if fraction is None:
        return Text("·" * width, style=palette.dim)
    filled = round(max(0.0, min(1.0, fraction)) * width)
    text = Text("█" * filled, style=palette.heat_fg(fraction))
    text.append("·" * (width - filled), style=palette.dim)
    return text
