"""The `gpuconsole` command and its subcommands."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuconsole import paths

# Each command imports what it runs as it runs it: `--help`, `config` or `doctor` load no
# hub or event loop, and a one-shot reading no ssh server, console or executor.
if TYPE_CHECKING:
    from gpuconsole.config import Config
    from gpuconsole.hub import Hub
    from gpuconsole.readings.snapshot import FleetSnapshot

# --- subcommands ----------------------------------------------------------------------


def _config(args: argparse.Namespace) -> Config:
    from gpuconsole import config as config_mod

    return config_mod.load(Path(args.config) if args.config else None)


def theme_named(name: str, where: str) -> str:
    """The theme `name` names, shipped or in the user's themes folder; ConfigError naming
    `where` (the key, or --theme) when there is none."""
    from gpuconsole.config import ConfigError
    from gpuconsole.tui.themes import find_theme, load_themes

    known = load_themes([paths.user_themes_dir()])
    found = find_theme(name, known)
    if found is None:
        raise ConfigError(f"{where}: no theme {name!r} (there are {', '.join(known)})")
    return found


def _theme_argument(name: str) -> str:
    """--theme, checked as argparse reads it: an unknown one is a usage error (exit 2)."""
    from gpuconsole.config import ConfigError

    try:
        return theme_named(name, "--theme")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--theme: ")) from None


def problems(cfg: Config) -> list[str]:
    """Everything a command would refuse in `cfg` when it starts, found by the very checks
    the commands run, each one whatever the others find."""
    from gpuconsole.config import ConfigError
    from gpuconsole.export.agent import tls_context
    from gpuconsole.wiring import (
        agent_settings,
        alert_rules,
        bmc_sources,
        members,
        nvml_library,
        ssh_settings,
    )

    checks = (
        lambda: tls_context(agent_settings(cfg, None)),
        lambda: ssh_settings(cfg),
        lambda: _ssh_keys(cfg),
        lambda: _ssh_passwords(cfg),
        lambda: members(cfg.fleet),
        lambda: nvml_library(cfg),
        lambda: bmc_sources(cfg),
        lambda: alert_rules(cfg),
        lambda: theme_named(cfg.ui.theme, "[ui] theme"),
        lambda: theme_named(cfg.wallboard.theme, "[wallboard] theme"),
    )
    found: list[str] = []
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            found.extend(exc.problems)
    return found


def _ssh_keys(cfg: Config) -> None:
    """[ssh] authorized_keys, where the config names it, read as the ssh server reads it."""
    from gpuconsole.config import ConfigError
    from gpuconsole.ssh.keys import AuthorizedKeysFile, KeyFileError

    if cfg.ssh.authorized_keys:
        try:
            AuthorizedKeysFile(Path(cfg.ssh.authorized_keys)).current()
        except KeyFileError as exc:
            raise ConfigError(f"[ssh] authorized_keys: {exc}") from None


def _ssh_passwords(cfg: Config) -> None:
    """[ssh] password_file, where the config names one, read as the ssh server reads it."""
    from gpuconsole.config import ConfigError
    from gpuconsole.ssh.keys import KeyFileError, load_passwords

    if cfg.ssh.password_file:
        try:
            load_passwords(Path(cfg.ssh.password_file))
        except KeyFileError as exc:
            said = str(exc)
            raise ConfigError(
                said if said.startswith("[ssh]") else f"[ssh] password_file: {said}"
            ) from None


class SafeFormatter(logging.Formatter):
    """Log lines quote what clients, BMCs and agents sent (an ssh user name, an error's text):
    each line goes out with its control characters written out (readings.base.safe_text), so
    nothing a peer chose acts on a terminal that shows the log."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from gpuconsole.readings.base import safe_text

        record.message = safe_text(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        from gpuconsole.readings.base import safe_text

        return "\n".join(safe_text(line) for line in super().formatException(ei).splitlines())


def _log_to_file() -> None:
    """Full-screen modes must never print: log to a file under the XDG state folder."""
    folder = paths.state_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(folder / "gpuconsole.log")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


def _run_console(
    hub: Hub | None,
    theme: str | None,
    snapshot: FleetSnapshot | None = None,
    *,
    acting: Config | None = None,
) -> int:
    """The console on `hub` (or a captured `snapshot`); with `acting`, the config of this
    machine's actions, it can move this machine's GPUs, and over ssh those of its fleet."""
    try:
        from gpuconsole.tui.actions import MachineAccess
        from gpuconsole.tui.app import ConsoleApp
    except ImportError as exc:
        print(f"gpuconsole: the console cannot start: {exc}", file=sys.stderr)
        return 1
    _log_to_file()
    if snapshot is not None:
        ConsoleApp(
            None, theme=theme, start_hub=False, snapshot=snapshot, freeze_heap=True, replay=True
        ).run()
    elif hub is not None:
        actions = (
            MachineAccess(acting, hub.post_event, hub, remote=True) if acting is not None else None
        )
        ConsoleApp(hub, theme=theme, actions=actions, freeze_heap=True).run()
    return 0


def read_capture(path: Path) -> FleetSnapshot:
    """A snapshot captured with `gpuconsole snapshot --json`, for --replay."""
    from gpuconsole.codec import DecodeError, loads
    from gpuconsole.config import ConfigError

    try:
        return loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"--replay {path}: {exc.strerror}") from None
    except DecodeError as exc:
        raise ConfigError(f"--replay {path}: not a gpuconsole snapshot: {exc}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuconsole.wiring import sim_hub, watch_alerts

    cfg = _config(args)
    theme = args.theme or theme_named(cfg.ui.theme, "[ui] theme")
    if args.replay:
        return _run_console(None, theme, read_capture(Path(args.replay)))
    hub = sim_hub(cfg, args.nodes, args.seed)
    watch_alerts(cfg, hub, "demo", demo=True)
    return _run_console(hub, theme)


def cmd_console(args: argparse.Namespace) -> int:
    from gpuconsole.wiring import console_hub, watch_alerts

    cfg = _config(args)
    theme = args.theme or theme_named(cfg.ui.theme, "[ui] theme")
    hub = console_hub(cfg)
    watch_alerts(cfg, hub, "console")
    return _run_console(hub, theme, acting=cfg)


def cmd_wallboard(args: argparse.Namespace) -> int:
    """The read-only wallboard in this terminal: this node's, the fleet's ([fleet]) or the
    simulator's."""
    from gpuconsole.wiring import console_hub, sim_hub, watch_alerts

    cfg = _config(args)
    try:
        from gpuconsole.tui.wallboard import WallboardApp
    except ImportError as exc:
        print(f"gpuconsole: the wallboard cannot start: {exc}", file=sys.stderr)
        return 1
    theme = args.theme or theme_named(cfg.wallboard.theme, "[wallboard] theme")
    hub = sim_hub(cfg, args.nodes, args.seed) if args.demo else console_hub(cfg)
    watch_alerts(cfg, hub, "wallboard", demo=args.demo)
    _log_to_file()
    page_s = args.page_s if args.page_s is not None else cfg.wallboard.page_s
    WallboardApp(hub, theme=theme, page_s=page_s).run()
    return 0


def cmd_ssh_server(args: argparse.Namespace) -> int:
    """Serve the console (and the wallboard) over ssh; keys decide the role."""
    if args.hash_password:
        import getpass

        from gpuconsole.ssh.keys import hash_password

        first = getpass.getpass("password: ")
        if first != getpass.getpass("again: "):
            print("gpuconsole: the passwords differ", file=sys.stderr)
            return 2
        print(f"USER:viewer:{hash_password(first)}")
        return 0
    try:
        from gpuconsole.ssh.keys import KeyFileError
        from gpuconsole.ssh.server import ConsoleServer, console_factory, serve
        from gpuconsole.tui.actions import MachineAccess
    except ImportError as exc:
        print(f"gpuconsole: the ssh server cannot start: {exc}", file=sys.stderr)
        return 1
    import asyncio

    from gpuconsole.wiring import console_hub, sim_hub, ssh_settings, watch_alerts

    cfg = _config(args)
    settings = ssh_settings(cfg, args.listen, args.authorized_keys)
    hub = sim_hub(cfg, args.nodes, args.seed) if args.demo else console_hub(cfg)
    watch_alerts(cfg, hub, "ssh-server", demo=args.demo)
    factory = console_factory(
        hub,
        theme=theme_named(cfg.ui.theme, "[ui] theme"),
        wallboard_theme=theme_named(cfg.wallboard.theme, "[wallboard] theme"),
        page_s=cfg.wallboard.page_s,
        refresh_s=cfg.ssh.refresh_s,
        actions=None if args.demo else MachineAccess(cfg, hub.post_event, hub),
    )
    logging.getLogger().setLevel(logging.INFO)
    # asyncssh writes ~4 INFO lines per connection, so a flood of connections would fill the
    # log; the server logs its own one line per cause.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    try:
        asyncio.run(serve(ConsoleServer(hub, settings, factory)))
    except KeyFileError as exc:
        print(f"gpuconsole ssh-server: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"gpuconsole ssh-server: cannot listen on {settings.host}:{settings.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.wiring import agent_settings, node_hub, sim_hub, watch_alerts, watch_cut_off

    if args.guest:
        return _guest_agent(args)
    from gpuconsole.export.agent import serve

    cfg = _config(args)
    settings = agent_settings(cfg, args.listen)
    hub = sim_hub(cfg, args.nodes, args.seed) if args.demo else node_hub(cfg)
    watch_alerts(cfg, hub, "agent", demo=args.demo)
    if not args.demo:  # the node's remediations its reboot cut off end as it comes back
        watch_cut_off(cfg, hub)
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


def _guest_agent(args: argparse.Namespace) -> int:
    import asyncio

    from gpuconsole.export.guest import serve_guest
    from gpuconsole.wiring import guest_hub

    cfg = _config(args)
    hub = guest_hub(cfg)
    where = f"unix socket {args.unix}" if args.unix else f"vsock port {cfg.guest.port}"
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger(__name__).info(
        "guest agent on %s, sharing %s", where, ", ".join(cfg.guest.share) or "nothing"
    )
    try:
        asyncio.run(serve_guest(hub, cfg.guest.share, port=cfg.guest.port, unix=args.unix))
    except OSError as exc:
        print(f"gpuconsole agent --guest: cannot listen on {where}: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from gpuconsole.wiring import console_hub, sim_hub

    cfg = _config(args)
    if args.demo:
        hub = sim_hub(cfg, args.nodes, args.seed, events=False)
    else:
        hub = console_hub(cfg, one_shot=True)
    if getattr(args, "own_process", False):
        gc.freeze()  # the imports are done: what they made lives to the exit
        gc.enable()  # a large fleet's reading is collected as usual
    if args.wait is not None:
        for source in hub.sources:
            source.timeout_s = args.wait
    # the counted summary said below stands for the hub's line per stale source and node
    if hub.blocking:  # this machine's own sources, each a blocking read: no event loop
        snapshot = hub.read_once(say_stale=False)
    else:
        import asyncio

        snapshot = asyncio.run(hub.poll_once(say_stale=False))
    if args.json:
        import json

        from gpuconsole.cli.derived import snapshot_document
        from gpuconsole.facts.verdict import verdicts_json

        # what every view derives, beside the readings: `jq` need not derive it again
        document = {**snapshot_document(snapshot), "verdicts": verdicts_json(snapshot)}
        print(json.dumps(document, indent=2 if args.pretty else None, allow_nan=False))
    else:
        from gpuconsole.cli.table import render_table

        print(render_table(snapshot))
    late = timed_out(snapshot)
    for line in late:
        print(f"gpuconsole snapshot: {line}", file=sys.stderr)
    if late:
        hint = "--wait SECONDS gives every source longer"
        print(f"gpuconsole snapshot: the reading is incomplete; {hint}", file=sys.stderr)
    failed = [s for n in snapshot.nodes for s in n.statuses if not s.ok]
    if failed and len(failed) == sum(len(n.statuses) for n in snapshot.nodes):
        return 1
    return SNAPSHOT_INCOMPLETE if late else 0


# `snapshot`'s exit status when some source on some node did not answer in time
SNAPSHOT_INCOMPLETE = 3


def timed_out(snapshot: FleetSnapshot, named: int = 5) -> list[str]:
    """A line per source that timed out somewhere: on how many of the nodes, and which
    (the first `named` of them)."""
    late: dict[str, list[str]] = {}
    for node in snapshot.nodes:
        for status in node.statuses:
            if not status.ok and (status.error or "").startswith("timeout after"):
                late.setdefault(status.source, []).append(node.node)
    lines = []
    for source, nodes in sorted(late.items()):
        which = ", ".join(nodes[:named]) + (
            f" and {len(nodes) - named} more" if len(nodes) > named else ""
        )
        lines.append(f"{source} timed out on {len(nodes)} of {len(snapshot.nodes)} nodes: {which}")
    return lines


def cmd_power(args: argparse.Namespace) -> int:
    """Power a node on, off, soft off or reset through its BMC: checked, confirmed, audited."""
    from gpuconsole.cli.power import run_power

    return run_power(_config(args), args.node, args.state, args.confirm, demo=args.demo)


def cmd_remediate(args: argparse.Namespace) -> int:
    """Repair one GPU as its verdict (or --action) asks: planned, confirmed, journaled; on a
    head, a GPU of another node of the fleet over ssh (--node NODE, or NODE:GPU)."""
    import asyncio
    import os
    import signal

    from gpuconsole.actions.roles import local_actor
    from gpuconsole.actions.ssh_caller import over_ssh
    from gpuconsole.cli.remediate import RemediateRequest, run_remediate

    actor = over_ssh(local_actor(), os.environ)
    if args.json_progress:
        # A head runs this over ssh: if its connection drops, the plan must still end here
        # (done, or stopped where the journal says) rather than die half-way with the session.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    request = RemediateRequest(
        gpu=args.gpu,
        action=args.action,
        node=args.node,
        dry_run=args.dry_run,
        demo=args.demo,
        confirm=args.confirm,
        json_progress=args.json_progress,
        expect_plan=args.expect_plan,
    )
    ask = input if sys.stdin.isatty() else None
    cfg = _config(args)
    return asyncio.run(
        run_remediate(cfg, request, actor.for_demo() if args.demo else actor, ask=ask)
    )


def cmd_assign(args: argparse.Namespace) -> int:
    """Move GPUs to free, drained, k8s or vm:NAME: planned, confirmed, journaled, audited;
    or propose free GPUs for a request (--propose N), and with --to move them."""
    import asyncio
    import os
    import signal

    from gpuconsole.actions.roles import local_actor
    from gpuconsole.actions.ssh_caller import over_ssh
    from gpuconsole.cli.assign import AssignRequest, gpu_args, run_assign

    cfg = _config(args)
    actor = over_ssh(local_actor(), os.environ)
    if args.demo:
        actor = actor.for_demo()
    if args.json_progress:
        # A head runs this over ssh: if its connection drops, the plan must still end here
        # (done or rolled back, journaled) rather than die half-way with the session.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    request = AssignRequest(
        gpus=gpu_args(args.gpus),
        target=args.to,
        node=args.node,
        dry_run=args.dry_run,
        yes=args.yes,
        demo=args.demo,
        propose=args.propose,
        model=args.model,
        confirm=args.confirm,
        json_progress=args.json_progress,
        expect_plan=args.expect_plan,
        recover=args.recover,
    )
    ask = input if sys.stdin.isatty() else None
    return asyncio.run(run_assign(cfg, request, actor, ask=ask))


def cmd_doctor(args: argparse.Namespace) -> int:
    """Every NVML call the NVML source makes, once, as this user: what the driver answered
    beside what the source made of it, and which readings this user cannot see."""
    from gpuconsole.cli.doctor import run_doctor

    library = args.library if args.library is not None else _config(args).nvml.library
    return run_doctor(library, as_json=args.json, timeout_s=args.timeout, out=sys.stdout)


def cmd_rules(args: argparse.Namespace) -> int:
    """The alert rules this config runs, as a Prometheus alerting-rules file."""
    from gpuconsole.alerts.prometheus import rules_file
    from gpuconsole.wiring import alert_rules

    print(rules_file(alert_rules(_config(args))), end="")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from gpuconsole import config as config_mod

    if args.action == "example":
        print(config_mod.example())
        return 0
    path = Path(args.config) if args.config else None
    cfg, found = config_mod.load_all(path)
    found += problems(cfg)
    for problem in found:
        print(f"gpuconsole: config error: {problem}", file=sys.stderr)
    if found:
        return 2
    where = cfg.path or f"{paths.default_config_file()} (absent: defaults)"
    print(f"{where}: ok")
    return 0


# --- argument parsing -----------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE", help="config file (default: XDG location)")


def _plan_options(p: argparse.ArgumentParser) -> None:
    """What every command that runs a plan on a node takes (assign, remediate): where, how
    it is confirmed, and how a head that runs it over ssh reads its progress."""
    p.add_argument(
        "--node",
        metavar="NAME",
        help="the node: this one, another of [fleet] (over ssh), or with --demo a simulated one",
    )
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument(
        "--confirm",
        metavar="WORD",
        help="the node name, or the GPU asked for by index or bus id, to confirm",
    )
    p.add_argument("--demo", action="store_true", help="a node of the simulated cluster")
    p.add_argument(
        "--json-progress",
        action="store_true",
        help="report as JSON lines (what a head reads when it runs this over ssh)",
    )
    p.add_argument(
        "--expect-plan",
        metavar="DIGEST",
        help="refuse unless the plan is still the one shown (its digest, from --json-progress)",
    )


def _seconds(text: str) -> float:
    """A positive number of seconds, as argparse reads it: anything else is a usage error."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _demo_args(p: argparse.ArgumentParser) -> None:
    # no number here: it went stale once (7, when the demo had 8 nodes)
    p.add_argument("--nodes", type=int, metavar="N", help="simulated nodes (default: the demo's)")
    p.add_argument("--seed", type=int, metavar="S", help="simulation seed")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `command`, only that command's arguments are built
    (every command is listed): building all of them costs every start a few milliseconds,
    most of it argparse looking up translations and the terminal's width per argument."""
    parser = argparse.ArgumentParser(
        prog="gpuconsole",
        description="A terminal console for GPU clusters: GPUs, BMCs, fabric and owners.",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser | None:
        p = sub.add_parser(name, **kwargs)
        return p if command in (None, name) else None

    if p := add("demo", help="the console on a simulated cluster (no GPU needed)"):
        _common(p)
        _demo_args(p)
        p.add_argument("--theme", type=_theme_argument, help="theme name")
        p.add_argument(
            "--replay", metavar="FILE", help="open a capture made with `gpuconsole snapshot --json`"
        )
        p.set_defaults(func=cmd_demo)

    if p := add(
        "console", help="the console: this node's sources, or the fleet's agents ([fleet])"
    ):
        _common(p)
        p.add_argument("--theme", type=_theme_argument, help="theme name")
        p.set_defaults(func=cmd_console)

    if p := add("agent", help="headless Prometheus exporter: /metrics, /api/v1/snapshot"):
        _common(p)
        _demo_args(p)
        p.add_argument("--demo", action="store_true", help="export the simulated cluster")
        p.add_argument(
            "--listen", metavar="HOST:PORT", help="default: [agent] listen, 127.0.0.1:9400"
        )
        p.add_argument(
            "--guest",
            action="store_true",
            help="inside a KVM guest: tell the host what NVML reads of its passthrough GPUs "
            "over vsock ([guest] port, share); read-only, NVML only",
        )
        p.add_argument(
            "--unix", metavar="PATH", help="with --guest: answer on this unix socket, not vsock"
        )
        p.set_defaults(func=cmd_agent)

    if p := add("wallboard", help="the read-only NOC wallboard: rotating pages"):
        _common(p)
        _demo_args(p)
        p.add_argument("--demo", action="store_true", help="show the simulated cluster")
        p.add_argument(
            "--theme",
            type=_theme_argument,
            help="theme name (default: [wallboard] theme, high contrast)",
        )
        p.add_argument("--page-s", type=float, metavar="S", help="seconds per page (default: 15)")
        p.set_defaults(func=cmd_wallboard)

    if p := add("ssh-server", help="serve the console over ssh; keys decide the role"):
        _common(p)
        _demo_args(p)
        p.add_argument("--demo", action="store_true", help="serve the simulated cluster")
        p.add_argument("--listen", metavar="HOST:PORT", help="default: [ssh] listen, 0.0.0.0:2222")
        p.add_argument(
            "--authorized-keys",
            metavar="FILE",
            help="OpenSSH public keys, each line optionally led by role=viewer|operator|admin",
        )
        p.add_argument(
            "--hash-password",
            action="store_true",
            help="print a [ssh] password_file line for a password typed twice, and exit",
        )
        p.set_defaults(func=cmd_ssh_server)

    if p := add("snapshot", help="one reading of every source, as a table or JSON"):
        _common(p)
        _demo_args(p)
        p.add_argument("--demo", action="store_true", help="read the simulated cluster")
        p.add_argument("--json", action="store_true", help="versioned JSON (schema_version)")
        p.add_argument("--pretty", action="store_true", help="indent the JSON")
        p.add_argument(
            "--wait",
            type=_seconds,
            metavar="SECONDS",
            help="give every source up to SECONDS to answer (default: each its own timeout); "
            "exit 3 when some did not",
        )
        p.set_defaults(func=cmd_snapshot)

    if p := add(
        "power", help="power a node on, off, soft off, reset or power-cycle it through its BMC"
    ):
        p.add_argument("node", help="the node, as [[bmc]] node names it")
        p.add_argument("state", choices=["on", "off", "soft", "reset", "cycle"])
        p.add_argument("--confirm", metavar="NODE", help="the node name again, to confirm")
        p.add_argument("--demo", action="store_true", help="a node of the simulated cluster")
        _common(p)
        p.set_defaults(func=cmd_power)

    if p := add(
        "remediate", help="repair a GPU as its verdict asks: drain, reset, power cycle, service"
    ):
        p.add_argument(
            "gpu",
            metavar="GPU",
            help="bus id, UUID or index; NODE:GPU for a GPU of another node (dgx-003:0000:c3:00.0)",
        )
        p.add_argument(
            "--action",
            choices=["drain", "reset_gpu", "reboot_node", "reseat", "service"],
            help="this action instead of the verdict's",
        )
        _plan_options(p)
        _common(p)
        p.set_defaults(func=cmd_remediate)

    if p := add("assign", help="move GPUs to free, drained, k8s or vm:NAME"):
        p.add_argument("gpus", nargs="*", metavar="GPU", help="index, bus id or UUID")
        p.add_argument("--to", metavar="TARGET", help="free, drained, k8s or vm:NAME")
        p.add_argument(
            "--propose",
            type=int,
            metavar="N",
            help="propose N free GPUs of one NVLink domain and their NICs (with --to: move them)",
        )
        p.add_argument("--model", metavar="NAME", help="with --propose: GPUs named so (H100)")
        p.add_argument(
            "--recover",
            action="store_true",
            help="finish or roll back unfinished plans (a crash's, or one a full journal "
            "stopped), then list the GPU locks left",
        )
        p.add_argument("--yes", action="store_true", help="confirm without asking")
        _plan_options(p)
        _common(p)
        p.set_defaults(func=cmd_assign)

    if p := add(
        "doctor",
        help="what NVML answers this user, beside what gpuconsole made of it",
        description="Run every NVML call the NVML source makes, once, as this user, and print "
        "what the driver answered (return code, value type, value) beside what the source made "
        "of it, and which readings this user cannot see and why. Exit 0 when NVML answered, "
        "1 when it is not available (no library or driver, not permitted), 3 when the driver "
        "hung.",
    ):
        _common(p)
        p.add_argument("--json", action="store_true", help="the whole report as JSON (to diff)")
        p.add_argument(
            "--library",
            metavar="PATH",
            help="the libnvidia-ml.so.1 to load (default: [nvml] library, else the system's)",
        )
        p.add_argument(
            "--timeout",
            type=_seconds,
            default=50.0,
            metavar="S",
            help="give up on a driver that does not answer after S seconds (default: 50)",
        )
        p.set_defaults(func=cmd_doctor)

    if p := add(
        "rules",
        help="the alert rules (defaults and [[alert]]) as a Prometheus alerting-rules file",
    ):
        _common(p)
        p.set_defaults(func=cmd_rules)

    if p := add("config", help="print an example config, or check one"):
        p.add_argument("action", choices=["example", "check"])
        _common(p)
        p.set_defaults(func=cmd_config)

    return parser


class _VersionAction(argparse.Action):
    """--version, looked up only when asked: the package metadata costs every other
    command ~10 ms of start."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"{parser.prog} {_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpuconsole")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    # the command is the first word that is no option: the top level takes only --version
    command = next((word for word in words if not word.startswith("-")), None)
    args = build_parser(command).parse_args(words)
    # A one-shot reading run as its own process (argv None: not called from Python) lives
    # a tenth of a second: the collector's passes over the tens of thousands of objects its
    # imports make, while importing and again as the interpreter exits, cost it a fifth of
    # its CPU. Off while importing (cmd_snapshot freezes what the imports made and turns it
    # back on), and everything frozen before the exit's passes: the memory goes back with
    # the process.
    args.own_process = argv is None and args.command == "snapshot" and not args.demo
    if args.own_process:
        gc.disable()
    try:
        return _run(args)
    finally:
        if args.own_process:
            gc.freeze()


def _run(args: argparse.Namespace) -> int:
    from gpuconsole.config import ConfigError

    if args.command not in ("demo", "console", "wallboard"):
        handler = logging.StreamHandler()
        handler.setFormatter(SafeFormatter("gpuconsole: %(message)s"))
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
    try:
        result: Any = args.func(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"gpuconsole: config error: {problem}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # its reader went away (`| head`): what it read stands; the flush at exit would
        # only fail again, so the rest goes nowhere, and the exit is a pipe writer's
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return int(result)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
