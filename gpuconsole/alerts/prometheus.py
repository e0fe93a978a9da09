"""The rules as a Prometheus alerting-rules file over the exporter's series, for sites that
alert in Prometheus: the same conditions, `for`, hysteresis, labels and annotations."""

from __future__ import annotations

import json
from collections.abc import Iterable

from gpuconsole.alerts.condition import duration
from gpuconsole.alerts.engine import CONTEXT
from gpuconsole.alerts.rules import Rule

__all__ = ["GROUP", "duration", "expression", "rules_file"]

GROUP = "gpuconsole"


def expression(rule: Rule) -> str:
    """The rule's condition as PromQL; with a clear threshold, the hysteresis written out:
    the condition, or the clear condition for a series whose alert fires already."""
    text = rule.condition.text()
    if rule.clear is None:
        return text
    ignoring = ", ".join(["alertname", "alertstate", *(name for name, _ in rule.all_labels)])
    firing = f'ALERTS{{alertname="{rule.name}", alertstate="firing"}}'
    held = rule.condition.text(rule.clear)
    return f"({text}) or ({held} and ignoring({ignoring}) {firing})"


def _q(text: str) -> str:
    # a JSON string is a YAML double-quoted scalar: every character escaped as YAML reads it
    return json.dumps(text, ensure_ascii=False)


def rules_file(rules: Iterable[Rule]) -> str:
    """A rules file `promtool check rules` accepts."""
    lines = [
        "# Alerting rules over gpuconsole's exporter series (`gpuconsole rules`): the rules",
        "# gpuconsole evaluates itself, for Prometheus to evaluate instead. gpuconsole's own",
        f"# alerts also carry, as annotations, what no series holds: {', '.join(CONTEXT)}.",
        "groups:",
        f"  - name: {_q(GROUP)}",
        "    rules:",
    ]
    for rule in rules:
        lines.append(f"      - alert: {_q(rule.name)}")
        lines.append(f"        expr: {_q(expression(rule))}")
        if rule.for_s:
            lines.append(f"        for: {duration(rule.for_s)}")
        if rule.keep_firing_for_s:
            lines.append(f"        keep_firing_for: {duration(rule.keep_firing_for_s)}")
        lines.append("        labels:")
        lines.extend(f"          {name}: {_q(value)}" for name, value in rule.all_labels)
        if rule.annotations:
            lines.append("        annotations:")
            lines.extend(f"          {name}: {_q(value)}" for name, value in rule.annotations)
    return "\n".join(lines) + "\n"
