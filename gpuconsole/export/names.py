"""Every exported metric name, in one place.

GPU metrics keep dcgm-exporter's names and labels so the standard DCGM Grafana
dashboard (12239) works unchanged. dcgm-exporter types a few of them as counters
without the `_total` suffix; here they are gauges with the same name and value, so
`promtool check metrics` passes and every PromQL query (rate() included) still works.
Everything else is `gpuconsole_*` in base units.
"""

from __future__ import annotations

# dcgm-exporter labels, in its order
DCGM_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
OWNER_LABELS = ("pod", "namespace", "container")
# gpuconsole's own metrics use snake_case labels
OWN_LABELS = ("node", "gpu", "uuid")

# (name, help) of per-GPU gauges
DCGM_GPU_UTIL = ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
DCGM_MEM_COPY_UTIL = ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).")
DCGM_FB_USED = ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
DCGM_FB_FREE = ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
DCGM_FB_RESERVED = ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).")
DCGM_GPU_TEMP = ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
DCGM_MEMORY_TEMP = ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).")
DCGM_POWER_USAGE = ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
DCGM_POWER_LIMIT = ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).")
DCGM_ENERGY = (
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "Total energy consumption since boot (in mJ).",
)
DCGM_SM_CLOCK = ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
DCGM_MEM_CLOCK = ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")
DCGM_PSTATE = ("DCGM_FI_DEV_PSTATE", "Performance state (0 is highest).")
DCGM_THROTTLE = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).")
DCGM_PCIE_REPLAY = ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.")
DCGM_PCIE_GEN = ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.")
DCGM_PCIE_WIDTH = ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width.")
DCGM_XID = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
DCGM_ECC_SBE_VOL = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total single-bit volatile ECC errors.")
DCGM_ECC_DBE_VOL = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total double-bit volatile ECC errors.")
DCGM_ECC_SBE_AGG = ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total single-bit persistent ECC errors.")
DCGM_ECC_DBE_AGG = ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total double-bit persistent ECC errors.")
DCGM_REMAP_COR = ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Rows remapped for correctable errors.")
DCGM_REMAP_UNC = (
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "Rows remapped for uncorrectable errors.",
)
DCGM_REMAP_FAILURE = ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.")
DCGM_REMAP_PENDING = ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether a row remap awaits a GPU reset.")
DCGM_NVLINK_TOTAL = (
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "Total NVLink data moved, all links, both directions (in KiB).",
)

# GPM profiling metrics (ratios 0..1 as dcgm-exporter reports them, or bytes/s)
PROF_GR_ENGINE = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.")
PROF_SM_ACTIVE = ("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.")
PROF_SM_OCCUPANCY = ("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of resident warps to the maximum.")
PROF_TENSOR = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active.")
PROF_DRAM = ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active.")
PROF_FP64 = ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipe is active.")
PROF_FP32 = ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipe is active.")
PROF_FP16 = ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipe is active.")
PROF_PCIE_TX = ("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe bytes transmitted per second.")
PROF_PCIE_RX = ("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe bytes received per second.")
PROF_NVLINK_TX = ("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink bytes transmitted per second.")
PROF_NVLINK_RX = ("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink bytes received per second.")

# gpuconsole's own
PREFIX = "gpuconsole"
SOURCE_UP = (f"{PREFIX}_source_up", "1 when the source's latest poll succeeded.")
SOURCE_LAST_OK = (
    f"{PREFIX}_source_last_success_timestamp_seconds",
    "When the source last returned a reading.",
)
SOURCE_STALE = (f"{PREFIX}_source_stale_seconds", "How long the source has been stale (0: fresh).")
SOURCE_POLL = (f"{PREFIX}_source_poll_duration_seconds", "Duration of the source's last poll.")
GPU_INFO = (f"{PREFIX}_gpu_info", "Identity and placement of a GPU.")
GPU_LOST = (f"{PREFIX}_gpu_lost", "1 when the GPU fell off the bus or needs a reset.")
GPU_HEALTH = (f"{PREFIX}_gpu_health", "GPU health at a glance: 1 for the current state.")
GPU_THROTTLE = (f"{PREFIX}_gpu_throttle_reason", "1 for each active clock throttle reason.")
GPU_NVLINK_ACTIVE = (f"{PREFIX}_gpu_nvlink_active_links", "NVLinks up on this GPU.")
GPU_PCIE_MAX_GEN = (f"{PREFIX}_gpu_pcie_max_link_generation", "PCIe generation the GPU supports.")
GPU_PCIE_MAX_WIDTH = (f"{PREFIX}_gpu_pcie_max_link_width", "PCIe width the GPU supports.")
GPU_PCIE_DOWNTRAINED = (f"{PREFIX}_gpu_pcie_downtrained", "1 when the link runs below its max.")
NVLINK_TX = (f"{PREFIX}_nvlink_transmit_bytes_total", "Bytes sent on one NVLink.")
NVLINK_RX = (f"{PREFIX}_nvlink_receive_bytes_total", "Bytes received on one NVLink.")
MIG_INFO = (f"{PREFIX}_mig_instance_info", "A MIG instance carved out of a GPU.")
TOPOLOGY = (f"{PREFIX}_gpu_topology_info", "How two GPUs are connected (nvidia-smi topo codes).")
EVENTS = (f"{PREFIX}_events_total", "Events recorded, by kind and severity.")
NODE_SIMULATED = (f"{PREFIX}_node_simulated", "1 when the node's data comes from the simulator.")
SNAPSHOT_AGE = (f"{PREFIX}_snapshot_timestamp_seconds", "When the exported snapshot was taken.")
