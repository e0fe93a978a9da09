"""A fake ``libnvidia-ml.so.1`` driven by a simulator profile, and the glue to use it.

The library (``fake_nvml.c``, next to this file) implements the NVML calls gpuconsole, gpustat and
nvitop make, with the structure layouts pynvml's ctypes declarations expect. A process finds it
through ``LD_LIBRARY_PATH`` and reads the GPUs from the text file ``write_profile`` writes; the
file format is documented at the top of ``fake_nvml.c``.

Which functions a driver exports is fixed when the library is linked, so there is one build per
driver branch (``build_library(dir, driver)``); the profile's driver version must be of that
branch. A driver is one of gpuconsole.sim.drivers.DRIVERS ("535" ... "580.82"), or by default the
one the node profile names.

Typical use from a test::

    lib = build_library(tmp_dir, "580.82")
    profile = write_profile(DGX_H100, tmp_dir / "node.profile", driver="580.82",
                            scenarios=["thermal 3"])
    env = {**os.environ, **environment(lib.parent, profile)}
    subprocess.run(["gpustat", "--json"], env=env)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuconsole.hardware import TOPO_LEVEL, GpuModel, MigProfile
from gpuconsole.sim.drivers import DRIVERS, DriverProfile, driver_profile
from gpuconsole.sim.identity import gpu_serial, gpu_uuid, mig_uuid
from gpuconsole.sim.node import MIG_LAYOUTS
from gpuconsole.sim.profiles import NodeProfile

__all__ = [
    "COUNTS_ENV",
    "LIBRARY_NAME",
    "PROFILE_ENV",
    "SOURCE",
    "TIME_ENV",
    "FakeNvmlError",
    "build_library",
    "call_counts",
    "driver_of",
    "environment",
    "mig_partition",
    "parse_scenario",
    "read_counts_file",
    "reset_call_counts",
    "write_profile",
]

LIBRARY_NAME = "libnvidia-ml.so.1"
SOURCE = Path(__file__).with_name("fake_nvml.c")
PROFILE_ENV = "GPUCONSOLE_FAKE_NVML_PROFILE"
COUNTS_ENV = "GPUCONSOLE_FAKE_NVML_COUNTS"
TIME_ENV = "GPUCONSOLE_FAKE_NVML_TIME"

GCC_FLAGS = ("-shared", "-fPIC", "-O2", f"-Wl,-soname,{LIBRARY_NAME}")

NVML_BRAND_NVIDIA = 14
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
# Memory slices a GPU instance of n compute slices occupies (its placement size).
PLACEMENT_SIZE = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
# nvmlNvlinkVersion_t for each NVLink generation (NVML_NVLINK_VERSION_3_0 = 4, 4_0 = 6).
NVLINK_VERSION_ENUM = {1: 1, 2: 2, 3: 4, 4: 6, 5: 7}
# NVSwitch PCI device ids: third generation (HGX H100) and second generation (HGX A100).
NVSWITCH_PCI_DEVICE_ID = {4: 0x22A310DE, 3: 0x1AF110DE}


class FakeNvmlError(RuntimeError):
    """The fake library cannot be built, loaded or configured."""


# Per-model details the profiles do not carry: PCI subsystem id, board part number, VBIOS and
# InfoROM image versions, video clock max. Formats follow nvidia-smi -q; the values are
# representative, not read from one particular board.
_MODEL_EXTRAS: dict[str, tuple[int, str, str, str, int]] = {
    "NVIDIA H100 80GB HBM3": (
        0x16C110DE,
        "692-2G520-0200-000",
        "96.00.74.00.0F",
        "G520.0200.00.05",
        1755,
    ),
    "NVIDIA A100-SXM4-40GB": (
        0x134F10DE,
        "692-2G506-0200-003",
        "92.00.19.00.10",
        "G506.0200.00.04",
        1290,
    ),
    "NVIDIA A100-PCIE-40GB": (
        0x145F10DE,
        "900-21001-0000-000",
        "92.00.25.00.08",
        "1001.0230.00.03",
        1290,
    ),
}

_KIND = r"(thermal|ecc|notsupported|mig|smoothing|reset|nvlinkerr|retired|xid[1-9][0-9]*)"
_AT = r"(\d+(?:\.\d+)?)"
_SCENARIO_FORMS = (
    re.compile(_KIND + r" (\d+)(?: at " + _AT + ")?"),  # the profile file's "xid79 5 at 20"
    re.compile(_KIND + r":(\d+)(?:@" + _AT + ")?"),  # the simulator's "xid79:5@20"
)


def parse_scenario(text: str) -> tuple[str, int, float | None]:
    """Split ``"xid79 5 at 20"`` (or ``"xid79:5@20"``) into ``("xid79", 5, 20.0)``.

    Raises ValueError when the text is neither form.
    """
    norm = " ".join(str(text).split())
    for form in _SCENARIO_FORMS:
        m = form.fullmatch(norm)
        if m is not None:
            kind, gpu, at = m.groups()
            return kind, int(gpu), float(at) if at is not None else None
    raise ValueError(
        f"bad fake NVML scenario {text!r}: want '<kind> <gpu> [at <seconds>]' (or "
        "'<kind>:<gpu>[@<seconds>]') with kind thermal, ecc, notsupported, mig, smoothing, "
        "reset or xid<N>"
    )


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from its parts."""
    raw = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(raw[:8], "big") / 2**64


def _cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _mask_words(cpus: Sequence[int], words: int) -> str:
    mask = [0] * words
    for cpu in cpus:
        mask[cpu // 64] |= 1 << (cpu % 64)
    return " ".join(f"0x{w:016x}" for w in mask)


def _socket_of(path: tuple[str, ...], numa_node: int) -> int:
    if path and path[0].startswith("socket") and path[0][6:].isdigit():
        return int(path[0][6:])
    return numa_node


def _socket_cpus(profile: NodeProfile, socket: int) -> list[int]:
    """Cores of one socket and their SMT siblings, numbered as Linux does on these servers."""
    cps, total = profile.cores_per_socket, profile.sockets * profile.cores_per_socket
    first = list(range(socket * cps, (socket + 1) * cps))
    return first + [c + total for c in first]


def _mig_lines(model: GpuModel) -> list[str]:
    return [
        f"mig_profile {p.index} {p.profile_id} {p.slices} {p.sm_count} "
        f"{p.mem_bytes // 2**20} {p.max_instances} {p.name}"
        for p in model.mig_profiles
    ]


def mig_partition(model: GpuModel) -> list[tuple[int, MigProfile, int, int]]:
    """(GPU instance id, profile, placement start, size) of the "mig" scenario's instances.

    The same partition as the in-process simulator (gpuconsole.sim.node.MIG_LAYOUTS): on H100
    3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb, on A100 3g.20gb + 2g.10gb + 1g.5gb + 1g.5gb, with
    GPU instance ids 1..4 in that order.
    """
    by_name = {p.name: p for p in model.mig_profiles}
    layout = MIG_LAYOUTS.get(model.architecture, ())
    return [
        (k + 1, by_name[name], start, PLACEMENT_SIZE.get(by_name[name].slices, 1))
        for k, (name, start) in enumerate(layout)
    ]


def _processes(
    profile: NodeProfile, seed: int, index: int, gi_ids: Sequence[int]
) -> list[tuple[int, float, int]]:
    """Deterministic fake processes: (pid, share of the used memory, GPU instance id or -1)."""
    owners = (
        list(gi_ids) if gi_ids else [-1] * (1 + int(3 * _unit("nprocs", profile.name, seed, index)))
    )
    procs = []
    for k, gi in enumerate(owners):
        pid = 200_000 + int(700_000 * _unit("pid", profile.name, seed, index, k))
        share = 0.2 + _unit("share", profile.name, seed, index, k)
        procs.append((pid, round(share, 4), gi))
    return procs


def driver_of(profile: NodeProfile, driver: DriverProfile | str | None = None) -> DriverProfile:
    """The driver the fake plays: ``driver`` (a DriverProfile, or its name such as "580.65"),
    else the one ``profile`` names. Raises ValueError for a name no profile has."""
    if isinstance(driver, DriverProfile):
        return driver
    wanted = driver if driver is not None else profile.driver_version
    found = driver_profile(wanted)
    if found is None or (driver is not None and found.name != driver):
        names = ", ".join(d.name for d in DRIVERS)
        raise ValueError(f"no fake NVML driver profile {wanted!r}: want one of {names}")
    return found


def write_profile(
    profile: NodeProfile,
    path: Path,
    *,
    driver: DriverProfile | str | None = None,
    scenarios: Sequence[str] = (),
    seed: int = 0,
    missing_fields: Sequence[int] = (),
    privileged: bool = True,
    profiling_admin_only: bool = True,
    open_errors: Mapping[int, int] | None = None,
    faults: Sequence[str] = (),
    recovery_actions: Mapping[int, int] | None = None,
    fabric_probes: Mapping[int, tuple[int, int]] | None = None,
    virtualization_mode: int = 0,
) -> Path:
    """Write the fake library's profile file for ``profile`` to ``path`` and return ``path``.

    ``driver`` is the driver it plays (see `driver_of`); the library must be built for its
    branch. ``scenarios`` are strings such as ``"thermal 3"``, ``"xid79 5 at 20"``,
    ``"ecc 2"``, ``"mig 7"``, ``"smoothing 0 at 5"``, ``"notsupported 1"``, ``"nvlinkerr 2"``
    (link 0's error counters climb), ``"retired 0"`` (pre-Ampere page retirement) or
    ``"reset 5 at 30"``
    (a GPU reset: one lost before answers again; before Ampere, every GPU NVLink joins to
    it is reset at the same time, else ValueError as nvidia-smi refuses) (kind, GPU index,
    optional start in seconds). ``missing_fields`` are field ids the driver answers
    NOT_SUPPORTED, as an older one does.
    ``privileged=False`` reads as an unprivileged user: NO_PERMISSION where drivers answer it
    (GPM too, unless ``profiling_admin_only=False``: RmProfilingAdminOnly=0 on the node).
    ``open_errors`` maps a GPU index to the nvmlReturn_t its handle cannot be opened with.
    ``faults`` are ``"<gpu> <function> <code, nan or hang> [<GPU instance id>]"`` (see
    fake_nvml.c; hang: the call never returns).
    ``recovery_actions`` maps a GPU index to the nvmlDeviceGpuRecoveryAction_t the driver
    advises (field 230, which only a 565 or newer branch answers); ``fabric_probes`` a GPU
    index to the (nvmlGpuFabricState_t, nvmlReturn_t status) of its fabric probe, on a node
    with NVSwitches. ``virtualization_mode`` is the nvmlGpuVirtualizationMode_t every GPU
    answers (1: passed through, as NVML says inside a guest).
    """
    parsed = [parse_scenario(s) for s in scenarios]
    n = len(profile.gpus)
    for kind, gpu, _ in parsed:
        if gpu >= n:
            raise ValueError(f"scenario {kind} names GPU {gpu}; {profile.name} has {n} GPUs")
        if kind == "mig" and not profile.gpu_model.mig_profiles:
            raise ValueError(f"scenario mig: {profile.gpu_model.name} has no MIG profiles")
    resets: dict[float | None, set[int]] = {}
    for kind, gpu, at in parsed:
        if kind == "reset":
            resets.setdefault(at, set()).add(gpu)
    for at, together in resets.items():
        # as nvidia-smi refuses a reset that leaves out a GPU NVLink joins to one it resets
        missing = sorted(profile.reset_together(together) - together)
        if missing:
            when = f" at {at:g}" if at is not None else ""
            raise ValueError(
                f"scenario reset{when}: GPUs with NVLink connections to a GPU being reset "
                f"must be reset in the same command on {profile.gpu_model.name}: add reset "
                f"scenarios for GPUs {', '.join(map(str, missing))}{when}"
            )
    mig_gpus = {gpu for kind, gpu, _ in parsed if kind == "mig"}
    gpu_lines: dict[int, list[str]] = {}
    for index, code in (open_errors or {}).items():
        gpu_lines.setdefault(index, []).append(f"open_error {int(code)}")
    for index, action in (recovery_actions or {}).items():
        gpu_lines.setdefault(index, []).append(f"recovery_action {int(action)}")
    for index, (state, status) in (fabric_probes or {}).items():
        gpu_lines.setdefault(index, []).append(f"fabric_probe {int(state)} {int(status)}")
    for text in faults:
        number, _, rest = text.strip().partition(" ")
        if not number.isdigit() or len(rest.split()) not in (2, 3):
            raise ValueError(f"bad fault {text!r}: want '<gpu> <function> <code> [<gi>]'")
        gpu_lines.setdefault(int(number), []).append(f"fault {rest}")
    for index in gpu_lines:
        if index >= n:
            raise ValueError(
                f"a fault, open error, recovery action or fabric probe names GPU {index}; "
                f"{profile.name} has {n} GPUs"
            )

    model = profile.gpu_model
    subsystem, part, vbios, inforom, video = _MODEL_EXTRAS.get(
        model.name, (0, "N/A", "N/A", "N/A", int(model.sm_clock_max_mhz * 0.89))
    )
    throttled = round(model.sm_clock_max_mhz * 0.712 / 15) * 15
    words = max(1, -(-profile.sockets * profile.cores_per_socket * 2 // 64))
    plays = driver_of(profile, driver)
    cuda_major = plays.cuda_driver_version // 1000

    lines = [
        "# gpuconsole fake NVML profile (format: see gpuconsole/sim/fakenvml/fake_nvml.c)",
        "format 1",
        f"node {profile.name}",
        f"seed {seed}",
        f"driver_version {plays.version}",
        f"nvml_version {cuda_major}.{plays.version}",
        f"cuda_driver_version {plays.cuda_driver_version}",
        f"virtualization_mode {int(virtualization_mode)}",
        f"privileged {int(privileged)}",
        f"profiling_admin_only {int(profiling_admin_only)}",
        *(f"missing_field {fid}" for fid in missing_fields),
    ]
    for kind, gpu, at in parsed:
        lines.append(f"scenario {kind} {gpu}" + (f" at {at:g}" if at is not None else ""))

    for slot in profile.gpus:
        i = slot.index
        socket = _socket_of(slot.pci_path, slot.numa_node)
        lines += [
            f"gpu {i}",
            f"name {model.name}",
            f"uuid {gpu_uuid(profile.name, seed, i)}",
            f"serial {gpu_serial(profile.name, seed, i)}",
            f"bus_id {slot.bus_id}",
            f"pci_device_id 0x{model.pci_device_id:08X}",
            f"pci_subsystem_id 0x{subsystem:08X}",
            f"minor {i}",
            f"module_id {slot.module_id}",
            f"arch {model.arch_code}",
            f"brand {NVML_BRAND_NVIDIA}",
            f"sm_count {model.sm_count}",
            f"memory_total {model.mem_bytes}",
            f"power_limits {model.power_min_w * 1000} {model.tdp_w * 1000} {model.tdp_w * 1000}",
            f"clocks_max {model.sm_clock_max_mhz} {model.mem_clock_mhz} {video}",
            f"clock_sm_idle {model.sm_clock_idle_mhz}",
            f"clock_sm_throttled {throttled}",
            f"temp_thresholds {model.temp_shutdown_c} {model.temp_slowdown_c} "
            f"{model.temp_shutdown_c + 3} {model.temp_slowdown_c}",
            f"numa_node {slot.numa_node}",
            f"cpu_affinity_node {_mask_words(_cpulist(slot.cpu_affinity), words)}",
            f"cpu_affinity_socket {_mask_words(_socket_cpus(profile, socket), words)}",
            f"pcie_max {model.pcie_gen_max} {model.pcie_width_max} {model.pcie_gen_max}",
            "fans 0",
            f"gpm {int(model.gpm)}",
            f"fabric {int(bool(profile.nvswitches))}",
            f"nvlink_version {NVLINK_VERSION_ENUM.get(model.nvlink_gen, 0)}",
            f"nvlink_bandwidth_gbs {model.nvlink_gbytes_per_s}",
            f"board_part_number {part}",
            f"vbios_version {vbios}",
            f"inforom_image_version {inforom}",
        ]
        link = 0
        switch_id = NVSWITCH_PCI_DEVICE_ID.get(model.nvlink_gen, 0)
        for sw in profile.nvswitches:
            for _ in range(sw.links_per_gpu[i]):
                lines.append(
                    f"nvlink {link} {sw.bus_id} {NVML_NVLINK_DEVICE_TYPE_SWITCH} 0x{switch_id:08X}"
                )
                link += 1
        for peer in profile.link_peers(i):  # GPUs joined directly (DGX-1)
            lines.append(
                f"nvlink {link} {profile.gpus[peer].bus_id} {NVML_NVLINK_DEVICE_TYPE_GPU} "
                f"0x{model.pci_device_id:08X}"
            )
            link += 1
        lines += _mig_lines(model)
        gi_ids: list[int] = []
        if i in mig_gpus:
            for k, (gi, mp, start, size) in enumerate(mig_partition(model)):
                lines.append(
                    f"mig_instance {gi} {mp.index} {start} {size} "
                    f"{mig_uuid(profile.name, seed, i, k)}"
                )
                gi_ids.append(gi)
        for pid, share, gi in _processes(profile, seed, i, gi_ids):
            lines.append(f"process {pid} {share} {gi}")
        levels = [
            TOPO_LEVEL[profile.pci_level(slot.pci_path, other.pci_path)] for other in profile.gpus
        ]
        lines.append("topology " + " ".join(str(level) for level in levels))
        lines += gpu_lines.get(i, [])

    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def build_library(out_dir: Path, driver: DriverProfile | str = DRIVERS[-1]) -> Path:
    """Compile ``fake_nvml.c`` for ``driver``'s branch to ``out_dir/r<branch>/libnvidia-ml.so.1``
    and return that path (``driver``: a DriverProfile or its name; the newest by default).

    Skips the compile when the library is newer than the source. Compiles to a temporary name
    and renames, so concurrent builders never load half a file.
    """
    if not isinstance(driver, DriverProfile):
        found = driver_profile(driver)
        if found is None:
            raise FakeNvmlError(f"no fake NVML driver profile {driver!r}")
        driver = found
    out_dir = Path(out_dir) / f"r{driver.branch}"
    out = out_dir / LIBRARY_NAME
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    gcc = shutil.which("gcc")
    if gcc is None:
        raise FakeNvmlError(
            f"gcc is needed to build the fake {LIBRARY_NAME} but is not on PATH "
            "(install it: apt-get install gcc)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        branch = f"-DFAKE_NVML_BRANCH={driver.branch}"
        proc = subprocess.run(
            [gcc, *GCC_FLAGS, branch, "-o", str(tmp), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise FakeNvmlError(f"gcc failed to build {LIBRARY_NAME}:\n{proc.stderr}")
        tmp.chmod(0o755)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def environment(
    lib_dir: Path,
    profile_path: Path,
    counts_path: Path | None = None,
    *,
    frozen_time: float | None = None,
) -> dict[str, str]:
    """The variables a subprocess needs to load the fake library; merge them into its env.

    ``LD_LIBRARY_PATH`` gets ``lib_dir`` prepended to the current value. ``counts_path``, when
    given, receives the library's per-function call counts at nvmlShutdown and at exit.
    ``frozen_time`` stops the simulated clock at that many seconds after nvmlInit.
    """
    current = os.environ.get("LD_LIBRARY_PATH", "")
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(lib_dir), current) if p),
        PROFILE_ENV: str(profile_path),
    }
    if counts_path is not None:
        env[COUNTS_ENV] = str(counts_path)
    if frozen_time is not None:
        env[TIME_ENV] = repr(float(frozen_time))
    return env


def _loaded_library() -> ctypes.CDLL:
    """The fake library already loaded in this process (dlopen by soname returns that handle)."""
    try:
        lib = ctypes.CDLL(LIBRARY_NAME)
    except OSError as exc:
        raise FakeNvmlError(f"cannot load {LIBRARY_NAME}: {exc}") from exc
    if not hasattr(lib, "fake_nvml_function_count"):
        raise FakeNvmlError(f"the {LIBRARY_NAME} loaded in this process is not the fake one")
    lib.fake_nvml_function_count.restype = ctypes.c_int
    lib.fake_nvml_function_name.restype = ctypes.c_char_p
    lib.fake_nvml_function_name.argtypes = [ctypes.c_int]
    lib.fake_nvml_call_count.restype = ctypes.c_ulonglong
    lib.fake_nvml_call_count.argtypes = [ctypes.c_int]
    lib.fake_nvml_reset_call_counts.restype = None
    return lib


def call_counts() -> dict[str, int]:
    """Calls per exported NVML function (zeros included) since load or the last reset."""
    lib = _loaded_library()
    counts: dict[str, int] = {}
    for i in range(lib.fake_nvml_function_count()):
        name: bytes = lib.fake_nvml_function_name(i)
        counts[name.decode()] = int(lib.fake_nvml_call_count(i))
    return counts


def reset_call_counts() -> None:
    """Set every call counter of the loaded fake library to zero."""
    _loaded_library().fake_nvml_reset_call_counts()


def read_counts_file(path: Path) -> dict[str, int]:
    """Parse the ``name count`` lines the library writes to GPUCONSOLE_FAKE_NVML_COUNTS."""
    counts: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            name, count = line.split()
            counts[name] = int(count)
    return counts
