"""A simulated server: load that moves, and the physics that follow it.

Everything is a deterministic function of (node name, seed, seconds since start), so two
readers at the same instant agree, a frozen clock gives a frozen world, and the same
profile drives the NVML simulator and (later) the BMC, fabric and tenancy simulators.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuconsole.hardware import GpuModel, MigProfile
from gpuconsole.sim.identity import boot_id, gpu_serial, gpu_uuid, mig_uuid
from gpuconsole.sim.profiles import NodeProfile

SCENARIO_KINDS = (
    "thermal",
    "xid79",
    "xid79hard",  # falls off the bus for good: neither a reset nor a power cycle helps
    "ecc",
    "nvlinkerr",  # link 0's replay, recovery and CRC error counters climb
    "retired",  # pages retired, one pending a reset (GPUs before Ampere only)
    "mig",
    "notsupported",
    "psu",
    "fan",
    "bmcsilent",
)
# Besides these, 'xid<N>' raises XID N once (xid48: a double-bit ECC error), as the fake
# library's scenario of that name does; xid79 also takes the GPU off the bus.


def xid_of(kind: str) -> int | None:
    """The XID a scenario kind raises: 79 for xid79 and xid79hard, N for xid<N>; None for
    a kind that raises none."""
    if kind == "xid79hard":
        return 79
    code = kind[3:]
    if kind.startswith("xid") and code.isdigit() and int(code) > 0:
        return int(code)
    return None


# What a GPU reset clears on that GPU, and a power cycle on every GPU: the lost GPU answers
# again; a pending row remap or page retirement is applied and the volatile ECC counts start
# over
RESET_CLEARS = ("xid79", "ecc", "xid48", "retired")
# Node-level kinds: their number is a PSU or fan (1-based), not a GPU (gpuconsole.sim.bmc).
NODE_SCENARIO_KINDS = ("psu", "fan", "bmcsilent")


@dataclass(frozen=True, slots=True)
class Scenario:
    """Something going wrong (or being set up) on one GPU, from `at_s` seconds on."""

    kind: str
    gpu: int
    at_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Scenario:
        """'thermal:3', 'xid79:5@60' (GPU 5 falls off the bus 60 s in), 'xid48:2', 'mig:7'."""
        kind, _, rest = text.strip().partition(":")
        where, _, at = rest.partition("@")
        if kind not in SCENARIO_KINDS and xid_of(kind) is None:
            raise ValueError(
                f"unknown scenario {kind!r} in {text!r} (known: {', '.join(SCENARIO_KINDS)}, "
                "xid<N>)"
            )
        try:
            return cls(kind, int(where), float(at) if at else 0.0)
        except ValueError:
            raise ValueError(f"scenario {text!r}: expected KIND:GPU[@SECONDS]") from None

    def __str__(self) -> str:
        return f"{self.kind}:{self.gpu}" + (f"@{self.at_s:g}" if self.at_s else "")


@dataclass(frozen=True, slots=True)
class GpuPhysics:
    """What a simulated GPU is doing at one instant."""

    util_pct: float
    mem_util_pct: float
    mem_used_bytes: int
    power_w: float
    temp_c: float
    temp_hbm_c: float
    sm_clock_mhz: int
    pstate: int
    throttle_mask: int
    energy_mj: int
    activity_s: float  # integral of utilization (seconds at 100%)


@dataclass(frozen=True, slots=True)
class SimMigSlice:
    """A MIG instance the simulator carves out of a GPU."""

    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    profile: MigProfile
    uuid: str


# MIG layouts used by the `mig` scenario (profile name, placement start)
MIG_LAYOUTS = {
    "hopper": (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)),
    "ampere": (("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3)),
}


class _Load:
    """Utilization of one GPU over time: a job pattern drawn from the seed."""

    def __init__(self, rng: random.Random, pattern: str) -> None:
        self.pattern = pattern
        self.phase = [rng.uniform(0, 2 * math.pi) for _ in range(3)]
        self.period = [rng.uniform(25, 45), rng.uniform(5, 9), rng.uniform(240, 360)]
        self.level = rng.uniform(0.9, 1.0)
        # the share of HBM the job holds while it computes: a model's size, not the clock's
        self.memory = rng.uniform(0.55, 0.88)

    def util(self, second: int) -> float:
        t = float(second)
        p, w = self.phase, self.period
        if self.pattern == "idle":
            return 0.0
        if self.pattern == "bursty":
            u = 50 + 45 * math.sin(2 * math.pi * t / (3 * w[0]) + p[0])
            return max(0.0, min(100.0, u))
        # training: high and steady, with evaluation/checkpoint dips every few minutes
        if (t + p[2] * 40) % w[2] < 15:
            return 12.0 + 5 * math.sin(t + p[1])
        u = 100 * self.level - 4 + 3 * math.sin(2 * math.pi * t / w[0] + p[0])
        u += 1.5 * math.sin(2 * math.pi * t / w[1] + p[1])
        return max(0.0, min(100.0, u))


class SimNode:
    """One simulated server, shared by every simulated source of that node."""

    def __init__(
        self,
        name: str,
        profile: NodeProfile,
        *,
        seed: int = 0,
        scenarios: Iterable[Scenario | str] = (),
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        passthrough: frozenset[int] = frozenset(),
        idle: frozenset[int] | None = None,
        mig_slots: frozenset[tuple[int, int]] | None = None,
        workloads: tuple[frozenset[int], ...] = (),
        sharers: dict[int, int] | None = None,
    ) -> None:
        """`passthrough`: GPUs bound to vfio-pci (NVML on the host cannot see them).
        `idle`: GPUs nobody computes on; None draws a load for every GPU from the seed.
        `mig_slots`: (GPU, slot) pairs whose MIG instance runs a process; None: every other.
        `workloads`: GPUs that run one workload together (a guest's, a pod's, a job's).
        `sharers`: GPU -> how many pods share it (time-slicing): one process each.
        """
        self.name = name
        self.profile = profile
        self.seed = seed
        self.scenarios = tuple(
            s if isinstance(s, Scenario) else Scenario.parse(s) for s in scenarios
        )
        for s in self.scenarios:
            if s.kind not in NODE_SCENARIO_KINDS and not 0 <= s.gpu < len(profile.gpus):
                raise ValueError(f"scenario {s}: {profile.name} has no GPU {s.gpu}")
        self.clock = clock
        self.t0 = clock() if start is None else start
        rng = random.Random(f"{name}/{seed}")
        node_job = rng.random() < 0.6  # most nodes run one 8-GPU job
        patterns = []
        for _ in profile.gpus:
            if node_job:
                patterns.append("train")
            else:
                patterns.append(rng.choices(["train", "idle", "bursty"], [0.5, 0.3, 0.2])[0])
        shared = random.Random(f"{name}/{seed}/job")
        self._loads = [
            _Load(shared if node_job else random.Random(f"{name}/{seed}/{i}"), pattern)
            for i, pattern in enumerate(patterns)
        ]
        if node_job:  # one job: every GPU moves together
            self._loads = [self._loads[0]] * len(profile.gpus)
        self.passthrough = passthrough
        self.idle = idle
        self.mig_slots = mig_slots
        self.sharers = sharers or {}
        if idle is not None:  # the tenants decide who computes; the seed only decides how
            self._follow_idle(idle)
        shaped: set[int] = set()
        for k, group in enumerate(workloads):  # one tenant's GPUs move together
            members = sorted(group - (idle or frozenset()) - shaped)
            if members:
                pattern = "train" if len(group) > 1 else "bursty"
                shared = random.Random(f"{name}/{seed}/workload/{k}")
                load = _Load(shared, pattern)
                for i in members:
                    self._loads[i] = load
                shaped.update(members)
        self._integrals: dict[int, tuple[int, float]] = {}
        self.uuids = tuple(gpu_uuid(name, seed, g.index) for g in profile.gpus)
        self.serials = tuple(gpu_serial(name, seed, g.index) for g in profile.gpus)
        self.migs = {s.gpu: self._mig_slices(s.gpu) for s in self.scenarios if s.kind == "mig"}
        self._cleared: set[tuple[str, int]] = set()  # (kind, GPU) a reset or power cycle ended
        self.resets: dict[int, int] = {}  # GPU -> how many times it was reset
        self.power_cycles = 0

    def _follow_idle(self, idle: frozenset[int]) -> None:
        """Idle GPUs run nothing; one the seed left idle that a tenant now uses runs bursts."""
        for i, load in enumerate(self._loads):
            if i in idle:
                self._loads[i] = _Load(random.Random(f"{self.name}/{self.seed}/{i}/idle"), "idle")
            elif load.pattern == "idle":
                self._loads[i] = _Load(random.Random(f"{self.name}/{self.seed}/{i}/busy"), "bursty")

    def retenant(
        self,
        *,
        passthrough: frozenset[int],
        idle: frozenset[int],
        mig_slots: frozenset[tuple[int, int]] | None = None,
        sharers: dict[int, int] | None = None,
    ) -> None:
        """The tenants changed (a GPU was reassigned or drained in the demo): which GPUs the
        host's NVML sees from now on, which nobody computes on (they go quiet; others wake),
        and which MIG instances and shared GPUs run a process of the pods left (None: as
        they were)."""
        self.passthrough = passthrough
        if mig_slots is not None:
            self.mig_slots = mig_slots
        if sharers is not None:
            self.sharers = sharers
        if idle != self.idle:
            self.idle = idle
            self._follow_idle(idle)

    # --- time and scenarios ----------------------------------------------------------

    def elapsed(self) -> float:
        return max(0.0, self.clock() - self.t0)

    def active(self, kind: str, gpu: int) -> Scenario | None:
        """The scenario of this kind on this GPU, if it has started."""
        t = self.elapsed()
        for s in self.scenarios:
            if s.kind == kind and s.gpu == gpu and t >= s.at_s and (kind, gpu) not in self._cleared:
                return s
        return None

    def lost(self, gpu: int) -> bool:
        return self.active("xid79", gpu) is not None or self.active("xid79hard", gpu) is not None

    def reset_gpu(self, gpu: int) -> bool:
        """`nvidia-smi -r` on GPU `gpu`: what a reset repairs is gone from now on (a fault
        that has not happened yet never will). False: it is still lost."""
        self.resets[gpu] = self.resets.get(gpu, 0) + 1
        self._cleared.update((kind, gpu) for kind in RESET_CLEARS)
        return not self.lost(gpu)

    def repairs(self) -> dict[str, object]:
        """What resets and power cycles did, to be kept across processes (SimWorld)."""
        return {
            "cleared": sorted(self._cleared),
            "resets": {str(g): n for g, n in self.resets.items()},
            "power_cycles": self.power_cycles,
        }

    def restore_repairs(
        self, cleared: list[tuple[str, int]], resets: dict[int, int], power_cycles: int
    ) -> None:
        self._cleared = set(cleared)
        self.resets = dict(resets)
        self.power_cycles = power_cycles

    @property
    def boot_id(self) -> str:
        """The kernel's boot id: a new one at every power cycle."""
        return boot_id(self.name, self.seed, self.power_cycles)

    def power_cycle(self) -> None:
        """The node's BMC cycled its power: every GPU comes back as a reset would bring it,
        and the kernel under a new boot id."""
        self.power_cycles += 1
        for gpu in range(len(self.profile.gpus)):
            self._cleared.update((kind, gpu) for kind in RESET_CLEARS)

    @property
    def model(self) -> GpuModel:
        return self.profile.gpu_model

    def pattern(self, gpu: int) -> str:
        return self._loads[gpu].pattern

    # --- physics ---------------------------------------------------------------------

    def _activity(self, gpu: int, t: float) -> float:
        """Integral of utilization/100 from 0 to t, stepping whole seconds (cached)."""
        load = self._loads[gpu]
        whole = int(t)
        start, total = self._integrals.get(gpu, (0, 0.0))
        if start > whole:
            start, total = 0, 0.0
        for second in range(start, whole):
            total += load.util(second) / 100.0
        self._integrals[gpu] = (whole, total)
        return total + (t - whole) * load.util(whole) / 100.0

    def gpu(self, index: int) -> GpuPhysics:
        """The state of GPU `index` now."""
        m = self.model
        t = self.elapsed()
        load = self._loads[index]
        util = load.util(int(t))
        if self.migs.get(index):
            util *= 0.8  # a partitioned GPU rarely has every slice busy
        idle_w = 0.11 * m.tdp_w
        span_w = 0.92 * m.tdp_w - idle_w
        power = idle_w + span_w * util / 100.0
        activity = self._activity(index, t)
        energy_j = idle_w * t + span_w * activity
        temp = 31.0 + 38.0 * power / m.tdp_w + (index % 3)
        hbm = temp + 6.0
        busy = util > 3.0
        clock = m.sm_clock_max_mhz if busy else m.sm_clock_idle_mhz
        mask = 0x0 if busy else 0x1  # GPU idle
        if self.active("thermal", index):
            temp = m.temp_slowdown_c + 2.0
            hbm = 95.0
            clock = 1410 if m.sm_clock_max_mhz > 1410 else int(m.sm_clock_max_mhz * 0.75)
            power = min(power, 0.8 * m.tdp_w)
            mask = 0x40 | 0x20  # HW and SW thermal slowdown
        wobble = 0.05 * math.sin(1.7 * index + load.phase[0] + 0.1 * t / 60.0)
        frac = load.memory + wobble if busy else 0.004
        if load.pattern == "bursty":
            frac = 0.35 + 0.2 * util / 100.0
        used = int(m.mem_bytes * frac)
        return GpuPhysics(
            util_pct=round(util),
            mem_util_pct=round(util * 0.55),
            mem_used_bytes=used,
            power_w=power,
            temp_c=round(temp),
            temp_hbm_c=round(hbm),
            sm_clock_mhz=clock,
            pstate=0 if busy else 8,
            throttle_mask=mask,
            energy_mj=int(energy_j * 1000),
            activity_s=activity,
        )

    def ecc(self, index: int) -> tuple[int, int, int, int]:
        """(volatile corrected, volatile uncorrected, aggregate corrected, aggregate
        uncorrected). A double-bit error (xid48) counts as uncorrected since the driver
        loaded until a reset, which remaps its row (remapped_rows); the aggregate keeps it,
        as it keeps the ecc scenario's uncorrectable error. (Its corrected errors stop at the
        reset, and their aggregate is not kept: the simulator does not know when it was.)"""
        dbe = self.active("xid48", index) is not None
        t = self.elapsed()
        ever = {s.kind for s in self.scenarios if s.gpu == index and t >= s.at_s}
        uncorrected = int("ecc" in ever) + int("xid48" in ever)
        if self.active("ecc", index) is None:
            return 0, int(dbe), 0, uncorrected
        grown = int(self.elapsed() / 30)
        return 12 + grown, int(dbe), 40 + grown, uncorrected

    def remapped_rows(self, index: int) -> tuple[int, int, bool]:
        """Rows remapped for correctable and for uncorrectable errors, and whether a remap
        waits for a GPU reset. The ecc scenario has remapped two rows for correctable errors
        and one for its uncorrectable one, a double-bit error (xid48) one row more. A reset
        puts the spare rows in (nothing pending), and they stay remapped: the counts are
        kept in the GPU's InfoROM across resets and reboots (NVIDIA's row remapping)."""
        t = self.elapsed()

        def began(kind: str) -> bool:
            return any(s.kind == kind and s.gpu == index and t >= s.at_s for s in self.scenarios)

        ecc, dbe = began("ecc"), began("xid48")
        pending = self.active("ecc", index) is not None or self.active("xid48", index) is not None
        return 2 * int(ecc), int(ecc) + int(dbe), pending

    def nvlink_errors(self, index: int, link: int) -> tuple[int, int, int]:
        """Replays, recoveries and CRC errors of one link since the driver loaded: link 0 of
        a GPU in the nvlinkerr scenario replays 3 and sees 10 CRC errors a second, and
        retrains every 20 s, as the fake library plays it."""
        s = self.active("nvlinkerr", index)
        if s is None or link != 0:
            return 0, 0, 0
        since = self.elapsed() - s.at_s
        return int(3 * since), int(since / 20), int(10 * since)

    def retired_pages(self, index: int) -> tuple[int, int, bool]:
        """Pages retired for single- and double-bit errors, and whether one waits for a reset
        (the retired scenario: 2, 1 and pending; once the GPU is reset, still 2 and 1, none
        pending: the reset retired the page)."""
        t = self.elapsed()
        if not any(s.kind == "retired" and s.gpu == index and t >= s.at_s for s in self.scenarios):
            return 0, 0, False
        return 2, 1, ("retired", index) not in self._cleared

    def thermal_slowdown_s(self, index: int) -> float:
        """Seconds this GPU has been held down by heat (the driver's violation counters)."""
        s = self.active("thermal", index)
        return self.elapsed() - s.at_s if s is not None else 0.0

    def _pcie_share(self) -> float:
        """Bytes per second moved at full load: a share of the link's bandwidth."""
        return {5: 64e9, 4: 32e9}.get(self.model.pcie_gen_max, 16e9) * 0.12

    def pcie_bytes(self, index: int) -> tuple[int, int]:
        """PCIe tx/rx byte counters: a share of the link's bandwidth while busy."""
        gbps = self._pcie_share()
        a = self._activity(index, self.elapsed())
        return int(a * gbps * 0.4), int(a * gbps)

    def pcie_rates(self, index: int) -> tuple[float, float]:
        """PCIe tx/rx bytes per second over the last second: what the counters moved."""
        t = self.elapsed()
        whole = int(t)
        load, part = self._loads[index], t - whole
        busy = ((1.0 - part) * load.util(whole - 1) + part * load.util(whole)) / 100.0
        gbps = self._pcie_share()
        return busy * gbps * 0.4, busy * gbps

    def nvlink_kib(self, index: int, link: int, *, rx: bool = False) -> int:
        """NVLink data counter of one link and direction (sent, or `rx` received), in KiB:
        a ring's links carry about as much each way, never exactly as much."""
        if not self.model.nvlink_count:
            return 0
        per_link = self.model.nvlink_gbytes_per_s * 1e9 / 2 / self.model.nvlink_count
        a = self._activity(index, self.elapsed())
        share = 0.35 * (1 + 0.02 * (link % 3))
        if rx:
            share *= 0.86 + 0.03 * ((index + 2 * link) % 5)
        return int(a * per_link * share / 1024)

    def visible(self, index: int) -> bool:
        """Whether the host's nvidia driver (and so NVML) sees this GPU: not when vfio-pci
        holds it for a guest."""
        return index not in self.passthrough

    def processes(self, index: int) -> list[tuple[int, int, int | None]]:
        """(pid, used bytes, gpu instance id) of host compute processes on a GPU.

        PIDs are distinct across the node: one process per GPU (a rank of its job) or per
        busy MIG instance. A guest's GPU and an idle GPU have none.
        """
        if not self.visible(index) or (self.idle is not None and index in self.idle):
            return []
        base = 1000 + (sum(self.name.encode()) * 37 + self.seed) % 60000 + 100 * index
        slices = self.migs.get(index)
        if slices:
            return [
                (base + k, int(s.profile.mem_bytes * 0.7), s.gpu_instance_id)
                for k, s in enumerate(slices)
                if ((index, k) in self.mig_slots if self.mig_slots is not None else k % 2 == 0)
            ]
        phys = self.gpu(index)
        if self.idle is None and phys.util_pct <= 3:
            return []
        used = max(0, phys.mem_used_bytes - 600 * 1024**2)
        sharers = self.sharers.get(index, 1)
        if sharers > 1:  # time-sliced: each pod's process holds its own share, unevenly
            weights = [k + 2 for k in range(sharers)]
            return [(base + k, used * w // sum(weights), None) for k, w in enumerate(weights)]
        return [(base, used, None)]

    def _mig_slices(self, index: int) -> tuple[SimMigSlice, ...]:
        by_name = {p.name: p for p in self.model.mig_profiles}
        layout = MIG_LAYOUTS.get(self.model.architecture, ())
        slices = []
        for k, (pname, start) in enumerate(layout):
            uuid = mig_uuid(self.name, self.seed, index, k)
            slices.append(SimMigSlice(k + 1, 0, start, by_name[pname], uuid))
        return tuple(slices)
