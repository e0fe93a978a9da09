"""Worlds and helpers for the reassign tests: simulated nodes with chosen tenants, executors
over them, a fake Kubernetes API server, a picture of a sysfs tree to compare, a slow PCI
driver and a small disk that fills up."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers, StepDriver
from gpuconsole.actions.executor import Executor, StepUpdate
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Step
from gpuconsole.sim.actions import SimWorld, sim_drivers
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100, NodeProfile
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan, SimPod
from gpuconsole.sources.base import EmitEvent
from tests.peers import require_peer

__all__ = [
    "MOVE_POD_TO_VM",
    "SlowPci",
    "SmallDisk",
    "executor_for",
    "small_disk",
    "tree_picture",
    "world",
]

# An Apollo (no NVSwitch) whose GPU 0 a pod holds, and a shut-off guest with no GPU yet:
# moving GPU 0 to the guest takes every kind of step there is.
MOVE_POD_TO_VM = SimPlan(
    guests=(SimGuest("tenant-b-vm1", (), state=5),),
    pods=(SimPod("team-nlp", "train-0", "trainer", gpus=(0,)),),
    jobs=(SimJob("4711", "physics", 1001, (3,)),),
)
PROFILES: dict[str, NodeProfile] = {"apollo": APOLLO_PCIE, "h100": DGX_H100, "a100": DGX_A100}


def world(root: Path, plan: SimPlan = MOVE_POD_TO_VM, profile: str = "apollo") -> SimWorld:
    """A simulated node under `root` (laid out the first time, reopened after)."""
    return SimWorld("sim-01", PROFILES[profile], root, plan)


def executor_for(
    world_: SimWorld,
    state: Path,
    *,
    drivers: Drivers | None = None,
    updates: list[StepUpdate] | None = None,
    emit: EmitEvent | None = None,
) -> Executor:
    """An executor over the world, journaling and auditing under `state`."""
    world_.journal = state / "actions.db"
    return Executor(
        world_.name,
        drivers or sim_drivers(world_),
        Journal(world_.journal, proc_root=world_.tree.proc_root),
        AuditLog(state / "audit.jsonl"),
        reader=world_.snapshot,
        emit=emit,
        on_step=updates.append if updates is not None else None,
    )


# sysfs attributes that are commands, not state: writing them leaves nothing to read back
COMMANDS = frozenset({"unbind", "bind", "drivers_probe", "reset"})


def tree_picture(root: str) -> dict[str, str]:
    """Every file's content and every link's target under a tree, to compare before/after."""
    picture: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in list(dirs) + [f for f in files if f not in COMMANDS]:
            path = os.path.join(folder, name)
            key = os.path.relpath(path, root)
            if os.path.islink(path):
                picture[key] = "-> " + os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    picture[key] = f.read().decode("utf-8", "replace")
    return picture


def owners(world_: SimWorld, indexes: Sequence[int]) -> list[list[str]]:
    return [world_.owners(i) for i in indexes]


class PassingDriver:
    """A layer's driver that passes each step to the real one (`inner`), as a test's own
    driver does for all it does not change (it overrides `run`)."""

    def __init__(self, inner: StepDriver) -> None:
        self.inner = inner

    async def run(self, step: Step) -> str:
        return await self.inner.run(step)

    async def undo(self, step: Step) -> str:
        return await self.inner.undo(step)

    async def cordoned(self) -> frozenset[str]:
        cordoned = getattr(self.inner, "cordoned")  # noqa: B009 (the Kubernetes layer's)
        return frozenset(await cordoned())


class SlowPci:
    """The simulated PCI driver, slow enough that two requests for one GPU overlap."""

    def __init__(self, inner: StepDriver) -> None:
        self.inner = inner

    async def run(self, step: Step) -> str:
        await asyncio.sleep(0.4)
        return await self.inner.run(step)

    async def undo(self, step: Step) -> str:
        return await self.inner.undo(step)


class SmallDisk:
    """A small tmpfs, filled and freed on demand: while full, every write that needs a new
    page there gets ENOSPC."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self) -> None:
        """Take every free page."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        finally:
            os.close(fd)

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)


@contextlib.contextmanager
def small_disk(path: Path, size: str = "256k") -> Iterator[SmallDisk]:
    """A tmpfs of `size` mounted at `path` (made here) for the block; needs root."""
    path.mkdir(parents=True)
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            timeout=10,
        ).returncode
        == 0
    )
    require_peer("a small tmpfs", mounted, "run as root: mounting a tmpfs needs CAP_SYS_ADMIN")
    try:
        yield SmallDisk(path)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=10).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)
