"""One TOML file describes a node (or, later, a fleet). Every key has a default.

A bad file gets an error that names the key and its line: `ConfigError`.
`example()` renders a complete, commented file from the same definitions, so the
example can never fall behind the loader.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, get_type_hints
from urllib.parse import urlsplit

import msgspec

from gpuconsole import paths

# The ports the agent and the ssh server listen on where a listen address names none.
AGENT_PORT, SSH_PORT = 9400, 2222

log = logging.getLogger(__name__)


def _doc(text: str, **limits: Any) -> dict[str, Any]:
    """A key's explanation (for `config example`) and limits (checked on load): its field's
    Annotated metadata, read back by `table_keys`."""
    return {"doc": text, **limits}


class _Section(msgspec.Struct, frozen=True):
    """A table of the file. A Struct, as cheap to define as a class: every command, the
    one-shot snapshot too, imports all of them. A key's default is read from an instance
    (`DEFAULTS.nvml.interval_s`); on the class the name is only the field's slot."""

    def __repr__(self) -> str:
        # a secret (a BMC password) never reaches a log line or a traceback
        shown = (
            f"{name}={getattr(self, name)!r}"
            for name, key in table_keys(type(self)).items()
            if not key.metadata.get("secret")
        )
        return f"{type(self).__name__}({', '.join(shown)})"


class TableKey(msgspec.Struct, frozen=True):
    """One key of a table: its name, type and `_doc` metadata."""

    name: str
    kind: Any
    metadata: dict[str, Any]


@functools.cache
def table_keys(cls: type) -> dict[str, TableKey]:
    """The keys of a table, in file order."""
    hints = get_type_hints(cls, include_extras=True)
    keys = {}
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        hint = hints[name]
        metadata: dict[str, Any] = {}
        if getattr(hint, "__metadata__", None):
            metadata = hint.__metadata__[0]
            hint = hint.__origin__
        keys[name] = TableKey(name, hint, metadata)
    return keys


class HostConfig(_Section, frozen=True):
    """[host]: this machine."""

    name: Annotated[str, _doc("Node name shown everywhere; empty: the hostname")] = ""
    sysfs_root: Annotated[str, _doc("Root of sysfs, shared by every source that reads it")] = "/sys"
    proc_root: Annotated[str, _doc("Root of procfs")] = "/proc"

    @property
    def node_name(self) -> str:
        # the kernel's host name, as gethostname(2) gives it, with no socket module to load
        return self.name or os.uname().nodename


class HubConfig(_Section, frozen=True):
    """[hub]: the data loop."""

    history_points: Annotated[
        int, _doc("Points kept per sparkline series", minimum=2, maximum=100_000)
    ] = 300
    event_log_size: Annotated[int, _doc("Events kept in memory", minimum=10, maximum=1_000_000)] = (
        2000
    )
    max_backoff_s: Annotated[
        float, _doc("Longest wait between retries of a failing source", minimum=1)
    ] = 60.0


class NvmlConfig(_Section, frozen=True):
    """[nvml]: the GPUs, through NVML."""

    enabled: Annotated[bool, _doc("Read GPUs through NVML")] = True
    interval_s: Annotated[float, _doc("Seconds between polls", minimum=0.05, maximum=3600)] = 1.0
    timeout_s: Annotated[
        float, _doc("A poll taking longer marks the source stale", minimum=0.1)
    ] = 5.0
    detail_every: Annotated[
        int, _doc("Clocks, throttle, processes and GPM every N polls", minimum=1, maximum=3600)
    ] = 2
    inventory_every: Annotated[
        int, _doc("PCIe, NVLink, MIG layout and fabric state every N polls", minimum=1)
    ] = 30
    events: Annotated[bool, _doc("Watch XID and ECC events in a thread")] = True
    library: Annotated[str, _doc("Path of libnvidia-ml.so.1 to load; empty: the system's")] = ""


class FabricConfig(_Section, frozen=True):
    """[fabric]: InfiniBand and RoCE ports, their netdevs, and GPU-NIC affinity."""

    enabled: Annotated[bool, _doc("Read RDMA ports under [host] sysfs_root")] = True
    interval_s: Annotated[float, _doc("Seconds between polls", minimum=0.1, maximum=3600)] = 2.0
    timeout_s: Annotated[
        float, _doc("A poll taking longer marks the source stale", minimum=0.1)
    ] = 5.0
    netlink: Annotated[
        bool, _doc("RoCE netdev statistics and link up/down notifications over rtnetlink")
    ] = True
    netns: Annotated[str, _doc("Network namespace of the netdevs; empty: this process's")] = ""
    roles: Annotated[
        dict[str, str],
        _doc(
            'Port roles by device, device/port or netdev, e.g. { mlx5_1 = "storage" }; '
            "unnamed ports: compute when under a GPU's PCIe switch",
            choices=("compute", "storage", "management"),
        ),
    ] = msgspec.field(default_factory=dict)


class TenancyConfig(_Section, frozen=True):
    """[tenancy]: who owns each GPU: PCI drivers, KVM guests, Kubernetes pods, processes."""

    enabled: Annotated[bool, _doc("Read GPU ownership on this node")] = True
    interval_s: Annotated[float, _doc("Seconds between polls", minimum=0.5, maximum=3600)] = 5.0
    timeout_s: Annotated[
        float, _doc("A poll taking longer marks the source stale", minimum=0.5)
    ] = 10.0
    libvirt_uri: Annotated[
        str,
        _doc(
            "libvirt to ask which guest holds each GPU (needs gpuconsole[libvirt]); "
            "empty: QEMU command lines only"
        ),
    ] = "qemu:///system"
    kubelet_socket: Annotated[
        str, _doc("The kubelet's pod-resources socket; empty: do not ask Kubernetes")
    ] = "/var/lib/kubelet/pod-resources/kubelet.sock"
    kubelet_checkpoint: Annotated[
        str,
        _doc(
            "The kubelet's device checkpoint (root-readable): which pod UID holds each shared "
            "GPU's replica, so a process finds its pod among several; empty: do not read it"
        ),
    ] = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    processes: Annotated[
        bool, _doc("Map GPU processes to pods, containers and Slurm jobs via /proc cgroups")
    ] = True
    guest_agents: Annotated[
        bool,
        _doc(
            "Ask the guest agent (`gpuconsole agent --guest`) of each running KVM guest with a "
            "vsock device for its passthrough GPUs' readings"
        ),
    ] = True
    guest_port: Annotated[
        int, _doc("The vsock port guest agents listen on", minimum=1, maximum=0xFFFFFFFE)
    ] = 9511
    namespaces: Annotated[
        dict[str, str], _doc('Kubernetes namespace (glob) to tenant, e.g. { "team-nlp" = "nlp" }')
    ] = msgspec.field(default_factory=dict)
    domains: Annotated[
        dict[str, str],
        _doc(
            'libvirt domain name (glob) to tenant, e.g. { "acme-*" = "acme" }; a domain\'s '
            "<metadata> tenant element wins"
        ),
    ] = msgspec.field(default_factory=dict)
    accounts: Annotated[dict[str, str], _doc("Slurm account (glob) to tenant")] = msgspec.field(
        default_factory=dict
    )
    users: Annotated[dict[str, str], _doc("Unix user (glob) to tenant, for plain processes")] = (
        msgspec.field(default_factory=dict)
    )


class FleetConfig(_Section, frozen=True):
    """[fleet]: the nodes a head console reads through their agents."""

    agents: Annotated[
        tuple[str, ...],
        _doc(
            'Agents as "URL" (each node named as its agent names it) or "NAME=URL" (named '
            'here), e.g. ["http://10.1.0.1:9400", "dgx-002=http://10.1.0.2:9400"]'
        ),
    ] = ()
    targets_file: Annotated[
        str, _doc("Prometheus file_sd JSON of agents: targets host:port, labels node and ssh")
    ] = ""
    prometheus: Annotated[
        str,
        _doc(
            "URL of a Prometheus (or compatible) server that scrapes the agents: the fleet "
            "overview is then read from it with PromQL, a node's detail still from its agent; "
            "empty: read every agent",
            url=True,
        ),
    ] = ""
    prometheus_selector: Annotated[
        str,
        _doc(
            'Label matchers added to every PromQL selector, e.g. job="gpuconsole"; '
            "empty: every target Prometheus scrapes"
        ),
    ] = ""
    interval_s: Annotated[float, _doc("Seconds between reads of each agent", minimum=0.1)] = 1.0
    timeout_s: Annotated[float, _doc("An agent slower than this is stale", minimum=0.1)] = 3.0
    max_connections: Annotated[int, _doc("Open connections to agents at most", minimum=1)] = 64


class RemoteConfig(_Section, frozen=True):
    """[remote]: moving GPUs of other fleet nodes, over ssh as yourself (assign --node NODE)."""

    destinations: Annotated[
        dict[str, str],
        _doc(
            'Node name to its ssh destination "[user@]host[:port]"; a node not listed: the '
            "ssh label of its targets_file entry, else its agent's host"
        ),
    ] = msgspec.field(default_factory=dict)
    user: Annotated[str, _doc("Login user on the nodes; empty: ~/.ssh/config, else yours")] = ""
    port: Annotated[
        int, _doc("ssh port of the nodes; 0: ~/.ssh/config, else 22", minimum=0, maximum=65535)
    ] = 0
    identity_files: Annotated[
        tuple[str, ...], _doc("Private keys to log in with; empty: ~/.ssh/id_* and the ssh agent")
    ] = ()
    known_hosts: Annotated[
        str,
        _doc(
            "known_hosts file that must hold each node's host key (an unknown or changed key "
            "is refused); empty: ~/.ssh/known_hosts"
        ),
    ] = ""
    command: Annotated[
        str, _doc("gpuconsole on the nodes, as the login shell runs it (a name or a path)")
    ] = "gpuconsole"
    connect_timeout_s: Annotated[
        float, _doc("A node that does not answer ssh in this long is unreachable", minimum=0.5)
    ] = 10.0
    keepalive_s: Annotated[
        float,
        _doc(
            "Seconds between ssh keepalives while a plan runs; 3 unanswered: contact lost",
            minimum=1,
        ),
    ] = 15.0


class ActionsConfig(_Section, frozen=True):
    """[actions]: reassigning GPUs (`gpuconsole assign`): journal, sysfs, Kubernetes."""

    state_dir: Annotated[
        str,
        _doc(
            "Folder of the action journal, GPU locks and audit log, shared by every user and "
            "session of this machine (make it: install -d -m 3770 -g gpuconsole-operator "
            "DIR); not writable: the user's own state folder, with a warning"
        ),
    ] = paths.SYSTEM_STATE_DIR
    journal: Annotated[
        str, _doc("SQLite journal of actions and GPU locks; empty: in state_dir")
    ] = ""
    audit_log: Annotated[
        str,
        _doc(
            "Audit log (JSON lines): each user appends to NAME.USER.jsonl beside it, which "
            "only they write and the group reads; empty: audit.jsonl in state_dir"
        ),
    ] = ""
    sysfs_root: Annotated[
        str, _doc("sysfs the vfio driver writes to; empty: [host] sysfs_root")
    ] = ""
    kubernetes: Annotated[
        bool, _doc("Cordon GPUs and evict pods through the Kubernetes API (gpuconsole[kubernetes])")
    ] = False
    kubeconfig: Annotated[str, _doc("kubeconfig file; empty: the in-cluster service account")] = ""
    kubernetes_node: Annotated[
        str, _doc("This machine's Kubernetes node name; empty: [host] name")
    ] = ""
    evict_timeout_s: Annotated[
        float, _doc("Wait this long for an evicted pod to go", minimum=1)
    ] = 300.0

    @property
    def journal_path(self) -> Path:
        """Where the machine's journal is, creating nothing: what a hub's JournalEvents reads."""
        folder = Path(self.state_dir) if self.state_dir else Path(paths.SYSTEM_STATE_DIR)
        return Path(self.journal) if self.journal else folder / paths.JOURNAL_FILE


class DemoConfig(_Section, frozen=True):
    """[demo]: the simulated cluster."""

    nodes: Annotated[int, _doc("Simulated nodes; 0: the 8-node demo cluster", minimum=0)] = 0
    seed: Annotated[int, _doc("Same seed, same cluster")] = 0


class UiConfig(_Section, frozen=True):
    """[ui]: the console."""

    theme: Annotated[str, _doc("Theme name: a shipped one or a file in the user themes folder")] = (
        "gpuconsole-dark"
    )


# What a guest agent may tell its host, by word (sources/tenancy/guest_agent maps each to the
# reading fields it stands for)
GUEST_SHAREABLE = (
    "util",
    "memory",
    "temperature",
    "power",
    "clocks",
    "ecc",
    "xids",
    "pcie",
    "nvlink",
    "mig",
    "processes",
)


class GuestConfig(_Section, frozen=True):
    """[guest]: `gpuconsole agent --guest`, inside a KVM guest: what its host may read."""

    port: Annotated[
        int, _doc("The vsock port to answer the host on", minimum=1, maximum=0xFFFFFFFE)
    ] = 9511
    share: Annotated[
        tuple[str, ...],
        _doc(
            "What the host may see of this guest's GPUs; left out stays unknown there "
            "(processes are not shared unless named)",
            choices=GUEST_SHAREABLE,
        ),
    ] = tuple(w for w in GUEST_SHAREABLE if w != "processes")


class AgentConfig(_Section, frozen=True):
    """[agent]: the headless exporter (`gpuconsole agent`)."""

    listen: Annotated[
        str,
        _doc(
            f"HOST:PORT to serve /metrics on ([::1]:PORT for IPv6; no port: {AGENT_PORT})",
            listen=AGENT_PORT,
        ),
    ] = f"127.0.0.1:{AGENT_PORT}"
    tls_cert: Annotated[str, _doc("PEM certificate file; empty: plain HTTP")] = ""
    tls_key: Annotated[str, _doc("PEM key file for tls_cert")] = ""
    basic_auth_user: Annotated[str, _doc("Require HTTP basic auth as this user")] = ""
    basic_auth_password_file: Annotated[
        str, _doc("File holding the basic-auth password (mode 0600)")
    ] = ""


class SshConfig(_Section, frozen=True):
    """[ssh]: the ssh-in console (`gpuconsole ssh-server`)."""

    listen: Annotated[
        str, _doc(f"HOST:PORT to accept ssh on (no port: {SSH_PORT})", listen=SSH_PORT)
    ] = f"0.0.0.0:{SSH_PORT}"
    authorized_keys: Annotated[
        str,
        _doc(
            "OpenSSH public-key lines, each optionally led by role=viewer|operator|admin "
            '(no role: viewer) and from="ADDRESS PATTERNS"; empty: authorized_keys in the '
            "config folder"
        ),
    ] = ""
    host_key: Annotated[
        str,
        _doc(
            "The server's private host key, generated (mode 0600) on first start; "
            "empty: ssh_host_ed25519_key in the state folder"
        ),
    ] = ""
    password_file: Annotated[
        str,
        _doc(
            "USER:ROLE:HASH lines (gpuconsole ssh-server --hash-password); "
            "empty: password authentication off"
        ),
    ] = ""
    max_sessions: Annotated[
        int,
        _doc("Sessions at once; the next is told the server is full", minimum=1, maximum=10_000),
    ] = 32
    operator_sessions: Annotated[
        int,
        _doc(
            "Of max_sessions, kept for operators and admins: viewers and wallboards take at "
            "most the rest",
            minimum=0,
            maximum=10_000,
        ),
    ] = 1
    max_sessions_per_key: Annotated[
        int,
        _doc(
            "Sessions one key (or one password user) may hold at once",
            minimum=1,
            maximum=10_000,
        ),
    ] = 8
    login_timeout_s: Annotated[
        float, _doc("A connection not logged in this long is closed", minimum=1, maximum=600)
    ] = 30.0
    max_startups: Annotated[
        int,
        _doc(
            "Connections still logging in at once; past it the one waiting longest is dropped",
            minimum=1,
            maximum=100_000,
        ),
    ] = 100
    max_startups_per_source: Annotated[
        int,
        _doc(
            "Connections still logging in from one client address; past it that "
            "address's longest waiting is dropped",
            minimum=1,
            maximum=100_000,
        ),
    ] = 10
    idle_timeout_s: Annotated[
        float,
        _doc(
            "Close a session after this long without input; 0: never "
            "(wallboard sessions never time out)",
            minimum=0,
        ),
    ] = 1800.0
    wallboard_user: Annotated[str, _doc("Logging in as this user gives the wallboard")] = (
        "wallboard"
    )
    output_buffer_bytes: Annotated[
        int,
        _doc(
            "Unsent bytes per session above which frames are skipped",
            minimum=4096,
            maximum=16 * 1024 * 1024,
        ),
    ] = 65536
    refresh_s: Annotated[
        float,
        _doc("A session repaints with new readings at most this often", minimum=0.1, maximum=60),
    ] = 1.0
    color_system: Annotated[
        str,
        _doc(
            "One colour depth for every session of the process",
            choices=("truecolor", "256", "standard"),
        ),
    ] = "truecolor"


class WallboardConfig(_Section, frozen=True):
    """[wallboard]: the read-only NOC wallboard (`gpuconsole wallboard`, or ssh)."""

    page_s: Annotated[float, _doc("Seconds each page shows", minimum=1, maximum=3600)] = 15.0
    theme: Annotated[str, _doc("Theme name")] = "gpuconsole-high-contrast"


class BmcConfig(_Section, frozen=True):
    """[[bmc]]: one BMC, over IPMI (RMCP+) or Redfish (HTTPS); repeat the table for more."""

    node: Annotated[str, _doc("Node this BMC belongs to; empty: [host] name")] = ""
    host: Annotated[str, _doc("Address of the BMC (required)")] = ""
    port: Annotated[
        int, _doc("Port; 0: 623 for ipmi, 443 for redfish", minimum=0, maximum=65535)
    ] = 0
    protocol: Annotated[
        str, _doc("ipmi (RMCP+ over UDP) or redfish (HTTPS)", choices=("ipmi", "redfish"))
    ] = "ipmi"
    username: Annotated[str, _doc("User name on the BMC")] = ""
    password_file: Annotated[str, _doc("File whose first line is the password (mode 0600)")] = ""
    password: Annotated[str, _doc("The password itself; prefer password_file", secret=True)] = ""
    verify_tls: Annotated[
        bool, _doc("Check the Redfish certificate; false turns checking off for this BMC")
    ] = True
    ca_file: Annotated[
        str, _doc("PEM file: a CA, or the BMC's own certificate; empty: the system's CAs")
    ] = ""
    interval_s: Annotated[float, _doc("Seconds between polls", minimum=1, maximum=3600)] = 10.0
    timeout_s: Annotated[float, _doc("A poll taking longer marks the BMC stale", minimum=0.5)] = (
        20.0
    )
    system: Annotated[
        str,
        _doc(
            "Redfish: the ComputerSystem power acts on, as /redfish/v1/Systems/ID, where the"
            " BMC manages several (blades, a host and its DPU); empty: its only one"
        ),
    ] = ""


class AlertsConfig(_Section, frozen=True):
    """[alerts]: alert rules over the exporter's series, sent to Alertmanager or webhooks."""

    enabled: Annotated[bool, _doc("Evaluate alert rules in this process")] = True
    defaults: Annotated[
        bool, _doc("Run the default rules (`gpuconsole rules` prints them); [[alert]] adds")
    ] = True
    interval_s: Annotated[float, _doc("Seconds between evaluations", minimum=0.1, maximum=3600)] = (
        5.0
    )
    alertmanager: Annotated[
        tuple[str, ...],
        _doc(
            "Alertmanager base URLs to POST alerts to (/api/v2/alerts), e.g. "
            '["http://alertmanager:9093"]; its silences are shown in the console',
            url=True,
        ),
    ] = ()
    webhook: Annotated[
        tuple[str, ...],
        _doc("URLs to POST JSON to, once when an alert fires and once when it resolves", url=True),
    ] = ()
    resend_s: Annotated[
        float,
        _doc(
            "Re-send firing alerts to Alertmanager this often (below its resolve_timeout)",
            minimum=1,
            maximum=3600,
        ),
    ] = 60.0
    timeout_s: Annotated[float, _doc("A receiver slower than this is down", minimum=0.1)] = 10.0
    max_backoff_s: Annotated[
        float, _doc("Longest wait between retries of a receiver that is down", minimum=1)
    ] = 300.0
    state_file: Annotated[
        str,
        _doc(
            "Where firing alerts and undelivered notices are kept across restarts; empty: "
            "alerts-MODE.json in the state folder"
        ),
    ] = ""


# An alert rule's `for` and keep_firing_for at most: a week (a longer one is a typo, and
# past 292 years Prometheus cannot read it at all).
LONGEST_ALERT_WAIT_S = 7 * 86400


class AlertRuleConfig(_Section, frozen=True):
    """[[alert]]: one alert rule; a rule named as a default one replaces it."""

    name: Annotated[str, _doc("Alert name, e.g. GpuHot (required)")] = ""
    expr: Annotated[
        str,
        _doc(
            'Condition over the exporter\'s series: metric{label="v"} OP number, joined by '
            "and / and on(labels), e.g. 'DCGM_FI_DEV_GPU_TEMP > 90' (required)"
        ),
    ] = ""
    for_s: Annotated[
        float,
        _doc(
            "Fire once the condition has held this long (to the millisecond, as Prometheus "
            "reads `for`)",
            minimum=0,
            maximum=LONGEST_ALERT_WAIT_S,
        ),
    ] = 0.0
    clear: Annotated[
        float,
        _doc(
            "Hysteresis: a firing alert clears only once its first comparison fails with this "
            "threshold (fire above 90, clear below 85); unset (nan): as it fired"
        ),
    ] = math.nan
    keep_firing_for_s: Annotated[
        float,
        _doc(
            "Hysteresis: keep firing this long after the condition last held",
            minimum=0,
            maximum=LONGEST_ALERT_WAIT_S,
        ),
    ] = 0.0
    severity: Annotated[
        str, _doc("How much it should worry", choices=("info", "warning", "critical"))
    ] = "warning"
    labels: Annotated[
        dict[str, str], _doc('Labels added to the alert, e.g. { team = "infra" }')
    ] = msgspec.field(default_factory=dict)
    annotations: Annotated[
        dict[str, str],
        _doc(
            'e.g. { summary = "GPU {{ $labels.gpu }} at {{ $value }} C" }: {{ $labels.NAME }} '
            "and {{ $value }} are filled in"
        ),
    ] = msgspec.field(default_factory=dict)


class Config(_Section, frozen=True):
    """The whole file."""

    host: HostConfig = msgspec.field(default_factory=HostConfig)
    hub: HubConfig = msgspec.field(default_factory=HubConfig)
    nvml: NvmlConfig = msgspec.field(default_factory=NvmlConfig)
    fabric: FabricConfig = msgspec.field(default_factory=FabricConfig)
    tenancy: TenancyConfig = msgspec.field(default_factory=TenancyConfig)
    demo: DemoConfig = msgspec.field(default_factory=DemoConfig)
    actions: ActionsConfig = msgspec.field(default_factory=ActionsConfig)
    ui: UiConfig = msgspec.field(default_factory=UiConfig)
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    guest: GuestConfig = msgspec.field(default_factory=GuestConfig)
    fleet: FleetConfig = msgspec.field(default_factory=FleetConfig)
    remote: RemoteConfig = msgspec.field(default_factory=RemoteConfig)
    ssh: SshConfig = msgspec.field(default_factory=SshConfig)
    wallboard: WallboardConfig = msgspec.field(default_factory=WallboardConfig)
    alerts: AlertsConfig = msgspec.field(default_factory=AlertsConfig)
    bmc: tuple[BmcConfig, ...] = ()
    alert: tuple[AlertRuleConfig, ...] = ()
    path: Path | None = None


# Every key's default, read from this one place where a signature or a setting defaults to a
# key's value (`DEFAULTS.nvml.interval_s`; BMCs are a list, so theirs is `DEFAULT_BMC`).
DEFAULTS = Config()
DEFAULT_BMC = BmcConfig()


class ConfigError(Exception):
    """A config file that cannot be used: each problem names the key and line that are
    wrong, every problem found, not only the first."""

    def __init__(self, *problems: str) -> None:
        super().__init__(*problems)
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(self.problems)


def parse_listen(text: str, default_port: int = AGENT_PORT) -> tuple[str, int]:
    """'HOST:PORT', ':PORT', 'HOST' or '[::1]:PORT' to (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    # int() would also take "٩٤٠٠", " 94_00" and 5,000 digits (which it refuses, raising)
    if port_text and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise ValueError(f"listen address {text!r}: port must be a number")
    port = int(port_text) if port_text else default_port
    if not 0 <= port <= 65535:
        raise ValueError(f"listen address {text!r}: port out of range (0 to 65535)")
    if not is_host(host):
        raise ValueError(f"listen address {text!r}: {host!r} is not a host name or address")
    return host or "0.0.0.0", port


# Names (RFC 1123, and the underscores some sites use), IPv4 and IPv6 addresses (with a
# zone, fe80::1%eth0): what getaddrinfo may be asked for. Spaces, slashes and control
# characters never are.
_HOST = re.compile(r"[A-Za-z0-9._:%-]*", re.ASCII)


def is_host(text: str) -> bool:
    """Whether `text` can be a host name or address (not whether it resolves)."""
    return len(text) <= 253 and _HOST.fullmatch(text) is not None


def http_url_problem(url: str) -> str | None:
    """What keeps `url` from being an http(s) URL a client can ask (None: nothing)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    if not parts.hostname:
        return "it has no host"
    if not is_host(parts.hostname):
        return f"{parts.hostname!r} is not a host name or address"
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked for it
    except ValueError:
        return "the port must be a number up to 65535"
    return None


_SECTIONS = [name for name in Config.__struct_fields__ if name != "path"]
# Arrays of tables ([[bmc]]): each entry is checked like a table, named "[[bmc]] #2".
_ARRAYS: dict[str, type] = {"bmc": BmcConfig, "alert": AlertRuleConfig}


def _line_of(text: str, table: str, key: str | None, index: int | None = None) -> int | None:
    """The line where [table] key is set (or where [table] starts); with `index`, in the
    index-th (1-based) [[table]]."""
    current = ""
    header = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(#.*)?$")
    assign = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")
    seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        m = header.match(line)
        if m:
            current = m.group(2)
            if index is not None:
                seen += current == table and m.group(1) == "[["
                current = current if current == table and seen == index else ""
            if key is None and current == table:
                return number
            continue
        if key is not None and current == table:
            a = assign.match(line)
            if a and a.group(1) == key:
                return number
    return None


def where(path: Path | None, table: str, key: str | None, index: int | None = None) -> str:
    """'FILE:LINE: [table] key' (or '[[table]] #INDEX key') for a problem found after
    loading, by a check that lives above the config (an alert rule's condition, say)."""
    text = ""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    return _where(path, text, table, key, index)


def _where(
    path: Path | None, text: str, table: str, key: str | None, index: int | None = None
) -> str:
    line = _line_of(text, table, key, index)
    head = f"[[{_bare(table)}]] #{index}" if index is not None else f"[{_bare(table)}]"
    name = f"{head} {_bare(key)}" if key else head
    place = str(path) if path else "config"
    return f"{place}:{line}: {name}" if line else f"{place}: {name}"


def _bare(name: str) -> str:
    """A table or key name as a message shows it: quoted (escaped) unless TOML's bare form,
    so a name in quotes never reaches a terminal with its control characters."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name, re.ASCII) else repr(name)


def suggest(word: str, options: Iterable[str]) -> str:
    import difflib  # only for a file with a misspelt name

    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _convert(value: Any, kind: Any) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise TypeError("must be true or false")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise TypeError("must be a whole number")
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise TypeError("must be a number")
    if kind is str:
        if isinstance(value, str):
            return _no_nul(value)
        raise TypeError("must be a string")
    if kind == dict[str, str]:
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            return {_no_nul(k): _no_nul(v) for k, v in value.items()}
        raise TypeError("must be a table of strings")
    if kind == tuple[str, ...]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(_no_nul(v) for v in value)
        raise TypeError("must be a list of strings")
    raise TypeError(f"unsupported type {kind}")


def _no_nul(text: str) -> str:
    # TOML can write "\u0000"; no path, name or URL holds one (the OS refuses it in a path)
    if "\0" in text:
        raise TypeError("must not hold a NUL character (\\u0000)")
    return text


def _check_value(spec: TableKey, value: Any) -> str | None:
    """What is wrong with a value of the right type for `spec` (to follow the key's name),
    or None."""
    choices = spec.metadata.get("choices")
    if choices is not None:
        items = value.values() if isinstance(value, dict) else value
        for item in items if isinstance(value, dict | tuple | list) else (value,):
            if item not in choices:
                return f" {item!r} is not one of {', '.join(choices)}"
    low, high = spec.metadata.get("minimum"), spec.metadata.get("maximum")
    # `not >=`: nan (valid TOML) compares false with everything, so it fails here too.
    if low is not None and not value >= low:
        return f" must be at least {low:g}"
    if high is not None and not value <= high:
        return f" must be at most {high:g}"
    # every float here is seconds: inf (never, forever) is not a time to wait or poll
    if isinstance(value, float) and not math.isfinite(value):
        return " must be a finite number"
    if spec.metadata.get("url") and value:
        for url in value if isinstance(value, tuple) else (value,):
            problem = http_url_problem(url)
            if problem is not None:
                return f": {url!r}: {problem}"
    port = spec.metadata.get("listen")
    if port is not None:
        try:
            parse_listen(value, port)
        except ValueError as exc:
            return f": {exc}"
    return None


def _section(
    cls: type,
    data: Any,
    path: Path | None,
    text: str,
    table: str,
    problems: list[str],
    index: int | None = None,
) -> Any:
    """The table's Struct from its TOML table: each key that is wrong left at its default,
    and said in `problems` (with its line, looked up only then)."""
    if not isinstance(data, dict):
        problems.append(f"{_where(path, text, table, None, index)} must be a table")
        return cls()
    known = table_keys(cls)
    values: dict[str, Any] = {}
    for key, raw in data.items():
        spec = known.get(key)
        if spec is None:
            where = _where(path, text, table, key, index)
            problems.append(f"{where}: unknown key{suggest(key, list(known))}")
            continue
        try:
            value = _convert(raw, spec.kind)
        except TypeError as exc:
            got = "" if spec.metadata.get("secret") else f", got {raw!r}"  # never echo secrets
            problems.append(f"{_where(path, text, table, key, index)} {exc}{got}")
            continue
        wrong = _check_value(spec, value)
        if wrong is not None:
            problems.append(f"{_where(path, text, table, key, index)}{wrong}")
            continue
        values[key] = value
    return cls(**values)


def parse(text: str, path: Path | None = None) -> Config:
    """A Config from TOML text; ConfigError names every key that is wrong, and where."""
    cfg, problems = read(text, path)
    if problems:
        raise ConfigError(*problems)
    return cfg


def read(text: str, path: Path | None = None) -> tuple[Config, list[str]]:
    """The Config TOML text gives, with every key that is wrong left at its default, and
    what is wrong with each (`config check` says them all; `parse` refuses them)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return Config(path=path), [f"{path or 'config'}: not valid TOML: {exc}"]
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for table, body in data.items():
        if table not in _SECTIONS:
            problems.append(
                f"{_where(path, text, table, None)}: unknown table{suggest(table, _SECTIONS)}"
            )
        elif table in _ARRAYS:
            sections[table] = _array(_ARRAYS[table], body, path, text, table, problems)
        else:
            sections[table] = _section(
                table_keys(Config)[table].kind, body, path, text, table, problems
            )
    return Config(**sections, path=path), problems


def _array(
    cls: type, data: Any, path: Path | None, text: str, table: str, problems: list[str]
) -> tuple[Any, ...]:
    if not isinstance(data, list):
        problems.append(f"{_where(path, text, table, None)} must be written [[{table}]]")
        return ()
    items = tuple(
        _section(cls, body, path, text, table, problems, index)
        for index, body in enumerate(data, start=1)
    )
    if cls is BmcConfig:
        wrong = _check_bmcs(items, path, text)
        problems.extend(wrong)
        if wrong:
            return ()  # a BMC half described is polled by no one
    return items


def _check_bmcs(bmcs: tuple[BmcConfig, ...], path: Path | None, text: str) -> list[str]:
    """Every [[bmc]] names a host and one way to give the password; one BMC per node."""
    problems = []
    nodes: dict[str, int] = {}
    for index, bmc in enumerate(bmcs, start=1):
        if not bmc.host:
            problems.append(f"{_where(path, text, 'bmc', None, index)} needs a host")
        if bmc.password and bmc.password_file:
            problems.append(
                f"{_where(path, text, 'bmc', 'password', index)}: give password or "
                "password_file, not both"
            )
        if bmc.node in nodes:
            problems.append(
                f"{_where(path, text, 'bmc', 'node', index)}: node {bmc.node or '(this host)'!r}"
                f" already has a BMC ([[bmc]] #{nodes[bmc.node]})"
            )
        if bmc.system and (bmc.protocol != "redfish" or not _is_system_url(bmc.system)):
            problems.append(
                f"{_where(path, text, 'bmc', 'system', index)}: {bmc.system!r} is not a "
                "Redfish system: give its URL, /redfish/v1/Systems/ID, with protocol = "
                '"redfish"'
            )
        nodes.setdefault(bmc.node, index)
    return problems


def _is_system_url(text: str) -> bool:
    head, _, rest = text.rstrip("/").partition("/redfish/v1/Systems/")
    return not head and bool(rest) and "/" not in rest and rest.isprintable()


def load(path: Path | None = None) -> Config:
    """Read the config: an explicit path must exist; the XDG default may be absent."""
    cfg, problems = load_all(path)
    if problems:
        raise ConfigError(*problems)
    return cfg


def load_all(path: Path | None = None) -> tuple[Config, list[str]]:
    """Like `load`, but every key that is wrong is left at its default and said: the
    Config and the problems (`config check` goes on to what the commands would refuse)."""
    explicit = path is not None
    target = path if path is not None else paths.default_config_file()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            return Config(), [f"{target}: no such config file"]
        return Config(), []
    except (OSError, UnicodeDecodeError) as exc:
        return Config(), [f"{target}: cannot read: {exc}"]
    return read(text, target)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_value(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def example() -> str:
    """A complete config file with every key at its default, each explained."""
    lines = [
        "# gpuconsole configuration. Every key is optional; shown here at its default.",
        f"# Default location: {paths.default_config_file()}",
        "",
    ]
    defaults = Config()
    for table in _SECTIONS:
        if table in _ARRAYS:
            lines.extend(_array_example(table, _ARRAYS[table]))
            continue
        section: _Section = getattr(defaults, table)
        lines.append(f"# {type(section).__doc__}")
        lines.append(f"[{table}]")
        for spec in table_keys(type(section)).values():
            doc = spec.metadata.get("doc", "")
            lines.append(f"# {doc}")
            lines.append(f"{spec.name} = {_toml_value(getattr(section, spec.name))}")
        lines.append("")
    return "\n".join(lines)


def _array_example(table: str, cls: type) -> list[str]:
    """A commented-out [[table]] entry: arrays are empty unless the file adds entries."""
    lines = [f"# {cls.__doc__}", f"# [[{table}]]"]
    for spec in table_keys(cls).values():
        lines.append(f"#   {spec.metadata.get('doc', '')}")
        lines.append(f"#   {spec.name} = {_toml_value(getattr(cls(), spec.name))}")
    lines.append("")
    return lines


def read_secret(path: Path, what: str) -> str:
    """The text of a file that holds a secret (every password file is read here): a
    warning when others may read it, which never shows the secret; ConfigError naming
    `what` when it cannot be read."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
    if mode & 0o077:
        log.warning(
            "%s: %s is readable by others (mode %o); chmod 600 it", what, path, mode & 0o777
        )
    return text
