"""A verdict as data: NVIDIA's recommended action, the evidence behind it, and a node's
verdict as its agent judged it and sends it in its snapshot.

Judging is `facts.verdict`'s; these types sit here so that the codec, which decodes an
agent's snapshot, can decode the verdict it carries.
"""

from __future__ import annotations

import enum

import msgspec

from gpuconsole.readings.base import Health, Severity


class Action(enum.StrEnum):
    """NVIDIA's recommended action, mildest first; a node or GPU takes its worst finding's."""

    FIT = "fit"
    WATCH = "watch"
    DRAIN = "drain"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    RESEAT = "reseat"
    SERVICE = "service"

    @property
    def rank(self) -> int:
        """0 for fit up to 6 for return to service: the value of the verdict series."""
        return _RANKS[self]

    @property
    def words(self) -> str:
        """What to do, as an operator reads it: 'reset the GPU'."""
        return ACTION_WORDS[self]


_RANKS = {action: rank for rank, action in enumerate(Action)}
ACTION_WORDS = {
    Action.FIT: "fit for work",
    Action.WATCH: "keep watching it",
    Action.DRAIN: "drain it",
    Action.RESET_GPU: "reset the GPU, then verify",
    Action.REBOOT_NODE: "reboot the node, then verify",
    Action.RESEAT: "reseat it / check cables and power",
    Action.SERVICE: "return it for service",
}
# Who saw a finding: a node's sources, and "agent" for what a head alone knows of a node
# it reads through its agent (the agent silent, its verdict refused).
SOURCES = ("nvml", "bmc", "fabric", "tenancy", "agent")


class Finding(msgspec.Struct, frozen=True):
    """One piece of evidence: a machine code, the words an operator reads, how bad, who saw
    it, what it calls for, and the GPU it is about (its bus id; None for the node)."""

    code: str  # machine name: "xid", "remap_pending", "psu_failed", "rail_down", ...
    text: str  # human words, without the subject: "a row remap is pending (ECC)"
    severity: Severity
    source: str  # one of SOURCES
    action: Action
    bus_id: str | None = None
    subject: str = ""  # what it is about, as views name it: "GPU 2 (52:00.0)", "mlx5_7/1"

    @property
    def message(self) -> str:
        """'GPU 2 (52:00.0): a row remap is pending': what a list of problems shows."""
        return f"{self.subject}: {self.text}" if self.subject else self.text


class Verdict(msgspec.Struct, frozen=True):
    """What to do with a GPU or a node, its health at a glance, and the evidence, worst
    first."""

    action: Action
    health: Health
    findings: tuple[Finding, ...] = ()

    @property
    def fit(self) -> bool:
        return self.action is Action.FIT

    @property
    def problems(self) -> tuple[Finding, ...]:
        """The findings worth an operator's look (warnings and worse)."""
        return tuple(f for f in self.findings if f.severity is not Severity.INFO)

    @property
    def advice(self) -> str:
        """What to do, naming the GPU where the action is about one: 'reset GPU 5 (c3:00.0),
        then verify'; else the action's words."""
        return self._advice(bus=True)

    @property
    def short_advice(self) -> str:
        """The advice where the GPU's bus id is on screen beside it: 'reset GPU 5, then
        verify' (no longer than the action's words)."""
        return self._advice(bus=False)

    def _advice(self, *, bus: bool) -> str:
        if self.action is Action.RESET_GPU:
            for finding in self.findings:
                if finding.action is Action.RESET_GPU and finding.subject.startswith("GPU"):
                    name = finding.subject if bus else finding.subject.split(" (")[0]
                    return f"reset {name}, then verify"
        return self.action.words

    @property
    def summary(self) -> str:
        """One line: 'reset GPU 2 (52:00.0), then verify: a row remap is pending (ECC)'."""
        worst = self.problems
        if not worst:
            return self.action.words
        more = f" (+{len(worst) - 1} more)" if len(worst) > 1 else ""
        advice, head = self.advice, worst[0]
        said = head.text if head.subject and head.subject in advice else head.message
        return f"{advice}: {said}{more}"


class JudgedGpu(msgspec.Struct, frozen=True):
    """One GPU's verdict in a carried node verdict: its findings are the node's that name
    its bus id."""

    bus_id: str
    action: Action
    health: Health


class CarriedVerdict(msgspec.Struct, frozen=True):
    """A node's verdict as its agent judged it, where every detail is: the node's action,
    every finding (worst first; a GPU's names its bus id) and each judged GPU's action and
    health. A head shows it, checked, instead of judging the node's summary again.

    `refused` is set by the head that read it, never taken from an agent: why the head did
    not take what the agent sent, and judged the node itself."""

    action: Action
    findings: tuple[Finding, ...] = ()
    gpus: tuple[JudgedGpu, ...] = ()
    refused: str = ""
