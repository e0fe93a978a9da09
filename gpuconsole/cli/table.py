"""`gpuconsole snapshot`'s plain-text table: one block per node, one row per GPU."""

from __future__ import annotations

from gpuconsole import format as fmt
from gpuconsole.hardware import product_name
from gpuconsole.readings.bmc import BmcReading
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.readings.tenancy import PciGpu


def _node_table(node: NodeSnapshot) -> list[str]:
    from gpuconsole.facts.inventory import node_gpus
    from gpuconsole.facts.summaries import bmc_unread
    from gpuconsole.facts.verdict import gpu_verdict, node_verdict

    nvml = node.nvml
    product = product_name(node.profile) or ""
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
    verdict = node_verdict(node)
    lines.append(f"  verdict: {verdict.health.value}, {verdict.action.words}")
    lines.extend(f"    {f.severity.value}: {f.message}" for f in verdict.problems)
    if node.bmc is not None:
        lines.append(_bmc_line(node.bmc))
        lines.extend(f"    not read: {p.part}: {p.detail}" for p in bmc_unread(node.bmc))
    # Every GPU, NVML's and those only sysfs sees (a guest's, through vfio-pci), with owners.
    gpus = node_gpus(node)
    if not gpus:
        return lines
    rows: list[tuple[str, ...]] = [
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
            "OWNER",
        )
    ]
    for row in gpus:
        gpu = row.reading
        if gpu is None or gpu.lost:
            state = "LOST" if gpu is not None else (row.driver or "not in NVML")
            rows.append(
                (
                    str(row.index) if row.index is not None else "-",
                    row.model or _pci_name(row.pci),
                    gpu.pci_bus_id if gpu is not None else row.bus_id,
                    state,
                    *([fmt.NA] * 7),
                    gpu_verdict(node, row).health.value,
                    row.label,
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
                gpu.pci_bus_id,  # as sysfs and lspci write it, the same for every row
                util,
                memory,
                fmt.celsius(gpu.temp_gpu_c),
                fmt.celsius(gpu.temp_hbm_c),
                power,
                fmt.mhz(gpu.sm_clock_mhz),
                fmt.throttle_words(gpu.throttle_reasons),
                ecc,
                gpu_verdict(node, row).health.value,
                row.label,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for line in rows:
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        )
    return lines


def _pci_name(pci: PciGpu | None) -> str:
    """What sysfs alone can name a GPU by: its PCI device id."""
    if pci is None or pci.device_id is None:
        return "unknown"
    return f"NVIDIA [10de:{pci.device_id:04x}]"


def _bmc_line(bmc: BmcReading) -> str:
    """The server around the GPUs in one line: power, temperatures, fans and PSUs, and
    which Redfish schema was read."""
    from gpuconsole.facts.summaries import bmc_schema

    fans = f"fans {bmc.fans_present - bmc.fans_failed}/{bmc.fans_present} ok"
    psus = bmc.psu_words
    schema = bmc_schema(bmc)
    return (
        f"  BMC: power {bmc.power_state}  {fmt.watts(bmc.power_w)}  "
        f"inlet {fmt.celsius(bmc.inlet_c)}  exhaust {fmt.celsius(bmc.exhaust_c)}  {fans}  {psus}"
        + (f"  ({schema})" if schema else "")
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
