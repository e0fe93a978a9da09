"""Config becomes objects here, and only here: the hubs a process runs (this machine's own
sources, a head's fleet of agents, or the simulated cluster), the settings of the agent and
the ssh server, the secrets their files hold, and the executors that act on GPUs, for every
mode (console, agent, ssh server, wallboard, actions).

A console's executors (`console_executor`, `remote_executor`, `live_demo_executor`) are those
of `gpuconsole assign`, with its hub's `post_event` as `emit`, so that every step and outcome
lands in its Events view.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgspec

from gpuconsole import paths
from gpuconsole.config import (
    DEFAULTS,
    SSH_PORT,
    Config,
    ConfigError,
    FleetConfig,
    parse_listen,
    read_secret,
)
from gpuconsole.hub import Hub, HubSettings

if TYPE_CHECKING:
    from gpuconsole.actions.audit import AuditLog
    from gpuconsole.actions.executor import Executor, Outcome, Reader, StepUpdate
    from gpuconsole.actions.over_ssh import RemoteExecutor, SshTarget
    from gpuconsole.actions.placement import Placement
    from gpuconsole.actions.plan import PlanContext, Target
    from gpuconsole.actions.rebooted import CutOffWatch
    from gpuconsole.actions.store import ActionStore
    from gpuconsole.alerts.engine import AlertEngine
    from gpuconsole.alerts.rules import Rule
    from gpuconsole.readings.snapshot import NodeSnapshot
    from gpuconsole.sources.base import EmitEvent
    from gpuconsole.sources.bmc import BmcSource
    from gpuconsole.sources.nvml.source import NvmlSource
    from gpuconsole.sources.targets import FleetMember
    from gpuconsole.sources.tenancy import TenancySource

log = logging.getLogger(__name__)


# --- hubs and their sources ----------------------------------------------------------------


def hub_settings(cfg: Config) -> HubSettings:
    """The data loop's knobs that [hub] sets."""
    return HubSettings(
        history_points=cfg.hub.history_points,
        event_log_size=cfg.hub.event_log_size,
        max_backoff_s=cfg.hub.max_backoff_s,
    )


def node_hub(cfg: Config, *, one_shot: bool = False, journal: Path | None = None) -> Hub:
    """The hub for this machine's own sources, as the config says; `one_shot` for a single
    reading (no actions of other processes to watch for: the journal read once, if any).
    `journal`: the one the node's plans write, where not the one [actions] names."""
    hub = Hub(hub_settings(cfg))
    node = cfg.host.node_name
    hub.add_node(node)
    if cfg.nvml.enabled:
        hub.add_source(nvml_source(cfg, one_shot=one_shot))
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
    if journal is None:
        journal = cfg.actions.journal_path
    # Plans other processes run (a shell, an ssh session from a head) as hub events, and
    # how each GPU's last repair went, which its verdict escalates from. A single reading
    # opens the journal only where one exists: a node that never acted pays one stat.
    if not one_shot or journal.exists():
        from gpuconsole.actions.journal_events import JournalEvents

        hub.add_source(JournalEvents(node, journal, proc_root=cfg.host.proc_root))
    return hub


def guest_hub(cfg: Config) -> Hub:
    """A guest agent's hub: NVML alone (a guest has no BMC, fabric or tenants to tell its
    host of), and no journal: nothing acts inside the guest."""
    hub = Hub(hub_settings(cfg))
    hub.add_node(cfg.host.node_name)
    hub.add_source(nvml_source(cfg))
    return hub


def nvml_source(cfg: Config, *, one_shot: bool = False) -> NvmlSource:
    """This machine's NVML source, as [nvml] says."""
    from gpuconsole.sources.nvml.source import NvmlSource

    return NvmlSource(
        cfg.host.node_name,
        lib=nvml_library(cfg),
        interval_s=cfg.nvml.interval_s,
        timeout_s=cfg.nvml.timeout_s,
        detail_every=cfg.nvml.detail_every,
        inventory_every=cfg.nvml.inventory_every,
        events=cfg.nvml.events,
        one_shot=one_shot,
        proc_root=cfg.host.proc_root,
        sysfs_root=cfg.host.sysfs_root,
        # its GPUs' XIDs outlive a restart of this process, not a reboot of the node
        state_dir=None if one_shot else paths.state_dir(),
    )


def nvml_library(cfg: Config) -> Any:
    """pynvml on [nvml] library (None: on the system's); ConfigError when that library
    cannot be loaded."""
    if not cfg.nvml.library:
        return None
    from gpuconsole.sources.base import SourceUnavailable
    from gpuconsole.sources.nvml.lib import load_pynvml

    try:
        return load_pynvml(cfg.nvml.library)
    except SourceUnavailable as exc:
        raise ConfigError(f"[nvml] library: {exc}") from None


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
        kubelet_checkpoint=t.kubelet_checkpoint,
        guest_agents=t.guest_agents,
        guest_port=t.guest_port,
        processes=t.processes,
        rules=TenantRules.from_tables(
            namespaces=t.namespaces, domains=t.domains, accounts=t.accounts, users=t.users
        ),
        interval_s=t.interval_s,
        timeout_s=t.timeout_s,
    )


def bmc_sources(cfg: Config) -> list[BmcSource]:
    """A BMC source per [[bmc]] entry, all sharing one bound on concurrent polls."""
    if not cfg.bmc:  # the BMC clients cost a one-shot reading a fifth of its CPU to import
        return []
    from gpuconsole.sources.bmc import BmcError, BmcPool, BmcTarget, source_for

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
            system=entry.system,
        )
        try:
            password = entry.password
            if entry.password_file:
                file = Path(entry.password_file).expanduser()
                text = read_secret(file, f"{target.label}: password_file")
                password = text.splitlines()[0] if text else ""
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
    """The hub over the simulated cluster, with the config's intervals and switches: every
    node simulated in full up to the demo cluster's size; past it, the fleet as a head
    meets one, through its agents' summaries ([fleet] interval_s, timeout_s), with only
    the node a console opens simulated in full."""
    from gpuconsole.sim.cluster import DEMO_CLUSTER, demo_cluster, demo_hub

    count = nodes if nodes is not None else (cfg.demo.nodes or None)
    if count is not None and count > len(DEMO_CLUSTER):
        from gpuconsole.sim.fleet import fleet_hub as sim_fleet_hub

        return sim_fleet_hub(
            demo_cluster(count),
            seed=cfg.demo.seed if seed is None else seed,
            interval_s=cfg.fleet.interval_s,
            timeout_s=cfg.fleet.timeout_s,
            settings=hub_settings(cfg),
        )
    return demo_hub(
        count,
        seed=cfg.demo.seed if seed is None else seed,
        interval_s=cfg.nvml.interval_s,
        events=events,
        settings=hub_settings(cfg),
        fabric=cfg.fabric.enabled,
        tenancy=cfg.tenancy.enabled,
        fabric_interval_s=cfg.fabric.interval_s,
        tenancy_interval_s=cfg.tenancy.interval_s,
    )


def demo_bmc_source(cfg: Config, node: str) -> BmcSource | None:
    """The BMC of a node of the simulated cluster; None when the simulator has no such node.
    A node `remediate --demo` and `assign --demo` act on is powered in their world: what
    its BMC does (a power cycle, a new boot) the next of them finds."""
    from gpuconsole.sim.actions import SimWorld
    from gpuconsole.sim.bmc import sim_link
    from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster
    from gpuconsole.sources.bmc import BmcSource

    if node in {s.name for s in demo_cluster()}:
        world = SimWorld.demo(node, demo_root(node))
        return BmcSource(node, sim_link(world.node), simulated=True)
    sims = {n.name: n for n in build_sim_nodes(demo_cluster(cfg.demo.nodes or None))}
    if node not in sims:
        return None
    return BmcSource(node, sim_link(sims[node]), simulated=True)


def members(cfg: FleetConfig) -> list[FleetMember]:
    """Every member the config names, in order: one per node name and one per agent URL."""
    if not cfg.agents and not cfg.targets_file:
        return []  # a node reading its own GPUs (a one-shot snapshot) parses no targets
    from gpuconsole.sources.targets import Found, distinct, parse_agent, read_targets

    found: list[Found] = []
    for i, entry in enumerate(cfg.agents):
        try:
            found.append(Found(parse_agent(entry), "=" in entry))
        except ValueError as exc:
            raise ConfigError(f"[fleet] agents[{i}]: {exc}") from None
    if cfg.targets_file:
        found.extend(read_targets(Path(cfg.targets_file).expanduser()))
    return distinct(found)


# How long a head waits, at its start, for agents to name the nodes it was given by URL only.
NAMING_TIMEOUT_S = 1.0


def named_members(cfg: FleetConfig) -> list[FleetMember]:
    """The members, each one given by URL only named as its agent names its node(s)."""
    listed = members(cfg)
    if all(m.named for m in listed):
        return listed
    from gpuconsole.sources.agents import named_by_agents

    # Asked once per process, before a hub holds a node by a name, and kept: the hub, and
    # an action on one of its nodes later (from the console's loop, which must not wait on
    # the network), go by the same names. In a thread of its own, since a caller may already
    # run a loop. An agent that does not answer at once keeps its host's name: a head's
    # first frame waits for no slow agent.
    key = repr(listed)
    if key not in _NAMED:
        import asyncio  # here: a node's own one-shot reading runs no loop and no pool
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as aside:
            wait_s = min(cfg.timeout_s, NAMING_TIMEOUT_S)
            _NAMED[key] = aside.submit(asyncio.run, named_by_agents(listed, wait_s)).result()
    return list(_NAMED[key])


_NAMED: dict[str, list[FleetMember]] = {}  # the members as their agents named them, by config

SPARE_FILES = 256  # descriptors kept beside the watches: ssh sessions, ptys, logs, other sources


def watch_slots(agents: int, connections: int) -> int:
    """How many of `agents` a head may read through a watch, each holding a connection
    open besides the client's `connections`: the soft limit on open files is raised toward
    the hard one as far as that needs (many systems start processes at 1,024); where the
    hard limit is short, the rest are polled through the bounded client, and the log says
    so once."""
    import resource  # here: POSIX only, and only a head with agents needs it

    wanted = agents + connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (OSError, ValueError) as exc:
                log.warning("open-file limit not raised to %d: %s", raised, exc)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return agents
    slots = max(0, soft - connections - SPARE_FILES)
    log.warning(
        "this process may open %d files (ulimit -n; hard limit %s): %d of %d agents are "
        "read through a watch, the rest polled; raise the limit (LimitNOFILE= in its unit) "
        "to watch them all",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        slots,
        agents,
    )
    return slots


def fleet_hub(cfg: FleetConfig, settings: HubSettings | None = None) -> Hub:
    """A hub that reads every member through its agent, with one bounded client; with
    [fleet] prometheus, the overview from Prometheus and only the drill-down from agents."""
    # Here, not at the top: the HTTP client (aiohttp) costs a one-shot command a third of
    # its CPU, and a node with no [fleet] never needs it.
    from gpuconsole.sources.agents import AgentClient, AgentSource, quiet_collector
    from gpuconsole.sources.promql import PrometheusReader, PromQLSource

    listed = named_members(cfg)
    quiet_collector()
    hub = Hub(settings)
    client = AgentClient(cfg.max_connections)
    reader = None
    if cfg.prometheus:
        reader = PrometheusReader(
            cfg.prometheus,
            client,
            selector=cfg.prometheus_selector,
            interval_s=cfg.interval_s,
            timeout_s=cfg.timeout_s,
        )
    # without Prometheus each agent's summary comes through a watch, a connection held open
    watched = watch_slots(len(listed), cfg.max_connections) if reader is None else 0
    for i, member in enumerate(listed):
        agent = AgentSource(
            member.node,
            member.url,
            client,
            interval_s=cfg.interval_s,
            timeout_s=cfg.timeout_s,
            watch=i < watched,
        )
        if reader is None:
            hub.add_source(agent)
        else:
            hub.add_source(PromQLSource(member.node, member.address, reader, agent))
    return hub


def console_hub(cfg: Config, *, one_shot: bool = False) -> Hub:
    """A head's hub when [fleet] names agents; this node's own sources otherwise."""
    if members(cfg.fleet):
        return fleet_hub(cfg.fleet, hub_settings(cfg))
    return node_hub(cfg, one_shot=one_shot)


# --- alerts ----------------------------------------------------------------------------


def alert_rules(cfg: Config) -> tuple[Rule, ...]:
    """The rules [alerts] and [[alert]] make; ConfigError names each entry that is wrong."""
    from gpuconsole.alerts.rules import build_rules

    return build_rules(cfg.alert, defaults=cfg.alerts.defaults, path=cfg.path)


def alert_engine(cfg: Config, mode: str, *, demo: bool = False) -> AlertEngine | None:
    """The alert engine of a long-running `mode` (console, wallboard, ssh-server, agent),
    its firing alerts kept in alerts-MODE.json in the state folder; None when [alerts]
    enabled is false. A demo's alerts go to no receiver and are kept in memory only:
    simulated GPUs never page anyone."""
    if not cfg.alerts.enabled:
        return None
    from gpuconsole.alerts.delivery import ALERTMANAGER, WEBHOOK, Receiver
    from gpuconsole.alerts.engine import AlertEngine
    from gpuconsole.alerts.state import StateFile

    a = cfg.alerts
    rules = alert_rules(cfg)
    if demo:
        return AlertEngine(rules, interval_s=a.interval_s, timeout_s=a.timeout_s)
    receivers = [
        Receiver(kind, url, resend_s=a.resend_s, max_backoff_s=a.max_backoff_s)
        for kind, urls in ((ALERTMANAGER, a.alertmanager), (WEBHOOK, a.webhook))
        for url in urls
    ]
    path = Path(a.state_file) if a.state_file else paths.state_dir() / f"alerts-{mode}.json"
    return AlertEngine(
        rules,
        receivers,
        state_file=StateFile(path.expanduser()),
        interval_s=a.interval_s,
        timeout_s=a.timeout_s,
    )


def watch_alerts(cfg: Config, hub: Hub, mode: str, *, demo: bool = False) -> AlertEngine | None:
    """The alert engine of `mode`, attached to `hub`: it starts with the hub's first
    snapshot, and its alerts are in every snapshot after."""
    engine = alert_engine(cfg, mode, demo=demo)
    if engine is not None:
        engine.attach(hub)
    return engine


# --- the servers' settings ---------------------------------------------------------------

_AGENT_HOST, _AGENT_PORT = parse_listen(DEFAULTS.agent.listen)
_SSH_HOST, _SSH_PORT = parse_listen(DEFAULTS.ssh.listen, SSH_PORT)


class AgentSettings(msgspec.Struct, frozen=True):
    """Where and how the agent listens; [agent] in the config declares the defaults."""

    host: str = _AGENT_HOST
    port: int = _AGENT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_password: str | None = None

    def __repr__(self) -> str:
        # the password never reaches a log line or a traceback, as a BMC's does not
        shown = (
            f"{name}=<set>"
            if name == "basic_auth_password" and value is not None
            else f"{name}={value!r}"
            for name, value in zip(
                self.__struct_fields__, msgspec.structs.astuple(self), strict=True
            )
        )
        return f"AgentSettings({', '.join(shown)})"


class SshSettings(msgspec.Struct, frozen=True):
    """How the ssh server listens, whom it lets in, and how it treats sessions; [ssh] in
    the config declares the defaults of those it sets."""

    host: str = _SSH_HOST
    port: int = _SSH_PORT
    host_key: Path = msgspec.field(
        default_factory=lambda: paths.state_dir() / "ssh_host_ed25519_key"
    )
    authorized_keys: Path = msgspec.field(
        default_factory=lambda: paths.config_dir() / "authorized_keys"
    )
    password_file: Path | None = None
    max_sessions: int = DEFAULTS.ssh.max_sessions
    operator_sessions: int = DEFAULTS.ssh.operator_sessions  # of max_sessions, viewers never take
    max_sessions_per_key: int = DEFAULTS.ssh.max_sessions_per_key
    idle_timeout_s: float = DEFAULTS.ssh.idle_timeout_s  # 0: never; the wallboard never times out
    wallboard_user: str = DEFAULTS.ssh.wallboard_user
    output_buffer_bytes: int = DEFAULTS.ssh.output_buffer_bytes
    color_system: str = DEFAULTS.ssh.color_system
    login_timeout_s: float = DEFAULTS.ssh.login_timeout_s
    max_startups: int = DEFAULTS.ssh.max_startups
    max_startups_per_source: int = DEFAULTS.ssh.max_startups_per_source
    keepalive_s: float = 30.0


def ssh_settings(
    cfg: Config, listen: str | None = None, authorized_keys: str | None = None
) -> SshSettings:
    """The ssh server's settings from the config and the command line."""
    s = cfg.ssh
    try:
        host, port = parse_listen(listen or s.listen, SSH_PORT)
    except ValueError as exc:
        raise ConfigError(f"[ssh] listen: {exc}") from None
    keys = authorized_keys or s.authorized_keys
    if s.operator_sessions >= s.max_sessions:
        raise ConfigError(
            f"[ssh] operator_sessions = {s.operator_sessions} leaves viewers no session of "
            f"max_sessions = {s.max_sessions}; lower it (0: none kept) or raise max_sessions"
        )
    unset = SshSettings()  # where an empty key leaves the host key and the authorized keys
    return SshSettings(
        host=host,
        port=port,
        host_key=Path(s.host_key) if s.host_key else unset.host_key,
        authorized_keys=Path(keys) if keys else unset.authorized_keys,
        password_file=Path(s.password_file) if s.password_file else None,
        max_sessions=s.max_sessions,
        operator_sessions=s.operator_sessions,
        max_sessions_per_key=s.max_sessions_per_key,
        login_timeout_s=s.login_timeout_s,
        max_startups=s.max_startups,
        max_startups_per_source=s.max_startups_per_source,
        idle_timeout_s=s.idle_timeout_s,
        wallboard_user=s.wallboard_user,
        output_buffer_bytes=s.output_buffer_bytes,
        color_system=s.color_system,
    )


def agent_settings(cfg: Config, listen: str | None) -> AgentSettings:
    """The agent's listen address, TLS and basic auth from the config and the command line."""
    a = cfg.agent
    try:
        host, port = parse_listen(listen or a.listen)
    except ValueError as exc:
        raise ConfigError(f"[agent] listen: {exc}") from None
    password = None
    if a.basic_auth_user:
        if not a.basic_auth_password_file:
            raise ConfigError("[agent] basic_auth_user needs basic_auth_password_file")
        password = read_secret(Path(a.basic_auth_password_file), "[agent] basic auth").strip()
    if bool(a.tls_cert) != bool(a.tls_key):
        raise ConfigError("[agent] tls_cert and tls_key go together")
    return AgentSettings(
        host=host,
        port=port,
        tls_cert=Path(a.tls_cert) if a.tls_cert else None,
        tls_key=Path(a.tls_key) if a.tls_key else None,
        basic_auth_user=a.basic_auth_user or None,
        basic_auth_password=password,
    )


# --- executors for actions ---------------------------------------------------------------


def demo_root(node: str) -> Path:
    """Where a simulated node's world lives between `assign --demo` runs."""
    return paths.state_dir() / "demo" / node


async def _read_here(cfg: Config, journal: Path) -> NodeSnapshot:
    """This node as a plan starts from it: one poll of its sources, and its action journal
    (how its GPUs' last repairs went is part of their verdict)."""
    hub = node_hub(cfg, one_shot=True, journal=journal)
    fleet = await hub.poll_once()
    found = fleet.node(cfg.host.node_name)
    assert found is not None
    return found


def node_executor(
    cfg: Config,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
    store: ActionStore | None = None,
    dry_run: bool = False,
) -> Executor:
    """The executor for this machine's GPUs, with the drivers the config enables, journaling
    and auditing in the machine's shared store (`dry_run`: it only plans, and its journal is
    an empty one in memory)."""
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
        **_repair_drivers(cfg),
    )

    where = store or action_store(cfg.actions)

    async def read() -> NodeSnapshot:
        return await _read_here(cfg, where.journal_path)

    return Executor(
        node,
        drivers,
        where.journal(dry_run=dry_run, proc_root=cfg.host.proc_root),
        where.audit(),
        reader=read,
        emit=emit,
        on_step=on_step,
    )


def _repair_drivers(cfg: Config) -> dict[str, Any]:
    """The drivers a remediation needs beyond reassigning, where this machine has them:
    nvidia-smi for a GPU reset, scontrol for the Slurm node, its [[bmc]] for a power cycle."""
    import shutil

    from gpuconsole.actions.drivers.repair import BmcPowerDriver, NvidiaSmiDriver, SlurmDriver

    node = cfg.host.node_name
    found: dict[str, Any] = {}
    if shutil.which("nvidia-smi"):
        found["gpu"] = NvidiaSmiDriver()
    if shutil.which("scontrol"):
        found["slurm"] = SlurmDriver(node)
    if any((entry.node or node) == node for entry in cfg.bmc):
        bmc = next(s for s in bmc_sources(cfg) if s.node == node)
        found["bmc"] = BmcPowerDriver(bmc, started=False)
    return found


def watch_cut_off(cfg: Config, hub: Hub) -> CutOffWatch:
    """On this node's agent: end the remediations a reboot of the node cut off as soon as
    its journal reading shows them (gpuconsole.actions.rebooted), in the machine's shared
    store; one the agent cannot write is left to a run on the node, and logged."""
    from gpuconsole.actions.drivers import Drivers
    from gpuconsole.actions.drivers.vfio import VfioDriver
    from gpuconsole.actions.executor import Executor
    from gpuconsole.actions.rebooted import CutOffWatch
    from gpuconsole.actions.store import action_store

    node = cfg.host.node_name

    def make(reader: Reader) -> Executor:
        where = action_store(cfg.actions)
        if not where.shared:  # not the journal the node's plans write
            raise ValueError(where.warning)
        # ending such a plan only reads the node (a guest's GPU: its binding in sysfs)
        pci = VfioDriver(cfg.actions.sysfs_root or cfg.host.sysfs_root, cfg.host.proc_root)
        return Executor(
            node,
            Drivers(pci=pci),
            where.journal(proc_root=cfg.host.proc_root),
            where.audit(),
            reader=reader,
            emit=hub.post_event,
        )

    watch = CutOffWatch(node, make)
    watch.attach(hub)
    return watch


def demo_executor(
    node: str,
    on_step: Callable[[StepUpdate], None] | None = None,
    *,
    emit: EmitEvent | None = None,
    dry_run: bool = False,
) -> Executor:
    """The executor for a node of the simulated demo cluster (its world, journal and audit
    log under the user's own state folder; `dry_run`: the journal in memory, as above)."""
    from gpuconsole.actions.executor import Executor
    from gpuconsole.actions.store import demo_store
    from gpuconsole.sim.actions import SIM_WAITS, SimWorld, sim_drivers

    world = SimWorld.demo(node, demo_root(node))
    reader: Reader = world.snapshot
    store = demo_store()
    world.journal = store.journal_path
    return Executor(
        node,
        sim_drivers(world),
        store.journal(dry_run=dry_run, proc_root=world.tree.proc_root),
        store.audit(),
        reader=reader,
        emit=emit,
        on_step=on_step,
        **SIM_WAITS,
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
            f"(ssh {node} gpuconsole assign ..., or gpuconsole remediate ...)"
        )
    return node_executor(cfg, on_step, emit=emit)


def ssh_target(cfg: Config, node: str) -> SshTarget:
    """Where `node` is reached: [remote] destinations, else its [fleet] entry (the ssh label
    of a targets_file entry, else its agent's host). RemoteError if neither names it."""
    from gpuconsole.actions.over_ssh import RemoteError, SshTarget, parse_destination

    remote = cfg.remote
    text = remote.destinations.get(node)
    if text is None:
        found = next((m for m in members(cfg.fleet) if m.node == node), None)
        if found is None:  # a node its agent named, the head given only the agent's URL
            found = next((m for m in named_members(cfg.fleet) if m.node == node), None)
        if found is None:
            raise RemoteError(
                f"this is {cfg.host.node_name}, and {node} is not in [fleet] (agents or "
                f"targets_file) nor [remote] destinations: add it, or run the command there"
            )
        text = found.ssh or urlsplit(found.url).hostname or node
    try:
        user, host, port = parse_destination(text)
    except ValueError as exc:
        raise ConfigError(f"[remote] / [fleet] {node}: {exc}") from None
    return SshTarget(
        node=node,
        host=host,
        port=port or remote.port or None,
        user=user or remote.user or None,
        identity_files=remote.identity_files,
        known_hosts=remote.known_hosts,
        command=remote.command,
        connect_timeout_s=remote.connect_timeout_s,
        keepalive_s=remote.keepalive_s,
    )


def remote_executor(
    cfg: Config,
    node: str,
    *,
    on_step: Callable[[StepUpdate], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    on_recovered: Callable[[Outcome], None] | None = None,
    emit: EmitEvent | None = None,
) -> RemoteExecutor:
    """The executor for another node of the fleet: that node's own gpuconsole over ssh,
    as this process's ssh identity. The head audits what it asked, the node what it ran.
    RemoteError when the config does not say where `node` is."""
    from gpuconsole.actions.over_ssh import RemoteExecutor
    from gpuconsole.actions.store import action_store

    target = ssh_target(cfg, node)
    audit = action_store(cfg.actions).audit()
    return RemoteExecutor(
        target,
        on_step=on_step,
        on_note=on_note,
        on_recovered=on_recovered,
        emit=emit,
        audit=audit,
    )


def simulates_tenants(hub: Hub) -> bool:
    """Whether `hub` reads the simulator's tenants (a demo hub), which consoles can move."""
    from gpuconsole.sim.tenancy import SimTenancySource

    return any(isinstance(s, SimTenancySource) for s in hub.sources)


def live_demo_executor(
    hub: Hub, node: str, on_step: Callable[[StepUpdate], None] | None = None
) -> Executor:
    """The executor for a node of a running demo hub: it acts on the very simulator the hub
    polls, its events posted to that hub. ValueError when the hub has no such world (yet)."""
    from gpuconsole.sim.actions import live_executor

    return live_executor(hub, node, hub.post_event, on_step)


def live_demo_audit(hub: Hub, node: str) -> AuditLog:
    """The audit log of a simulated node of a running demo hub (beside its journal)."""
    from gpuconsole.actions.audit import AuditLog
    from gpuconsole.actions.store import AUDIT_FILE
    from gpuconsole.sim.actions import live_actions, live_world

    world = live_world(hub, node)
    if world is None:
        raise ValueError(f"{node}: the demo simulates no actions there")
    return AuditLog(live_actions(world.tree) / AUDIT_FILE)


def live_demo_contexts(hub: Hub, nodes: Sequence[str]) -> dict[str, PlanContext]:
    """What the Kubernetes layer of each simulated node of a running demo hub says."""
    from gpuconsole.actions.plan import PlanContext
    from gpuconsole.sim.actions import live_world

    found = {}
    for name in nodes:
        world = live_world(hub, name)
        if world is not None:
            found[name] = PlanContext(kubernetes=True, cordoned=frozenset(world.cordoned))
    return found


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
