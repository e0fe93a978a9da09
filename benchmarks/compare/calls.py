"""NVML calls each tool makes, as the fake library counts them.

A one-shot tool's calls come from the file the library writes at exit
(GPUCONSOLE_FAKE_NVML_COUNTS). A long-running tool writes that file only when it stops, so
its counters are read live instead, straight out of its memory (/proc/PID/mem, as py-spy
reads a process), at the start and the end of the measured window: the difference holds
exactly the steady state, without start-up.
"""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from collections.abc import Mapping
from pathlib import Path

from benchmarks.compare.procs import ToolFailed

# Every tool compared reads each GPU's utilization exactly once per refresh (gpuconsole in its
# poll, nvitop in Device.as_snapshot / oneshot, gpustat in new_query): its count is the number
# of refreshes, so the other counts divide by it without any timing in the figure.
REFRESH_MARKER = "nvmlDeviceGetUtilizationRates"
COUNTERS_SYMBOL = "g_calls"


def total(counts: Mapping[str, int]) -> int:
    return sum(counts.values())


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Calls per function between two readings, functions not called left out."""
    out = {name: n - before.get(name, 0) for name, n in after.items()}
    return {name: n for name, n in out.items() if n}


def per_refresh(calls: Mapping[str, int], gpus: int) -> tuple[float, int]:
    """(NVML calls per GPU per refresh, refreshes) in a window's call counts."""
    refreshes = calls.get(REFRESH_MARKER, 0) // gpus
    if refreshes == 0:
        raise ToolFailed(f"no {REFRESH_MARKER} call in the window: cannot count refreshes")
    return total(calls) / gpus / refreshes, refreshes


class LiveCounts:
    """Reads the fake library's call counters out of a running process."""

    def __init__(self, library: Path) -> None:
        self.library = library.resolve()
        lib = ctypes.CDLL(str(self.library))
        lib.fake_nvml_function_count.restype = ctypes.c_int
        lib.fake_nvml_function_name.restype = ctypes.c_char_p
        lib.fake_nvml_function_name.argtypes = [ctypes.c_int]
        self.names: list[str] = [
            lib.fake_nvml_function_name(i).decode() for i in range(lib.fake_nvml_function_count())
        ]
        self.offset = _symbol_offset(self.library, COUNTERS_SYMBOL)

    def _base(self, pid: int) -> int:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5] == str(self.library) and int(parts[2], 16) == 0:
                return int(parts[0].partition("-")[0], 16)
        raise ToolFailed(f"process {pid} has not loaded {self.library}")

    def read(self, pid: int) -> dict[str, int]:
        """Calls per function that process `pid` has made so far."""
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(self._base(pid) + self.offset)
            raw = mem.read(8 * len(self.names))
        values = struct.unpack(f"={len(self.names)}Q", raw)
        return dict(zip(self.names, values, strict=True))


def _symbol_offset(library: Path, symbol: str) -> int:
    nm = shutil.which("nm")
    if nm is None:
        raise ToolFailed("nm (binutils, installed with gcc) is needed to find the call counters")
    out = subprocess.run(
        [nm, "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == symbol:
            return int(parts[0], 16)
    raise ToolFailed(f"{library} has no symbol {symbol}: is it the fake library?")
