"""The BMC source against a real IPMI BMC (ipmi_sim), checked against ipmitool."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import logging
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyghmi.exceptions import IpmiException

from gpuconsole.codec import dumps
from gpuconsole.facts.verdict import Action, node_verdict
from gpuconsole.hub import Hub, HubSettings
from gpuconsole.readings.base import Event, Health, Severity, SourceStatus
from gpuconsole.readings.bmc import BmcReading, PowerState, SensorHealth, SensorKind
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot
from gpuconsole.sources.bmc import (
    BmcError,
    BmcPool,
    BmcSource,
    BmcTarget,
    PowerAction,
    open_link,
)
from gpuconsole.sources.bmc.ipmi import PyghmiSession, notice_early_replies
from gpuconsole.sources.bmc.sel import SelCursor
from tests.bmc_fixtures import (
    IPMI_PASSWORD,
    IpmiSim,
    free_port,
    running_ipmi_sim,
)
from tests.test_bmc_mockups import edit, node_of, poll, serving_copy
from tests.waiting import until


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[IpmiSim]:
    with running_ipmi_sim(tmp_path / "ipmi_sim") as sim:
        yield sim


def target(sim: IpmiSim, *, node: str = "dgx-017", password: str | None = None) -> BmcTarget:
    return BmcTarget(
        node=node,
        host="127.0.0.1",
        protocol="ipmi",
        port=sim.port,
        username=sim.username,
        password=sim.password if password is None else password,
    )


async def read_once(source: BmcSource, events: list[Event] | None = None) -> BmcReading:
    await source.start((events if events is not None else []).append)
    try:
        return await source.poll()
    finally:
        await source.close()


def number(text: str) -> float:
    match = re.match(r"-?[0-9.]+", text)
    assert match, text
    return float(match.group(0))


def test_every_value_equals_what_ipmitool_reads(bmc: IpmiSim) -> None:
    reading = asyncio.run(read_once(BmcSource("dgx-017", open_link(target(bmc)))))
    sdr = bmc.sdr_list()
    numeric = [s for s in reading.sensors if s.value is not None]
    assert len(numeric) == 8  # every analog sensor but the one without a reading
    for sensor in numeric:
        assert sensor.value == pytest.approx(number(sdr[sensor.name])), sensor.name
    assert {s.name for s in reading.sensors} == set(sdr)
    kinds = {s.name: (s.kind, s.unit) for s in reading.sensors}
    assert kinds["Inlet Temp"] == (SensorKind.TEMPERATURE, "C")
    assert kinds["FAN 1"] == (SensorKind.FAN, "RPM")
    assert kinds["Total Power"] == (SensorKind.POWER, "W")
    assert kinds["P12V"] == (SensorKind.VOLTAGE, "V")
    assert kinds["PSU1 Current"] == (SensorKind.CURRENT, "A")


def test_thresholds_equal_ipmitool_and_a_sensor_without_reading_has_none(bmc: IpmiSim) -> None:
    reading = asyncio.run(read_once(BmcSource("dgx-017", open_link(target(bmc)))))
    expected = bmc.sensor_thresholds()
    names = {
        "lnr": "lower_non_recoverable",
        "lcr": "lower_critical",
        "lnc": "lower_non_critical",
        "unc": "upper_non_critical",
        "ucr": "upper_critical",
        "unr": "upper_non_recoverable",
    }
    for sensor in reading.sensors:
        limits = expected[sensor.name]
        if not limits:
            assert sensor.thresholds is None
            continue
        assert sensor.thresholds is not None, sensor.name
        for short, value in limits.items():
            assert getattr(sensor.thresholds, names[short]) == pytest.approx(value), sensor.name
    cpu = reading.sensor("CPU0 Temp")
    assert cpu is not None and cpu.value is None and not cpu.available
    assert bmc.sdr_list()["CPU0 Temp"] in ("disabled", "no reading")


def test_node_totals(bmc: IpmiSim) -> None:
    reading = asyncio.run(read_once(BmcSource("dgx-017", open_link(target(bmc)))))
    assert reading.power_w == 6000.0
    assert (reading.inlet_c, reading.exhaust_c) == (24.0, 41.0)
    assert (reading.fans_present, reading.fans_failed) == (2, 0)
    assert (reading.psus_present, reading.psus_failed) == (1, 0)
    assert reading.power_state is PowerState.ON
    assert reading.bmc == f"ipmi://127.0.0.1:{bmc.port}"


def _polled(bmc: IpmiSim) -> FleetSnapshot:
    """One poll of `bmc` as node dgx-017's BMC source reads it."""
    hub = Hub()
    hub.add_source(BmcSource("dgx-017", open_link(target(bmc))))
    return asyncio.run(hub.poll_once())


def test_a_stopped_fan_a_failed_psu_and_a_hot_inlet_are_each_named_in_the_verdict(
    bmc: IpmiSim,
) -> None:
    bmc.set_raw(4, 0)  # FAN 1 at 0 RPM: past all three lower thresholds
    bmc.set_raw(1, 42)  # Inlet Temp 42 C: past its critical 40
    # PSU1 Status asserts Failure alone (a BMC that has no presence offset for it)
    bmc.command("sensor_set_bit_clr_rest 0x20 0 10 1 1")
    node = _polled(bmc).node("dgx-017")
    assert node is not None
    found = {f.code: f for f in node_verdict(node).findings if f.code != "sel_critical"}
    said = {code: (f.text, f.severity.value, f.action.value) for code, f in found.items()}
    assert said == {
        "fan_failed": ("1 of 2 fans failed: FAN 1 at 0 RPM", "critical", "service"),
        "psu_failed": ("1 of 1 PSUs failed: PSU1 Status", "critical", "service"),
        "inlet_hot": ("inlet at 42 C past its critical limit", "critical", "drain"),
    }
    assert found["inlet_hot"].subject == "BMC sensor Inlet Temp"


def test_a_sel_assertion_that_came_again_after_its_deassertion_stays_evidence(
    bmc: IpmiSim,
) -> None:
    for raw in (42, 24, 42):  # Inlet Temp past its critical 40, back, past it again
        bmc.set_raw(1, raw)
    node = _polled(bmc).node("dgx-017")
    assert node is not None and node.bmc is not None
    log = [(e.record_id, e.deassertion) for e in node.bmc.sel_recent]
    assert log == [(1, False), (2, False), (3, True), (4, True), (5, False), (6, False)]
    sel = [f.text for f in node_verdict(node).findings if f.code == "sel_critical"]
    assert len(sel) == 1 and sel[0].endswith("Inlet Temp at 42 C: Upper critical"), sel


def test_a_threshold_crossing_lands_in_the_sel_and_is_announced_once(
    bmc: IpmiSim, tmp_path: Path
) -> None:
    state = tmp_path / "state"

    def source() -> BmcSource:
        label = f"ipmi://127.0.0.1:{bmc.port}"
        cursor = SelCursor.for_bmc(state, label)
        return BmcSource("dgx-017", open_link(target(bmc)), sel_cursor=cursor)

    async def rounds() -> tuple[list[Event], list[Event], list[Event]]:
        first: list[Event] = []
        src = source()
        await src.start(first.append)
        await src.poll()  # first contact: the log so far is history
        bmc.set_raw(1, 42)  # Inlet Temp 42 C: past non-critical (35) and critical (40)
        after: list[Event] = []
        src._emit = after.append
        reading = await src.poll()
        assert reading.sensor("Inlet Temp").health is SensorHealth.CRITICAL  # type: ignore[union-attr]
        await src.poll()
        await src.close()
        restarted: list[Event] = []
        await read_once(source(), restarted)  # a new process: the cursor was persisted
        return first, after, restarted

    first, after, restarted = asyncio.run(rounds())
    assert first == []
    assert [e.code for e in after] == [1, 2]
    assert all(e.kind == "sel" and e.source == "bmc" for e in after)
    assert after[-1].severity.value == "critical"
    assert after[-1].message == "SEL: Inlet Temp at 42 C: Upper critical"
    sel = bmc.ipmitool("sel", "list").splitlines()
    assert [int(line.split("|")[0], 16) for line in sel] == [1, 2]
    assert "Upper Critical going high" in sel[1]
    assert restarted == []
    saved = json.loads(next(state.glob("sel-*.json")).read_text())
    assert saved == {"last_record_id": 2}


def test_power_off_and_on_reach_the_bmc(bmc: IpmiSim) -> None:
    async def toggle() -> tuple[str, BmcReading, BmcReading]:
        src = BmcSource("dgx-017", open_link(target(bmc)))
        await src.start(lambda _e: None)
        answer = await src.set_power(PowerAction.OFF)
        off = await src.poll()
        await src.set_power(PowerAction.ON)
        on = await src.poll()
        await src.close()
        return answer, off, on

    answer, off, on = asyncio.run(toggle())
    assert answer == "off"
    assert off.power_state is PowerState.OFF
    assert on.power_state is PowerState.ON
    assert "Chassis Power is on" in bmc.ipmitool("chassis", "power", "status")


def test_a_power_cycle_reaches_the_bmc_as_chassis_control(bmc: IpmiSim) -> None:
    async def cycle() -> tuple[str, list[PowerState]]:
        src = BmcSource("dgx-017", open_link(target(bmc)))
        await src.start(lambda _e: None)
        answer = await src.set_power(PowerAction.CYCLE)
        seen = [(await src.poll()).power_state]
        for _ in range(50):  # the BMC powers it on again after a pause of its own
            if seen[-1] is PowerState.ON:
                break
            await asyncio.sleep(0.2)
            seen.append((await src.poll()).power_state)
        await src.close()
        return answer, seen

    answer, seen = asyncio.run(cycle())
    assert answer == "cycle"
    # the BMC took it (a refused one raises): off, then on again
    assert seen[0] is PowerState.OFF and seen[-1] is PowerState.ON


def test_a_wrong_password_is_a_clear_error_that_never_shows_the_password(
    bmc: IpmiSim, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "WrongPass-93xq"
    hub = Hub()
    hub.add_source(BmcSource("dgx-017", open_link(target(bmc, password=wrong)), timeout_s=10))
    with caplog.at_level(logging.DEBUG):
        snapshot = asyncio.run(hub.poll_once())
    status = snapshot.nodes[0].status("bmc")
    assert status is not None and not status.ok
    assert status.error is not None
    assert f"ipmi://127.0.0.1:{bmc.port}" in status.error
    assert "refused the user name or password" in status.error
    text = dumps(snapshot) + caplog.text + repr(target(bmc, password=wrong))
    assert wrong not in text and IPMI_PASSWORD not in text


def test_a_dead_and_a_slow_bmc_go_stale_while_the_others_are_fine(
    bmc: IpmiSim, tmp_path: Path
) -> None:
    dead_port = free_port()
    with running_ipmi_sim(tmp_path / "slow") as slow:
        slow.proc.send_signal(19)  # SIGSTOP: it stops answering, like a hung BMC
        try:
            pool = BmcPool(8)
            hub = Hub()
            good = BmcSource("good", open_link(target(bmc)), pool=pool, timeout_s=10)
            dead_target = BmcTarget("dead", "127.0.0.1", "ipmi", dead_port, "admin", "x")
            dead = BmcSource("dead", open_link(dead_target), pool=pool, timeout_s=12)
            stuck = BmcSource(
                "slow", open_link(target(slow, node="slow")), pool=pool, timeout_s=0.5
            )
            for source in (good, dead, stuck):
                hub.add_source(source)
            began = time.monotonic()
            snapshot = asyncio.run(hub.poll_once())
            took = time.monotonic() - began
        finally:
            slow.proc.send_signal(18)  # SIGCONT, so it can be stopped cleanly
    statuses = {n.node: n.status("bmc") for n in snapshot.nodes}
    # pyghmi gives up on the dead BMC after ~4.5 s; the good one is read long before.
    assert statuses["good"].ok and statuses["good"].last_poll_s < 8.0  # type: ignore[union-attr]
    assert snapshot.node("good").bmc.power_w == 6000.0  # type: ignore[union-attr]
    slow_error = statuses["slow"].error  # type: ignore[union-attr]
    assert slow_error == f"BmcError: ipmi://127.0.0.1:{slow.port}: no answer within 0.5 s"
    dead_error = statuses["dead"].error  # type: ignore[union-attr]
    assert (
        dead_error
        == f"BmcError: ipmi://127.0.0.1:{dead_port}: no answer (BMC down or unreachable?)"
    )
    assert took < 12


def test_many_dead_bmcs_never_starve_a_live_one(bmc: IpmiSim) -> None:
    # Two slots, six BMCs where nothing answers, retried every half second, and the live
    # BMC queued last. A dead BMC holds a slot for its timeout at most, and only a slot of
    # the BMCs that do not answer: once the live one has answered it never waits again.
    pool = BmcPool(2)
    hub = Hub(HubSettings(max_backoff_s=0.5))
    for i in range(6):
        dead = BmcTarget(f"dead-{i}", "127.0.0.1", "ipmi", free_port(socket.SOCK_DGRAM), "u", "p")
        hub.add_source(
            BmcSource(dead.node, open_link(dead), interval_s=0.25, timeout_s=0.5, pool=pool)
        )
    live = BmcSource(
        "live", open_link(target(bmc, node="live")), interval_s=0.25, timeout_s=2.0, pool=pool
    )
    hub.add_source(live)
    seen: list[SourceStatus] = []

    def record(snapshot: FleetSnapshot) -> None:
        status = snapshot.node("live").status("bmc")  # type: ignore[union-attr]
        if status is not None and (status.ok or seen):
            seen.append(status)  # from the first fresh reading on

    def status(node: str) -> SourceStatus:
        found = hub.latest.node(node).status("bmc")  # type: ignore[union-attr]
        assert found is not None
        return found

    def good_polls() -> int:
        return status("live").polls - status("live").failures

    async def watch() -> FleetSnapshot:
        hub.subscribe(record)
        await hub.start()
        try:
            await until(lambda: hub.latest is not None and status("live").ok, timeout=20)
            start = good_polls()
            dead_failures = {f"dead-{i}": status(f"dead-{i}").failures for i in range(6)}
            # six more fresh readings while every dead BMC fails at least twice more
            await until(
                lambda: (
                    good_polls() >= start + 6
                    and all(status(n).failures >= f + 2 for n, f in dead_failures.items())
                ),
                timeout=30,
            )
            return hub.publish()
        finally:
            await hub.stop()

    snapshot = asyncio.run(watch())
    assert seen and all(s.ok for s in seen), [s.error for s in seen if not s.ok]
    assert snapshot.node("live").bmc.power_w == 6000.0  # type: ignore[union-attr]
    for i in range(6):
        dead_status = snapshot.node(f"dead-{i}").status("bmc")  # type: ignore[union-attr]
        assert dead_status is not None and not dead_status.ok
        assert "no answer" in (dead_status.error or "")


def test_power_is_never_queued_behind_a_poll_stuck_on_a_silent_bmc(tmp_path: Path) -> None:
    with running_ipmi_sim(tmp_path / "silent") as sim:
        sim.proc.send_signal(signal.SIGSTOP)

        async def ask() -> None:
            src = BmcSource("dgx-017", open_link(target(sim)), timeout_s=0.5)
            await src.start(lambda _e: None)
            try:
                with pytest.raises(BmcError, match=r"no answer within 0\.5 s"):
                    await src.poll()  # pyghmi keeps trying to log on, on the BMC's thread
                with pytest.raises(BmcError, match="power off was not sent"):
                    await src.set_power(PowerAction.OFF)
            finally:
                sim.proc.send_signal(signal.SIGCONT)  # the stuck logon may now finish
                await src.close()

        try:
            asyncio.run(ask())
        finally:
            sim.proc.send_signal(signal.SIGCONT)
        assert "Chassis Power is on" in sim.ipmitool("chassis", "power", "status")


def test_a_reply_that_beats_the_waiter_is_taken_at_once(
    bmc: IpmiSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pyghmi sends a request, then queues its waiter. Sleeping in between (as a busy CPU
    # does) lets the reply in first; unfixed, every command then waits out the retry
    # timer and is sent again, and one poll takes seconds.
    from pyghmi.ipmi.private import session

    notice_early_replies()
    fixed = session._io_wait

    def late(timeout: float, myaddr: object = None, evq: object = None) -> None:
        time.sleep(0.02)
        fixed(timeout, myaddr, evq)

    retries: list[float] = []
    timed_out = session.Session._timedout

    def counted(self: object) -> None:
        retries.append(time.monotonic())
        timed_out(self)

    monkeypatch.setattr(session, "_io_wait", late)
    monkeypatch.setattr(session.Session, "_timedout", counted)
    source = BmcSource("dgx-017", open_link(target(bmc)), timeout_s=5)
    reading = asyncio.run(read_once(source))
    assert reading.power_w == 6000.0
    assert len(retries) <= 2  # unfixed: one per command, dozens (a loaded box may lose one)


# --- several BMCs on several threads (pyghmi runs one event loop for all of them) ---------


def on_threads(work: dict[str, Callable[[], None]], seconds: float) -> dict[str, list[float]]:
    """Run each `work` in a loop on a thread of its own (as each BMC source does) for
    `seconds`; the moments each call returned, by name, and under "" when it began and
    stopped. Threads still blocked at the end are left behind (daemons)."""
    returned: dict[str, list[float]] = {name: [] for name in work}
    returned[""] = [time.monotonic()]
    stop = threading.Event()

    def loop(name: str) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                work[name]()
            returned[name].append(time.monotonic())

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in work]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    returned[""].append(time.monotonic())
    deadline = time.monotonic() + 2
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return returned


def longest_gap(returned: dict[str, list[float]], name: str) -> float:
    """The longest time `name` went without a call returning, while the threads ran."""
    began, stopped = returned[""]
    moments = [began, *(m for m in returned[name] if m <= stopped), stopped]
    return max(b - a for a, b in itertools.pairwise(moments))


def test_bmcs_that_stop_answering_never_hold_up_the_others(tmp_path: Path) -> None:
    # Two BMCs read over and over beside six that stop answering once logged on, so that
    # pyghmi sends their requests again and again: the live ones never wait on them.
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(running_ipmi_sim(tmp_path / f"bmc-{i}")) for i in range(8)]
        links = {f"bmc-{i}": open_link(target(sim, node=f"bmc-{i}")) for i, sim in enumerate(sims)}
        for link in links.values():
            link.read(sel=False)  # logged on
        live, silent = list(links)[:2], sims[2:]
        for sim in silent:
            sim.proc.send_signal(signal.SIGSTOP)
        try:
            returned = on_threads(
                {name: functools.partial(link.read, sel=False) for name, link in links.items()},
                seconds=15,
            )
        finally:
            for sim in silent:
                sim.proc.send_signal(signal.SIGCONT)
    for name in live:
        # a read takes about 20 ms; unfixed, two BMCs' threads end up waiting for each
        # other for good within seconds, and so does every BMC's next call
        assert longest_gap(returned, name) < 5.0, name
        assert len(returned[name]) > 50, name


def test_a_wrong_password_is_named_while_other_bmcs_log_on(tmp_path: Path) -> None:
    # pyghmi handles one BMC's packets on whichever thread waits: another BMC logging on
    # meanwhile may see this logon fail, and unfixed this thread then read a reason not
    # yet kept ("'Session' object has no attribute 'errormsg'"), or two threads took the
    # last packet off one queue ("pop from an empty deque").
    failures: collections.Counter[str] = collections.Counter()
    said: collections.Counter[str] = collections.Counter()
    with contextlib.ExitStack() as stack:
        sims = [stack.enter_context(running_ipmi_sim(tmp_path / f"bmc-{i}")) for i in range(5)]

        def log_on(sim: IpmiSim, password: str) -> None:
            try:
                PyghmiSession(
                    "127.0.0.1", sim.port, sim.username.encode(), password.encode()
                ).logout()
            except IpmiException as exc:
                said[str(exc)] += 1  # what the BMC said: a refused password, or no room
            except Exception as exc:
                failures[f"{type(exc).__name__}: {exc}"] += 1

        work = {
            f"bmc-{i}": functools.partial(log_on, sim, sim.password)
            for i, sim in enumerate(sims[:2])
        }
        work |= {
            f"wrong-{i}": functools.partial(log_on, sim, "Not-the-pw-1")
            for i, sim in enumerate(sims[2:])
        }
        on_threads(work, seconds=8)
    assert not failures, failures
    assert said["Incorrect password provided"] > 0, said


def test_a_session_removed_from_pyghmis_table_twice_is_removed(bmc: IpmiSim) -> None:
    # pyghmi's logout checks that the session is in its table, then deletes it: the thread
    # that saw a logon fail and the thread logging on both log it out, and the second to
    # delete raised KeyError with the local port (once in a suite run, in the test above)
    from pyghmi.ipmi.private import session as pyghmi_session

    PyghmiSession("127.0.0.1", bmc.port, bmc.username.encode(), bmc.password.encode()).logout()
    table = pyghmi_session.Session.bmc_handlers
    table[("192.0.2.1", 623)] = {}
    table[("192.0.2.1", 623)][57111] = "a session"
    del table[("192.0.2.1", 623)][57111]
    del table[("192.0.2.1", 623)][57111]  # by the other thread
    assert table[("192.0.2.1", 623)] == {}
    del table[("192.0.2.1", 623)]
    del table[("192.0.2.1", 623)]
    assert ("192.0.2.1", 623) not in table


def test_polling_a_bmc_for_long_leaves_nothing_behind_in_pyghmi(bmc: IpmiSim) -> None:
    # pyghmi's I/O thread queues the session for every reply it receives, and a logged-on
    # session takes its replies elsewhere: unfixed, that queue grows by one entry per
    # command for as long as the console runs (a day of polls: hundreds of thousands).
    from pyghmi.ipmi.private import session as pyghmi_session

    polled = PyghmiSession("127.0.0.1", bmc.port, bmc.username.encode(), bmc.password.encode())
    try:
        for _ in range(300):
            assert polled.get_power()["powerstate"] == "on"
        mine = polled._cmd.ipmi_session
        assert sum(queued is mine for queued in list(pyghmi_session.sessionqueue)) <= 1
    finally:
        polled.logout()


_PSU = re.compile(r"\bPSU|Power Supply")
_BAY1 = "Chassis/1U/PowerSubsystem/PowerSupplies/Bay1"


@pytest.mark.parametrize(
    ("offset", "bay1", "expected"),
    [
        # Predictive failure (02h); rackmount1's Bay 1 as DMTF wrote it: Health Warning with
        # a PowerSupplyPredictiveFailure condition (the Power registry's severity: Warning).
        # The PSU still delivers power: a warning to watch, not a failed PSU.
        (2, {}, (Health.WARNING, 0, 0, [(Severity.WARNING, Action.WATCH)])),
        # Power input lost (03h); Bay 1 with LineInputStatus LossOfInput (its Health a
        # Warning, as the registry rates LossOfInputPower): it delivers no power, and the
        # PSU may be fine: not a failed PSU to return, its cable and power to check. The
        # node's only PSU: no redundancy left, critical
        (
            3,
            {"LineInputStatus": "LossOfInput", "Status": {"State": "Enabled", "Health": "Warning"}},
            (Health.CRITICAL, 0, 1, [(Severity.CRITICAL, Action.RESEAT)]),
        ),
        # Power input out of range (04h) and OutOfRange, its Health Critical as some BMCs
        # rate it: the same
        (
            4,
            {"LineInputStatus": "OutOfRange", "Status": {"State": "Enabled", "Health": "Critical"}},
            (Health.CRITICAL, 0, 1, [(Severity.CRITICAL, Action.RESEAT)]),
        ),
        # Failure detected (01h); Bay 1 Critical: a failed PSU, returned for service
        (
            1,
            {"Status": {"State": "Enabled", "Health": "Critical"}},
            (Health.CRITICAL, 1, 0, [(Severity.CRITICAL, Action.SERVICE)]),
        ),
    ],
)
def test_a_psus_state_is_the_same_reading_over_ipmi_as_over_redfish(
    bmc: IpmiSim,
    tmp_path: Path,
    offset: int,
    bay1: dict[str, object],
    expected: tuple[object, ...],
) -> None:
    # IPMI: PSU1 Status (sensor type 08h) asserts Presence detected (00h) and `offset`
    bmc.command(f"sensor_set_bit 0x20 0 10 {offset} 1 0")
    ipmi_node = _polled(bmc).node("dgx-017")
    assert ipmi_node is not None and ipmi_node.bmc is not None
    with serving_copy(tmp_path, "public-rackmount1") as server:
        edit(server.root, _BAY1, **bay1)
        rf_node = node_of(poll(server))

    def said(node: NodeSnapshot) -> tuple[object, ...]:
        bmc_reading = node.bmc
        assert bmc_reading is not None
        psu = [f for f in node_verdict(node).findings if _PSU.search(f.subject + f.text)]
        return (
            bmc_reading.health,
            bmc_reading.psus_failed,
            bmc_reading.psus_no_input,
            [(f.severity, f.action) for f in psu],
        )

    assert said(ipmi_node) == said(rf_node) == expected


@pytest.mark.parametrize(
    ("offset", "event", "severity", "found"),
    [
        (2, "Predictive failure", Severity.WARNING, [("sensor_warning", Action.WATCH)]),
        (3, "Power input lost", Severity.WARNING, [("psu_no_input", Action.RESEAT)]),
        (4, "Power input out of range or lost", Severity.WARNING, [("psu_no_input", Action.RESEAT)]),
        (1, "Failure", Severity.CRITICAL, [("psu_failed", Action.SERVICE), ("sel_critical", Action.SERVICE)]),
    ],
)  # fmt: skip
def test_a_psus_event_log_record_is_rated_as_its_state_is(
    bmc: IpmiSim, offset: int, event: str, severity: Severity, found: list[tuple[str, Action]]
) -> None:
    # PSU1 Status asserts `offset`, and the BMC logs it. pyghmi rates every one of these
    # critical: a PSU whose input is lost (its cable out) or that predicts its failure was
    # judged "return it for service" by its SEL record, whatever its state said
    bmc.command(f"sensor_set_bit 0x20 0 10 {offset} 1 1")
    node = _polled(bmc).node("dgx-017")
    assert node is not None and node.bmc is not None
    [record] = node.bmc.sel_recent
    assert (record.sensor, record.event, record.severity) == ("PSU1 Status", event, severity)
    said = sorted((f.code, f.action) for f in node_verdict(node).findings)
    assert said == found


def test_a_discrete_psu_sensors_finding_says_the_state_it_asserts(bmc: IpmiSim) -> None:
    # PSU1 Status (sensor type 08h) asserts Predictive failure (02h): the finding says so,
    # not a bare "warning" (a discrete sensor has no value to show)
    bmc.command("sensor_set_bit 0x20 0 10 2 1 0")
    node = _polled(bmc).node("dgx-017")
    assert node is not None
    psu = [f for f in node_verdict(node).findings if _PSU.search(f.subject + f.text)]
    assert [(f.subject, f.severity) for f in psu] == [("BMC sensor PSU1 Status", Severity.WARNING)]
    assert (
        psu[0].text.lower().startswith("warning: ") and "predictive failure" in psu[0].text.lower()
    )


def test_a_bmc_clock_two_days_behind_is_measured_and_shown_and_its_sel_is_on_our_clock(
    bmc: IpmiSim,
) -> None:
    # Set SEL Time 50 h behind this host's clock, then a threshold crossing lands in the SEL
    # stamped by it: pyghmi corrects the record's time from Get SEL Time, and the skew is
    # measured for the operator to see (ipmi_sim's SEL clock is not set until then)
    behind = int(time.time()) - 50 * 3600
    bmc.ipmitool("raw", "0x0a", "0x49", *(f"0x{b:02x}" for b in behind.to_bytes(4, "little")))
    bmc.set_raw(1, 42)  # Inlet Temp 42 C: past its critical 40
    snapshot = _polled(bmc)
    node = snapshot.node("dgx-017")
    assert node is not None and node.bmc is not None
    skew = node.bmc.clock_skew_s
    assert skew is not None and abs(skew + 50 * 3600) < 5
    assert node.bmc.sel_recent and all(
        e.at is not None and abs(e.at - time.time()) < 60 for e in node.bmc.sel_recent
    )
    assert "sel_critical" in {f.code for f in node_verdict(node).findings}
    said = [e.message for e in snapshot.events if e.kind == "clock_skew"]
    assert said == [
        "bmc clock 2 d behind this host's: its event log times are corrected by it; set its "
        "time (NTP)"
    ]
