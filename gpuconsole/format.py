"""The one place that turns numbers into text: bytes, rates, watts, ages, throttle words."""

from __future__ import annotations

import time

NA = "-"

THROTTLE_WORDS = {
    "gpu_idle": "idle",
    "applications_clocks_setting": "app clocks",
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "sync_boost": "sync boost",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake",
    "display_clock_setting": "display clocks",
}


# Readings NVML answers only to root (GpuReading.denied), as an operator reads them.
DENIED_WORDS = {
    "memory": "whole-GPU memory",
    "processes": "whole-GPU process list",
    "mig_placement": "MIG placement",
    "gpm": "GPM metrics (profiling is admin-only: RmProfilingAdminOnly=1)",
}


def denied_words(denied: tuple[str, ...]) -> str:
    """What NVML would not tell this user, or NA."""
    return ", ".join(DENIED_WORDS.get(d, d) for d in denied) or NA


def throttle_words(reasons: tuple[str, ...], *, include_idle: bool = False) -> str:
    """Throttle reasons as an operator reads them; idle is not a throttle."""
    words = [THROTTLE_WORDS.get(r, r) for r in reasons if include_idle or r != "gpu_idle"]
    return ", ".join(words) if words else NA


def gib(n: float | None, digits: int = 1) -> str:
    if n is None:
        return NA
    return f"{n / 1024**3:.{digits}f} GiB"


def bytes_(n: float | None) -> str:
    """Bytes with a binary unit: 512 B, 3.2 KiB, 80.0 GiB."""
    if n is None:
        return NA
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def rate(bytes_per_s: float | None) -> str:
    """A data rate in decimal units, as links are quoted: 12.5 GB/s."""
    if bytes_per_s is None:
        return NA
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"):
        if abs(value) < 1000 or unit == "TB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def watts(value: float | None) -> str:
    return NA if value is None else f"{value:.0f} W"


def celsius(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}°C"


def mhz(value: int | None) -> str:
    return NA if value is None else f"{value} MHz"


def age(since: float | None, now: float | None = None) -> str:
    """How long ago: '4 s', '12 min', '3 h', '2 d'."""
    if since is None:
        return NA
    seconds = max(0.0, (time.time() if now is None else now) - since)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def clock_time(at: float | None) -> str:
    """Local wall-clock time of day, HH:MM:SS."""
    return NA if at is None else time.strftime("%H:%M:%S", time.localtime(at))


def date_time(at: float | None) -> str:
    """Local date and time, YYYY-MM-DD HH:MM:SS: an instant that may be days away."""
    return NA if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def count(n: int | None) -> str:
    return NA if n is None else f"{n:,}"


# --- for the console's narrow cells: sparklines, value/limit pairs, short times --------

SPARK_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(
    values: tuple[float, ...] | list[float], width: int, lo: float = 0.0, hi: float | None = None
) -> str:
    """The last `width` values as block characters, padded on the left with spaces."""
    tail = list(values)[-width:] if width > 0 else []
    if not tail:
        return " " * max(0, width)
    top = max(tail) if hi is None else hi
    span = top - lo
    chars = []
    for v in tail:
        level = 0.0 if span <= 0 else (v - lo) / span
        chars.append(SPARK_BLOCKS[int(max(0.0, min(1.0, level)) * (len(SPARK_BLOCKS) - 1))])
    return " " * (width - len(chars)) + "".join(chars)


def pcie_link(gen: int | None, width: int | None) -> str:
    """A PCIe link as lspci says it: 'Gen5 x16'."""
    if gen is None and width is None:
        return NA
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def watts_of(value: float | None, limit: float | None) -> str:
    """Power against its limit: '585/700 W'."""
    if value is None:
        return NA
    if limit is None:
        return watts(value)
    return f"{value:.0f}/{limit:.0f} W"


def mem_of(used: float | None, total: float | None) -> str:
    """Memory used of total, in GiB without repeating the unit: '32.1/80.0 GiB'."""
    if used is None or total is None:
        return gib(used)
    return f"{used / 1024**3:.1f}/{total / 1024**3:.1f} GiB"


def gbytes_per_s(value: float | None) -> str:
    """A bandwidth quoted in decimal GB/s or TB/s, as vendors quote HBM: '3.35 TB/s'."""
    if value is None:
        return NA
    if value >= 1e12:
        return f"{value / 1e12:.2f} TB/s"
    return f"{value / 1e9:.0f} GB/s"


def number(value: float | int | None, digits: int = 0) -> str:
    """A plain number, or '-' when absent."""
    if value is None:
        return NA
    return f"{value:.{digits}f}" if isinstance(value, float) else f"{value}"


def kilowatts(value: float | None) -> str:
    """A node's or rack's power: '4.7 kW'."""
    return NA if value is None else f"{value / 1000:.1f} kW"
