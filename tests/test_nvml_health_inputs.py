"""What the verdict reads from NVML, on the fake library: the driver's recovery action, the
GPU's fabric probe, XIDs counted per code until a reset, whether Fabric Manager runs, the
NVLink error counters, retired pages, and how long a slowdown has lasted."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.readings.base import normal_bus_id
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sim.node import Scenario, SimNode
from gpuconsole.sim.nvml import SimNvml
from gpuconsole.sim.profiles import APOLLO_PCIE, DGX_H100, NodeProfile
from gpuconsole.sources.nvml.source import NvmlSource
from gpuconsole.sources.nvml.xids import XidHistory
from tests.fakenvml_fixtures import FakeNvmlEnv

GPU_RESET, NODE_REBOOT = 1, 2  # nvmlDeviceGpuRecoveryAction_t
FABRIC_COMPLETED, FABRIC_IN_PROGRESS = 3, 2  # nvmlGpuFabricState_t
NVML_ERROR_UNKNOWN = 999


def python_out(env: dict[str, str], *args: str) -> str:
    """What `python ARGS` prints, run with `env` (the fake library's); it must succeed."""
    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def snapshot(
    env: dict[str, str], tmp_path: Path, profile: NodeProfile, proc_root: Path | None = None
) -> dict[str, Any]:
    """`gpuconsole snapshot --json` of this node: its one node."""
    host = f"[host]\nname = '{profile.name}'\n"
    if proc_root is not None:
        host += f"proc_root = '{proc_root}'\n"
    config = tmp_path / "gpuconsole.toml"
    config.write_text(host + "[fabric]\nenabled = false\n[tenancy]\nenabled = false\n")
    stdout = python_out(env, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config))
    node: dict[str, Any] = json.loads(stdout)["nodes"][0]
    return node


def proc_tree(root: Path, *names: str) -> Path:
    """A process table with one process per name, as /proc/PID/comm holds it (15 bytes)."""
    for pid, name in enumerate(names, start=1):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "comm").write_text(name[:15] + "\n")
    (root / "self").mkdir(parents=True, exist_ok=True)
    return root


def test_the_driver_advises_a_reset_and_a_reboot_and_the_reading_says_which_gpu(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env(DGX_H100, driver="580.82", recovery_actions={3: GPU_RESET, 5: NODE_REBOOT})
    gpus = snapshot(env, tmp_path, DGX_H100)["nvml"]["gpus"]
    assert [g["recovery_action"] for g in gpus] == [0, 0, 0, GPU_RESET, 0, NODE_REBOOT, 0, 0]
    assert not any("field 230" in g["unsupported"] for g in gpus)


def test_a_driver_branch_without_the_recovery_action_says_it_is_unknown(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """R550 has no field 230: the reading says nothing (None), not "none" (0), and lists no
    NotSupported field on every GPU for asking it."""
    env = fake_nvml_env(DGX_H100, driver="550", recovery_actions={3: GPU_RESET})
    gpus = snapshot(env, tmp_path, DGX_H100)["nvml"]["gpus"]
    assert [g["recovery_action"] for g in gpus] == [None] * 8
    assert not any("field 230" in g["unsupported"] for g in gpus)
    assert all(g["state"] == "ok" for g in gpus)


def test_a_gpu_that_failed_to_join_the_fabric_says_so_beside_its_state(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env(
        DGX_H100,
        fabric_probes={2: (FABRIC_COMPLETED, NVML_ERROR_UNKNOWN), 4: (FABRIC_IN_PROGRESS, 0)},
    )
    gpus = snapshot(env, tmp_path, DGX_H100)["nvml"]["gpus"]
    assert [g["fabric_state"] for g in gpus] == ["completed"] * 4 + ["in_progress"] + [
        "completed"
    ] * 3
    # the probe's result once it ended: 0 joined, another nvmlReturn_t failed; none before
    assert [g["fabric_status"] for g in gpus] == [0, 0, NVML_ERROR_UNKNOWN, 0, None, 0, 0, 0]


def test_an_nvswitch_node_says_whether_fabric_manager_runs(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    env = fake_nvml_env(DGX_H100)
    running = proc_tree(tmp_path / "up", "systemd", "nv-fabricmanager", "bash")
    stopped = proc_tree(tmp_path / "down", "systemd", "nvidia-persistenced", "bash")
    assert snapshot(env, tmp_path, DGX_H100, running)["nvml"]["fabric_manager_running"] is True
    assert snapshot(env, tmp_path, DGX_H100, stopped)["nvml"]["fabric_manager_running"] is False


def test_inside_a_guest_fabric_manager_is_not_known(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """GPUs passed through to a VM: Fabric Manager runs on the host (or a service VM), not in
    the guest's process table, so the guest says nothing rather than "not running"."""
    env = fake_nvml_env(DGX_H100, virtualization_mode=1)
    node = snapshot(env, tmp_path, DGX_H100, proc_tree(tmp_path / "guest", "systemd", "python3"))
    assert {g["virtualization_mode"] for g in node["nvml"]["gpus"]} == {"passthrough"}
    assert node["nvml"]["fabric_manager_running"] is None


def test_a_process_table_hidden_from_this_user_leaves_fabric_manager_unknown_and_says_why(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """procfs mounted with hidepid=2 lists a user its own processes only: no nv-fabricmanager
    among them is no evidence that it is down (which would drain the node)."""
    own = tmp_path / "own"
    (own / "4242").mkdir(parents=True)
    (own / "4242" / "comm").write_text("bash\n")
    config = tmp_path / "gpuconsole.toml"
    config.write_text(
        f"[host]\nname = 'dgx'\nproc_root = '{own}'\n[fabric]\nenabled = false\n"
        "[tenancy]\nenabled = false\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config)],
        env=fake_nvml_env(DGX_H100), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["nodes"][0]["nvml"]["fabric_manager_running"] is None
    assert "whether Fabric Manager runs is not known" in proc.stderr
    assert "hidepid" in proc.stderr
    findings = document["verdicts"]["dgx"]["findings"]
    assert not any(f["code"] == "fabric_manager_down" for f in findings)


FM_OPENS = """
import sys
from gpuconsole.sources.nvml.source import fabric_manager_running
opened = []
sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" else None)
running = fabric_manager_running(sys.argv[1], sys.argv[2])
print(running, len(opened))
"""


def test_fabric_manager_is_found_by_its_pid_file_without_reading_every_process(
    tmp_path: Path,
) -> None:
    """On a busy node the process table runs to thousands: the service's pid file names the
    process to look at. A pid file a crash left behind proves nothing."""
    names = ["systemd"] + ["python3"] * 300 + ["nv-fabricmanager"]
    table = proc_tree(tmp_path / "proc", *names)
    pid_file = tmp_path / "nv-fabricmanager.pid"
    pid_file.write_text(f"{len(names)}\n")
    assert python_out({**os.environ}, "-c", FM_OPENS, str(table), str(pid_file)) == "True 2\n"
    pid_file.write_text("2\n")  # stale: now a python3
    assert python_out({**os.environ}, "-c", FM_OPENS, str(table), str(pid_file)).startswith("True ")
    pid_file.unlink()
    os.mkfifo(pid_file)  # no writer: a blocking open would wait for ever
    assert python_out({**os.environ}, "-c", FM_OPENS, str(table), str(pid_file)).startswith("True ")
    stopped = proc_tree(tmp_path / "stopped", "systemd", "python3")
    assert python_out({**os.environ}, "-c", FM_OPENS, str(stopped), str(pid_file)).startswith(
        "False "
    )


def test_a_pcie_node_needs_no_fabric_manager(fake_nvml_env: FakeNvmlEnv, tmp_path: Path) -> None:
    node = snapshot(fake_nvml_env(APOLLO_PCIE), tmp_path, APOLLO_PCIE, proc_tree(tmp_path / "p"))
    assert node["nvml"]["fabric_manager_running"] is None
    assert {g["fabric_state"] for g in node["nvml"]["gpus"]} == {None}
    assert {g["fabric_status"] for g in node["nvml"]["gpus"]} == {None}


XIDS = """
import json, threading, time
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", interval_s=0.1, inventory_every=1)
events = []
source._emit = events.append
source._ensure_init()
seen = []
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    reading = source.collect()
    seen.append({{g.index: [g.state.value, [[x.code, x.count] for x in g.xids]]
                 for g in reading.gpus}})
    if {done}:
        break
    time.sleep(0.1)
source._shutdown()
print(json.dumps({{"polls": seen, "events": [[e.kind, e.gpu_bus_id, e.code] for e in events]}}))
"""


def run_xids(env: dict[str, str], done: str) -> dict[str, Any]:
    """Polls of a long-running NVML source (its event thread on) until `done` holds of the
    last poll's `reading`."""
    stdout = python_out(env, "-c", XIDS.format(done=done))
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def test_xids_are_counted_per_code_and_gpu_by_bus_id(fake_nvml_env: FakeNvmlEnv) -> None:
    env = fake_nvml_env(
        DGX_H100,
        scenarios=["xid13 2 at 0.2", "xid13 2 at 0.4", "xid31 2 at 0.5", "xid48 6 at 0.3"],
    )
    done = "sum(x.count for g in reading.gpus for x in g.xids) >= 4"
    result = run_xids(env, done)
    last = result["polls"][-1]
    assert last["2"][1] == [[13, 2], [31, 1]]
    assert last["6"][1] == [[48, 1]]
    assert all(last[str(i)][1] == [] for i in (0, 1, 3, 4, 5, 7))
    # the events name the GPU by bus id, as the counts are kept
    assert ["xid", normal_bus_id(DGX_H100.gpus[2].bus_id), 13] in result["events"]


def test_a_reset_clears_the_xids_of_a_gpu_that_fell_off_the_bus(fake_nvml_env: FakeNvmlEnv) -> None:
    env = fake_nvml_env(DGX_H100, scenarios=["xid13 5 at 0.2", "xid79 5 at 0.5", "reset 5 at 2"])
    seen_lost = "any(p[5][0] == 'lost' for p in seen)"
    result = run_xids(env, f"{seen_lost} and reading.gpus[5].state.value == 'ok'")
    states = [p["5"] for p in result["polls"]]
    lost = [xids for state, xids in states if state == "lost"]
    assert lost and lost[-1] == [[13, 1], [79, 1]]  # the evidence stays while it is lost
    assert states[-1] == ["ok", []]  # answering again after the reset: the XIDs are history
    assert ["gpu_recovered", normal_bus_id(DGX_H100.gpus[5].bus_id), None] in result["events"]


def test_xids_older_than_the_window_drop_out() -> None:
    history = XidHistory(window_s=3600)
    history.add("0000:18:00.0", 94, at=1000.0)
    history.add("0000:18:00.0", 94, at=1500.0)
    history.add("0000:18:00.0", 48, at=5000.0)
    counts = history.counts("0000:18:00.0", now=5000.0)  # the window reaches back to 1400
    assert [(x.code, x.count, x.first_at, x.last_at) for x in counts] == [
        (48, 1, 5000.0, 5000.0),
        (94, 1, 1500.0, 1500.0),
    ]
    later = history.counts("0000:18:00.0", now=5200.0)
    assert [(x.code, x.count) for x in later] == [(48, 1)]
    assert history.counts("0000:18:00.0", now=9000.0) == ()


def test_a_reset_clears_the_xids_it_recovers_and_keeps_those_that_ask_for_a_person() -> None:
    """NVIDIA's catalog names the recovery per XID: a reset (or the reboot it stands in for)
    is it for a double-bit error or a fall off the bus, not for a micro-controller breakpoint
    (contact support) or reduced clocks for power (check the mechanicals)."""
    bus = "0000:18:00.0"
    history = XidHistory(window_s=3600)
    for code in (48, 54, 61, 79, 999):
        history.add(bus, code, at=1000.0)
    history.clear(bus, at=1100.0)
    assert [x.code for x in history.counts(bus, now=1200.0)] == [54, 61]
    assert history.reset_at(bus, now=1200.0) == 1100.0


def test_xids_outlive_a_restart_of_gpuconsole_but_not_a_reboot(tmp_path: Path) -> None:
    """Repeats stay visible across a restart of the agent (an upgrade, a crash): only the
    recovery the catalog names clears them, and a reboot is one, told by the kernel's boot
    id. A state file that is not what this process wrote starts the history afresh."""
    bus, path = "0000:18:00.0", tmp_path / "state" / "xids-n.json"
    first = XidHistory(window_s=3600, path=path, boot="boot-a")
    first.add(bus, 48, at=1000.0)
    first.add(bus, 48, at=1010.0)
    first.add(bus, 61, at=1020.0)  # contact support: no reboot recovers it
    first.clear("0000:2a:00.0", at=990.0)  # a GPU NVML saw come back: when, kept too
    first.mark_lost("0000:9a:00.0")  # off the bus when this process ended
    first.flush()
    restarted = XidHistory(window_s=3600, path=path, boot="boot-a")
    assert [(x.code, x.count, x.first_at, x.last_at) for x in restarted.counts(bus, 1100.0)] == [
        (48, 2, 1000.0, 1010.0),
        (61, 1, 1020.0, 1020.0),
    ]
    assert restarted.reset_at("0000:2a:00.0", 1100.0) == 990.0
    assert restarted.was_lost("0000:9a:00.0") and not restarted.was_lost(bus)
    assert restarted.counts(bus, 5000.0) == ()  # the window still closes on them
    rebooted = XidHistory(window_s=3600, path=path, boot="boot-b")
    assert [x.code for x in rebooted.counts(bus, 1100.0)] == [61]
    assert rebooted.reset_at("0000:2a:00.0", 1100.0) is None
    assert not rebooted.was_lost("0000:9a:00.0")
    assert XidHistory(window_s=3600, path=path, boot="").counts(bus, 1100.0) == ()
    for junk in (b"\xff\xfe", b"[1, 2]", b'{"boot_id": "boot-a", "gpus": {"x": {"48": "y"}}}'):
        path.write_bytes(junk)
        assert XidHistory(window_s=3600, path=path, boot="boot-a").counts(bus, 1100.0) == ()


XIDS_KEPT = """
import json, sys, time
from pathlib import Path
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", interval_s=0.1, inventory_every=1, proc_root=sys.argv[1],
                    state_dir=Path(sys.argv[2]),
                    sysfs_root=sys.argv[5] if len(sys.argv) > 5 else "/sys")
source._ensure_init()
gpu = int(sys.argv[4]) if len(sys.argv) > 4 else 6
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    reading = source.collect()
    if reading.gpus[gpu].xids or float(sys.argv[3]) < time.monotonic() - deadline + 20:
        break
    time.sleep(0.1)
source._shutdown()
print(json.dumps([[x.code, x.count] for x in reading.gpus[gpu].xids]))
"""


def test_an_agent_restarted_still_shows_the_xid_until_the_node_reboots(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    proc, state = tmp_path / "proc", tmp_path / "state"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("boot-a\n")
    seen = fake_nvml_env(DGX_H100, scenarios=["xid48 6 at 0.3"])
    assert python_out(seen, "-c", XIDS_KEPT, str(proc), str(state), "20") == "[[48, 1]]\n"
    quiet = fake_nvml_env(DGX_H100)  # the same node, the agent started again
    assert python_out(quiet, "-c", XIDS_KEPT, str(proc), str(state), "1") == "[[48, 1]]\n"
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("boot-b\n")  # rebooted
    assert python_out(quiet, "-c", XIDS_KEPT, str(proc), str(state), "1") == "[]\n"


def test_the_simulator_fills_the_same_fields() -> None:
    node = SimNode("sim", DGX_H100, scenarios=["xid79:5"])
    lib = SimNvml(node, driver="580.82")
    lib.recovery_actions[3] = GPU_RESET
    lib.fabric_probes[2] = (FABRIC_COMPLETED, NVML_ERROR_UNKNOWN)
    source = NvmlSource("sim", lib=lib, events=False, simulated=True, fabric_manager=lambda: False)
    reading = source.collect()
    assert [g.recovery_action for g in reading.gpus if g.state.value == "ok"] == [
        0,
        0,
        0,
        GPU_RESET,
        0,
        0,
        0,
    ]
    assert reading.gpus[2].fabric_status == NVML_ERROR_UNKNOWN
    assert reading.gpus[0].fabric_state == "completed" and reading.gpus[0].fabric_status == 0
    assert reading.fabric_manager_running is False
    older = NvmlSource("sim", lib=SimNvml(SimNode("sim", DGX_H100), driver="550"), events=False)
    assert {g.recovery_action for g in older.collect().gpus} == {None}


def test_the_simulator_raises_any_xid_as_the_fake_library_does() -> None:
    """'xid48:2' (XID 48 on GPU 2), as the fake library's 'xid48 2': story 8 in the demo's
    own simulator, through the same event watch."""
    node = SimNode("sim", DGX_H100, scenarios=["xid48:2"])
    source = NvmlSource("sim", lib=SimNvml(node), simulated=True, fabric_manager=lambda: True)
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            reading = source.collect()
            if reading.gpus[2].xids:
                break
            time.sleep(0.05)
    finally:
        source._shutdown()
    assert [(x.code, x.count) for x in reading.gpus[2].xids] == [(48, 1)]
    assert reading.gpus[2].state.value == "ok"  # an XID 48 leaves the GPU on the bus
    text = reading_verdict(reading.gpus[2]).findings[0].text
    assert text.startswith("XID 48 double-bit ECC error: drain, then reset the GPU")
    for wrong in ("xid:2", "xidx:2", "xid0:2"):
        with pytest.raises(ValueError, match="unknown scenario"):
            Scenario.parse(wrong)


# --- NVLink error counters, retired pages and slowdowns that last -------------------------

POLLS = """
import json, time
from gpuconsole.facts.verdict import reading_verdict
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", interval_s=0.1, events=False, inventory_every=3)
source._ensure_init()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    reading = source.collect()
    if {done}:
        break
    time.sleep(0.2)
source._shutdown()
print(json.dumps([{{
    "links": [[l.link, l.replay_errors_total, l.recovery_errors_total, l.crc_errors_total]
              for l in g.nvlinks],
    "climbed": [[e.link, e.replay, e.recovery, e.crc] for e in g.nvlink_errors],
    "unsupported": list(g.unsupported),
    "verdict": [reading_verdict(g).action.value, reading_verdict(g).summary],
}} for g in reading.gpus]))
"""


def run_polls(env: dict[str, str], done: str) -> list[dict[str, Any]]:
    """A long-running NVML source's last poll, each GPU with its verdict, once `done` holds
    of `reading`."""
    stdout = python_out(env, "-c", POLLS.format(done=done))
    gpus: list[dict[str, Any]] = json.loads(stdout.strip().splitlines()[-1])
    return gpus


def test_a_link_whose_error_counters_climb_is_watched(fake_nvml_env: FakeNvmlEnv) -> None:
    env = fake_nvml_env(DGX_H100, scenarios=["nvlinkerr 2 at 0.5"])
    gpus = run_polls(env, "any(e.replay for e in reading.gpus[2].nvlink_errors)")
    link0 = gpus[2]["links"][0]
    assert link0[0] == 0 and link0[1] > 0 and link0[3] > link0[1]  # CRC climbs fastest
    assert all(link[1:] == [0, 0, 0] for link in gpus[2]["links"][1:])  # the rest: clean
    assert [e[0] for e in gpus[2]["climbed"]] == [0]
    action, summary = gpus[2]["verdict"]
    assert action == "watch"
    assert "NVLink 0:" in summary and "replay" in summary
    assert "CRC errors in the last 10 min" in summary
    assert "drain and reseat if they keep climbing" in summary
    # the other GPUs' links read zero: no finding, and the counters are not NotSupported
    assert all(
        g["climbed"] == [] and g["verdict"][0] == "fit" for i, g in enumerate(gpus) if i != 2
    )
    assert not any("field 161" in g["unsupported"] for g in gpus)


def test_a_driver_without_the_link_error_counters_says_nothing_of_them(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    """Blackwell drops fields 161-163 (NotSupported): no finding, no error, no counter."""
    env = fake_nvml_env(DGX_H100, scenarios=["nvlinkerr 2"], missing_fields=[161, 162, 163])
    gpus = run_polls(env, "True")
    assert all(link[1:] == [None, None, None] for g in gpus for link in g["links"])
    assert {g["verdict"][0] for g in gpus} == {"fit"}
    assert all({"field 161", "field 162", "field 163"} <= set(g["unsupported"]) for g in gpus)


def test_link_counters_are_read_in_the_inventory_round_only() -> None:
    """The error counters of every link come in the inventory round's batched call, not in
    every poll's (54 entries per Hopper GPU); the reading keeps them between rounds. Where
    NVML answers NotSupported (Blackwell) they are listed as such, and nothing else."""
    asked: list[list[Any]] = []

    class Blackwellish(SimNvml):
        def nvmlDeviceGetFieldValues(self, h: Any, fields: list[Any]) -> Any:
            asked.append(list(fields))
            values = super().nvmlDeviceGetFieldValues(h, fields)
            for entry in values:
                if entry.fieldId in (161, 162, 163):
                    entry.nvmlReturn = 3  # NOT_SUPPORTED
            return values

    def errors_asked() -> list[Any]:
        return [
            f for call in asked for f in call if isinstance(f, tuple) and f[0] in (161, 162, 163)
        ]

    healthy = NvmlSource("sim", lib=SimNvml(SimNode("sim", DGX_H100)), events=False,
                         inventory_every=1000)  # fmt: skip
    healthy.collect()
    reading = healthy.collect()
    assert all(link.replay_errors_total == 0 for link in reading.gpus[0].nvlinks)
    source = NvmlSource("sim", lib=Blackwellish(SimNode("sim", DGX_H100)), events=False,
                        inventory_every=1000)  # fmt: skip
    source.collect()
    assert len(errors_asked()) == 8 * 18 * 3  # the first (inventory) round: every link's
    asked.clear()
    reading = source.collect()
    assert asked and errors_asked() == []
    assert all(link.replay_errors_total is None for g in reading.gpus for link in g.nvlinks)
    assert all("field 161" in g.unsupported and g.state.value == "ok" for g in reading.gpus)


def test_retired_pages_before_ampere_and_none_after(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    volta_model = msgspec.structs.replace(APOLLO_PCIE.gpu_model, architecture="volta", arch_code=5)
    volta = dataclasses.replace(APOLLO_PCIE, gpu_model=volta_model)
    data = snapshot_all(fake_nvml_env(volta, scenarios=["retired 1"]), tmp_path, volta)
    ecc = [g["ecc"] for g in data["nodes"][0]["nvml"]["gpus"]]
    assert (ecc[1]["retired_sbe"], ecc[1]["retired_dbe"], ecc[1]["retired_pending"]) == (2, 1, True)
    assert (ecc[0]["retired_sbe"], ecc[0]["retired_pending"]) == (0, False)
    # the calls nvidia-smi -q and DCGM use say the same as the fields
    calls = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit(); "
         "h = pynvml.nvmlDeviceGetHandleByIndex(1); "
         "print(len(pynvml.nvmlDeviceGetRetiredPages(h, 0)), "
         "len(pynvml.nvmlDeviceGetRetiredPages(h, 1)), "
         "pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h))"],
        env=fake_nvml_env(volta, scenarios=["retired 1"]), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert calls.stdout.split() == ["2", "1", "1"]
    bus = normal_bus_id(volta.gpus[1].bus_id)
    verdict = data["verdicts"][volta.name]
    assert verdict["gpus"][bus]["action"] == "reset_gpu"
    assert any("page retirement is pending" in f["text"] for f in verdict["findings"])
    # Ampere and newer remap rows instead: NVML answers NotSupported, which is no finding
    # (and not asked at all, so not listed on every GPU)
    data = snapshot_all(fake_nvml_env(APOLLO_PCIE, scenarios=["retired 1"]), tmp_path, APOLLO_PCIE)
    gpus = data["nodes"][0]["nvml"]["gpus"]
    assert {g["ecc"]["retired_pending"] for g in gpus} == {None}
    assert not any("field 29" in g["unsupported"] for g in gpus)
    assert data["verdicts"][APOLLO_PCIE.name]["gpus"] == {}


def snapshot_all(env: dict[str, str], tmp_path: Path, profile: NodeProfile) -> dict[str, Any]:
    """`gpuconsole snapshot --json` of this node, the verdicts with it."""
    config = tmp_path / "gpuconsole.toml"
    config.write_text(f"[host]\nname = '{profile.name}'\n[fabric]\nenabled = false\n"
                      "[tenancy]\nenabled = false\n")  # fmt: skip
    stdout = python_out(env, "-m", "gpuconsole", "snapshot", "--json", "-c", str(config))
    data: dict[str, Any] = json.loads(stdout)
    return data


def test_a_slowdown_is_judged_on_how_long_it_has_lasted(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """The driver's clock-event counters (580.82) say how long GPU 3 has been held down when
    the console first reads it: a few seconds is a spike (fit), five minutes is a GPU to
    watch."""
    bus = normal_bus_id(DGX_H100.gpus[3].bus_id)
    for held_s, action in ((2.0, "fit"), (300.0, "watch")):
        env = fake_nvml_env(DGX_H100, driver="580.82", scenarios=["thermal 3"], frozen_time=held_s)
        data = snapshot_all(env, tmp_path, DGX_H100)
        verdict = data["verdicts"][DGX_H100.name]
        assert verdict["gpus"].get(bus, {"action": "fit"})["action"] == action, held_s
        texts = [f["text"] for f in verdict["findings"]]
        if action == "watch":
            assert any(t.startswith("clocks held down for 5 min: ") for t in texts), texts


def test_the_simulator_counts_a_slowdown_from_when_it_began() -> None:
    """On a driver without the counters (550) the console dates a slowdown from when it saw
    it begin: at first a spike, a minute of polls later a GPU to watch. One already on at
    the first poll is of unknown length: judged as it looks (watch)."""
    from gpuconsole.facts.verdict import Action, reading_verdict

    clock = [1000.0]
    node = SimNode("sim", DGX_H100, scenarios=["thermal:3@20", "thermal:5"],
                   clock=lambda: clock[0], start=1000.0)  # fmt: skip
    # the bitmask (what a 550 driver gives) read at every poll
    source = NvmlSource("sim", lib=SimNvml(node, driver="550"), events=False, simulated=True,
                        clock=lambda: clock[0], detail_every=1)  # fmt: skip

    def judged(index: int) -> tuple[float | None, Action, str]:
        reading = source.collect()
        gpu = reading.gpus[index]
        verdict = reading_verdict(gpu, NodeSnapshot("sim", nvml=reading))
        return gpu.slowdown_since, verdict.action, verdict.summary

    assert judged(3)[:2] == (None, Action.FIT)
    assert judged(5)[:2] == (None, Action.WATCH)  # on from the start: how long, unknown
    clock[0] = 1030.0
    since, action, _ = judged(3)
    assert (since, action) == (1030.0, Action.FIT)  # seen to begin: a spike so far
    for step in range(1, 8):
        clock[0] = 1030.0 + 10 * step
        since, action, summary = judged(3)
    assert (since, action) == (1030.0, Action.WATCH)
    assert "clocks held down for 70 s" in summary


AGAIN = """
import json, time
from gpuconsole.facts.verdict import gpu_verdict
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.nvml.source import NvmlSource
source = NvmlSource("n", interval_s=0.1, inventory_every=1)
source._emit = lambda event: None
source._ensure_init()
seen = []
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    reading = source.collect()
    gpu = reading.gpus[5]
    verdict = gpu_verdict(NodeSnapshot("n", nvml=reading), gpu)
    seen.append([gpu.state.value, gpu.reset_at is not None, verdict.action.value,
                 [f.text for f in verdict.findings]])
    if len([1 for a, b in zip(seen, seen[1:]) if a[0] != b[0]]) >= 2 and seen[-1][0] == "lost":
        break
    time.sleep(0.1)
source._shutdown()
print(json.dumps(seen))
"""


def test_a_gpu_that_falls_off_the_bus_again_after_its_reset_asks_for_the_node_reboot(
    fake_nvml_env: FakeNvmlEnv,
) -> None:
    """The first fall asks for the GPU's reset (the catalog's node reboot follows if it does
    not come back); a second after a reset NVML saw asks for the reboot itself."""
    env = fake_nvml_env(DGX_H100, scenarios=["xid79 5 at 0.3", "reset 5 at 1.5", "xid79 5 at 3"])
    polls = json.loads(python_out(env, "-c", AGAIN).strip().splitlines()[-1])
    states = [p[0] for p in polls]
    first = polls[states.index("lost")]
    assert first[1:3] == [False, "reset_gpu"]
    assert "reset the GPU; if it does not come back, reboot the node" in first[3][0]
    back = polls[states.index("ok", states.index("lost"))]
    assert back[1:3] == [True, "fit"]  # reset and healthy: fit, the reset remembered
    again = polls[-1]
    assert again[:3] == ["lost", True, "reboot_node"]
    assert "reboot the node: its reset at" in again[3][0] and "did not hold" in again[3][0]


# A long-running NVML source beside the node's journal (sys.argv[1]), as an agent has them.
JOURNALED = """
import json, sys, time
from pathlib import Path
from gpuconsole.actions.journal import Journal, PlanState, StepState
from gpuconsole.actions.journal_events import JournalEvents
from gpuconsole.actions.plan import StepKind
from gpuconsole.actions.remediation import make_remediation_plan
from gpuconsole.facts.verdict import Action, gpu_verdict
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.sources.nvml.source import NvmlSource
path = Path(sys.argv[1])
journal = Journal(path)
source = NvmlSource("n", interval_s=0.1, inventory_every=1)
source._emit = lambda event: None
source._ensure_init()
events = JournalEvents("n", path)
deadline = time.monotonic() + 20
"""

FAILED_RESET = (
    JOURNALED
    + """
seen, tried = [], None
while time.monotonic() < deadline:
    reading = source.collect()
    gpu = reading.gpus[5]
    node = NodeSnapshot("n", nvml=reading, actions=events._read())
    verdict = gpu_verdict(node, gpu)
    seen.append([gpu.state.value, tried, verdict.action.value, [f.text for f in verdict.findings]])
    if gpu.state.value == "lost" and tried is None:
        # the remediation's reset, as the executor journals one that fails
        plan = make_remediation_plan(node, "5", Action.RESET_GPU)
        seq = next(k for k, s in enumerate(plan.steps) if s.kind is StepKind.GPU_RESET)
        with journal.transaction() as db:
            plan_id = journal.start_plan(db, plan, "ops", "operator", None)
        row = journal.intent(plan_id, seq, StepKind.GPU_RESET.value)
        journal.result(row, StepState.FAILED, "nvidia-smi -r: unable to reset the GPU")
        journal.finish_plan(plan_id, PlanState.FAILED, "the reset failed")
        tried = journal.plan(plan_id).steps[0].started_at
    if len([1 for a, b in zip(seen, seen[1:]) if a[0] != b[0]]) >= 2 and seen[-1][0] == "lost":
        break
    time.sleep(0.1)
source._shutdown()
print(json.dumps(seen))
"""
)


def test_a_reset_that_failed_asks_for_the_node_reboot_until_nvml_sees_the_gpu_come_back(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """The node's journal says GPU 5's reset failed: its verdict asks for the node's power
    cycle, by its bus id and the time of the reset. Once NVML saw it come back (a later reset
    that worked), that failure no longer counts: a second fall is judged on that reset."""
    env = fake_nvml_env(DGX_H100, scenarios=["xid79 5 at 0.3", "reset 5 at 2", "xid79 5 at 3.5"])
    polls = json.loads(
        python_out(env, "-c", FAILED_RESET, str(tmp_path / "actions.db")).splitlines()[-1]
    )
    bus = normal_bus_id(DGX_H100.gpus[5].bus_id)
    states = [p[0] for p in polls]
    first = polls[states.index("lost")]
    assert first[2] == "reset_gpu"  # nothing tried yet
    failed = polls[states.index("lost") + 1]
    assert failed[0] == "lost" and failed[2] == "reboot_node"
    at = time.strftime("%H:%M:%S", time.localtime(failed[1]))
    assert failed[3][0].endswith(f"reboot the node: the reset of GPU 5 ({bus[5:]}) at {at} failed")
    back = polls[states.index("ok", states.index("lost"))]
    assert back[2] == "fit"
    again = polls[-1]
    assert again[0] == "lost" and again[2] == "reboot_node"
    assert "did not hold" in again[3][0] and "failed" not in again[3][0]


STORY_8 = (
    JOURNALED
    + """
seen = []
while time.monotonic() < deadline:
    reading = source.collect()
    gpu = reading.gpus[2]
    node = NodeSnapshot("n", nvml=reading, actions=events._read())
    verdict = gpu_verdict(node, gpu)
    seen.append([[[x.code, x.count] for x in gpu.xids], verdict.action.value,
                 [f.text for f in verdict.findings]])
    if verdict.action.value == "fit" and len(seen) > 1 and seen[-2][1] != "fit":
        break
    if gpu.xids and len(seen) > 1 and seen[-2][0]:
        # the remediation the verdict asks for, as the executor journals one that worked:
        # drained, reset (nvidia-smi between two polls: NVML never sees the GPU go), verified
        plan = make_remediation_plan(node, "2", verdict.action)
        with journal.transaction() as db:
            plan_id = journal.start_plan(db, plan, "ops", "operator", None)
        for seq, step in enumerate(plan.steps):
            row = journal.intent(plan_id, seq, step.kind.value)
            journal.result(row, StepState.DONE, "done")
        journal.finish_plan(plan_id, PlanState.DONE, "fit again")
    time.sleep(0.1)
source._shutdown()
print(json.dumps(seen))
"""
)


def test_story_8_xid_48_is_reset_by_its_plan_and_the_verdict_turns_fit(
    fake_nvml_env: FakeNvmlEnv, tmp_path: Path
) -> None:
    """XID 48 on GPU 2: the verdict says drain, then reset the GPU, with the catalog's
    bucket; the plan resets it without NVML seeing it go, and the verdict turns fit: the
    XID is what that reset cleared. The node never rebooted."""
    env = fake_nvml_env(DGX_H100, scenarios=["xid48 2 at 0.3"])
    polls = json.loads(
        python_out(env, "-c", STORY_8, str(tmp_path / "actions.db")).splitlines()[-1]
    )
    judged = [p for p in polls if p[0]]
    assert judged[0][1] == "reset_gpu"
    assert judged[0][2][0].startswith("XID 48 double-bit ECC error: drain, then reset the GPU")
    assert "WORKFLOW_XID_48 now" in judged[0][2][0]
    assert polls[-1] == [[[48, 1]], "fit", []]  # NVML still counts it; the reset cleared it
