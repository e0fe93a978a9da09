"""The PCI layer through sysfs (under a configurable root): driver_override, unbind,
drivers_probe, reset, and the checks around them (idle, bound as planned, UUID visible).

The writes are the kernel's documented ones (Documentation/ABI/testing/sysfs-bus-pci):
`echo vfio-pci > devices/BDF/driver_override`, `echo BDF > drivers/DRV/unbind`,
`echo BDF > drivers_probe`, `echo 1 > devices/BDF/reset`. A tree that is not sysfs (tests,
the simulator) passes `kernel`, which plays the kernel's part after each write.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.plan import Step, StepKind
from gpuconsole.sources.pci import read_attribute
from gpuconsole.sources.tenancy import procfs
from gpuconsole.sources.tenancy.pci_binding import driver_of, nvidia_info

__all__ = ["Kernel", "VfioDriver"]

# Called after each write with (path, text): a fake tree's stand-in for the kernel.
Kernel = Callable[[str, str], None]


class VfioDriver:
    """Binds PCI functions to drivers through sysfs at `sysfs_root`."""

    def __init__(
        self,
        sysfs_root: str = "/sys",
        proc_root: str = "/proc",
        *,
        kernel: Kernel | None = None,
        settle_s: float = 10.0,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.kernel = kernel
        self.settle_s = settle_s

    # --- paths and writes ----------------------------------------------------------

    def _device(self, bdf: str, name: str = "") -> str:
        return os.path.join(self.sysfs_root, "bus", "pci", "devices", bdf, name)

    def _write(self, path: str, text: str) -> None:
        if not (text.isascii() and text.strip().isprintable()):
            raise StepFailed(f"writing {text.strip()!r} to {path}: sysfs takes a line of ASCII")
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(text)
        except OSError as exc:
            raise StepFailed(f"writing {text.strip()!r} to {path} failed: {exc.strerror}") from None
        if self.kernel is not None:
            self.kernel(path, text)

    def override_of(self, bdf: str) -> str | None:
        """driver_override as the kernel shows it; "" when cleared, None where it cannot be
        read or names no driver (not a line of ASCII): clearing it then writes "" over it."""
        text = read_attribute(self._device(bdf, "driver_override"))
        return "" if text == "(null)" else text

    def driver(self, bdf: str) -> str | None:
        return driver_of(self.sysfs_root, bdf)

    def set_override(self, bdf: str, driver: str) -> None:
        """Write driver_override ("" clears it; "none" blocks binding)."""
        if self.override_of(bdf) != driver:
            self._write(self._device(bdf, "driver_override"), (driver or "") + "\n")

    def unbind(self, bdf: str) -> str | None:
        """Unbind from whatever driver holds it; returns that driver."""
        current = self.driver(bdf)
        if current is not None:
            path = os.path.join(self.sysfs_root, "bus", "pci", "drivers", current, "unbind")
            self._write(path, bdf)
        return current

    def probe(self, bdf: str) -> None:
        self._write(os.path.join(self.sysfs_root, "bus", "pci", "drivers_probe"), bdf)

    def _settle(self, bdf: str, driver: str | None) -> bool:
        deadline = time.monotonic() + self.settle_s
        while True:
            if self.driver(bdf) == driver:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    # --- steps -----------------------------------------------------------------------

    async def run(self, step: Step) -> str:
        return await asyncio.to_thread(self._run, step)

    async def undo(self, step: Step) -> str:
        if step.kind in (StepKind.OVERRIDE, StepKind.UNBIND, StepKind.PROBE, StepKind.RESET):
            return await asyncio.to_thread(self._restore, step)
        return "nothing to undo"

    def _run(self, step: Step) -> str:
        if step.kind is StepKind.CHECK_IDLE:
            return self.check_idle(step)
        if step.kind is StepKind.OVERRIDE:
            value = step.driver or "none"
            for bdf in step.functions:
                self.set_override(bdf, value)
            return f"driver_override={value} on {', '.join(step.functions)}"
        if step.kind is StepKind.UNBIND:
            done = []
            for bdf in step.functions:
                was = self.unbind(bdf)
                if was is not None:
                    done.append(f"{bdf} from {was}")
                    if not self._settle(bdf, None):
                        raise StepFailed(
                            f"{bdf} is still bound to {self.driver(bdf)}: a process may hold "
                            "it (check lsof /dev/nvidia*, nvidia-persistenced), then retry"
                        )
            return "unbound " + (", ".join(done) if done else "nothing (already unbound)")
        if step.kind is StepKind.PROBE:
            for bdf in step.functions:
                if self.driver(bdf) != step.driver:
                    self.probe(bdf)
            stuck = [b for b in step.functions if not self._settle(b, step.driver)]
            if stuck:
                raise StepFailed(
                    f"{', '.join(stuck)} did not bind {step.driver}: is the module loaded "
                    f"(modprobe {step.driver})? dmesg says why"
                )
            return f"bound {', '.join(step.functions)} to {step.driver}"
        if step.kind in (StepKind.RESET, StepKind.GPU_RESET):  # the latter: a guest's GPU
            return self.reset(step.gpus or step.functions)
        if step.kind is StepKind.VERIFY:
            return self.verify(step)
        raise StepFailed(f"the PCI driver does not do {step.kind.value}")

    def check_idle(self, step: Step) -> str:
        """No process has /dev/nvidiaN of the GPU open: N as the plan read it, else as the
        nvidia driver says now for the GPU's bus id (never NVML's index)."""
        minors = set(step.minors)
        if not minors:
            minors = {
                m for bdf in step.gpus if (m := nvidia_info(self.proc_root, bdf)[2]) is not None
            }
        if not minors and step.gpus:
            raise StepFailed(
                f"cannot tell which /dev/nvidiaN is {', '.join(step.gpus)}: the nvidia driver "
                "names no minor for it. Check that nothing holds it (lsof /dev/nvidia*), "
                "then ask again"
            )
        wanted = {f"/dev/nvidia{m}" for m in minors}
        holders: list[str] = []
        for pid in procfs.pids(self.proc_root):
            fd_dir = os.path.join(self.proc_root, str(pid), "fd")
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue
            for name in names:
                try:
                    target = os.readlink(os.path.join(fd_dir, name))
                except OSError:
                    continue
                if target in wanted:
                    comm = procfs.comm(self.proc_root, pid) or "?"
                    holders.append(f"{pid} ({comm})")
                    break
        if holders:
            raise StepFailed(
                f"{', '.join(sorted(wanted))} is held by {', '.join(holders)}: "
                "stop those processes, then ask again"
            )
        return f"idle: no process holds {', '.join(sorted(wanted)) or 'the GPU'}"

    def reset(self, functions: tuple[str, ...]) -> str:
        done, skipped = [], []
        for bdf in functions:
            path = self._device(bdf, "reset")
            if os.path.exists(path) or self.kernel is not None:
                self._write(path, "1\n")
                done.append(bdf)
            else:
                skipped.append(bdf)
        text = f"reset {', '.join(done)}" if done else "no reset"
        return text + (f"; no reset method for {', '.join(skipped)}" if skipped else "")

    def verify(self, step: Step) -> str:
        problems = []
        for k, bdf in enumerate(step.gpus):
            bound = self.driver(bdf)
            if bound != step.driver:
                problems.append(f"{bdf} is bound to {bound or 'nothing'}, not {step.driver}")
                continue
            if step.driver == "nvidia" and k < len(step.uuids) and step.uuids[k]:
                uuid, _model, _minor = nvidia_info(self.proc_root, bdf)
                if uuid != step.uuids[k]:
                    problems.append(f"{bdf}: UUID {step.uuids[k]} not visible to nvidia")
            if step.driver is None and self.override_of(bdf) != "none":
                problems.append(f"{bdf}: driver_override is not none")
        if problems:
            raise StepFailed("; ".join(problems))
        return f"{', '.join(step.gpus)} bound as planned ({step.driver or 'unbound'})"

    def _restore(self, step: Step) -> str:
        """Put each function back on its driver and override from before the plan."""
        for k, bdf in enumerate(step.functions):
            before = step.before_drivers[k] if k < len(step.before_drivers) else ""
            override = step.before_overrides[k] if k < len(step.before_overrides) else ""
            self.set_override(bdf, override)
            current = self.driver(bdf)
            if current == (before or None):
                continue
            if current is not None:
                self.unbind(bdf)
                self._settle(bdf, None)
            if before:
                self.probe(bdf)
                if not self._settle(bdf, before):
                    raise StepFailed(f"{bdf} did not go back to {before}")
        return f"restored {', '.join(step.functions)}"
