"""Config becomes objects here: the hubs a process runs (this machine's own sources, or the
simulated cluster) and the executors that act on GPUs, for every mode (console, agent, ssh
server, wallboard, actions).

A console builds the same executors as `gpuconsole assign` (`node_executor`, `demo_executor`)
with its hub's `post_event` as `emit`, so that every step and outcome lands in its Events view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuconsole import paths
from gpuconsole.config import Config, ConfigError
from gpuconsole.hub import Hub, HubSettings

if TYPE_CHECKING:
    from gpuconsole.actions.executor import Executor, StepUpdate
    from gpuconsole.actions.placement import Placement
    from gpuconsole.actions.plan import Target
    from gpuconsole.actions.store import ActionStore
    from gpuconsole.readings.snapshot import NodeSnapshot
    from gpuconsole.sources.base import EmitEvent
    from gpuconsole.sources.bmc import BmcSource
    from gpuconsole.sources.tenancy import TenancySource


def hub_settings(cfg: Config) -> HubSettings:
    return HubSettings(
        history_points=cfg.hub.history_points,
        event_log_size=cfg.hub.event_log_size,
        max_backoff_s=cfg.hub.max_backoff_s,
    )


def node_hub(cfg: Config, *, one_shot: bool = False) -> Hub:
    """The hub for this machine's own sources, as the config says; `one_shot` for a single
    reading (nothing to watch for: no actions of other processes)."""
    from gpuconsole.sources.nvml import NvmlSource, load_pynvml

    hub = Hub(hub_settings(cfg))
    node = cfg.host.node_name
    hub.add_node(node)
    if cfg.nvml.enabled:
        hub.add_source(
            NvmlSource(
                node,
                lib=load_pynvml(cfg.nvml.library) if cfg.nvml.library else None,
                interval_s=cfg.nvml.interval_s,
                timeout_s=cfg.nvml.timeout_s,
                detail_every=cfg.nvml.detail_every,
                inventory_every=cfg.nvml.inventory_every,
                events=cfg.nvml.events,
            )
        )
    if cfg.fabric.enabled:
        from gpuconsole.sources.fabric import FabricSource

        hub.add_source(
            FabricSource(
                node,
                sysfs_root=cfg.host.sysfs_root,
                interval_s=cfg.fabric.interval_s,
                timeout_s=cfg.fabric.timeout_s,
                roles=cfg.fabric.roles,
                netlink=cfg.fabric.netlink,
                netns=cfg.fabric.netns or None,
            )
        )
    for source in bmc_sources(cfg):
        hub.add_source(source)
    if cfg.tenancy.enabled:
        hub.add_source(tenancy_source(cfg))
    if not one_shot:
        # Plans other processes run (a shell, an ssh session from a head) as hub events.
        from gpuconsole.actions.journal_events import JournalEvents
        from gpuconsole.actions.store import journal_path

        hub.add_source(JournalEvents(node, journal_path(cfg.actions)))
    return hub


def tenancy_source(cfg: Config) -> TenancySource:
    """The tenancy source for this machine, with the config's tenant rules."""
    from gpuconsole.sources.tenancy import TenancySource, TenantRules

    t = cfg.tenancy
    return TenancySource(
        cfg.host.node_name,
        sysfs_root=cfg.host.sysfs_root,
        proc_root=cfg.host.proc_root,
        libvirt_uri=t.libvirt_uri,
        kubelet_socket=t.kubelet_socket,
        processes=t.processes,
        rules=TenantRules.from_tables(
            namespaces=t.namespaces, domains=t.domains, accounts=t.accounts, users=t.users
        ),
        interval_s=t.interval_s,
        timeout_s=t.timeout_s,
    )


def bmc_sources(cfg: Config) -> list[BmcSource]:
    """A BMC source per [[bmc]] entry, all sharing one bound on concurrent polls."""
    from gpuconsole.sources.bmc import BmcError, BmcPool, BmcTarget, source_for
    from gpuconsole.sources.bmc.source import read_password

    pool = BmcPool()
    sources = []
    for entry in cfg.bmc:
        target = BmcTarget(
            node=entry.node or cfg.host.node_name,
            host=entry.host,
            protocol=entry.protocol,
            port=entry.port,
            username=entry.username,
            verify_tls=entry.verify_tls,
            ca_file=entry.ca_file,
            timeout_s=entry.timeout_s,
        )
        try:
            password = entry.password
            if entry.password_file:
                password = read_password(entry.password_file, target.label)
            target = dataclasses.replace(target, password=password)
            sources.append(
                source_for(
                    target, interval_s=entry.interval_s, pool=pool, state_dir=paths.state_dir()
                )
            )
        except BmcError as exc:
            raise ConfigError(str(exc)) from None
    return sources


def sim_hub(cfg: Config, nodes: int | None, seed: int | None, *, events: bool = True) -> Hub:
    """The hub over the simulated cluster, with the config's intervals and switches."""
    from gpuconsole.sim.cluster import demo_hub

    return demo_hub(
        nodes if nodes is not None else (cfg.demo.nodes or None),
        seed=cfg.demo.seed if seed is None else seed,
        interval_s=cfg.nvml.interval_s,
        events=events,
        settings=hub_settings(cfg),
        fabric=cfg.fabric.enabled,
        tenancy=cfg.tenancy.enabled,
        fabric_interval_s=cfg.fabric.interval_s,
        tenancy_interval_s=cfg.tenancy.interval_s,
    )


# --- executors for actions ---------------------------------------------------------------


def demo_root(node: str) -> Path:
    """Where a simulated node's world lives between `assign --demo` runs."""
    return paths.state_dir() / "demo" / node


async def _read_here(cfg: Config) -> NodeSnapshot:
    fleet = await node_hub(cfg, one_shot=True).poll_once()
    found = fleet.node(cfg.host.node_name)
    assert found is not None
    return found


def node_executor(
    cfg: Config,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
    store: ActionStore | None = None,
) -> Executor:
    """The executor for this machine's GPUs, with the drivers the config enables, journaling
    and auditing in the machine's shared store."""
    from gpuconsole.actions.drivers import Drivers
    from gpuconsole.actions.drivers.vfio import VfioDriver
    from gpuconsole.actions.executor import Executor
    from gpuconsole.actions.store import action_store

    node = cfg.host.node_name
    guests = None
    if cfg.tenancy.libvirt_uri:
        from gpuconsole.actions.drivers.libvirt import LibvirtDriver

        guests = LibvirtDriver(cfg.tenancy.libvirt_uri)
    kube = None
    if cfg.actions.kubernetes:
        from gpuconsole.actions.drivers.kubernetes import KubernetesDriver, api_client

        kube = KubernetesDriver(
            cfg.actions.kubernetes_node or node,
            api_client(cfg.actions.kubeconfig),
            evict_timeout_s=cfg.actions.evict_timeout_s,
        )
    drivers = Drivers(
        pci=VfioDriver(cfg.actions.sysfs_root or cfg.host.sysfs_root, cfg.host.proc_root),
        guests=guests,
        kubernetes=kube,
    )

    async def read() -> NodeSnapshot:
        return await _read_here(cfg)

    where = store or action_store(cfg.actions)
    return Executor(
        node,
        drivers,
        where.journal(),
        where.audit(),
        reader=read,
        emit=emit,
        on_step=on_step,
    )


def demo_executor(
    node: str,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
) -> Executor:
    """The executor for a node of the simulated demo cluster (its world, journal and audit
    log under the user's own state folder)."""
    from gpuconsole.actions.executor import Executor, Reader
    from gpuconsole.actions.store import demo_store
    from gpuconsole.sim.actions import SimWorld, sim_drivers

    world = SimWorld.demo(node, demo_root(node))
    reader: Reader = world.snapshot
    store = demo_store()
    return Executor(
        node,
        sim_drivers(world),
        store.journal(),
        store.audit(),
        reader=reader,
        emit=emit,
        on_step=on_step,
    )


def console_executor(
    cfg: Config,
    node: str,
    emit: EmitEvent,
    *,
    demo: bool = False,
    on_step: Callable[[StepUpdate], None] | None = None,
) -> Executor:
    """The executor a console (local, or one ssh session) runs a node's plans with, its
    events posted to the console's hub (`emit`: the hub's thread-safe `post_event`).

    Only this machine's GPUs, or with `demo` a simulated node's; a GPU of another node is
    moved on that node (ssh NODE gpuconsole assign ...), which its agent's hub reports.
    """
    if demo:
        return demo_executor(node, on_step, emit=emit)
    if node != cfg.host.node_name:
        raise ValueError(
            f"{node} is not this machine ({cfg.host.node_name}): run the plan there "
            f"(ssh {node} gpuconsole assign ...)"
        )
    return node_executor(cfg, on_step, emit=emit)


async def propose_with(
    executor: Executor, count: int, model: str | None = None, target: Target | None = None
) -> Placement:
    """Placement help on the executor's node, from a fresh reading (this machine's includes
    the fabric, for the NIC rails) and the executor's cordons."""
    from gpuconsole.actions.placement import placements

    if executor.reader is None:
        raise RuntimeError("this executor has no reader to propose from")
    node = await executor.reader()
    return placements([node], count, model, target, {node.node: await executor.context()})


async def propose_demo(
    count: int,
    model: str | None = None,
    target: Target | None = None,
    nodes: Sequence[str] | None = None,
) -> Placement:
    """Placement help over the simulated demo cluster's worlds (or the nodes named)."""
    from gpuconsole.actions.placement import placements
    from gpuconsole.actions.plan import PlanContext
    from gpuconsole.sim.actions import SimWorld
    from gpuconsole.sim.cluster import demo_cluster

    names = list(nodes) if nodes else [s.name for s in demo_cluster()]
    snapshots, contexts = [], {}
    for name in names:
        world = SimWorld.demo(name, demo_root(name))
        snapshots.append(await world.snapshot(fabric=True))
        contexts[name] = PlanContext(kubernetes=True, cordoned=frozenset(world.cordoned))
    return placements(snapshots, count, model, target, contexts)
