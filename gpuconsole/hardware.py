"""Hardware facts that do not change between two machines of one model: GPU datasheets,
server product names and NVSwitch partition tables.

Facts follow ../shared/DOMAIN.md (published datasheets, the DGX user guides, the Fabric
Manager user guide). The simulator builds its servers from these; production code reads them
here, never from the simulator.
"""

from __future__ import annotations

import msgspec

GIB = 1024**3
MIB = 1024**2

# nvmlGpuTopologyLevel_t values, and the codes nvidia-smi prints for them.
TOPO_LEVEL = {"X": 0, "PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class MigProfile(msgspec.Struct, frozen=True):
    """A GPU instance profile as `nvidia-smi mig -lgip` lists it."""

    name: str  # "3g.40gb"
    profile_id: int  # the id nvidia-smi prints (19, 15, 14, 9, 5, 0)
    index: int  # NVML_GPU_INSTANCE_PROFILE_* constant
    slices: int
    sm_count: int
    mem_bytes: int
    max_instances: int


class GpuModel(msgspec.Struct, frozen=True):
    """What does not change between two GPUs of one model."""

    name: str  # as nvmlDeviceGetName returns it
    short: str  # "H100", for narrow columns
    architecture: str  # "hopper", "ampere"
    arch_code: int  # NVML_DEVICE_ARCH_*
    pci_device_id: int  # (device << 16) | vendor, as nvmlPciInfo.pciDeviceId
    sm_count: int
    gpc_count: int
    tpc_per_gpc: tuple[int, ...]  # TPCs enabled in each GPC; 2 SMs per TPC
    fp32_cores_per_sm: int
    tensor_cores_per_sm: int
    l2_bytes: int
    mem_bytes: int
    mem_kind: str
    mem_bandwidth_bytes_per_s: int
    tdp_w: int
    power_min_w: int
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    mem_clock_mhz: int
    temp_slowdown_c: int
    temp_shutdown_c: int
    nvlink_gen: int
    nvlink_count: int
    nvlink_gbytes_per_s: int  # all links, both directions, as NVIDIA quotes it
    pcie_gen_max: int
    pcie_width_max: int
    gpm: bool
    mig_profiles: tuple[MigProfile, ...]


H100_MIG = (
    MigProfile("1g.10gb", 19, 0, 1, 16, 10 * GIB, 7),
    MigProfile("1g.20gb", 15, 7, 1, 26, 20 * GIB, 4),
    MigProfile("2g.20gb", 14, 1, 2, 32, 20 * GIB, 3),
    MigProfile("3g.40gb", 9, 2, 3, 60, 40 * GIB, 2),
    MigProfile("4g.40gb", 5, 3, 4, 64, 40 * GIB, 1),
    MigProfile("7g.80gb", 0, 4, 7, 132, 80 * GIB, 1),
)

A100_40_MIG = (
    MigProfile("1g.5gb", 19, 0, 1, 14, 5 * GIB, 7),
    MigProfile("1g.10gb", 15, 7, 1, 14, 10 * GIB, 4),
    MigProfile("2g.10gb", 14, 1, 2, 28, 10 * GIB, 3),
    MigProfile("3g.20gb", 9, 2, 3, 42, 20 * GIB, 2),
    MigProfile("4g.20gb", 5, 3, 4, 56, 20 * GIB, 1),
    MigProfile("7g.40gb", 0, 4, 7, 98, 40 * GIB, 1),
)

H100_SXM5 = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    short="H100",
    architecture="hopper",
    arch_code=9,
    pci_device_id=(0x2330 << 16) | 0x10DE,
    sm_count=132,
    gpc_count=8,
    # 66 TPCs over 8 GPCs (the full die has 8x9); which TPCs are fused off varies by part.
    tpc_per_gpc=(9, 9, 8, 8, 8, 8, 8, 8),
    fp32_cores_per_sm=128,
    tensor_cores_per_sm=4,
    l2_bytes=50 * MIB,
    mem_bytes=80 * GIB,
    mem_kind="HBM3",
    mem_bandwidth_bytes_per_s=3_350_000_000_000,
    tdp_w=700,
    power_min_w=200,
    sm_clock_max_mhz=1980,
    sm_clock_idle_mhz=345,
    mem_clock_mhz=2619,
    temp_slowdown_c=87,
    temp_shutdown_c=92,
    nvlink_gen=4,
    nvlink_count=18,
    nvlink_gbytes_per_s=900,
    pcie_gen_max=5,
    pcie_width_max=16,
    gpm=True,
    mig_profiles=H100_MIG,
)

H200_MIG = (
    MigProfile("1g.18gb", 19, 0, 1, 16, 18 * GIB, 7),
    MigProfile("1g.35gb", 15, 7, 1, 26, 35 * GIB, 4),
    MigProfile("2g.35gb", 14, 1, 2, 32, 35 * GIB, 3),
    MigProfile("3g.71gb", 9, 2, 3, 60, 71 * GIB, 2),
    MigProfile("4g.71gb", 5, 3, 4, 64, 71 * GIB, 1),
    MigProfile("7g.141gb", 0, 4, 7, 132, 141 * GIB, 1),
)

# The H100's die with 141 GB of HBM3e. Name, PCI id, memory, clocks, slowdown and power limit
# as NVML answered on a real H200 SXM (driver 580.159.04); the rest from NVIDIA's datasheet.
H200_SXM = GpuModel(
    name="NVIDIA H200",
    short="H200",
    architecture="hopper",
    arch_code=9,
    pci_device_id=(0x2335 << 16) | 0x10DE,
    sm_count=132,
    gpc_count=8,
    tpc_per_gpc=(9, 9, 8, 8, 8, 8, 8, 8),
    fp32_cores_per_sm=128,
    tensor_cores_per_sm=4,
    l2_bytes=60 * MIB,  # as CUDA reports it on the H200 this project ran on
    mem_bytes=150_754_820_096,
    mem_kind="HBM3e",
    mem_bandwidth_bytes_per_s=4_800_000_000_000,
    tdp_w=700,
    power_min_w=200,
    sm_clock_max_mhz=1980,
    sm_clock_idle_mhz=345,
    mem_clock_mhz=3201,
    temp_slowdown_c=89,
    temp_shutdown_c=92,
    nvlink_gen=4,
    nvlink_count=18,
    nvlink_gbytes_per_s=900,
    pcie_gen_max=5,
    pcie_width_max=16,
    gpm=True,
    mig_profiles=H200_MIG,
)

A100_SXM4_40GB = GpuModel(
    name="NVIDIA A100-SXM4-40GB",
    short="A100",
    architecture="ampere",
    arch_code=7,
    pci_device_id=(0x20B0 << 16) | 0x10DE,
    sm_count=108,
    gpc_count=8,
    # 54 TPCs over 8 GPCs (full die 8x8): one GPC carries only 5 TPCs on SXM4 parts.
    tpc_per_gpc=(7, 7, 7, 7, 7, 7, 7, 5),
    fp32_cores_per_sm=64,
    tensor_cores_per_sm=4,
    l2_bytes=40 * MIB,
    mem_bytes=40 * GIB,
    mem_kind="HBM2",
    mem_bandwidth_bytes_per_s=1_555_000_000_000,
    tdp_w=400,
    power_min_w=100,
    sm_clock_max_mhz=1410,
    sm_clock_idle_mhz=210,
    mem_clock_mhz=1215,
    temp_slowdown_c=85,
    temp_shutdown_c=90,
    nvlink_gen=3,
    nvlink_count=12,
    nvlink_gbytes_per_s=600,
    pcie_gen_max=4,
    pcie_width_max=16,
    gpm=False,
    mig_profiles=A100_40_MIG,
)

# PCIe A100 for the PCIe-switch server: no NVLink, 250 W.
A100_PCIE_40GB = GpuModel(
    name="NVIDIA A100-PCIE-40GB",
    short="A100P",
    architecture="ampere",
    arch_code=7,
    pci_device_id=(0x20F1 << 16) | 0x10DE,
    sm_count=108,
    gpc_count=8,
    tpc_per_gpc=(7, 7, 7, 7, 7, 7, 7, 5),
    fp32_cores_per_sm=64,
    tensor_cores_per_sm=4,
    l2_bytes=40 * MIB,
    mem_bytes=40 * GIB,
    mem_kind="HBM2",
    mem_bandwidth_bytes_per_s=1_555_000_000_000,
    tdp_w=250,
    power_min_w=150,
    sm_clock_max_mhz=1410,
    sm_clock_idle_mhz=210,
    mem_clock_mhz=1215,
    temp_slowdown_c=85,
    temp_shutdown_c=90,
    nvlink_gen=0,
    nvlink_count=0,
    nvlink_gbytes_per_s=0,
    pcie_gen_max=4,
    pcie_width_max=16,
    gpm=False,
    mig_profiles=A100_40_MIG,
)

# SXM2 V100 of the DGX-1 (Volta): dynamic page retirement instead of row remapping, no MIG,
# no GPM, six NVLink 2 links joined GPU to GPU (no NVSwitch). From NVIDIA's V100 datasheet and
# whitepaper (80 SMs over 6 GPCs, 40 of the die's 42 TPCs), the PCI id from pci.ids.
V100_SXM2_32GB = GpuModel(
    name="Tesla V100-SXM2-32GB",
    short="V100",
    architecture="volta",
    arch_code=5,
    pci_device_id=(0x1DB5 << 16) | 0x10DE,
    sm_count=80,
    gpc_count=6,
    tpc_per_gpc=(7, 7, 7, 7, 6, 6),
    fp32_cores_per_sm=64,
    tensor_cores_per_sm=8,
    l2_bytes=6 * MIB,
    mem_bytes=32 * GIB,
    mem_kind="HBM2",
    mem_bandwidth_bytes_per_s=900_000_000_000,
    tdp_w=300,
    power_min_w=150,
    sm_clock_max_mhz=1530,
    sm_clock_idle_mhz=135,
    mem_clock_mhz=877,
    temp_slowdown_c=87,
    temp_shutdown_c=90,
    nvlink_gen=2,
    nvlink_count=6,
    nvlink_gbytes_per_s=300,
    pcie_gen_max=3,
    pcie_width_max=16,
    gpm=False,
    mig_profiles=(),
)


# Server products by the profile name a simulated node carries (NodeSnapshot.profile).
PRODUCTS = {
    "dgx-h100": "DGX H100",
    "dgx-a100": "DGX A100",
    "apollo-pcie": "Apollo 6500 Gen10 Plus (XL675d, PCIe GPUs)",
    "dgx-1v": "DGX-1 (V100)",
}


def product_name(profile: str | None) -> str | None:
    """The product a server profile names ("DGX H100"), if known."""
    return None if profile is None else PRODUCTS.get(profile)


# NVSwitch full passthrough (Fabric Manager user guide): the partitions a guest may hold, by
# GPU count, and how many of the baseboard's NVSwitches go to the guest with them.
H100_SWITCHES = {1: 0, 8: 4}  # and a single GPU only with its NVLinks disabled
A100_SWITCHES = {1: 0, 2: 1, 4: 3, 8: 6, 16: 12}
H100_PARTITIONS = frozenset(H100_SWITCHES)
A100_PARTITIONS = frozenset(A100_SWITCHES)
A100_BOARD_GPUS, A100_BOARD_SWITCHES = 8, 6


MODELS: tuple[GpuModel, ...] = (
    H100_SXM5,
    H200_SXM,
    A100_SXM4_40GB,
    A100_PCIE_40GB,
    V100_SXM2_32GB,
)
_MODELS = {model.name: model for model in MODELS}


# Architectures before Ampere (NVML's names): nvidia-smi resets one of these only in one
# command with every GPU NVLink joins it to, and they retire pages; from Ampere on, one GPU
# resets at a time and row remapping replaces page retirement (NVML answers NotSupported).
BEFORE_AMPERE = frozenset({"kepler", "maxwell", "pascal", "volta", "turing"})


def model_spec(gpu_name: str | None) -> GpuModel | None:
    """The datasheet of a GPU model by the name NVML reports, if known."""
    return None if gpu_name is None else _MODELS.get(gpu_name)


def model_for_pci_device(device_id: int | None) -> GpuModel | None:
    """The datasheet of a GPU by its PCI device id (0x2330), for one NVML cannot name."""
    if device_id is None:
        return None
    for model in _MODELS.values():
        if model.pci_device_id >> 16 == device_id:
            return model
    return None


def short_model(gpu_name: str | None) -> str:
    """A narrow name for a GPU model: 'H100', 'A100'; '-' when unknown."""
    spec = model_spec(gpu_name)
    if spec is not None:
        return spec.short
    if not gpu_name or gpu_name == "unknown":
        return "-"
    # NVML names data-centre GPUs before Ampere "Tesla V100-…", later ones "NVIDIA A100-…"
    words = [w for w in gpu_name.replace("NVIDIA", "").replace("Tesla", "").split() if w]
    return words[0][:6] if words else "-"
