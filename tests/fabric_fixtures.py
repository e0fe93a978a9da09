"""Fake sysfs trees laid out like real mlx5 nodes: PCI chains, HCAs, ports and counters.

Written by hand (not by the simulator), so the fabric parser is tested against the layout
the kernel documents, e.g. class/infiniband/mlx5_0 -> ../../devices/pci0000:17/.../infiniband/mlx5_0.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.peers import require_peer

IB_COUNTERS = {
    "symbol_error": 0,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_rcv_remote_physical_errors": 0,
    "port_xmit_discards": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "VL15_dropped": 0,
    "port_xmit_wait": 0,
    "port_xmit_data": 0,
    "port_rcv_data": 0,
    "port_xmit_packets": 0,
    "port_rcv_packets": 0,
    "unicast_xmit_packets": 0,
    "unicast_rcv_packets": 0,
}
HW_COUNTERS = {
    "out_of_buffer": 0,
    "out_of_sequence": 0,
    "local_ack_timeout_err": 0,
    "rnr_nak_retry_err": 0,
    "packet_seq_err": 0,
}
ROCE_COUNTERS = {
    "np_cnp_sent": 0,
    "np_ecn_marked_roce_packets": 0,
    "rp_cnp_handled": 0,
    "rp_cnp_ignored": 0,
    "roce_adp_retrans": 0,
}


class FakeSysfs:
    """A sysfs root in a temp dir, built device by device."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pci(
        self, chain: tuple[str, ...], *, vendor: int, device: int, pci_class: int, numa: int
    ) -> Path:
        """A PCI function at devices/<chain>, linked from bus/pci/devices/<BDF>."""
        path = self.root / "devices" / Path(*chain)
        path.mkdir(parents=True, exist_ok=True)
        (path / "vendor").write_text(f"0x{vendor:04x}\n")
        (path / "device").write_text(f"0x{device:04x}\n")
        (path / "class").write_text(f"0x{pci_class:06x}\n")
        (path / "numa_node").write_text(f"{numa}\n")
        link = self.root / "bus" / "pci" / "devices" / chain[-1]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(path, link.parent))
        return path

    def gpu(self, chain: tuple[str, ...], *, numa: int, pci_class: int = 0x030200) -> Path:
        return self.pci(chain, vendor=0x10DE, device=0x2330, pci_class=pci_class, numa=numa)

    def hca(
        self,
        name: str,
        chain: tuple[str, ...],
        *,
        numa: int,
        link_layer: str = "InfiniBand",
        rate: str = "400 Gb/sec (4X NDR)",
        state: str = "4: ACTIVE",
        phys_state: str = "5: LinkUp",
        netdev: str | None = None,
        counters: dict[str, int | str] | None = None,
        hw_counters: dict[str, int | str] | None = None,
    ) -> Path:
        """An mlx5 device with one port; returns the port's folder."""
        ib = link_layer == "InfiniBand"
        pci = self.pci(
            chain, vendor=0x15B3, device=0x1021, pci_class=0x020700 if ib else 0x020000, numa=numa
        )
        if netdev:
            (pci / "net" / netdev).mkdir(parents=True)
        dev = pci / "infiniband" / name
        dev.mkdir(parents=True)
        (dev / "device").symlink_to(Path("..", "..", "..", chain[-1]))
        (dev / "fw_ver").write_text("28.39.1002\n")
        (dev / "board_id").write_text("MT_0000000838\n")
        (dev / "hca_type").write_text("MT4129\n")
        (dev / "node_guid").write_text("b83f:d203:0011:2233\n")
        port = dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text(phys_state + "\n")
        (port / "rate").write_text(rate + "\n")
        (port / "link_layer").write_text(link_layer + "\n")
        (port / "lid").write_text("0x1a\n" if ib else "0x0\n")
        (port / "sm_lid").write_text("0x1\n" if ib else "0x0\n")
        if not ib:
            (port / "gid_attrs" / "ndevs").mkdir(parents=True)
            (port / "gid_attrs" / "ndevs" / "0").write_text(f"{netdev or ''}\n")
        values = dict(IB_COUNTERS) if counters is None else counters
        for key, value in values.items():
            (port / "counters" / key).write_text(f"{value}\n")
        hw: dict[str, int | str] = dict(HW_COUNTERS, **({} if ib else ROCE_COUNTERS))
        hw.update(hw_counters or {})
        for key, value in hw.items():
            (port / "hw_counters" / key).write_text(f"{value}\n")
        (port / "hw_counters" / "lifespan").write_text("10\n")
        link = self.root / "class" / "infiniband" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(dev, link.parent))
        return port

    def numa(self, node: int, cpus: str, package: int) -> None:
        base = self.root / "devices" / "system"
        (base / "node" / f"node{node}").mkdir(parents=True, exist_ok=True)
        (base / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
        first = cpus.split("-")[0].split(",")[0]
        topo = base / "cpu" / f"cpu{first}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        (topo / "physical_package_id").write_text(f"{package}\n")

    def modules(self, *names: str) -> None:
        for name in names:
            (self.root / "module" / name).mkdir(parents=True, exist_ok=True)


def set_value(port: Path, name: str, value: int | str, folder: str = "counters") -> None:
    (port / folder / name).write_text(f"{value}\n")


def dgx_h100_slice(root: Path) -> FakeSysfs:
    """Two sockets of a DGX H100, cut down: per socket one GPU and one NDR NIC under one
    Gen5 switch, and a 200G Ethernet storage port on socket 0's own root port."""
    fs = FakeSysfs(root)
    fs.numa(0, "0-55,112-167", 0)
    fs.numa(1, "56-111,168-223", 1)
    # socket 0: pci0000:15 -> root port 15:01.0 -> switch 16:00.0 -> DSPs 17:00.0 / 17:01.0
    sw0 = ("pci0000:15", "0000:15:01.0", "0000:16:00.0")
    fs.gpu((*sw0, "0000:17:00.0", "0000:1b:00.0"), numa=0)
    fs.hca("mlx5_0", (*sw0, "0000:17:01.0", "0000:18:00.0"), numa=0, netdev="ibp24s0")
    sw1 = ("pci0000:97", "0000:97:01.0", "0000:98:00.0")
    fs.gpu((*sw1, "0000:99:00.0", "0000:9d:00.0"), numa=1)
    fs.hca("mlx5_6", (*sw1, "0000:99:01.0", "0000:9a:00.0"), numa=1, netdev="ibp154s0")
    fs.hca(
        "mlx5_1",
        ("pci0000:27", "0000:27:01.0", "0000:29:00.0"),
        numa=0,
        link_layer="Ethernet",
        rate="200 Gb/sec (4X HDR)",
        netdev="enp41s0f0np0",
    )
    # an NVSwitch (bridge class) and a NIC from another vendor: not GPUs
    fs.pci(("pci0000:05", "0000:05:00.0"), vendor=0x10DE, device=0x22A3, pci_class=0x068000, numa=0)
    fs.pci(("pci0000:06", "0000:06:00.0"), vendor=0x8086, device=0x1572, pci_class=0x020000, numa=0)
    fs.modules("nvidia", "nvidia_peermem")
    return fs


# --- other projects' sysfs trees (../shared/fixtures, see its README) ------------------

SHARED_FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"
_TTAR_EOF = re.compile(r"(?<!\\)EOF$")


def shared_fixture(*parts: str) -> Path:
    """A file or folder of ../shared/fixtures; skip (fail under GPUCONSOLE_REQUIRE_PEERS=1)
    when it is absent."""
    path = SHARED_FIXTURES.joinpath(*parts)
    require_peer(
        f"fixture {'/'.join(parts)}", path.exists(), f"the shared fixtures at {SHARED_FIXTURES}"
    )
    return path


def unpack_ttar(archive: Path, into: Path) -> None:
    """Extract a ttar archive (procfs's plain-text tar) under `into`, as `ttar -x` does:
    `Directory:`, `Path:` with `Lines: N` and N lines of content, `SymlinkTo:`, `Mode:`;
    a last line ending in an unescaped EOF had no newline; NULLBYTE is a NUL."""
    lines = archive.read_text().splitlines()
    path: Path | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        key, _, value = line.partition(": ")
        if line.startswith("#") or not line:
            continue
        if key == "Directory":
            path = into / value
            path.mkdir(parents=True, exist_ok=True)
        elif key == "Path":
            path = into / value
            path.parent.mkdir(parents=True, exist_ok=True)
        elif key == "Lines" and path is not None:
            count = int(value.split()[0])
            text = []
            for raw in lines[i : i + count]:
                ending = "" if _TTAR_EOF.search(raw) else "\n"
                raw = _TTAR_EOF.sub("", raw).replace("\\EOF", "EOF")
                raw = re.sub(r"(?<!\\)NULLBYTE", "\0", raw).replace("\\NULLBYTE", "NULLBYTE")
                text.append(raw + ending)
            i += count
            path.write_text("".join(text))
        elif key == "SymlinkTo" and path is not None:
            path.symlink_to(value)
        elif key == "Mode" and path is not None:
            path.chmod(int(value, 8) | (0o700 if path.is_dir() else 0o600))
        else:
            raise ValueError(f"{archive}:{i}: unknown ttar line {line!r}")


def ttar_sysfs(fixture: str, into: Path) -> Path:
    """The sysfs root (the folder holding class/infiniband) of a shared ttar fixture,
    unpacked under `into`."""
    unpack_ttar(shared_fixture(fixture, "sys-infiniband.ttar"), into)
    (found,) = {p.parent.parent for p in into.glob("**/class/infiniband")}
    return found
