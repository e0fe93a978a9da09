"""GPU metrics from NVML's reading: dcgm-exporter's names and labels, and gpuconsole_gpu_*."""

from __future__ import annotations

from gpuconsole.export import names
from gpuconsole.export.families import Families, Labels, Spec
from gpuconsole.export.ownership import PodLabels
from gpuconsole.facts.inventory import short_bus_id
from gpuconsole.facts.ownership import Ownership
from gpuconsole.facts.verdict import SLOWDOWNS, gpu_verdict
from gpuconsole.readings.base import nvml_bus_id
from gpuconsole.readings.nvml import GpmMetrics, GpuReading
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.nvml.lib import THROTTLE_BITS

MIB = 1024 * 1024
HEALTH_STATES = ("ok", "warning", "critical", "stale", "unknown")
_GPU_INFO = (
    "node",
    "gpu",
    "uuid",
    "model",
    "pci_bus_id",
    "serial",
    "architecture",
    "numa_node",
    "module_id",
)
_MIG_INFO = (*names.OWN_LABELS, "gpu_instance", "profile", "mig_uuid", "sm_count")
_MIG = (*names.DCGM_LABELS, *names.MIG_LABELS)
_SLOWDOWN_MASK = sum(bit for bit, name in THROTTLE_BITS if name in SLOWDOWNS)


def _identity(gpu: GpuReading, ownership: Ownership | None) -> tuple[str, str, str]:
    """UUID, bus id (NVML's form) and model to label a GPU's series by: NVML's; for a GPU
    NVML lost before it could read them, what sysfs and the nvidia driver say of it (as
    ownership joins them), else empty. Never NVML's placeholders ('unknown-5', 'unknown'):
    they name no GPU, and the number in one is NVML's, which changes when it renumbers."""
    if ":" in gpu.pci_bus_id:
        return gpu.uuid, nvml_bus_id(gpu.pci_bus_id), gpu.name
    known = ownership.gpus if ownership is not None else ()
    owner = next((g for g in known if g.index == gpu.index and ":" in g.bus_id), None)
    if owner is None:
        return "", "", ""
    return owner.uuid or "", nvml_bus_id(owner.bus_id), owner.model or ""


def _dcgm_values(node: NodeSnapshot, index: str, ident: tuple[str, str, str]) -> Labels:
    uuid, bus, model = ident  # the bus in dcgm-exporter's form, which dashboards join on
    device = f"nvidia{index}" if index.isdigit() else ""  # /dev/nvidiaN: a host GPU's
    return (index, uuid, device, model, node.node, bus)


def gpu_metrics(
    out: Families,
    node: NodeSnapshot,
    gpu: GpuReading,
    pods: PodLabels,
    ownership: Ownership | None = None,
    *,
    guest_bus: str | None = None,
) -> bool:
    """Every series of one GPU and its MIG instances; whether it wrote a health flag above
    0 (what gpuconsole_node_gpus_flagged counts). `guest_bus`: the host's bus id of a
    guest's GPU (its agent's reading), which the host's NVML does not number: its gpu
    label is that bus id as the console shows it."""
    ident = _identity(gpu, ownership)
    uuid, bus, model = ident
    pod = pods.gpus.get(uuid) if uuid else None
    number = _number(gpu.index) if guest_bus is None else short_bus_id(guest_bus)
    base = _dcgm_values(node, number, ident)
    labels = names.DCGM_LABELS if pod is None else (*names.DCGM_LABELS, *pod[0])
    values = base if pod is None else (*base, *pod[1])
    own, own_values = names.OWN_LABELS, (node.node, number, uuid)
    if out.wants(names.GPU_HEALTH):
        # its verdict's health, the one every console shows: a guest's GPU's by its bus id
        health = gpu_verdict(node, gpu if guest_bus is None else guest_bus).health.value
        for state in HEALTH_STATES:
            out.gauge(names.GPU_HEALTH, (*own, "state"), (*own_values, state),
                      float(state == health))  # fmt: skip
    out.gauge(names.GPU_LOST, own, own_values, float(gpu.lost))
    out.gauge(
        names.GPU_INFO,
        _GPU_INFO,
        (
            node.node,
            number,
            uuid,
            model,
            bus,
            gpu.serial or "",
            gpu.architecture or "",
            "" if gpu.numa_node is None else str(gpu.numa_node),
            "" if gpu.module_id is None else str(gpu.module_id),
        ),
        1.0,
    )
    if gpu.unreadable:  # nothing read: no series, not a row of zeros
        return gpu.lost
    xid = node.last_xid.get(uuid)
    out.gauge(names.DCGM_XID, labels, values, float(xid or 0))
    if gpu.lost:
        return True

    def put(spec: Spec, value: float | int | None, scale: float = 1.0) -> None:
        if value is not None:
            out.gauge(spec, labels, values, float(value) * scale)

    put(names.DCGM_GPU_UTIL, gpu.util_gpu_pct)
    put(names.DCGM_MEM_COPY_UTIL, gpu.util_mem_pct)
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes is not None:
        reserved = gpu.mem_reserved_bytes or 0  # unknown: NVML's v1 counts it as used
        put(names.DCGM_FB_USED, gpu.mem_used_bytes / MIB)
        put(names.DCGM_FB_FREE, (gpu.mem_total_bytes - gpu.mem_used_bytes - reserved) / MIB)
        put(names.DCGM_FB_RESERVED, gpu.mem_reserved_bytes, 1 / MIB)
    put(names.DCGM_GPU_TEMP, gpu.temp_gpu_c)
    put(names.DCGM_MEMORY_TEMP, gpu.temp_hbm_c)
    put(names.DCGM_POWER_USAGE, gpu.power_w)
    put(names.DCGM_POWER_LIMIT, gpu.power_limit_w)
    put(names.DCGM_ENERGY, gpu.energy_mj_total)
    put(names.DCGM_SM_CLOCK, gpu.sm_clock_mhz)
    put(names.DCGM_MEM_CLOCK, gpu.mem_clock_mhz)
    put(names.DCGM_PSTATE, gpu.pstate)
    mask = 0
    if gpu.throttle_known:
        mask = sum(bit for bit, name in THROTTLE_BITS if name in gpu.throttle_reasons)
        put(names.DCGM_THROTTLE, mask)
    for _bit, reason in THROTTLE_BITS:
        if reason in gpu.throttle_reasons:
            out.gauge(names.GPU_THROTTLE, (*own, "reason"), (*own_values, reason), 1.0)
    pcie = gpu.pcie
    put(names.DCGM_PCIE_REPLAY, pcie.replay_count)
    put(names.DCGM_PCIE_GEN, pcie.gen_current)
    put(names.DCGM_PCIE_WIDTH, pcie.width_current)

    def own_put(spec: Spec, value: float | int | None) -> None:
        if value is not None:
            out.gauge(spec, own, own_values, float(value))

    own_put(names.GPU_PCIE_MAX_GEN, pcie.gen_max)
    own_put(names.GPU_PCIE_MAX_WIDTH, pcie.width_max)
    known = (pcie.gen_current is not None and pcie.gen_max is not None) or (
        pcie.width_current is not None and pcie.width_max is not None
    )
    own_put(names.GPU_PCIE_DOWNTRAINED, float(pcie.downtrained) if known else None)
    ecc = gpu.ecc
    put(names.DCGM_ECC_SBE_VOL, ecc.volatile_corrected)
    put(names.DCGM_ECC_DBE_VOL, ecc.volatile_uncorrected)
    put(names.DCGM_ECC_SBE_AGG, ecc.aggregate_corrected)
    put(names.DCGM_ECC_DBE_AGG, ecc.aggregate_uncorrected)
    put(names.DCGM_REMAP_COR, ecc.remapped_corrected)
    put(names.DCGM_REMAP_UNC, ecc.remapped_uncorrected)
    if ecc.remap_failure is not None:
        put(names.DCGM_REMAP_FAILURE, float(ecc.remap_failure))
    if ecc.remap_pending is not None:
        put(names.DCGM_REMAP_PENDING, float(ecc.remap_pending))
    put(names.DCGM_RETIRED_SBE, ecc.retired_sbe)
    put(names.DCGM_RETIRED_DBE, ecc.retired_dbe)
    if ecc.retired_pending is not None:
        put(names.DCGM_RETIRED_PENDING, float(ecc.retired_pending))
    if gpu.nvlinks:
        _nvlink_metrics(out, node, gpu, labels, values, own_values)
    if out.wants(*_PROFILING):
        _profiling(out, labels, values, gpu.gpm, _counted_rates(node, gpu))
    if out.wants(names.MIG_INFO, names.DCGM_FB_USED, *_PROFILING):
        _mig_metrics(out, gpu, pods, base, own_values)
    # the flags the Prometheus overview asks of a node's GPUs where this count is above 0,
    # each as written above
    return bool(
        (xid or 0) > 0
        or mask & _SLOWDOWN_MASK
        or (ecc.volatile_uncorrected or 0) > 0
        or ecc.remap_failure
        or ecc.remap_pending
        or (ecc.retired_sbe or 0) > 0
        or (ecc.retired_dbe or 0) > 0
        or ecc.retired_pending
    )


# GPU and link numbers as label values, made once: the same string objects every time, whose
# hash is kept, where an evaluation looks up each series by its label values
_NUMBERS = tuple(str(n) for n in range(256))


def _number(n: int) -> str:
    return _NUMBERS[n] if 0 <= n < 256 else str(n)


def _nvlink_metrics(
    out: Families,
    node: NodeSnapshot,
    gpu: GpuReading,
    labels: Labels,
    values: Labels,
    own_values: Labels,
) -> None:
    """A GPU's NVLink series: links up, the traffic of all, each link's counters."""
    own = names.OWN_LABELS
    if out.wants(names.GPU_NVLINK_ACTIVE):
        out.gauge(names.GPU_NVLINK_ACTIVE, own, own_values, float(gpu.nvlinks_active))
    if out.wants(names.DCGM_NVLINK_TOTAL):
        total = _nvlink_kib_per_s(node, gpu, "tx_kib", "rx_kib")
        if total is not None:
            out.gauge(names.DCGM_NVLINK_TOTAL, labels, values, float(total) * (1 / 1024))
    traffic = out.wants(names.NVLINK_TX, names.NVLINK_RX)
    errors = out.wants(names.GPU_NVLINK_ERRORS)
    if not (traffic or errors):
        return
    link_labels = (*own, "link", "remote")
    error_labels = (*own, "link", "counter")
    node_name, number, uuid = own_values
    counter = out.counter
    rows: list[tuple[Labels, Labels, float]] = []
    row = rows.append
    for link in gpu.nvlinks:
        number_of = _number(link.link)
        if traffic:
            lv = (node_name, number, uuid, number_of, link.remote_kind.value)
            if link.tx_kib_total is not None:
                counter(names.NVLINK_TX, link_labels, lv, link.tx_kib_total * 1024.0)
            if link.rx_kib_total is not None:
                counter(names.NVLINK_RX, link_labels, lv, link.rx_kib_total * 1024.0)
        if not errors:
            continue
        # one counter of each kind a link, written out and handed over together: a large
        # fleet has 100,000s of them
        if (total := link.replay_errors_total) is not None:
            row((error_labels, (node_name, number, uuid, number_of, "replay"), total))
        if (total := link.recovery_errors_total) is not None:
            row((error_labels, (node_name, number, uuid, number_of, "recovery"), total))
        if (total := link.crc_errors_total) is not None:
            row((error_labels, (node_name, number, uuid, number_of, "crc"), total))
    out.counters(names.GPU_NVLINK_ERRORS, rows)


def _mig_metrics(
    out: Families, gpu: GpuReading, pods: PodLabels, base: Labels, own_values: Labels
) -> None:
    """The series of each MIG instance of a GPU."""
    for mig in gpu.mig_instances:
        mig_pod = pods.migs.get(mig.uuid)
        mig_labels = _MIG if mig_pod is None else (*_MIG, *mig_pod[0])
        mig_values: Labels = (*base, mig.profile_name, str(mig.gpu_instance_id))
        if mig_pod is not None:
            mig_values = (*mig_values, *mig_pod[1])
        out.gauge(
            names.MIG_INFO,
            _MIG_INFO,
            (*own_values, str(mig.gpu_instance_id), mig.profile_name, mig.uuid, str(mig.sm_count)),
            1.0,
        )
        if mig.mem_used_bytes is not None:
            out.gauge(names.DCGM_FB_USED, mig_labels, mig_values, mig.mem_used_bytes / MIB)
        _profiling(out, mig_labels, mig_values, mig.gpm, _NO_RATES)


def _nvlink_kib_per_s(node: NodeSnapshot, gpu: GpuReading, *directions: str) -> float | None:
    """The NVLink data counters of every link, summed, from the hub's rates (None until
    two polls, or on a GPU without NVLink counters)."""
    rates = [
        node.rate("gpu", gpu.uuid, "nvlink", str(link.link), direction)
        for link in gpu.nvlinks
        for direction in directions
    ]
    known = [rate for rate in rates if rate is not None]
    return sum(known) if known else None


# PCIe tx, rx, NVLink tx, rx, in bytes/s
ByteRates = tuple[float | None, float | None, float | None, float | None]
_NO_RATES: ByteRates = (None, None, None, None)
_BYTE_RATES = (names.PROF_PCIE_TX, names.PROF_PCIE_RX, names.PROF_NVLINK_TX, names.PROF_NVLINK_RX)
_RATIOS = (
    names.PROF_GR_ENGINE,
    names.PROF_SM_ACTIVE,
    names.PROF_SM_OCCUPANCY,
    names.PROF_TENSOR,
    names.PROF_DRAM,
    names.PROF_FP64,
    names.PROF_FP32,
    names.PROF_FP16,
)
_PROFILING = (*_RATIOS, *_BYTE_RATES)  # every family _profiling writes


def _counted_rates(node: NodeSnapshot, gpu: GpuReading) -> ByteRates:
    """PCIe and NVLink bytes/s from NVML's counters, for a GPU whose GPM lacks them."""
    pcie_tx, pcie_rx = node.pcie_rates(gpu)
    nvlink_tx = _nvlink_kib_per_s(node, gpu, "tx_kib")
    nvlink_rx = _nvlink_kib_per_s(node, gpu, "rx_kib")
    return (
        pcie_tx,
        pcie_rx,
        None if nvlink_tx is None else nvlink_tx * 1024,
        None if nvlink_rx is None else nvlink_rx * 1024,
    )


def _profiling(
    out: Families, labels: Labels, values: Labels, gpm: GpmMetrics | None, counted: ByteRates
) -> None:
    """DCGM_FI_PROF_* of a GPU or MIG instance: ratios only from GPM, never estimated from
    other figures; byte rates from GPM, else from `counted`."""
    measured: ByteRates = _NO_RATES
    if gpm is not None:
        pcts = (
            gpm.graphics_util_pct,
            gpm.sm_util_pct,
            gpm.sm_occupancy_pct,
            gpm.tensor_util_pct,
            gpm.dram_bw_util_pct,
            gpm.fp64_util_pct,
            gpm.fp32_util_pct,
            gpm.fp16_util_pct,
        )
        for spec, pct in zip(_RATIOS, pcts, strict=True):
            if pct is not None:
                out.gauge(spec, labels, values, pct / 100.0)
        measured = (
            gpm.pcie_tx_bytes_per_s,
            gpm.pcie_rx_bytes_per_s,
            gpm.nvlink_tx_bytes_per_s,
            gpm.nvlink_rx_bytes_per_s,
        )
    for spec, rate, fallback in zip(_BYTE_RATES, measured, counted, strict=True):
        value = rate if rate is not None else fallback
        if value is not None:
            out.gauge(spec, labels, values, value)


def topology_metrics(out: Families, node: NodeSnapshot) -> None:
    """How each pair of GPUs is connected, in nvidia-smi's topo codes."""
    if node.nvml is None or not out.wants(names.TOPOLOGY):
        return
    for i, row in enumerate(node.nvml.gpu_topology):
        for j, code in enumerate(row):
            if i != j and code != "?":  # "?": NVML did not say (a GPU it cannot open)
                out.gauge(
                    names.TOPOLOGY,
                    ("node", "gpu", "peer", "level"),
                    (node.node, str(i), str(j), code),
                    1.0,
                )
