"""The drivers a remediation adds: the GPU's reset (nvidia-smi), the Slurm node's drain
(scontrol) and the node's power cycle (its BMC). Each runs the real tool; a missing one is a
StepFailed that says what to run by hand."""

from __future__ import annotations

import asyncio
import shutil
from typing import TYPE_CHECKING, Protocol

from gpuconsole.actions.drivers import StepFailed
from gpuconsole.actions.plan import Step, StepKind
from gpuconsole.readings.base import safe_text
from gpuconsole.sources.base import EmitEvent

if TYPE_CHECKING:  # the BMC's modules load for a power cycle, not for every executor
    from gpuconsole.sources.bmc.link import PowerAction

__all__ = ["BmcControl", "BmcPowerDriver", "NvidiaSmiDriver", "SlurmDriver", "run_tool"]

TOOL_TIMEOUT_S = 120.0


async def run_tool(argv: list[str], timeout_s: float = TOOL_TIMEOUT_S) -> str:
    """Run a command; its output as text, or StepFailed with what it said."""
    if shutil.which(argv[0]) is None:
        raise StepFailed(f"{argv[0]} not found: run `{' '.join(argv)}` on the node yourself")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise StepFailed(f"`{' '.join(argv)}` did not finish within {timeout_s:g} s") from None
    text = safe_text(out.decode("utf-8", "replace")).strip()
    if proc.returncode != 0:
        raise StepFailed(f"`{' '.join(argv)}` failed ({proc.returncode}): {text or 'no output'}")
    return text


class NvidiaSmiDriver:
    """Resets GPUs by bus id: `nvidia-smi -r -i BUS[,BUS...]` (root; the driver refuses
    while any process holds one). The step's GPUs go in one command: before Ampere,
    nvidia-smi resets NVLink-connected GPUs only together, and names those missing."""

    def __init__(self, command: str = "nvidia-smi") -> None:
        self.command = command

    async def run(self, step: Step) -> str:
        if step.kind is not StepKind.GPU_RESET:
            raise StepFailed(f"the GPU driver does not do {step.kind.value}")
        said = await run_tool([self.command, "-r", "-i", ",".join(step.gpus)])
        return said or f"reset {', '.join(step.gpus)}"

    async def undo(self, step: Step) -> str:
        return "a reset cannot be undone"


class SlurmDriver:
    """Drains the Slurm node (no new job starts; running ones end by themselves); undo
    resumes it."""

    def __init__(self, slurm_node: str, command: str = "scontrol") -> None:
        self.slurm_node = slurm_node
        self.command = command

    async def run(self, step: Step) -> str:
        if step.kind is not StepKind.SLURM_DRAIN:
            raise StepFailed(f"the Slurm driver does not do {step.kind.value}")
        reason = f"reason=gpuconsole remediation of {', '.join(step.gpus)}"
        argv = [self.command, "update", f"nodename={self.slurm_node}", "state=drain", reason]
        await run_tool(argv)
        return f"Slurm node {self.slurm_node} draining"

    async def undo(self, step: Step) -> str:
        argv = [self.command, "update", f"nodename={self.slurm_node}", "state=resume"]
        await run_tool(argv)
        return f"Slurm node {self.slurm_node} resumed"


class BmcControl(Protocol):
    """A BMC source (as actions.power's PowerControl, which it is too): started before its
    first request, closed after."""

    @property
    def label(self) -> str: ...

    async def set_power(self, action: PowerAction) -> str: ...

    async def start(self, emit: EmitEvent) -> None: ...

    async def close(self) -> None: ...


class BmcPowerDriver:
    """Power-cycles the node through its BMC (the power action's own path: a BmcSource),
    started for the request where nothing else has started it."""

    def __init__(self, control: BmcControl, *, started: bool = True) -> None:
        self.control = control
        self.started = started

    async def run(self, step: Step) -> str:
        from gpuconsole.sources.bmc.link import BmcError, PowerAction

        if step.kind is not StepKind.POWER_CYCLE:
            raise StepFailed(f"the BMC driver does not do {step.kind.value}")
        try:
            if not self.started:
                await self.control.start(lambda _event: None)
            try:
                answer = await self.control.set_power(PowerAction.CYCLE)
            finally:
                if not self.started:
                    await self.control.close()
        except BmcError as exc:
            raise StepFailed(str(exc)) from None
        return f"power cycle requested through {self.control.label} ({answer})"

    async def undo(self, step: Step) -> str:
        return "a power cycle cannot be undone"
