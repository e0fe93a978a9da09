"""The alert engine: a consumer of the hub's snapshots that evaluates the rules over the
exporter's series, keeps each alert pending, firing or resolved, tells the receivers, and
puts what fires back into the hub's snapshots for every console and wallboard to show."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuconsole.alerts.condition import Sample
from gpuconsole.alerts.delivery import ALERTMANAGER, Receiver
from gpuconsole.alerts.rules import Rule, expand
from gpuconsole.alerts.silences import Silence, held_key, parse_silences, silenced_alerts
from gpuconsole.alerts.state import FIRING, PENDING, RESOLVED, Alert, Saved, StateFile, fingerprint
from gpuconsole.alerts.window import Windows
from gpuconsole.facts.inventory import GpuRow, node_gpus
from gpuconsole.facts.verdict import gpu_verdict, node_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.alerts import ActiveAlert, AlertState
from gpuconsole.readings.base import Event, Severity, known_bus_id, normal_bus_id, safe_text
from gpuconsole.readings.snapshot import FleetSnapshot, NodeSnapshot

if TYPE_CHECKING:
    import aiohttp

    from gpuconsole.alerts.series import Series

log = logging.getLogger(__name__)

SILENCES_EVERY_S = 30.0
# Evaluations take at most this share of a core: a head of a thousand nodes builds the series
# of each node polled since the last (about 0.5 s of CPU for all of them, benchmarks/bench_alerts),
# so it evaluates less often than interval_s asks.
CPU_SHARE = 0.05
_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
# The verdict's findings an alert's evidence names at most (the worst first).
EVIDENCE_SHOWN = 5
# The annotations the engine adds from the console's own knowledge (`context`): Prometheus
# evaluating `gpuconsole rules` has the same alerts, without these.
CONTEXT = ("bus_id", "owner", "evidence", "advice")


@dataclass(frozen=True, slots=True)
class Change:
    """An alert that fired or resolved in one evaluation."""

    alert: Alert
    state: str  # firing or resolved


def ready(snapshot: FleetSnapshot) -> bool:
    """Whether every source of every node has been polled once: before that a series that
    is absent says nothing, and a restored alert must not be resolved for it."""
    return bool(snapshot.nodes) and all(
        status.polls or status.failures or status.last_ok_at is not None
        for node in snapshot.nodes
        for status in node.statuses
    )


class AlertEngine:
    """Evaluates `rules` on the latest snapshot every `interval_s` and delivers changes."""

    def __init__(
        self,
        rules: Sequence[Rule],
        receivers: Sequence[Receiver] = (),
        *,
        state_file: StateFile | None = None,
        interval_s: float = 5.0,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rules = tuple(rules)
        self.receivers = list(receivers)
        self.state_file = state_file
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.alerts: dict[str, Alert] = {}
        self.silences: tuple[Silence, ...] = ()
        # held_key of each alert Alertmanager holds silenced -> the silence (its answer)
        self.silenced: dict[str, Silence] = {}
        self.problem: str | None = None  # what went wrong reading the state file
        self._metrics = frozenset(m for r in self.rules for m in r.condition.metrics)
        self._samples: Series | None = None  # made by the first evaluation
        self._windows = Windows(rng for r in self.rules for rng in r.condition.ranges)
        self._hub: Hub | None = None
        self._latest: FleetSnapshot | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None  # from the hub it runs on
        self._silences_at = 0.0
        self.last_cpu_s = 0.0  # what the last evaluation cost
        self._nodes = 0
        self._said_paced = False
        self._restore()

    # --- state --------------------------------------------------------------------

    def _restore(self) -> None:
        if self.state_file is None:
            return
        saved, self.problem = self.state_file.load()
        if self.problem:
            log.warning("alerts: %s", self.problem)
        self.alerts = saved.alerts
        for receiver in self.receivers:
            receiver.told = saved.told.get(receiver.name, {})

    def save(self) -> None:
        if self.state_file is None:
            return
        told = {r.name: dict(r.told) for r in self.receivers}
        try:
            self.state_file.save(Saved(dict(self.alerts), told))
        except OSError as exc:
            log.warning("alerts: cannot write %s: %s", self.state_file.path, exc.strerror)

    async def save_off_loop(self) -> None:
        """save() in a worker thread: it syncs the file to disk, which a busy disk may take
        its time over, while the hub and every console share this loop. (Nothing else
        changes the alerts meanwhile: evaluation and delivery take turns.)"""
        await asyncio.to_thread(self.save)

    # --- evaluation ---------------------------------------------------------------

    def evaluate(self, snapshot: FleetSnapshot) -> list[Change]:
        """One evaluation at the snapshot's time: each alert pending, firing or resolved."""
        now = snapshot.at
        by_name = self._series().samples(snapshot)
        self._windows.observe(by_name, now)
        changes: list[Change] = []
        seen: set[str] = set()
        nodes = {node.node: node for node in snapshot.nodes}
        for rule in self.rules:
            held = rule.condition.evaluate(by_name)
            for sample in held:
                alert = self._held(rule, sample, now, changes)
                about = nodes.get(alert.labels.get("node") or alert.labels.get("Hostname", ""))
                alert.annotations = {**context(about, alert.labels), **alert.annotations}
                seen.add(alert.fingerprint)
            kept = self._kept_by_hysteresis(rule, by_name, now, seen)
            seen |= kept
        for fp, alert in list(self.alerts.items()):
            if fp in seen or alert.state == RESOLVED:
                continue
            if alert.state == PENDING:
                if any(r.told.get(fp, ("",))[0] == FIRING for r in self.receivers):
                    # it resolved while a receiver was down, then held again for less than
                    # for_s: in the same place, so this one owes that receiver its resolution
                    alert.state, alert.resolved_at = RESOLVED, now
                else:
                    del self.alerts[fp]
                continue
            alert.state, alert.resolved_at = RESOLVED, now
            changes.append(Change(alert, RESOLVED))
        self._drop_told_resolved()
        return changes

    def _series(self) -> Series:
        # imported here, not at the top: the exporter's builder (and prometheus_client)
        # would cost every console's start, and only an evaluation needs it
        from gpuconsole.alerts.series import Series

        if self._samples is None:
            self._samples = Series(self._metrics)
        return self._samples

    def _held(self, rule: Rule, sample: Sample, now: float, changes: list[Change]) -> Alert:
        labels = rule.alert_labels(sample.labels, sample.value)
        fp = fingerprint(labels)
        alert = self.alerts.get(fp)
        if alert is None or alert.state == RESOLVED:
            alert = Alert(
                rule=rule.name,
                labels=labels,
                annotations={},
                severity=rule.severity,
                state=PENDING,
                active_at=now,
                last_held_at=now,
            )
            self.alerts[fp] = alert
        alert.last_held_at, alert.value, alert.unheld_at = now, sample.value, None
        series = dict(sample.labels)  # what Prometheus's $labels holds: not the rule's
        alert.annotations = {k: expand(v, series, sample.value) for k, v in rule.annotations}
        if alert.state == PENDING and now - alert.active_at >= rule.for_s:
            alert.state, alert.fired_at = FIRING, now
            changes.append(Change(alert, FIRING))
        return alert

    def _kept_by_hysteresis(
        self, rule: Rule, by_name: dict[str, list[Sample]], now: float, seen: set[str]
    ) -> set[str]:
        """The firing alerts of `rule` its hysteresis keeps firing though the condition no
        longer holds: above the clear threshold, or within keep_firing_for_s."""
        firing = {
            fp: a
            for fp, a in self.alerts.items()
            if a.rule == rule.name and a.state == FIRING and fp not in seen
        }
        if not firing:
            return set()
        kept: set[str] = set()
        if rule.clear is not None:
            for sample in rule.condition.evaluate(by_name, rule.clear):
                labels = rule.alert_labels(sample.labels, sample.value)
                fp = fingerprint(labels)
                if fp in firing:
                    firing[fp].value = sample.value
                    kept.add(fp)
        if rule.keep_firing_for_s:
            for fp, alert in firing.items():
                if alert.unheld_at is None:
                    alert.unheld_at = now
                if now - alert.unheld_at < rule.keep_firing_for_s:
                    kept.add(fp)
        return kept

    def _drop_told_resolved(self) -> None:
        """Forget resolved alerts once no receiver still needs telling."""
        for fp, alert in list(self.alerts.items()):
            if alert.state != RESOLVED:
                continue
            if not any(r.due([alert], 0.0) for r in self.receivers):
                del self.alerts[fp]
        for receiver in self.receivers:
            receiver.forget(self.alerts)

    # --- what consoles see --------------------------------------------------------

    def active(self) -> tuple[ActiveAlert, ...]:
        """Pending and firing alerts, worst first, each with the silence Alertmanager says
        holds it."""
        found = []
        for alert in self.alerts.values():
            if alert.state == RESOLVED:
                continue
            silence = self.silenced.get(held_key(alert.labels)) if self.silenced else None
            # a series' labels are a peer's words: every one a console shows is escaped
            labels = {k: safe_text(v) for k, v in alert.labels.items()}
            bus = _gpu_of(alert)
            found.append(
                ActiveAlert(
                    name=alert.rule,
                    severity=alert.severity,
                    state=AlertState.FIRING if alert.state == FIRING else AlertState.PENDING,
                    labels=tuple(sorted(labels.items())),
                    summary=safe_text(alert.annotations.get("summary", "")),
                    since=alert.fired_at if alert.fired_at is not None else alert.active_at,
                    value=alert.value,
                    node=labels.get("node") or labels.get("Hostname") or None,
                    gpu_bus_id=safe_text(bus) if bus is not None else None,
                    silenced_by=silence.said() if silence is not None else None,
                )
            )
        found.sort(key=lambda a: (a.state != AlertState.FIRING, _RANK[a.severity], -a.since))
        return tuple(found)

    # --- delivery -----------------------------------------------------------------

    async def deliver(self, session: aiohttp.ClientSession) -> bool:
        """Tell each receiver that is not backing off what it must be told, all at once (one
        that never answers holds up no other); True if any receiver acknowledged something
        (the state file is then written)."""
        now = self.clock()
        rounds = [
            (receiver, due)
            for receiver in self.receivers
            if now >= receiver.next_try_at and (due := receiver.due(self.alerts.values(), now))
        ]
        if not rounds:
            return False
        took = await asyncio.gather(*(r.deliver(session, due, now) for r, due in rounds))
        if any(r.kind == ALERTMANAGER for (r, _), ok in zip(rounds, took, strict=True) if ok):
            self._silences_at = 0.0  # which of them it silences: asked next
        if any(took):
            self._drop_told_resolved()
        return any(took)

    async def refresh_silences(self, session: aiohttp.ClientSession) -> None:
        """Ask Alertmanager for its silences and for the alerts it holds silenced (it
        judges which alert a silence covers: see alerts.silences)."""
        am = next((r for r in self.receivers if r.kind == ALERTMANAGER), None)
        now = self.clock()
        if am is None or am.failures or not self.alerts:
            return  # none; down (asked again once it takes alerts again); nothing to cover
        if now - self._silences_at < SILENCES_EVERY_S:
            return
        self._silences_at = now
        silences, held = await asyncio.gather(
            _get_json(session, am, "/api/v2/silences"),
            _get_json(session, am, "/api/v2/alerts", _SUPPRESSED),
        )
        if silences is None or held is None:
            return  # the receiver's own retry says it is down
        self.silences = parse_silences(silences)
        self.silenced = silenced_alerts(held, self.silences)

    # --- running on a hub ---------------------------------------------------------

    def attach(self, hub: Hub) -> None:
        """Run on `hub`'s loop once it publishes: evaluate its snapshots, post a hub event
        per alert that fires or resolves, and put what fires into its snapshots."""
        self._hub = hub
        self._unsubscribe = hub.subscribe(self._offer)

    def _offer(self, snapshot: FleetSnapshot) -> None:
        self._latest = snapshot
        if self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # subscribed before the hub runs: its first publish starts the engine
            self._wake = asyncio.Event()
            self._task = loop.create_task(self.run(), name="alert engine")
        elif self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Evaluate and deliver until cancelled."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if self._hub is not None:
                self._hub.set_alerts(self.active())
            if self.problem and self._hub is not None:
                self._hub.post_event(
                    Event(self.clock(), "", "alerts", "alert", Severity.WARNING, self.problem)
                )
            evaluated_seq = -1
            next_eval = 0.0
            while True:
                snapshot = self._latest
                now = time.monotonic()
                if (
                    snapshot is not None
                    and snapshot.seq != evaluated_seq
                    and now >= next_eval
                    and ready(snapshot)
                ):
                    evaluated_seq = snapshot.seq
                    try:
                        await self.step(snapshot)
                    except Exception:  # a rule that trips on odd data must not end alerting
                        log.exception("alerts: evaluating the rules failed")
                    next_eval = now + self.paced_interval()
                try:
                    await self.refresh_silences(session)
                    if await self.deliver(session):
                        await self.save_off_loop()
                except Exception:  # a receiver's odd answer must not end alerting either
                    log.exception("alerts: delivering failed")
                if self._hub is not None:
                    self._hub.set_alerts(self.active())
                await asyncio.sleep(self._pause(next_eval))

    def _pause(self, next_eval: float) -> float:
        """Seconds until the next look: one while a receiver may be owed a delivery or its
        silences a refresh; with none, until the next evaluation is due, since only an
        evaluation changes what fires (an idle console need not wake each second for it)."""
        tick = min(1.0, self.interval_s)
        if self.receivers:
            return tick
        return max(tick, next_eval - time.monotonic())

    def paced_interval(self) -> float:
        """Seconds until the next evaluation: interval_s, or longer where the last one cost
        more than CPU_SHARE of a core over it (said once in the log)."""
        paced = max(self.interval_s, self.last_cpu_s / CPU_SHARE)
        if paced > self.interval_s and not self._said_paced:
            self._said_paced = True
            log.warning(
                "alerts: an evaluation costs %.2f s of CPU (%d nodes); evaluating every "
                "%g s instead of every %g s",
                self.last_cpu_s,
                self._nodes,
                round(paced, 1),
                self.interval_s,
            )
        return paced

    def _timed(self, snapshot: FleetSnapshot) -> list[Change]:
        began = time.thread_time()
        try:
            return self.evaluate(snapshot)
        finally:
            self.last_cpu_s = time.thread_time() - began
            self._nodes = len(snapshot.nodes)

    async def step(self, snapshot: FleetSnapshot) -> list[Change]:
        """One evaluation off the loop (building the series costs a large fleet some
        time), its changes said as hub events and written to the state file."""
        changes = await asyncio.to_thread(self._timed, snapshot)
        if changes:
            await self.save_off_loop()
            for change in changes:
                self._say(change)
        return changes

    def _say(self, change: Change) -> None:
        alert = change.alert
        summary = alert.annotations.get("summary", "")
        line = f"alert {alert.rule} {change.state}" + (f": {summary}" if summary else "")
        log.info("%s", safe_text(line))
        if self._hub is None:
            return
        labels = alert.labels
        self._hub.post_event(
            Event(
                at=self.clock(),
                node=labels.get("node") or labels.get("Hostname") or "",
                source="alerts",
                kind="alert",
                severity=alert.severity if change.state == FIRING else Severity.INFO,
                message=line,
                gpu_uuid=labels.get("uuid") or labels.get("UUID") or None,
                gpu_bus_id=_gpu_of(alert),
            )
        )

    async def stop(self) -> None:
        """Stop evaluating (the state file holds what fires): its hub's next publish does
        not start it again."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# Alertmanager's alerts a silence or an inhibition holds (not those active, nor unprocessed)
_SUPPRESSED = {"active": "false", "silenced": "true", "inhibited": "true", "unprocessed": "false"}
# of an answer of Alertmanager's: one past this is left unread
MAX_ANSWER_BYTES = 16 * 1024 * 1024


async def _get_json(
    session: aiohttp.ClientSession,
    am: Receiver,
    path: str,
    params: dict[str, str] | None = None,
) -> Any:
    """Alertmanager's JSON answer at `path`; None for none (an error, a redirect, a body
    past MAX_ANSWER_BYTES, what is not JSON)."""
    import aiohttp

    from gpuconsole.codec import DecodeError, parse_json
    from gpuconsole.sources.agents import read_body

    try:
        async with session.get(am.url + path, params=params, allow_redirects=False) as response:
            if response.status != 200:
                return None
            body = await read_body(response, MAX_ANSWER_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    if len(body) > MAX_ANSWER_BYTES:
        log.warning(
            "alerts: %s answered %s with more than %d bytes; not read",
            am.shown,
            path,
            MAX_ANSWER_BYTES,
        )
        return None
    try:
        return parse_json(body)
    except DecodeError:
        return None


def _bus_id(labels: dict[str, str]) -> str | None:
    """The GPU an alert is about, by bus id (sysfs form), where its series names one."""
    for name in ("pci_bus_id", "gpu"):
        value = labels.get(name, "")
        if value.count(":") >= 1 and "." in value:
            with contextlib.suppress(ValueError):
                return normal_bus_id(value)
    return None


def _gpu_of(alert: Alert) -> str | None:
    """The bus id of the GPU an alert is about: its series', else the one the engine found
    by the UUID its series names (an alert of a series numbered by NVML's index)."""
    return _bus_id(alert.labels) or alert.annotations.get("bus_id") or None


def _names(row: GpuRow, bus: str | None, uuid: str | None, number: int | None) -> bool:
    """Whether `row` is the GPU of bus id `bus` (sysfs form), else of UUID `uuid`, else
    of NVML's `number` (all a series of a GPU NVML cannot read names)."""
    if bus is not None:
        known = known_bus_id(row.bus_id)
        return known is not None and normal_bus_id(known) == bus
    if uuid:
        return row.uuid == uuid
    return row.index == number


def context(node: NodeSnapshot | None, labels: dict[str, str]) -> dict[str, str]:
    """What the console knows of what an alert is about, as annotations for the page: the
    GPU's bus id (sysfs form) and owner, and its verdict's evidence and advice (the GPU's
    for an alert about one, else the node's). Annotations, not labels: an alert must stay
    the same alert while its evidence grows and while a repair drains its owner."""
    if node is None:
        return {}
    notes: dict[str, str] = {}
    bus, uuid = _bus_id(labels), labels.get("uuid") or labels.get("UUID")
    number = int(labels["gpu"]) if labels.get("gpu", "").isdecimal() else None
    if bus is None and not uuid and number is None:
        verdict = node_verdict(node)
    else:
        row = next((r for r in node_gpus(node) if _names(r, bus, uuid, number)), None)
        if row is None:
            return {}  # a GPU the node's readings no longer show
        known = known_bus_id(row.bus_id)
        if known is not None:
            notes["bus_id"] = normal_bus_id(known)
        if row.owner is not None:
            notes["owner"] = row.owner.label
        verdict = gpu_verdict(node, row)
    problems = verdict.problems
    if problems:
        said = [f.message for f in problems[:EVIDENCE_SHOWN]]
        if len(problems) > EVIDENCE_SHOWN:
            said.append(f"and {len(problems) - EVIDENCE_SHOWN} more")
        notes["evidence"] = "; ".join(said)
        notes["advice"] = verdict.advice
    return notes
