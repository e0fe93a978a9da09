"""A verdict an agent sends is untrusted: a head checks it against its own findings, its
types, its sizes and the node's GPUs, shows its text only made safe, and refuses one that
lies or babbles with the reason, on that node alone, judging the node itself instead."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from aiohttp import web

from gpuconsole import codec
from gpuconsole.export.agent import Agent, select
from gpuconsole.facts import verdict as verdict_facts
from gpuconsole.facts.verdict import Action, gpu_verdict, node_verdict
from gpuconsole.hub import Hub
from gpuconsole.readings.snapshot import NodeSnapshot
from gpuconsole.readings.verdict import CarriedVerdict
from gpuconsole.wiring import AgentSettings
from tests.export_fixtures import HeldHub, frozen_fleet
from tests.test_agents_source import serve
from tests.test_verdict_agents import head_of, with_links_down
from tests.waiting import until

Verdict = dict[str, Any]


def _set(key: str, value: Any) -> Callable[[Verdict], Any]:
    def change(verdict: Verdict) -> Verdict:
        verdict[key] = value
        return verdict

    return change


def _finding(key: str, value: Any, times: int = 1) -> Callable[[Verdict], Any]:
    def change(verdict: Verdict) -> Verdict:
        verdict["findings"][0][key] = value
        verdict["findings"] = verdict["findings"] * times
        return verdict

    return change


def _gpu(key: str, value: Any) -> Callable[[Verdict], Any]:
    def change(verdict: Verdict) -> Verdict:
        verdict["gpus"][0][key] = value
        return verdict

    return change


def _elsewhere(verdict: Verdict) -> Verdict:
    """A consistent verdict about a GPU the node does not have."""
    verdict["findings"][0]["bus_id"] = verdict["gpus"][0]["bus_id"] = "0000:99:00.0"
    return verdict


LIES: list[tuple[str, Callable[[Verdict], Any], str]] = [
    ("an action that is none", _set("action", "explode"), "verdict.action: invalid enum value 'explode'"),
    ("not an object", lambda v: "trust me, reset everything", "verdict: expected object"),
    ("findings not a list", _set("findings", {"a": 1}), "verdict.findings: expected array"),
    ("fit despite its findings", _set("action", "fit"),
     "the node is said fit, its findings say reset_gpu"),
    ("a GPU's health that its findings do not give", _gpu("health", "ok"),
     "GPU '0000:61:00.0' is said reset_gpu (ok), its findings say reset_gpu (warning)"),
    ("a GPU with findings and no verdict", _set("gpus", []),
     "GPU 0000:61:00.0 has findings and no verdict"),
    ("a GPU judged twice", lambda v: {**v, "gpus": v["gpus"] * 2}, "is judged twice"),
    ("a GPU the node does not have", _elsewhere,
     "finding 0 is about GPU '0000:99:00.0', which the node does not have"),
    ("too many findings", _finding("text", "x", 2000), "6000 findings, more than 1024"),
    ("a text too long", _finding("text", "x" * 5000), "longer than 1000 characters"),
    ("an escape for a code", _finding("code", "\x1b]52;c;cm0gLXJmIC8K\x07"),
     r"code '\x1b]52;c;cm0gLXJmIC8K\x07' is not a machine name"),
    ("a source there is none of", _finding("source", "kernel"), "source 'kernel' is none of"),
    ("a refusal of its own", _set("refused", "nothing to see"), "only a head says"),
]  # fmt: skip


def _served(change: Callable[[Verdict], Any]) -> dict[str, Any]:
    """dgx-004's summary as its agent serves it (a row remap pending on GPU 2), its verdict
    changed."""
    body = codec.snapshot_json(select(frozen_fleet(), "dgx-004", summary=True), sparse=True)
    body = copy.deepcopy(body)
    node = body["nodes"][0]
    node["verdict"] = change(node["verdict"])
    return body


async def _head_reads(body: dict[str, Any]) -> tuple[Any, Any]:
    """dgx-004 from an agent that serves `body`, beside dgx-002 from a real agent with two
    NVLinks of GPU 2 down (which only its agent's verdict says); both as the head has them."""

    async def liar(request: web.Request) -> web.Response:
        return web.json_response(body)

    runner, port = await serve(liar)
    sick = with_links_down(frozen_fleet(), "dgx-002", 2, 2)
    neighbour = Agent(HeldHub(sick), AgentSettings(port=0))
    await neighbour.start()
    try:
        snapshot = await head_of(
            ("dgx-004", f"http://127.0.0.1:{port}"),
            ("dgx-002", f"http://127.0.0.1:{neighbour.port}"),
        ).poll_once()
    finally:
        await neighbour.stop()
        await runner.cleanup()
    return snapshot.node("dgx-004"), snapshot.node("dgx-002")


@pytest.mark.parametrize(("change", "reason"), [(c, r) for _, c, r in LIES],
                         ids=[name for name, _, _ in LIES])  # fmt: skip
async def test_a_lying_or_garbage_verdict_is_refused_with_its_reason(
    change: Callable[[Verdict], Any], reason: str
) -> None:
    node, neighbour = await _head_reads(_served(change))
    assert node is not None and node.status("remote").ok  # its readings are kept
    verdict = node_verdict(node)
    refused = [f for f in verdict.findings if f.code == "verdict_refused"]
    assert len(refused) == 1, verdict.findings
    assert reason in refused[0].text and "judged here from its readings" in refused[0].text
    assert all("\x1b" not in f.message and "\x07" not in f.message for f in verdict.findings)
    # judged here, from what the summary holds: the pending row remap on GPU 2
    assert verdict.action is Action.RESET_GPU
    assert gpu_verdict(node, node.gpus[2]).action is Action.RESET_GPU
    # the neighbour keeps the verdict its own agent sent
    assert neighbour is not None
    assert gpu_verdict(neighbour, neighbour.gpus[2]).action is Action.RESET_GPU
    assert "verdict_refused" not in [f.code for f in node_verdict(neighbour).findings]


async def test_escapes_in_a_verdict_that_holds_together_are_shown_written_out() -> None:
    node, _ = await _head_reads(_served(_finding("text", "\x1b[2J\x1b]0;owned\x07row remap")))
    assert node is not None
    verdict = node_verdict(node)
    assert "verdict_refused" not in [f.code for f in verdict.findings]
    shown = [f.text for f in verdict.findings if f.code == "remap_pending"]
    assert shown == [r"\x1b[2J\x1b]0;owned\x07row remap"]


async def test_a_refused_verdict_sent_again_and_again_is_checked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent that lies the same way at every poll costs the head one check of what it
    sent, not one per poll: each snapshot still says why its verdict is refused."""
    checked: list[object] = []
    check = verdict_facts._carried

    def counted(node: NodeSnapshot, carried: CarriedVerdict) -> object:
        checked.append(carried)
        return check(node, carried)

    monkeypatch.setattr(verdict_facts, "_carried", counted)
    body = _served(_set("action", "fit"))

    async def liar(request: web.Request) -> web.Response:
        return web.json_response(body)

    runner, port = await serve(liar)
    head = head_of(("dgx-004", f"http://127.0.0.1:{port}"))
    await head.start()
    try:
        polls: set[int] = set()
        while len(polls) < 4:  # snapshots of four polls, judged as each is published
            await until(lambda: _polls(head) not in polls | {0})
            node = head.latest.node("dgx-004")  # type: ignore[union-attr]
            assert node is not None
            polls.add(_polls(head))
            refused = [f for f in node_verdict(node).findings if f.code == "verdict_refused"]
            assert len(refused) == 1
            assert "the node is said fit, its findings say reset_gpu" in refused[0].text
            assert node_verdict(node).action is Action.RESET_GPU  # judged here instead
    finally:
        await head.stop()
        await runner.cleanup()
    assert len(checked) == 1, f"checked {len(checked)} times over {len(polls)} polls"


def _polls(head: Hub) -> int:
    """How often the head has read dgx-004 so far (0 before it published it)."""
    node = head.latest.node("dgx-004") if head.latest is not None else None
    status = node.status("remote") if node is not None else None
    return status.polls if status is not None else 0


def test_a_finding_about_a_gpu_nvml_lost_that_sysfs_lists_is_the_nodes_and_one_about_none_is_not() -> (
    None
):
    """A head looks for a finding's GPU among NVML's first (the GPUs most findings are
    about), then among those sysfs and the node's guests list: a GPU NVML lost is still
    the node's; one that none of them lists is refused."""
    fleet = with_links_down(frozen_fleet(), "dgx-002", 2, 2)
    node = verdict_facts.carry_verdict(fleet.nodes[0])
    assert node.verdict is not None and node.nvml is not None and node.tenancy is not None
    bus = next(f.bus_id for f in node.verdict.findings if f.bus_id is not None)
    assert bus in {g.bus_id for g in node.tenancy.gpus}
    gone = tuple(g for g in node.nvml.gpus if g.pci_bus_id != bus)
    lost = msgspec.structs.replace(node, nvml=msgspec.structs.replace(node.nvml, gpus=gone))
    taken = verdict_facts._carried(lost, lost.verdict)  # type: ignore[arg-type]
    assert not isinstance(taken, str), taken
    tenancy = msgspec.structs.replace(
        lost.tenancy, gpus=tuple(g for g in lost.tenancy.gpus if g.bus_id != bus)
    )
    nowhere = msgspec.structs.replace(lost, tenancy=tenancy)
    refused = verdict_facts._carried(nowhere, nowhere.verdict)  # type: ignore[arg-type]
    assert isinstance(refused, str) and "which the node does not have" in refused
