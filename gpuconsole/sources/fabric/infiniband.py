"""/sys/class/infiniband parsed: devices, ports, link state, rate and raw counters.

Layout (Documentation/ABI/stable/sysfs-class-infiniband): per device fw_ver, board_id,
hca_type, node_guid and a `device` link to the PCI function; per port state ("4: ACTIVE"),
phys_state ("5: LinkUp"), rate ("400 Gb/sec (4X NDR)"), link_layer, lid, sm_lid,
counters/*, on kernels before 4.5 counters_ext/* (the 64-bit PortCountersExtended, beside
32-bit counters/*), and on mlx5 hw_counters/* (whose `lifespan` is a setting, not a
counter). A counter reading "N/A (no PMA)" is skipped, as node_exporter does; a file or
device vanishing mid-read drops only what vanished.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuconsole.readings.base import safe_text
from gpuconsole.sources.pci import PciDevice, read_path

log = logging.getLogger(__name__)

# counters/* are the PMA's PortCounters (IBA 16.1.3.5), each as wide as the kernel reads
# it (drivers/infiniband/core/sysfs.c, PORT_PMA_ATTR: 4, 8, 16 or 32 bits); they saturate
# at their maximum and never wrap (mlx4 and mlx5 clamp what they report to it), so a value
# there is pegged: the counter counts no more until it is cleared (`perfquery -R`). A
# counter not in the table is taken as 32 bits.
PMA_WIDTHS = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_data": 32,
    "port_rcv_data": 32,
    "port_xmit_packets": 32,
    "port_rcv_packets": 32,
    "port_xmit_wait": 32,
}
# Data and packet counters come from PortCountersExtended (64-bit) where the HCA has the
# extended PMA, as every ConnectX-4 and newer does; mlx5 hw_counters are read as 32-bit
# and wrap. A value past a counter's width proves it wider (a driver of its own), and it
# stays 64-bit.
EXTENDED = frozenset(
    {
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    }
)
EXTENDED_PMA_DRIVERS = ("mlx5_",)
# The kernel prints "%d%s Gb/sec (%dX%s)", the %s being "" or ".5": bounded digits, so
# every match converts (float() of 400 digits is inf, int() of 4300 raises).
_RATE = re.compile(
    r"^\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*Gb/sec\s*\(([0-9]{1,4})X\s*([A-Za-z0-9]*)\)", re.ASCII
)
# The kernel's other numbers: "%d: %s" for a state (the id a u8), "%d\n" for lifespan
# (ms, never negative) and "0x%x\n" for a LID (u32). Anything else is unknown; the
# digits are bounded so int() never sees 4300 of them.
_STATE_ID = re.compile(r"[0-9]{1,3}", re.ASCII)
_DECIMAL = re.compile(r"([0-9]{1,10})\n?", re.ASCII)
_HEX = re.compile(r"0x([0-9a-fA-F]{1,8})\n?", re.ASCII)
# A port folder is named "%u" by the kernel. str.isdigit() also takes "²" (which int()
# refuses) and "\u0661" (which int() reads as 1, a second port 1): only the kernel's form is one.
_PORT_NAME = re.compile(r"0|[1-9][0-9]{0,9}", re.ASCII)
NO_PMA = "N/A (no PMA)"
_NO_WIDTHS: Mapping[str, int] = {}
LIFESPAN = "lifespan"


@dataclass(frozen=True, slots=True)
class IbPort:
    """One port as sysfs shows it this instant."""

    device: str
    port: int
    state_id: int | None
    state: str
    phys_state_id: int | None
    phys_state: str
    link_layer: str
    rate_gbps: float | None
    rate_text: str
    width: int | None
    speed: str | None
    lid: int | None
    sm_lid: int | None
    netdev: str | None
    counters: tuple[tuple[str, int, int], ...]
    hw_counters: tuple[tuple[str, int, int], ...]
    no_pma: bool
    lifespan_ms: int | None = None  # hw_counters/lifespan: how long reads are cached
    counters_ext: tuple[tuple[str, int, int], ...] = ()  # counters_ext/*, all 64-bit


@dataclass(frozen=True, slots=True)
class IbDevice:
    """One RDMA device and the PCI function behind it."""

    name: str
    pci: PciDevice | None
    board_id: str | None
    fw_ver: str | None
    hca_type: str | None
    node_guid: str | None
    ports: tuple[IbPort, ...]


def parse_state(text: str) -> tuple[int | None, str]:
    """'4: ACTIVE' -> (4, 'ACTIVE'); '5: LinkUp' -> (5, 'LinkUp'); an id not in the
    kernel's form ('²: X', '-1: X') -> (None, the whole text)."""
    head, sep, name = text.strip().partition(":")
    head = head.strip()
    if sep and _STATE_ID.fullmatch(head):
        return int(head), name.strip()
    return None, text.strip()


def parse_rate(text: str) -> tuple[float | None, int | None, str | None]:
    """'400 Gb/sec (4X NDR)' -> (400.0, 4, 'NDR'); '10 Gb/sec (4X)' -> (10.0, 4, None);
    anything else (a number like '1.2.3') -> (None, None, None)."""
    m = _RATE.match(text)
    if m is None:
        return None, None, None
    return float(m.group(1)), int(m.group(2)), m.group(3) or None


def _read(path: str) -> str | None:
    """A small sysfs file's text, or None when it is gone or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _unsigned(text: str | None, form: re.Pattern[str], bits: int, base: int = 10) -> int | None:
    """A number in the kernel's `form` below 2**`bits`; None for anything else ('-1')."""
    m = form.fullmatch(text) if text is not None else None
    if m is None:
        return None
    value = int(m.group(1), base)
    return value if value >> bits == 0 else None


def _lifespan(text: str | None) -> int | None:
    return _unsigned(text, _DECIMAL, 31)  # an int of ms


def _lid(text: str | None) -> int | None:
    return _unsigned(text, _HEX, 32, 16)


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return head, int(tail) if tail else -1


@dataclass
class _PortLayout:
    device: str
    port: int
    path: str
    counters: list[str]
    hw_counters: list[str]
    extended: bool
    lifespan_ms: int | None
    counters_ext: list[str]


@dataclass
class _DeviceLayout:
    name: str
    pci: PciDevice | None
    board_id: str | None
    fw_ver: str | None
    hca_type: str | None
    node_guid: str | None
    ports: list[_PortLayout]
    net: list[str]


class InfinibandReader:
    """Reads every RDMA device under a sysfs root; the layout is listed once and re-listed
    every `rescan_every` reads, or at once when something vanished."""

    def __init__(self, sysfs_root: str = "/sys", *, rescan_every: int = 30) -> None:
        self.sysfs_root = sysfs_root
        self.class_dir = os.path.join(sysfs_root, "class", "infiniband")
        self.rescan_every = max(1, rescan_every)
        self._layout: list[_DeviceLayout] | None = None
        self._reads = 0
        self._wide: set[tuple[str, int, str]] = set()
        self._odd: set[tuple[str, str]] = set()  # port folders not named as the kernel names them

    @property
    def present(self) -> bool:
        return os.path.isdir(self.class_dir)

    def rescan(self) -> None:
        """Forget the layout; the next read lists devices, ports and counters again."""
        self._layout = None

    def read(self) -> tuple[IbDevice, ...]:
        """Every device and port now."""
        if self._layout is None or self._reads % self.rescan_every == 0:
            self._layout = self._scan()
        self._reads += 1
        devices = []
        for dev in self._layout:
            ports = []
            for layout in dev.ports:
                port = self._read_port(layout, dev)
                if port is not None:
                    ports.append(port)
            devices.append(
                IbDevice(
                    dev.name,
                    dev.pci,
                    dev.board_id,
                    dev.fw_ver,
                    dev.hca_type,
                    dev.node_guid,
                    tuple(ports),
                )
            )
        return tuple(devices)

    # --- layout --------------------------------------------------------------------

    def _scan(self) -> list[_DeviceLayout]:
        try:
            names = sorted(os.listdir(self.class_dir), key=_natural)
        except OSError:
            return []
        layout = []
        for name in names:
            base = os.path.join(self.class_dir, name)
            try:
                port_names = sorted(os.listdir(os.path.join(base, "ports")), key=_natural)
            except OSError:
                continue  # vanished between the two listings
            pci_link = os.path.join(base, "device")
            pci = read_path(self.sysfs_root, pci_link) if os.path.exists(pci_link) else None
            try:
                net = sorted(os.listdir(os.path.join(pci_link, "net")))
            except OSError:
                net = []
            ports = []
            extended = name.startswith(EXTENDED_PMA_DRIVERS)
            for port_name in port_names:
                if not _PORT_NAME.fullmatch(port_name):
                    self._odd_port(name, port_name)
                    continue
                path = os.path.join(base, "ports", port_name)
                hw = _list(os.path.join(path, "hw_counters"))
                # lifespan is how long (ms) mlx5 caches hw_counters reads: a setting an
                # admin changes rarely, so it is read with the layout, not every poll.
                lifespan = (
                    _lifespan(_read(os.path.join(path, "hw_counters", LIFESPAN)))
                    if LIFESPAN in hw
                    else None
                )
                ports.append(
                    _PortLayout(
                        name,
                        int(port_name),
                        path,
                        _list(os.path.join(path, "counters")),
                        [c for c in hw if c != LIFESPAN],
                        extended,
                        lifespan,
                        _list(os.path.join(path, "counters_ext")),
                    )
                )
            layout.append(
                _DeviceLayout(
                    name,
                    pci,
                    _strip(_read(os.path.join(base, "board_id"))),
                    _strip(_read(os.path.join(base, "fw_ver"))),
                    _strip(_read(os.path.join(base, "hca_type"))),
                    _strip(_read(os.path.join(base, "node_guid"))),
                    ports,
                    net,
                )
            )
        return layout

    def _odd_port(self, device: str, folder: str) -> None:
        """Skip a port folder the kernel would not have named so, and say so once."""
        if (device, folder) not in self._odd:
            self._odd.add((device, folder))
            log.warning(
                "%s: skipping port folder '%s': not a port number",
                safe_text(device), safe_text(folder),
            )  # fmt: skip

    # --- one port ------------------------------------------------------------------

    def _read_port(self, layout: _PortLayout, dev: _DeviceLayout) -> IbPort | None:
        path = layout.path
        state_text = _read(os.path.join(path, "state"))
        if state_text is None:
            self.rescan()  # the port (or its device) went away
            return None
        state_id, state = parse_state(state_text)
        phys_id, phys = parse_state(_read(os.path.join(path, "phys_state")) or "")
        rate_text = (_read(os.path.join(path, "rate")) or "").strip()
        rate, width, speed = parse_rate(rate_text)
        link_layer = (_read(os.path.join(path, "link_layer")) or "InfiniBand").strip()
        wide = EXTENDED if layout.extended else frozenset()
        counters, no_pma = self._counters(layout, "counters", layout.counters, wide, PMA_WIDTHS)
        hw, _ = self._counters(layout, "hw_counters", layout.hw_counters, frozenset())
        ext, ext_no_pma = self._counters(
            layout, "counters_ext", layout.counters_ext, frozenset(layout.counters_ext)
        )
        return IbPort(
            device=layout.device,
            port=layout.port,
            state_id=state_id,
            state=state,
            phys_state_id=phys_id,
            phys_state=phys,
            link_layer=link_layer,
            rate_gbps=rate,
            rate_text=rate_text,
            width=width,
            speed=speed,
            lid=_lid(_read(os.path.join(path, "lid"))),
            sm_lid=_lid(_read(os.path.join(path, "sm_lid"))),
            netdev=self._netdev(path, layout.port, dev.net),
            counters=counters,
            hw_counters=hw,
            no_pma=no_pma or ext_no_pma,
            lifespan_ms=layout.lifespan_ms,
            counters_ext=ext,
        )

    def _counters(
        self,
        layout: _PortLayout,
        folder: str,
        names: list[str],
        extended: frozenset[str],
        widths: Mapping[str, int] = _NO_WIDTHS,
    ) -> tuple[tuple[tuple[str, int, int], ...], bool]:
        """(name, value, bits) of the counter files `names` of one folder, and whether one
        read "N/A (no PMA)"; those in `extended` are known to be 64-bit, the others as wide
        as `widths` says (32 bits where it does not)."""
        base = os.path.join(layout.path, folder)
        values = []
        no_pma = False
        wide = self._wide
        for name in names:
            try:
                fd = os.open(os.path.join(base, name), os.O_RDONLY)
            except FileNotFoundError:
                self.rescan()
                continue
            except OSError:
                continue
            try:
                raw = os.read(fd, 64)
            except OSError:
                continue  # EINVAL/EIO: the HCA did not answer this counter (busy firmware)
            finally:
                os.close(fd)
            # The kernel writes "%llu\n"; int() would also take "-5", " 5" and "1_000".
            # bytes.isdigit() is ASCII only, and false for b"": anything else is skipped,
            # as is a value past a u64 (at most 64 bytes are read: int() stays cheap).
            digits = raw.rstrip(b"\n")
            if not digits.isdigit():
                if raw.startswith(b"N/A"):
                    no_pma = True
                continue
            value = int(digits)
            if value >> 64:
                continue
            key = (layout.device, layout.port, name)
            bits = 64 if name in extended else widths.get(name, 32)
            if value >> bits or key in wide:
                wide.add(key)
                bits = 64
            values.append((name, value, bits))
        return tuple(values), no_pma

    def _netdev(self, path: str, port: int, net: list[str]) -> str | None:
        # RoCE: the netdev of GID 0; otherwise the PCI function's netdev (IPoIB, or a
        # RoCE port whose GID table is not readable).
        name = _strip(_read(os.path.join(path, "gid_attrs", "ndevs", "0")))
        if name:
            return name
        if len(net) == 1:
            return net[0]
        return net[port - 1] if 0 < port <= len(net) else None


def _list(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _strip(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None
