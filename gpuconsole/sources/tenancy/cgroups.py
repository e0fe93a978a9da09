"""Processes holding NVIDIA devices, and the pod, container or Slurm job their cgroup names.

Which processes: those with a /dev/nvidia* file open (a readlink of each /proc/PID/fd
entry). That finds every CUDA process, including ones NVML lists under a PID of another
namespace, without asking NVML; the merge then keeps only the PIDs NVML reports as compute
processes, so monitoring tools holding /dev/nvidiactl do not become owners, except on a GPU
NVML lost (it lists none): there the processes holding its /dev/nvidiaN are its owners. The cost is one
listdir per process and one readlink per open file, every poll; what a PID's cgroup, user
and environment say is cached by (PID, start time), since it does not change.

cgroup paths it understands (v2 and v1, systemd and cgroupfs drivers):
  kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
  /kubepods/besteffort/pod<uid>/<id>
  /system.slice/slurmstepd.scope/job_<N>/step_0/...     /slurm/uid_1000/job_<N>/step_0
  /system.slice/docker-<id>.scope    /docker/<id>    libpod-<id>.scope
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import msgspec

from gpuconsole.readings.tenancy import HostProcess
from gpuconsole.sources.tenancy import procfs
from gpuconsole.sources.tenancy.sharing import share_limits

__all__ = ["CgroupOwner", "ProcessScanner", "parse_cgroup"]

_POD = re.compile(
    r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})"
)
_JOB = re.compile(r"(?:^|/)job_(\d+)(?:/|$)")
_CONTAINER = re.compile(r"(?:(cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIMES = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
    "libpod": "podman",
}
_NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a cgroup path says a process belongs to."""

    path: str
    pod_uid: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    slurm_job: str | None = None


def _pick_path(text: str) -> str:
    """The cgroup v2 path, else the first v1 hierarchy that names a pod, job or container."""
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            if parts[0] == "0" and parts[1] == "":
                return parts[2]
            paths.append(parts[2])
    for path in paths:
        if "kubepods" in path or "job_" in path or _CONTAINER.search(path.rsplit("/", 1)[-1]):
            return path
    return paths[0] if paths else ""


def parse_cgroup(text: str) -> CgroupOwner:
    """A /proc/PID/cgroup file's owner: pod UID, container, Slurm job, or nothing."""
    path = _pick_path(text)
    pod_uid = container = runtime = job = None
    pod = _POD.search(path) if "kubepods" in path else None
    if pod:
        pod_uid = pod.group(1).replace("_", "-")
    found = _JOB.search(path)
    if found:
        job = found.group(1)
    for segment in reversed(path.split("/")):
        m = _CONTAINER.search(segment)
        if m:
            container = m.group(2)
            runtime = _RUNTIMES.get(m.group(1) or "", None)
            if runtime is None and pod_uid is None:
                runtime = "docker" if "docker" in path else None
            break
    return CgroupOwner(path, pod_uid, container, runtime, job)


class ProcessScanner:
    """Finds processes with NVIDIA devices open and reads what they belong to."""

    def __init__(
        self, proc_root: str, passwd_file: str = "/etc/passwd", own_pid: int | None = None
    ) -> None:
        self.proc_root = proc_root
        # this process holds every /dev/nvidiaN through its own NVML, for nobody's work: it
        # is left out (else a GPU NVML lost would seem held by the console reading it)
        if own_pid is None and os.path.realpath(proc_root) == "/proc":
            own_pid = os.getpid()
        self.own_pid = own_pid
        self.passwd_file = passwd_file
        self._clock: procfs.Clock | None = None
        self._users: dict[int, str] | None = None
        self._known: dict[tuple[int, float | None], HostProcess] = {}

    def _nvidia_minors(self, pid: int) -> tuple[int, ...] | None:
        """The /dev/nvidiaN minors a process has open; None when it holds no NVIDIA file."""
        folder = os.path.join(self.proc_root, str(pid), "fd")
        try:
            names = os.listdir(folder)
        except OSError:
            return None
        minors: set[int] = set()
        nvidia = False
        for name in names:
            try:
                target = os.readlink(os.path.join(folder, name))
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                nvidia = True
                m = _NVIDIA_DEV.match(target)
                if m:
                    minors.add(int(m.group(1)))
        return tuple(sorted(minors)) if nvidia else None

    def scan(self) -> tuple[HostProcess, ...]:
        """Every process holding a /dev/nvidia* file, with its cgroup owner and user."""
        if self._clock is None:
            self._clock = procfs.Clock(self.proc_root)
        if self._users is None:
            self._users = procfs.users(self.passwd_file)
        found = []
        known: dict[tuple[int, float | None], HostProcess] = {}
        for pid in procfs.pids(self.proc_root):
            if pid == self.own_pid:
                continue
            minors = self._nvidia_minors(pid)
            if minors is None:
                continue
            started = self._clock.started_at(pid)
            process = self._known.get((pid, started))
            if process is None:
                process = self._describe(pid, started)
                if process is None:
                    continue
            process = msgspec.structs.replace(process, gpu_minors=minors)
            known[(pid, started)] = process
            found.append(process)
        self._known = known
        return tuple(sorted(found, key=lambda p: p.pid))

    def _describe(self, pid: int, started: float | None) -> HostProcess | None:
        text = procfs.read_text(self.proc_root, pid, "cgroup")
        if text is None:
            return None  # gone
        owner = parse_cgroup(text)
        uid = procfs.real_uid(self.proc_root, pid)
        env = procfs.environ(self.proc_root, pid)  # empty where this user may not read it
        account = (env.get("SLURM_JOB_ACCOUNT") or None) if owner.slurm_job is not None else None
        users = self._users or {}
        return HostProcess(
            pid=pid,
            comm=procfs.comm(self.proc_root, pid),
            cgroup=owner.path,
            uid=uid,
            user=users.get(uid, f"uid {uid}") if uid is not None else None,
            started_at=started,
            pod_uid=owner.pod_uid,
            container_id=owner.container_id,
            runtime=owner.runtime,
            slurm_job=owner.slurm_job,
            slurm_account=account,
            limits=share_limits(env),
        )
