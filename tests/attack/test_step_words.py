"""What a driver says of a step comes from outside gpuconsole (a Kubernetes API server's
refusal, an admission webhook's message, libvirt, a BMC): whatever it holds, the journal,
the audit log, the events and the operator's terminal get it written out, never obeyed."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gpuconsole.actions.audit import AuditLog
from gpuconsole.actions.drivers import Drivers, StepFailed
from gpuconsole.actions.executor import Executor, StepUpdate
from gpuconsole.actions.journal import Journal
from gpuconsole.actions.plan import Step, Target, make_plan
from gpuconsole.actions.progress import TextReport
from gpuconsole.actions.roles import Actor, Role
from gpuconsole.readings.base import Event
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.tenancy import TenancyReading
from gpuconsole.sources.tenancy.pci_binding import read_gpus
from tests.tenancy_fixtures import FakeHost

GPU = "0000:1b:00.0"
HOSTILE = "admission webhook denied: \x1b]52;c;cm0gLXJmIC8K\x07\x1b[2J\u202edone"


class Talker:
    """A driver that says hostile words: done with them on the first step, then fails
    with them."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, step: Step) -> str:
        self.calls += 1
        if self.calls == 1:
            return HOSTILE
        raise StepFailed(HOSTILE)

    async def undo(self, step: Step) -> str:
        return HOSTILE


async def test_a_drivers_words_reach_journal_audit_events_and_terminal_written_out(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path)
    host.pci(GPU, driver="nvidia", group=40)
    host.nvidia_info(GPU, "GPU-00000000-0000-0000-0000-000000000001", 0)
    node = NodeSnapshot(
        "n1", tenancy=TenancyReading(at=0.0, gpus=read_gpus(host.sysfs_root, host.proc_root))
    )

    async def read() -> NodeSnapshot:
        return node

    events: list[Event] = []
    shown = io.StringIO()
    report = TextReport(shown)
    updates: list[StepUpdate] = []

    def on_step(update: StepUpdate) -> None:
        updates.append(update)
        report.step(update)

    state = tmp_path / "state"
    executor = Executor(
        "n1",
        Drivers(pci=Talker()),  # type: ignore[arg-type]
        Journal(state / "actions.db"),
        AuditLog(state / "audit.jsonl"),
        reader=read,
        emit=events.append,
        on_step=on_step,
    )
    plan = make_plan(node, [GPU], Target.parse("drained"))
    report.plan(plan)
    outcome = await executor.execute(plan, Actor("ops", Role.OPERATOR), "n1")
    report.outcome(outcome)

    said = [
        shown.getvalue(),
        outcome.message,
        *(u.detail for u in updates),
        *(e.message for e in events),
        *(s.detail for p in executor.journal.plans() for s in p.steps),
        (state / "audit.jsonl").read_text(),
    ]
    assert any("admission webhook denied" in text for text in said[2:4])
    for text in said:
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, text
    assert json.loads((state / "audit.jsonl").read_text().splitlines()[-1])
