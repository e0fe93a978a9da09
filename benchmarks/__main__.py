"""Run every benchmark in turn and print its figures."""

from __future__ import annotations

import importlib
import platform
import sys

BENCHES = ["benchmarks.bench_nvml", "benchmarks.bench_console"]


def main() -> int:
    print(
        f"gpuconsole benchmarks on {platform.node()} ({platform.machine()}, "
        f"Python {platform.python_version()})\n"
    )
    for name in BENCHES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            print(f"{name}: not available ({exc})\n")
            continue
        module.main()
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
