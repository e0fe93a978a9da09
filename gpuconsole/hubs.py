"""The hubs a process runs: this machine's own sources, or the simulated cluster.

Built from the config, for every mode (console, agent, ssh server, wallboard, actions).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpuconsole import paths
from gpuconsole.config import Config, ConfigError
from gpuconsole.hub import Hub, HubSettings

if TYPE_CHECKING:
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
