"""The `gpuconsole` command and its subcommands."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuconsole import config as config_mod
from gpuconsole import format as fmt
from gpuconsole import paths
from gpuconsole.config import Config, ConfigError
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.model import FleetSnapshot, NodeSnapshot, gpu_health
from gpuconsole.sim.profiles import PROFILES

if TYPE_CHECKING:
    from gpuconsole.export.agent import AgentSettings
    from gpuconsole.readings.bmc import BmcReading
    from gpuconsole.sources.bmc import BmcSource
    from gpuconsole.sources.tenancy import TenancySource

log = logging.getLogger("gpuconsole")

NOT_YET = {
    "wallboard": "the read-only wallboard arrives with issue #7 (three ways in)",
    "ssh-server": "the ssh-in console arrives with issue #7 (three ways in)",
}


# --- building the data loop ---------------------------------------------------------------


def hub_settings(cfg: Config) -> HubSettings:
    return HubSettings(
        history_points=cfg.hub.history_points,
        event_log_size=cfg.hub.event_log_size,
        max_backoff_s=cfg.hub.max_backoff_s,
    )


def node_hub(cfg: Config) -> Hub:
    """The hub for this machine's own sources, as the config says."""
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


# --- subcommands ----------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Config:
    return config_mod.load(Path(args.config) if args.config else None)


def _log_to_file() -> None:
    """Full-screen modes must never print: log to a file under the XDG state folder."""
    folder = paths.state_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(folder / "gpuconsole.log")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def _run_console(hub: Hub, theme: str | None) -> int:
    try:
        from gpuconsole.tui.app import ConsoleApp
    except ImportError as exc:
        print(f"gpuconsole: the console cannot start: {exc}", file=sys.stderr)
        return 1
    _log_to_file()
    ConsoleApp(hub, theme=theme).run()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    cfg = _config(args)
    hub = sim_hub(cfg, args.nodes, args.seed)
    return _run_console(hub, args.theme or cfg.ui.theme)


def cmd_console(args: argparse.Namespace) -> int:
    cfg = _config(args)
    return _run_console(node_hub(cfg), args.theme or cfg.ui.theme)


def cmd_not_yet(args: argparse.Namespace) -> int:
    print(f"gpuconsole {args.command}: not built yet: {NOT_YET[args.command]}.", file=sys.stderr)
    return 2


def agent_settings(cfg: Config, listen: str | None) -> AgentSettings:
    """The agent's listen address, TLS and basic auth from the config and the command line."""
    from gpuconsole.export.agent import AgentSettings, parse_listen

    try:
        host, port = parse_listen(listen or cfg.agent.listen)
    except ValueError as exc:
        raise ConfigError(f"[agent] listen: {exc}") from None
    password = None
    if cfg.agent.basic_auth_user:
        if not cfg.agent.basic_auth_password_file:
            raise ConfigError("[agent] basic_auth_user needs basic_auth_password_file")
        password = read_secret(Path(cfg.agent.basic_auth_password_file), "[agent] basic auth")
    if bool(cfg.agent.tls_cert) != bool(cfg.agent.tls_key):
        raise ConfigError("[agent] tls_cert and tls_key go together")
    return AgentSettings(
        host=host,
        port=port,
        tls_cert=Path(cfg.agent.tls_cert) if cfg.agent.tls_cert else None,
        tls_key=Path(cfg.agent.tls_key) if cfg.agent.tls_key else None,
        basic_auth_user=cfg.agent.basic_auth_user or None,
        basic_auth_password=password,
    )


def read_secret(path: Path, what: str) -> str:
    """A password from a file; warns when others may read it, never echoes it."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        log.warning("%s: %s is readable by others; chmod 600 it", what, path)
    return text


def cmd_agent(args: argparse.Namespace) -> int:
    from gpuconsole.export.agent import serve

    cfg = _config(args)
    settings = agent_settings(cfg, args.listen)
    hub = sim_hub(cfg, args.nodes, args.seed) if args.demo else node_hub(cfg)
    logging.getLogger().setLevel(logging.INFO)
    try:
        asyncio.run(serve(hub, settings))
    except OSError as exc:
        print(
            f"gpuconsole agent: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.demo:
        hub = sim_hub(cfg, args.nodes, args.seed, events=False)
    else:
        hub = node_hub(cfg)
    snapshot = asyncio.run(hub.poll_once())
    if args.json:
        from gpuconsole.codec import dumps

        print(dumps(snapshot, indent=2 if args.pretty else None))
    else:
        print(render_table(snapshot))
    failed = [s for n in snapshot.nodes for s in n.statuses if not s.ok]
    return 1 if failed and len(failed) == sum(len(n.statuses) for n in snapshot.nodes) else 0


def cmd_power(args: argparse.Namespace) -> int:
    """Power a node on, off, soft off or reset through its BMC: checked, confirmed, audited."""
    from gpuconsole.actions.audit import AuditLog
    from gpuconsole.actions.power import ActionRefused, PowerRequest, power
    from gpuconsole.actions.roles import Actor, Role, local_actor
    from gpuconsole.sources.bmc import BmcError, PowerAction

    cfg = _config(args)
    actor = local_actor()
    if args.demo:
        from gpuconsole.sim.bmc import sim_link
        from gpuconsole.sim.cluster import build_sim_nodes, demo_cluster
        from gpuconsole.sources.bmc import BmcSource

        sims = {n.name: n for n in build_sim_nodes(demo_cluster(cfg.demo.nodes or None))}
        if args.node not in sims:
            print(f"gpuconsole power: no simulated node {args.node!r}", file=sys.stderr)
            return 2
        source = BmcSource(args.node, sim_link(sims[args.node]), simulated=True)
        if not actor.role.may_act:  # a simulated server: nobody's machine is at stake
            actor = Actor(actor.user, Role.OPERATOR)
    else:
        found = [s for s in bmc_sources(cfg) if s.node == args.node]
        if not found:
            print(f"gpuconsole power: no [[bmc]] for node {args.node!r}", file=sys.stderr)
            return 2
        source = found[0]
    confirm = args.confirm
    if confirm is None and sys.stdin.isatty():
        confirm = input(f"Power {args.state} {args.node}: type the node name to confirm: ")
    request = PowerRequest(args.node, PowerAction(args.state), actor, (confirm or "").strip())

    async def run() -> str:
        await source.start(lambda _event: None)
        try:
            return await power(request, source, AuditLog())
        finally:
            await source.close()

    try:
        answer = asyncio.run(run())
    except ActionRefused as exc:
        print(f"gpuconsole power: refused: {exc}", file=sys.stderr)
        return 3
    except BmcError as exc:
        print(f"gpuconsole power: failed: {exc}", file=sys.stderr)
        return 1
    print(f"{args.node}: power {args.state} requested through {source.label} ({answer})")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "example":
        print(config_mod.example())
        return 0
    cfg = _config(args)
    where = cfg.path or f"{paths.default_config_file()} (absent: defaults)"
    print(f"{where}: ok")
    return 0


# --- the plain-text table -------------------------------------------------------------


def _node_table(node: NodeSnapshot) -> list[str]:
    nvml = node.nvml
    product = PROFILES[node.profile].product if node.profile in PROFILES else ""
    head = [node.node]
    if product:
        head.append(product)
    if node.simulated:
        head.append("(simulated)")
    if nvml is not None:
        head.append(f"driver {nvml.driver_version or '?'}  CUDA {nvml.cuda_driver_version or '?'}")
    for status in node.statuses:
        state = "ok" if status.ok else f"STALE: {status.error}"
        head.append(f"{status.source}: {state}")
    lines = ["  ".join(head)]
    if node.bmc is not None:
        lines.append(_bmc_line(node.bmc))
    if nvml is None:
        return lines
    rows = [
        (
            "GPU",
            "NAME",
            "BUS ID",
            "UTIL",
            "MEMORY",
            "TEMP",
            "HBM",
            "POWER",
            "SM CLOCK",
            "THROTTLE",
            "ECC",
            "HEALTH",
        )
    ]
    for gpu in nvml.gpus:
        if gpu.lost:
            rows.append(
                (
                    str(gpu.index),
                    gpu.name,
                    gpu.pci_bus_id,
                    "LOST",
                    fmt.NA,
                    fmt.NA,
                    fmt.NA,
                    fmt.NA,
                    fmt.NA,
                    fmt.NA,
                    fmt.NA,
                    "critical",
                )
            )
            continue
        memory = f"{fmt.gib(gpu.mem_used_bytes)} / {fmt.gib(gpu.mem_total_bytes)}"
        power = f"{fmt.watts(gpu.power_w)} / {fmt.watts(gpu.power_limit_w)}"
        util = fmt.pct(gpu.util_gpu_pct)
        if gpu.mig_enabled:
            util = f"MIG x{len(gpu.mig_instances)}"
        ecc = str(gpu.ecc.volatile_uncorrected or 0) + "/" + str(gpu.ecc.volatile_corrected or 0)
        if gpu.ecc.remap_pending:
            ecc += " remap pending"
        rows.append(
            (
                str(gpu.index),
                gpu.name,
                gpu.pci_bus_id,
                util,
                memory,
                fmt.celsius(gpu.temp_gpu_c),
                fmt.celsius(gpu.temp_hbm_c),
                power,
                fmt.mhz(gpu.sm_clock_mhz),
                fmt.throttle_words(gpu.throttle_reasons),
                ecc,
                gpu_health(gpu).value,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    return lines


def _bmc_line(bmc: BmcReading) -> str:
    """The server around the GPUs in one line: power, temperatures, fans and PSUs."""
    fans = f"fans {bmc.fans_present - bmc.fans_failed}/{bmc.fans_present} ok"
    psus = f"PSUs {bmc.psus_present - bmc.psus_failed}/{bmc.psus_present} ok"
    return (
        f"  BMC: power {bmc.power_state}  {fmt.watts(bmc.power_w)}  "
        f"inlet {fmt.celsius(bmc.inlet_c)}  exhaust {fmt.celsius(bmc.exhaust_c)}  {fans}  {psus}"
    )


def render_table(snapshot: FleetSnapshot) -> str:
    """One reading as text, node by node."""
    out: list[str] = []
    for node in snapshot.nodes:
        out.extend(_node_table(node))
        out.append("")
    if snapshot.simulated:
        out.append("SIMULATED DATA: no real GPU was read.")
    return "\n".join(out).rstrip() + "\n"


# --- argument parsing -----------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE", help="config file (default: XDG location)")


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, metavar="N", help="simulated nodes (default: 7)")
    p.add_argument("--seed", type=int, metavar="S", help="simulation seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description="A terminal console for GPU clusters: GPUs, BMCs, fabric and owners.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("demo", help="the console on a simulated cluster (no GPU needed)")
    _common(p)
    _demo_args(p)
    p.add_argument("--theme", help="theme name")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("console", help="the console on this node's real sources")
    _common(p)
    p.add_argument("--theme", help="theme name")
    p.set_defaults(func=cmd_console)

    p = sub.add_parser("agent", help="headless Prometheus exporter: /metrics, /api/v1/snapshot")
    _common(p)
    _demo_args(p)
    p.add_argument("--demo", action="store_true", help="export the simulated cluster")
    p.add_argument("--listen", metavar="HOST:PORT", help="default: [agent] listen, 127.0.0.1:9400")
    p.set_defaults(func=cmd_agent)

    for name in ("wallboard", "ssh-server"):
        p = sub.add_parser(name, help=f"{NOT_YET[name]} (not built yet)")
        _common(p)
        p.set_defaults(func=cmd_not_yet)

    p = sub.add_parser("snapshot", help="one reading of every source, as a table or JSON")
    _common(p)
    _demo_args(p)
    p.add_argument("--demo", action="store_true", help="read the simulated cluster")
    p.add_argument("--json", action="store_true", help="versioned JSON (schema_version)")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("power", help="power a node on, off, soft off or reset through its BMC")
    p.add_argument("node", help="the node, as [[bmc]] node names it")
    p.add_argument("state", choices=["on", "off", "soft", "reset"])
    p.add_argument("--confirm", metavar="NODE", help="the node name again, to confirm")
    p.add_argument("--demo", action="store_true", help="a node of the simulated cluster")
    _common(p)
    p.set_defaults(func=cmd_power)

    p = sub.add_parser("config", help="print an example config, or check one")
    p.add_argument("action", choices=["example", "check"])
    _common(p)
    p.set_defaults(func=cmd_config)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuconsole")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in ("demo", "console"):
        logging.basicConfig(level=logging.WARNING, format="gpuconsole: %(message)s")
    try:
        result: Any = args.func(args)
    except ConfigError as exc:
        print(f"gpuconsole: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(result)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
