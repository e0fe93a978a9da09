"""Worlds and helpers for the reassign tests: simulated nodes with chosen tenants, executors
over them, a fake Kubernetes API server, and a picture of a sysfs tree to compare."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers
from gpuconsole.actions.drivers.sim import SimWorld, sim_drivers
from gpuconsole.actions.executor import Executor, StepUpdate
from gpuconsole.actions.journal import Journal
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_A100, DGX_H100, NodeProfile
from gpuconsole.sim.tenancy import SimGuest, SimJob, SimPlan, SimPod
from gpuconsole.sources.base import EmitEvent

__all__ = [
    "MOVE_POD_TO_VM",
    "executor_for",
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
    return Executor(
        world_.name,
        drivers or sim_drivers(world_),
        Journal(state / "actions.db"),
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
