"""A node whose journal says GPU 5's reset failed (its driver asks for one): `gpuconsole snapshot --json` and the
agent's exporter ask for the node's power cycle, as its console does. A node that never
acted has no journal, and a one-shot reading creates none."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpuconsole.actions.journal import SCHEMA, Journal, PlanState, StepState
from gpuconsole.actions.journal_events import JournalEvents
from gpuconsole.actions.plan import Layer, Plan, Step, StepKind, Target, TargetKind
from gpuconsole.facts.verdict import Action
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.nvml import XID_WINDOW_S
from gpuconsole.sim.identity import gpu_uuid
from gpuconsole.sim.profiles import DGX_H100
from tests.alert_fixtures import free_port
from tests.export_fixtures import one, parse
from tests.fakenvml_fixtures import FakeNvmlEnv
from tests.tenancy_fixtures import FakeHost
from tests.test_nvml_health_inputs import GPU_RESET, XIDS_KEPT, python_out

NODE = "dgx-e2e"
GPU5 = normal_bus_id(DGX_H100.gpus[5].bus_id)


def failed_reset(journal: Path, node: str = NODE, proc_root: Path | None = None) -> None:
    """Journal a remediation of GPU 5 on `node` whose reset failed, as the executor does
    (the node's boot read under `proc_root`, this machine's /proc by default)."""
    plan = Plan(
        node,
        Target(TargetKind.DRAINED),
        (GPU5,),
        (f"GPU 5 ({GPU5})",),
        (5,),
        ("free",),
        (),
        (Step(StepKind.GPU_RESET, Layer.GPU, f"reset GPU 5 ({GPU5})"),),
        remedy="reset_gpu",
    )
    store = Journal(journal) if proc_root is None else Journal(journal, proc_root=str(proc_root))
    with store.transaction() as db:
        plan_id = store.start_plan(db, plan, "ops", "operator", None)
    row = store.intent(plan_id, 0, StepKind.GPU_RESET.value)
    store.result(row, StepState.FAILED, "nvidia-smi -r: unable to reset the GPU")
    store.finish_plan(plan_id, PlanState.FAILED, "the reset failed")
    store.close()


def config(tmp_path: Path, journal: Path, extra: str = "") -> Path:
    path = tmp_path / "gpuconsole.toml"
    path.write_text(
        f"[host]\nname = '{NODE}'\n[nvml]\ninterval_s = 0.2\nevents = false\n"
        f"[fabric]\nenabled = false\n[tenancy]\nenabled = false\n"
        f"[actions]\nstate_dir = '{tmp_path / 'state'}'\njournal = '{journal}'\n{extra}"
    )
    return path


def gpu5_verdict(env: dict[str, str], cfg: Path) -> str:
    stdout = python_out(env, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg))
    verdicts = json.loads(stdout)["verdicts"]
    return str(verdicts[NODE]["gpus"][GPU5]["action"])


def dgx_h100_host(root: Path) -> FakeHost:
    """A DGX H100's GPUs as sysfs and the nvidia driver's /proc show them (the NVSwitches,
    on the nvidia driver too, are bridges: no GPU)."""
    host = FakeHost(root)
    for gpu in DGX_H100.gpus:
        bdf = normal_bus_id(gpu.bus_id)
        host.pci(bdf, driver="nvidia", group=gpu.index)
        host.nvidia_info(bdf, gpu_uuid(NODE, 0, gpu.index), gpu.index)
    for k, switch in enumerate(DGX_H100.nvswitches):
        host.pci(normal_bus_id(switch.bus_id), driver="nvidia", group=100 + k, pci_class=0x068000)
    return host


def test_a_gpu_lost_before_the_one_shot_started_is_named_by_sysfs_and_its_failed_reset_counts(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """NVML cannot open GPU 5 (it fell off the bus before the process started) and tenancy
    is off: its bus id is the nvidia driver's PCI device NVML did not open, its UUID the
    driver's /proc entry for it; so the journal's failed reset of it is its own."""
    env = fake_nvml_env(DGX_H100, open_errors={5: 15})  # NVML_ERROR_GPU_IS_LOST
    host = dgx_h100_host(tmp_path / "host")
    journal = tmp_path / "actions.db"
    paths = f"sysfs_root = '{host.sysfs_root}'\nproc_root = '{host.proc_root}'\n"
    cfg = config(tmp_path, journal)
    cfg.write_text(cfg.read_text().replace("[nvml]\n", paths + "[nvml]\n"))
    stdout = python_out(env, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg))
    (node,) = json.loads(stdout)["nodes"]
    gpu5 = node["nvml"]["gpus"][5]
    assert gpu5["state"] == "lost"
    assert normal_bus_id(gpu5["pci_bus_id"]) == GPU5 and gpu5["uuid"] == gpu_uuid(NODE, 0, 5)
    assert gpu5_verdict(env, cfg) == "reset_gpu"
    failed_reset(journal)
    assert gpu5_verdict(env, cfg) == "reboot_node"


def test_snapshot_json_asks_for_the_power_cycle_once_the_journal_says_the_reset_failed(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env(DGX_H100, driver="580.82", recovery_actions={5: GPU_RESET})
    journal = tmp_path / "actions.db"
    cfg = config(tmp_path, journal)
    assert gpu5_verdict(env, cfg) == "reset_gpu"
    assert not journal.exists()  # a one-shot reading creates no journal
    failed_reset(journal, "dgx-other")  # another node's plan in a shared journal
    assert gpu5_verdict(env, cfg) == "reset_gpu"
    failed_reset(journal)
    assert gpu5_verdict(env, cfg) == "reboot_node"


def test_the_agent_exports_the_power_cycle_once_the_journal_says_the_reset_failed(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env(DGX_H100, driver="580.82", recovery_actions={5: GPU_RESET})
    journal = tmp_path / "actions.db"
    port = free_port()
    cfg = config(tmp_path, journal, f"[agent]\nlisten = '127.0.0.1:{port}'\n")
    log = (tmp_path / "agent.log").open("ab")
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpuconsole", "agent", "-c", str(cfg)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )

    def action() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as got:
                body = got.read().decode()
        except OSError:
            return None
        series = parse(body).get("gpuconsole_gpu_verdict", [])
        found = [s for s in series if s.labels.get("gpu") == GPU5]
        return one(found, node=NODE).labels["action"] if found else None

    def seen(want: str, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while action() != want:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            assert time.monotonic() < deadline, f"{want} not exported in {seconds:g} s"
            time.sleep(0.2)

    try:
        seen("reset_gpu")
        failed_reset(journal)  # e.g. `gpuconsole remediate` in a shell on the node
        seen("reboot_node", 15.0)
    finally:
        agent.terminate()
        agent.wait(15)
        log.close()


async def test_a_node_reads_only_its_own_repairs_and_sees_each_new_one(tmp_path: Path) -> None:
    """The simulated cluster's nodes share one journal and their GPUs the same bus ids:
    another node's failed reset is not this node's. A journal unchanged since the last look
    is not read again, yet a repair that left the window drops out and a new one shows."""
    journal = tmp_path / "actions.db"
    now = [time.time()]
    events = JournalEvents(NODE, journal, clock=lambda: now[0])
    try:
        assert (await events.poll()).repairs == ()
        failed_reset(journal, "dgx-other")
        assert (await events.poll()).repairs == ()
        failed_reset(journal)
        (tried,) = (await events.poll()).repairs
        assert (tried.bus_id, tried.action, tried.ok) == (GPU5, Action.RESET_GPU, False)
        now[0] += XID_WINDOW_S + 1
        assert (await events.poll()).repairs == ()
        failed_reset(journal)  # its clock is the wall clock: the window's start
        now[0] = time.time()
        assert len((await events.poll()).repairs) == 1
    finally:
        await events.close()


async def test_a_journal_left_alone_is_not_read_again_until_a_plan_writes(tmp_path: Path) -> None:
    """Its files' stamps say whether anything was written: one written long ago is taken at
    its word, and the next write shows at the next poll."""
    journal = tmp_path / "actions.db"
    failed_reset(journal, "dgx-other")
    events = JournalEvents(NODE, journal)
    try:
        assert (await events.poll()).repairs == ()
        old = time.time() - 60
        for name in (journal, journal.with_name(journal.name + "-wal")):
            os.utime(name, (old, old))  # as a journal nobody wrote to for a minute
        assert (await events.poll()).repairs == ()
        assert events._stamp is not None  # trusted: the next poll only looks
        failed_reset(journal)
        (tried,) = (await events.poll()).repairs
        assert (tried.bus_id, tried.ok) == (GPU5, False)
    finally:
        await events.close()


BOOT_A = "0c6f3d5e-2d1a-4b8e-9a51-7e0f6b1c2d3a"
BOOT_B = "5b2e9f71-8c4d-4e6a-b3f0-1a2b3c4d5e6f"


def booted(proc: Path, boot_id: str, at: float) -> None:
    """The node's /proc as a boot leaves it: the kernel's boot id and the boot time."""
    random = proc / "sys" / "kernel" / "random"
    random.mkdir(parents=True, exist_ok=True)
    (random / "boot_id").write_text(boot_id + "\n")
    (proc / "stat").write_text(f"cpu 1 2 3 4\nbtime {int(at)}\n")


async def test_each_step_journals_the_boot_and_a_reboot_since_a_failed_reset_is_its_repair(
    tmp_path: Path,
) -> None:
    """The reset failed in one boot; the node was rebooted by hand (no power cycle in the
    journal), so the next process reads a new boot id: the reboot is GPU 5's last repair,
    and while GPU 5 is not fit, a failed one."""
    proc = tmp_path / "proc"
    booted(proc, BOOT_A, time.time() - 3600)
    journal = tmp_path / "actions.db"
    failed_reset(journal, proc_root=proc)
    (step,) = Journal(journal).plans()[0].steps
    assert step.boot_id == BOOT_A
    before = JournalEvents(NODE, journal, proc_root=str(proc))
    try:
        (tried,) = (await before.poll()).repairs
        assert (tried.action, tried.ok, tried.reset_failed_at) == (Action.RESET_GPU, False, None)
    finally:
        await before.close()
    rebooted = int(step.started_at) + 1  # the next second
    booted(proc, BOOT_B, rebooted)
    after = JournalEvents(NODE, journal, proc_root=str(proc))
    try:
        (seen,) = (await after.poll()).repairs
    finally:
        await after.close()
    assert (seen.bus_id, seen.action, seen.ok) == (GPU5, Action.REBOOT_NODE, False)
    assert (seen.at, seen.reset_failed_at) == (rebooted, step.started_at)


def test_a_gpu_still_broken_after_a_reboot_by_hand_goes_for_service(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """`gpuconsole snapshot` on the node: GPU 5's reset failed, the node was rebooted outside
    gpuconsole, and the driver still asks for a reset: return it for service. Fit after the
    reboot, it is fit."""
    broken = fake_nvml_env(DGX_H100, driver="580.82", recovery_actions={5: GPU_RESET})
    proc = tmp_path / "proc"
    booted(proc, BOOT_A, time.time() - 3600)
    journal = tmp_path / "actions.db"
    cfg = config(tmp_path, journal)
    cfg.write_text(cfg.read_text().replace("[nvml]\n", f"proc_root = '{proc}'\n[nvml]\n"))
    failed_reset(journal, proc_root=proc)
    assert gpu5_verdict(broken, cfg) == "reboot_node"
    booted(proc, BOOT_B, time.time() + 1)
    stdout = python_out(broken, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg))
    verdict = json.loads(stdout)["verdicts"][NODE]
    assert verdict["gpus"][GPU5]["action"] == "service"
    (why,) = [f["text"] for f in verdict["findings"] if f["action"] == "service"]
    assert "return it for service: the node was rebooted at " in why
    assert why.endswith("failed, and it is not fit since")
    healthy = fake_nvml_env(DGX_H100, driver="580.82")
    stdout = python_out(healthy, "-m", "gpuconsole", "snapshot", "--json", "-c", str(cfg))
    assert GPU5 not in json.loads(stdout)["verdicts"][NODE]["gpus"]  # judged fit: not listed


async def test_a_journal_from_before_boot_ids_is_read_and_then_written_with_them(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "actions.db"
    before = SCHEMA.replace(",\n    boot_id TEXT NOT NULL DEFAULT ''", "")
    assert before != SCHEMA
    db = sqlite3.connect(journal)
    db.executescript(before)
    db.close()
    proc = tmp_path / "proc"
    booted(proc, BOOT_A, time.time() - 3600)
    reader = JournalEvents(NODE, journal, proc_root=str(proc))  # read-only: it adds nothing
    try:
        assert (await reader.poll()).repairs == ()
        failed_reset(journal, proc_root=proc)  # a writer adds the column
        (tried,) = (await reader.poll()).repairs
        assert (tried.bus_id, tried.action, tried.ok) == (GPU5, Action.RESET_GPU, False)
    finally:
        await reader.close()
    (step,) = Journal(journal).plans()[0].steps
    assert step.boot_id == BOOT_A


def test_a_gpu_lost_before_the_agent_restarted_and_answering_after_it_was_reset(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """GPU 5 fell off the bus; the agent stopped, someone reset the GPU, the agent started
    again and finds it answering: the reset NVML did not see is told by the GPU lost before
    and answering now. One still lost (named by sysfs, as NVML cannot) keeps its XID."""
    host = dgx_h100_host(tmp_path / "host")
    booted(host.proc, "boot-a", 1000.0)
    state = tmp_path / "state"

    def xids(env: dict[str, str], wait_s: str) -> str:
        where = (str(host.proc), str(state), wait_s, "5", str(host.sysfs))
        return python_out(env, "-c", XIDS_KEPT, *where)

    assert xids(fake_nvml_env(DGX_H100, scenarios=["xid79 5 at 0.3"]), "20") == "[[79, 1]]\n"
    assert xids(fake_nvml_env(DGX_H100, scenarios=["xid79 5"]), "1") == "[[79, 1]]\n"
    assert xids(fake_nvml_env(DGX_H100), "1") == "[]\n"  # reset while no agent ran
