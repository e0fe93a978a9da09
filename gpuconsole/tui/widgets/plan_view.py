"""Rich renderings of an action's plan (with each step's progress) and of placement help."""

from __future__ import annotations

import re
from collections.abc import Mapping

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuconsole.actions.journal import StepProgress
from gpuconsole.actions.placement import Placement, Proposal
from gpuconsole.actions.plan import Plan
from gpuconsole.readings.base import Health
from gpuconsole.tui.themes import Palette

# A step's progress as the executor reports it (StepUpdate.state), and "" before it runs.
# A shape per state, so progress reads without colour too.
STEP_MARKS: dict[str, tuple[str, Health | None]] = {
    "": ("·", None),
    StepProgress.RUNNING: ("▸", Health.UNKNOWN),
    StepProgress.DONE: ("✓", Health.OK),
    StepProgress.FAILED: ("✗", Health.CRITICAL),
    StepProgress.UNDOING: ("↶", Health.WARNING),
    StepProgress.UNDONE: ("↶", Health.WARNING),
}


# A line's indent and its mark ("  ✓ ", "    → ", "  • "): a wrapped line goes on under
# the words after them.
_LEAD = re.compile(r"^ *(?:[^\w\s(\[]{1,2} )?")


def hanging(text: Text) -> Group:
    """`text` line by line, each wrapping under its own words rather than at column 0."""
    rows: list[RenderableType] = []
    for line in text.split("\n", allow_blank=True):
        found = _LEAD.match(line.plain)
        lead = found.end() if found else 0
        if not lead:
            rows.append(line)
            continue
        grid = Table.grid()
        grid.add_column(no_wrap=True, width=lead)
        grid.add_column(ratio=1)
        grid.add_row(line[:lead], line[lead:])
        rows.append(grid)
    return Group(*rows)


def _heading(text: Text, title: str) -> None:
    text.append(f"\n{title}\n", style="bold")


def plan_text(
    plan: Plan,
    palette: Palette,
    progress: Mapping[int, tuple[str, str]] | None = None,
    now: Mapping[str, str] | None = None,
) -> Text:
    """What moves where, what each GPU is now, the preconditions (a failed one in red with
    what to do), notes, and the numbered steps, each marked with its progress:
    `progress` maps a step's number (from 0) to (state, what the driver said); `now`, once
    the plan ran, each GPU's owner by bus id (what it was is said beside it)."""
    progress = progress or {}
    now = now or {}
    text = Text()
    goal = plan.remedy.replace("_", " ") if plan.remedy else str(plan.target)
    text.append(f"{plan.node}: {', '.join(plan.labels)} → {goal}", style="bold")
    if plan.simulated:
        text.append("  ")
        text.append(" SIMULATED ", style=palette.simulated)
    for bus, label, owner in zip(plan.gpus, plan.labels, plan.owners, strict=True):
        if bus in now:
            text.append(f"\n  {label} now: {now[bus]}", style="bold")
            text.append(f" (was: {owner})", style=palette.dim)
        else:
            text.append(f"\n  {label} now: {owner}")
    _heading(text, "preconditions")
    for check in plan.preconditions:
        if check.ok:
            text.append("  ✓ ", style=palette.health[Health.OK])
            text.append(f"{check.name}: {check.detail}\n")
        else:
            bad = palette.health[Health.CRITICAL]
            text.append(f"  ✗ {check.name}: {check.detail}\n", style=bad)
            if check.remedy:
                text.append(f"    → {check.remedy}\n", style=bad)
    if plan.notes:
        _heading(text, "notes")
        for note in plan.notes:
            text.append(f"  • {note}\n", style=palette.health[Health.WARNING])
    if plan.blocked:
        text.append("\nnothing will run until every precondition holds", style=palette.dim)
        text.rstrip()
        return text
    _heading(text, "steps")
    for seq, step in enumerate(plan.steps):
        state, detail = progress.get(seq, ("", ""))
        mark, health = STEP_MARKS.get(state, ("?", Health.UNKNOWN))
        style = palette.health[health] if health is not None else palette.dim
        text.append(f"  {mark} ", style=style)
        text.append(f"{seq + 1}. {step.title}", style=style if state == StepProgress.FAILED else "")
        if detail:
            text.append(f": {detail}", style=palette.dim)
        text.append("\n")
    text.rstrip()
    return text


def proposal_text(proposal: Proposal, palette: Palette) -> Text:
    """One node's proposal: what is critical on the node, its GPUs with the NIC rail each
    should use (a flag in the warning colour), the NVSwitches that go with a guest's
    partition, notes, alternatives."""
    text = Text()
    gpus = ", ".join(map(str, proposal.indexes))
    text.append(f"{proposal.node}: GPU {gpus}", style="bold")
    text.append(f" — {proposal.reason}")
    for problem in proposal.problems:
        text.append(f"\n  ! {proposal.node}: {problem}", style=palette.health[Health.CRITICAL])
    for rail in proposal.rails:
        gpu = f"GPU {rail.index}" if rail.index is not None else "GPU"
        text.append(f"\n  {gpu} ({rail.gpu})  ")
        if rail.device:
            text.append(f"rail {rail.device} ({rail.level})")
        else:
            text.append("no NIC", style=palette.dim)
        for flag in rail.flags:
            text.append(f"\n    ! {flag}", style=palette.health[Health.WARNING])
    if proposal.switches:
        text.append(f"\n  NVSwitches with them: {', '.join(proposal.switches)}")
    for note in proposal.notes:
        text.append(f"\n  • {note}", style=palette.health[Health.WARNING])
    if proposal.alternatives:
        others = "; ".join(", ".join(map(str, a)) for a in proposal.alternatives)
        text.append(f"\n  also possible: GPU {others}", style=palette.dim)
    return text


def proposal_line(proposal: Proposal) -> str:
    """A proposal in one line, for the list to choose from."""
    gpus = ", ".join(map(str, proposal.indexes))
    flagged = f", {proposal.flagged} flagged" if proposal.flagged else ""
    critical = f"  ! {len(proposal.problems)} critical on the node" if proposal.problems else ""
    nics = ", ".join(proposal.nics) or "no NIC"
    return f"{proposal.node}: GPU {gpus} ({nics}{flagged}){critical}"


def refusals_text(placement: Placement, palette: Palette) -> Text:
    """Why the other nodes cannot serve the request, one line each."""
    text = Text(style=palette.dim)
    for node, why in placement.refusals:
        text.append(f"{node}: {why}\n")
    text.rstrip()
    return text
