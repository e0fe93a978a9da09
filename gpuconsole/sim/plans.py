"""Who holds what on each simulated node: guests, pods, Slurm jobs, free GPUs.

Plain data, shared by the tenancy simulator (which lays it out as sysfs, /proc, libvirt and
kubelet answers) and by `build_sim_nodes` (which tells each SimNode which GPUs are passed
through and which are idle, so NVML, the BMC and the fabric agree with the tenants).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gpuconsole.sim.profiles import NodeProfile

__all__ = ["SimGuest", "SimJob", "SimPlan", "SimPod", "plan_for"]


@dataclass(frozen=True, slots=True)
class SimGuest:
    """A KVM guest holding GPUs (by index) through vfio-pci."""

    name: str
    gpus: tuple[int, ...]
    state: int = 1  # virDomainState: 1 running, 5 shut off
    tenant: str | None = None  # in the domain's metadata; else the name rule applies
    nvswitches: bool = False  # full passthrough: the baseboard's switches go with it
    started_h: float = 30.0  # hours before the demo started
    agent: bool = False  # runs `gpuconsole agent --guest`: the host reads its GPUs through it


@dataclass(frozen=True, slots=True)
class SimPod:
    """A pod's container holding whole GPUs, MIG slots (gpu, slot) or replicas (gpu, n)."""

    namespace: str
    pod: str
    container: str
    gpus: tuple[int, ...] = ()
    mig: tuple[tuple[int, int], ...] = ()
    replicas: tuple[tuple[int, int], ...] = ()
    started_h: float = 5.0
    # the ResourceClaim its whole GPUs come through (DRA, NVIDIA's gpu.nvidia.com driver),
    # None for the device plugin
    claim: str | None = None


@dataclass(frozen=True, slots=True)
class SimJob:
    """A Slurm job on some GPUs."""

    job: str
    account: str
    uid: int
    gpus: tuple[int, ...]
    started_h: float = 2.5


@dataclass(frozen=True, slots=True)
class SimPlan:
    """Who holds what on one simulated node."""

    guests: tuple[SimGuest, ...] = ()
    pods: tuple[SimPod, ...] = ()
    jobs: tuple[SimJob, ...] = ()
    # GPUs a user's process runs on outside any scheduler (alice's notebook, started by hand)
    loose: tuple[int, ...] = ()

    @property
    def vfio_gpus(self) -> frozenset[int]:
        """GPUs bound to vfio-pci: invisible to NVML on a real host."""
        return frozenset(g for guest in self.guests for g in guest.gpus)

    @property
    def busy_gpus(self) -> frozenset[int]:
        """GPUs some host-side tenant uses; the others are free (idle, in the host pool)."""
        held = {g for pod in self.pods for g in pod.gpus}
        held |= {g for pod in self.pods for g, _ in pod.mig + pod.replicas}
        held |= {g for job in self.jobs for g in job.gpus}
        return frozenset(held | set(self.loose))

    @property
    def guest_load_gpus(self) -> frozenset[int]:
        """GPUs a running guest computes on: the host cannot see them, but they draw power."""
        return frozenset(g for guest in self.guests if guest.state == 1 for g in guest.gpus)

    def idle_gpus(self, count: int) -> frozenset[int]:
        """GPUs of a `count`-GPU node that nobody computes on: the host pool's free GPUs and
        those of a shut-off guest (bound to vfio-pci, so also passed through)."""
        return frozenset(range(count)) - self.busy_gpus - self.guest_load_gpus

    @property
    def workloads(self) -> tuple[frozenset[int], ...]:
        """The GPUs of each running guest, pod and job: each set runs one workload."""
        groups = [frozenset(g.gpus) for g in self.guests if g.state == 1 and g.gpus]
        groups += [
            frozenset(pod.gpus) | {g for g, _ in pod.mig + pod.replicas} for pod in self.pods
        ]
        groups += [frozenset(job.gpus) for job in self.jobs]
        groups += [frozenset((g,)) for g in self.loose]
        return tuple(groups)

    @property
    def sharers(self) -> dict[int, int]:
        """GPU -> how many pods share it through replicas (time-slicing), where more than one."""
        counts: dict[int, int] = {}
        for pod in self.pods:
            for gpu in {g for g, _ in pod.replicas}:
                counts[gpu] = counts.get(gpu, 0) + 1
        return {gpu: n for gpu, n in counts.items() if n > 1}

    @property
    def mig_slots(self) -> frozenset[tuple[int, int]]:
        """(GPU, MIG slot) pairs a pod holds: where MIG compute processes run."""
        return frozenset(slot for pod in self.pods for slot in pod.mig)


_DEMO_PLANS: dict[str, SimPlan] = {
    "dgx-001": SimPlan(
        guests=(SimGuest("acme-train-vm", tuple(range(8)), tenant="acme", nvswitches=True),)
    ),
    "dgx-002": SimPlan(jobs=(SimJob("4711", "physics", 1001, tuple(range(8))),)),
    "dgx-003": SimPlan(
        # a new guest waiting for its passthrough GPU (story 3: GPU 3 is the free one)
        guests=(SimGuest("tenant-b-vm8", (), started_h=0.2),),
        pods=(
            SimPod("team-nlp", "train-llm-7b-0", "trainer", gpus=(4, 5, 6, 7)),
            SimPod("team-vision", "resnet-ft-1", "train", gpus=(0, 1), started_h=1.5),
            SimPod("team-nlp", "notebook-alice", "notebook", gpus=(2,), started_h=26.0),
        ),
    ),
    "dgx-004": SimPlan(
        guests=(SimGuest("tenant-b-vm7", (2,), started_h=50.0, agent=True),),
        pods=(
            SimPod("team-vision", "infer-0", "server", mig=((7, 0),)),
            SimPod("team-nlp", "embed-1", "server", mig=((7, 1),), started_h=0.5),
        ),
    ),
    "dgx-005": SimPlan(
        pods=(
            SimPod("team-nlp", "pretrain-34b-0", "trainer", gpus=(0, 1, 2, 3), started_h=9.0),
            SimPod("team-vision", "detr-ft-2", "train", gpus=(4, 5, 6, 7), started_h=3.0),
        ),
    ),
    "dgx-006": SimPlan(
        pods=(
            SimPod("team-research", "sweep-lr-3", "trainer", gpus=(0, 1, 2, 3), started_h=11.0),
            SimPod("team-vision", "infer-h100-2", "server", gpus=(6,), started_h=20.0),
        ),
    ),
    "dgxa-001": SimPlan(
        pods=(SimPod("team-vision", "infer-a100-0", "server", mig=((0, 0), (0, 2))),),
        jobs=(SimJob("4712", "chem", 1002, (4, 5, 6, 7)),),
    ),
    "dgxa-002": SimPlan(
        guests=(SimGuest("tenant-c-vm2", (6, 7), state=5),),
        pods=(
            SimPod("team-nlp", "dev-a", "shell", replicas=((0, 0),)),
            SimPod("team-nlp", "dev-b", "shell", replicas=((0, 1),), started_h=3.0),
            SimPod("team-nlp", "dev-c", "shell", replicas=((0, 2),), started_h=0.7),
            SimPod(
                "team-research", "dra-train-0", "main", gpus=(1,), started_h=2.0, claim="one-gpu"
            ),
        ),
    ),
    "apollo-01": SimPlan(pods=(SimPod("team-vision", "label-svc", "app", gpus=(0,)),)),
    "dgx1-001": SimPlan(jobs=(SimJob("4690", "bio", 1000, tuple(range(8)), started_h=7.0),)),
}


def plan_for(name: str, profile: NodeProfile) -> SimPlan:
    """The demo cluster's own plan for its nodes; for larger clusters, a rotation of the same
    shapes (pods 4+2+1, a Slurm job, a one-GPU guest, a free node) chosen by the name."""
    if name in _DEMO_PLANS:
        return _DEMO_PLANS[name]
    n = len(profile.gpus)
    pick = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 4
    if pick == 0 and n >= 7:
        return SimPlan(
            pods=(
                SimPod("team-nlp", f"train-{name}", "trainer", gpus=(0, 1, 2, 3)),
                SimPod("team-vision", f"ft-{name}", "train", gpus=(4, 5)),
                SimPod("team-nlp", f"nb-{name}", "notebook", gpus=(6,)),
            )
        )
    if pick == 1:
        job = str(5000 + int(hashlib.sha256(name.encode()).hexdigest()[8:12], 16) % 4000)
        return SimPlan(jobs=(SimJob(job, "physics", 1001, tuple(range(n))),))
    if pick == 2:
        return SimPlan(guests=(SimGuest(f"tenant-b-{name}", (n - 1,)),))
    return SimPlan()
