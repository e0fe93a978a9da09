"""What the NVML source keeps between polls: one record per GPU, its links and MIG instances."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuconsole.readings.nvml import (
    PCIE_REPLAY_WINDOW_S,
    GpmMetrics,
    NvLinkErrors,
    ProcessReading,
    RemoteKind,
)
from gpuconsole.sources.climb import ClimbWindow
from gpuconsole.sources.nvml.linkerrors import LinkErrorWindow


class LinkRecord(msgspec.Struct):
    link: int
    active: bool
    version: int | None = None  # the NVLink generation (4 on H100), not nvmlNvlinkVersion_t
    remote_kind: RemoteKind = RemoteKind.UNKNOWN
    remote_pci_bus_id: str | None = None  # sysfs form
    # replays, recoveries and CRC errors since the driver loaded, at the last inventory round
    errors: tuple[int | None, int | None, int | None] = (None, None, None)


class MigRecord(msgspec.Struct):
    handle: Any
    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    profile_name: str
    slice_count: int
    sm_count: int
    mem_total_bytes: int | None
    placement_start: int | None
    mem_used_bytes: int | None = None
    gpm: GpmMetrics | None = None
    gpm_sample: Any = None
    gpm_spare: Any = None


class GpuRecord(msgspec.Struct):
    """What the source keeps between polls for one GPU."""

    index: int
    handle: Any
    uuid: str
    name: str
    bus_id: str  # sysfs form, 0000:18:00.0
    serial: str | None = None
    module_id: int | None = None
    architecture: str | None = None
    sm_count: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    temp_slowdown_c: float | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    gpm_supported: bool = False
    nvlink_count: int = 0
    unsupported: set[str] = msgspec.field(default_factory=set)
    denied: set[str] = msgspec.field(default_factory=set)  # calls NVML refused this user
    # NotSupported is not forever (a fault can pass): each inventory round asks every such
    # call (and every refused one) once more, when it next comes up
    reprobe: set[str] = msgspec.field(default_factory=set)
    fields: list[int | tuple[int, int]] = msgspec.field(default_factory=list)
    lost_since: float | None = None
    unopened: str | None = None  # why NVML counts this GPU but cannot open it
    errors: list[str] = msgspec.field(default_factory=list)
    # detail tier
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pstate: int | None = None
    throttle: tuple[str, ...] = ()
    throttle_mask: tuple[str, ...] = ()  # as the bitmask said at the last detail poll
    throttle_mask_read: bool = False  # the bitmask answered at the last detail poll
    throttle_ns: dict[int, int] = msgspec.field(default_factory=dict)  # counters at the last poll
    pcie_tx_bytes_per_s: float | None = None  # sampled, where the byte counters are missing
    pcie_rx_bytes_per_s: float | None = None
    pcie_counter_bits: int | None = None  # width of the PCIe byte counters, once read
    processes: tuple[ProcessReading, ...] = ()
    gpm: GpmMetrics | None = None
    gpm_sample: Any = None
    gpm_spare: Any = None
    # inventory tier
    power_limit_w: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_busy: bool | None = None  # whether the GPU was at work when pcie_gen was read
    links: list[LinkRecord] = msgspec.field(default_factory=list)
    mig_enabled: bool | None = None
    mig_pending: bool | None = None
    migs: list[MigRecord] = msgspec.field(default_factory=list)
    mig_profile_names: dict[int, str] | None = None
    virtualization: str | None = None
    fabric_state: str | None = None
    fabric_status: int | None = None  # nvmlReturn_t of the fabric probe, once it completed
    # since when heat or power has held the clocks down without a break; unknown for one
    # already on at the first poll where the driver keeps no slowdown counters
    slowdown_since: float | None = None
    slowdown_unknown: bool = False
    throttle_seen: bool = False  # the reasons were worked out once already
    link_errors: LinkErrorWindow = msgspec.field(default_factory=LinkErrorWindow)
    nvlink_climbed: tuple[NvLinkErrors, ...] = ()  # the links that climbed in the window
    # its PCIe replay counter over the window its health counts it in (one key: the GPU)
    replays: ClimbWindow[int] = msgspec.field(
        default_factory=lambda: ClimbWindow(PCIE_REPLAY_WINDOW_S)
    )
