"""Alert rules: the default set every gpuconsole runs without a config, and [[alert]] tables
of the config, which add rules or replace a default of the same name."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from gpuconsole import format as fmt
from gpuconsole.alerts.condition import Condition, ConditionError, Labels, duration, parse
from gpuconsole.config import AlertRuleConfig, ConfigError, suggest, where
from gpuconsole.export.names import series_names
from gpuconsole.facts.verdict import (
    NVLINK_RECOVERIES_DRAIN,
    RETIRED_PAGES_SERVICE,
    SLOWDOWN_PERSISTS_S,
    Action,
)
from gpuconsole.readings.base import Severity
from gpuconsole.readings.nvml import NVLINK_ERROR_WINDOW_S

_ALERT_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The two templates Prometheus and this engine both expand; any other {{ }} is refused.
_TEMPLATE = re.compile(r"\{\{\s*(?:\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)|(\$value))\s*\}\}")
_RESERVED = frozenset({"alertname", "alertstate"})


@dataclass(frozen=True, slots=True)
class Rule:
    """Fire while `condition` holds for a series, once it has held `for_s`.

    Hysteresis: with `clear`, a firing alert clears only once the first comparison fails
    with `clear` as its threshold (fire above 90, clear below 85); with
    `keep_firing_for_s`, it keeps firing that long after the condition last held."""

    name: str
    condition: Condition
    severity: Severity = Severity.WARNING
    for_s: float = 0.0
    clear: float | None = None
    keep_firing_for_s: float = 0.0
    labels: Labels = ()
    annotations: Labels = ()

    @property
    def all_labels(self) -> Labels:
        """The labels every alert of this rule carries (severity last given wins)."""
        merged = {"severity": self.severity.value, **dict(self.labels)}
        return tuple(sorted(merged.items()))

    def alert_labels(self, series: Labels, value: float) -> dict[str, str]:
        """The labels of the alert of one series, as Prometheus makes them: the series'
        (one with an empty value is none: Prometheus never holds it), then the rule's with
        their templates filled in from the series (one that comes out empty is no label),
        then alertname."""
        labels = {name: value for name, value in series if value}
        for name, text in self.all_labels:
            filled = expand(text, dict(series), value)
            if filled:
                labels[name] = filled
            else:
                labels.pop(name, None)
        labels["alertname"] = self.name
        return labels


def expand(text: str, labels: Mapping[str, str], value: float) -> str:
    """An annotation with {{ $labels.NAME }} and {{ $value }} filled in, as Prometheus does."""

    def fill(found: re.Match[str]) -> str:
        if found.group(2):
            return _value_text(value)
        return labels.get(found.group(1), "")

    return _TEMPLATE.sub(fill, text)


def _value_text(value: float) -> str:
    """A value as Go's fmt prints a float64 (%v), as Prometheus fills in {{ $value }}:
    its shortest digits, with an exponent where it is below -4 or 6 and above."""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits))
    power = len(digits) - 1 + exponent  # where the first digit stands, as 10**power
    lead = "-" if sign else ""
    if power < -4 or power >= 6:
        mantissa = shown[0] + (f".{shown[1:]}" if len(shown) > 1 else "")
        return f"{lead}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if exponent >= 0:
        return lead + shown + "0" * exponent
    point = len(shown) + exponent
    if point <= 0:
        return f"{lead}0.{'0' * -point}{shown}"
    return f"{lead}{shown[:point]}.{shown[point:]}"


def _rule(
    name: str,
    condition: str,
    severity: Severity,
    summary: str,
    *,
    for_s: float = 0.0,
    clear: float | None = None,
    keep_firing_for_s: float = 0.0,
    description: str = "",
) -> Rule:
    notes = {"summary": summary, **({"description": description} if description else {})}
    return Rule(
        name,
        parse(condition),
        severity,
        for_s=for_s,
        clear=clear,
        keep_firing_for_s=keep_firing_for_s,
        annotations=tuple(sorted(notes.items())),
    )


_DRAIN = Action.DRAIN.rank
_CRIT, _WARN = Severity.CRITICAL, Severity.WARNING
# The window the verdict watches NVLink error counters over, as a PromQL range.
_LINK_WINDOW = duration(NVLINK_ERROR_WINDOW_S)
# The throttle reasons that slow a GPU below its clocks (not idling, not a cap set on purpose).
SLOWDOWN_REASONS = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
)

# A verdict of drain or worse pages once it has held this long (STORIES.md 9), and keeps
# firing this long after it last held: a verdict that eases to watch for a moment and back
# pages once, and one that worsens (drain, then reset_gpu: another series, so another
# alert, pending from then on) has the first firing until the second does.
VERDICT_FOR_S = 120.0
VERDICT_KEEP_S = VERDICT_FOR_S
# A slowdown that comes and goes (a GPU at its thermal limit) is one alert, not one a minute.
SLOWDOWN_KEEP_S = 300.0
# A BMC's failed PSU or fan, read so this long: one odd reading of a sensor is not a page.
BMC_FAILED_FOR_S = 60.0

DEFAULT_RULES: tuple[Rule, ...] = (
    _rule(
        "GpuNotFitForWork",
        f"gpuconsole_gpu_verdict >= {_DRAIN}",
        _CRIT,
        "GPU {{ $labels.gpu }} on {{ $labels.node }}: {{ $labels.action }}",
        for_s=VERDICT_FOR_S,
        keep_firing_for_s=VERDICT_KEEP_S,
        description="The GPU's verdict has called for drain or worse for "
        f"{fmt.age(0.0, VERDICT_FOR_S)}; its evidence is in the console's GPU view.",
    ),
    _rule(
        "NodeNotFitForWork",
        f"gpuconsole_node_verdict >= {_DRAIN}",
        _CRIT,
        "Node {{ $labels.node }}: {{ $labels.action }}",
        for_s=VERDICT_FOR_S,
        keep_firing_for_s=VERDICT_KEEP_S,
    ),
    _rule(
        "GpuLost",
        "gpuconsole_gpu_lost == 1",
        _CRIT,
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.node }} fell off the bus or "
        "needs a reset",
    ),
    # one uncorrectable error is a counter that climbed once: a warning here, and the page
    # is GpuNotFitForWork's (its verdict: reset the GPU), with the evidence
    _rule(
        "GpuUncorrectableEcc",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
        _WARN,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }}: {{ $value }} uncorrectable "
        "ECC errors since its last reset",
    ),
    _rule(
        "GpuRowRemapPending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING == 1",
        _WARN,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }}: a row remap waits for a GPU reset",
    ),
    _rule(
        "GpuRowRemapFailed",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1",
        _CRIT,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }}: row remapping failed; "
        "return it for service",
    ),
    _rule(
        "GpuRetirementPending",
        "DCGM_FI_DEV_RETIRED_PENDING == 1",
        _WARN,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }}: a memory page retirement "
        "waits for a GPU reset",
    ),
    _rule(
        "GpuRetiredPagesAtLimit",
        f"DCGM_FI_DEV_RETIRED_SBE + DCGM_FI_DEV_RETIRED_DBE >= {RETIRED_PAGES_SERVICE}",
        _CRIT,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }}: {{ $value }} memory pages "
        f"retired, at NVIDIA's limit of {RETIRED_PAGES_SERVICE}; return it for service",
    ),
    _rule(
        "GpuNvLinkErrorsClimbing",
        f"increase(gpuconsole_gpu_nvlink_errors_total[{_LINK_WINDOW}]) > 0",
        _WARN,
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.node }}: NVLink "
        "{{ $labels.link }} {{ $labels.counter }} errors climbing: about {{ $value }} in "
        f"{fmt.age(0.0, NVLINK_ERROR_WINDOW_S)}",
        description="Replays and CRC errors are resent and cost bandwidth; recoveries stop "
        "the link while it retrains. Drain and reseat if they keep climbing.",
    ),
    _rule(
        "GpuNvLinkRetraining",
        f'increase(gpuconsole_gpu_nvlink_errors_total{{counter="recovery"}}[{_LINK_WINDOW}]) '
        f">= {NVLINK_RECOVERIES_DRAIN}",
        _CRIT,
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.node }}: NVLink "
        f"{{{{ $labels.link }}}} retrained about {{{{ $value }}}} times in "
        f"{fmt.age(0.0, NVLINK_ERROR_WINDOW_S)}; "
        "drain it, then reseat",
    ),
    _rule(
        "GpuClocksHeldDown",
        f'gpuconsole_gpu_throttle_reason{{reason=~"{"|".join(SLOWDOWN_REASONS)}"}} == 1',
        _WARN,
        "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.node }}: clocks held down "
        f"({{{{ $labels.reason }}}}) for {fmt.age(0.0, SLOWDOWN_PERSISTS_S)} or more",
        for_s=SLOWDOWN_PERSISTS_S,
        keep_firing_for_s=SLOWDOWN_KEEP_S,
    ),
    _rule(
        "GpuOverheating",
        "DCGM_FI_DEV_GPU_TEMP >= 87",
        _WARN,
        "GPU {{ $labels.pci_bus_id }} on {{ $labels.Hostname }} at {{ $value }} °C",
        for_s=60.0,
        clear=82.0,
    ),
    _rule(
        "PowerSupplyFailed",
        "gpuconsole_bmc_psus_failed > 0",
        _CRIT,
        "Node {{ $labels.node }}: {{ $value }} power supplies failed",
        for_s=BMC_FAILED_FOR_S,
    ),
    _rule(
        "PowerSupplyInputLost",
        "gpuconsole_bmc_psus_no_input > 0",
        _WARN,
        "Node {{ $labels.node }}: {{ $value }} power supplies have no input power",
        for_s=BMC_FAILED_FOR_S,
        description="The PSU may be fine: reseat it, check its cable, PDU and feed. The node "
        "has lost PSU redundancy; its verdict pages where no PSU is left to spare.",
    ),
    _rule(
        "FanFailed",
        "gpuconsole_bmc_fans_failed > 0",
        _CRIT,
        "Node {{ $labels.node }}: {{ $value }} fans failed",
        for_s=BMC_FAILED_FOR_S,
    ),
    _rule(
        "FabricRailDown",
        "node_infiniband_state_id != 4 and on(node, device, port) "
        'gpuconsole_fabric_port_info{role="compute"} == 1',
        _CRIT,
        "Node {{ $labels.node }}: compute port {{ $labels.device }}/{{ $labels.port }} is "
        "not active",
        for_s=15.0,
        keep_firing_for_s=300.0,
        description="Kept firing 5 minutes after the port comes back, so that a flapping "
        "rail pages once.",
    ),
    _rule(
        "FabricManagerDown",
        "gpuconsole_fabric_manager_running == 0",
        _CRIT,
        "Node {{ $labels.node }}: the NVIDIA Fabric Manager does not run; CUDA jobs will "
        "not start on its NVSwitch GPUs",
        for_s=60.0,
    ),
    _rule(
        "SourceStale",
        "gpuconsole_source_up == 0",
        _WARN,
        "Node {{ $labels.node }}: the {{ $labels.source }} source has been failing",
        for_s=120.0,
    ),
)


def build_rules(
    entries: Sequence[AlertRuleConfig], *, defaults: bool = True, path: Path | None = None
) -> tuple[Rule, ...]:
    """The rules to evaluate: the defaults (unless `defaults` is false) with each [[alert]]
    added, or put in place of the default of its name. ConfigError names every entry that
    is wrong, its line in `path` (the config file), and why."""
    problems: list[str] = []
    configured: dict[str, Rule] = {}
    named: set[str] = set()
    for index, entry in enumerate(entries, start=1):
        wrong: list[tuple[str, str]] = []
        if entry.name in named:
            wrong.append(("name", f"another [[alert]] is named {entry.name!r} already"))
        else:
            named.add(entry.name)
            rule = _from_config(entry, wrong)
            if rule is not None and not wrong:
                configured[entry.name] = rule
        problems.extend(f"{where(path, 'alert', key, index)}: {said}" for key, said in wrong)
    if problems:
        raise ConfigError(*problems)
    base = [r for r in DEFAULT_RULES if r.name not in configured] if defaults else []
    return (*base, *configured.values())


def _from_config(entry: AlertRuleConfig, wrong: list[tuple[str, str]]) -> Rule | None:
    """The rule an [[alert]] describes; what is wrong with it added to `wrong` as
    (key, why)."""
    if not _ALERT_NAME.fullmatch(entry.name):
        wrong.append(
            (
                "name",
                f"{entry.name!r} is not an alert name (letters, digits, _ and :, not led by "
                "a digit)",
            )
        )
    condition = None
    if not entry.expr:
        wrong.append(("expr", "required, e.g. expr = 'DCGM_FI_DEV_GPU_TEMP > 90'"))
    else:
        try:
            condition = parse(entry.expr)
        except ConditionError as exc:
            wrong.append(("expr", f"{entry.expr!r}: {exc}"))
    if condition is not None:
        # rules read the exporter's series alone: one it never writes would never fire
        known = series_names()
        for metric in dict.fromkeys(condition.metrics):
            if metric not in known:
                wrong.append(
                    ("expr", f"{metric} is not a series gpuconsole exports{suggest(metric, known)}")
                )
    clear = None if math.isnan(entry.clear) else entry.clear
    if clear is not None and condition is not None:
        problem = _clear_problem(condition, clear)
        if problem:
            wrong.append(("clear", problem))
    if clear is not None and entry.keep_firing_for_s:
        wrong.append(("clear", "give clear or keep_firing_for_s, not both"))
    for key, table in (("labels", entry.labels), ("annotations", entry.annotations)):
        for name, text in table.items():
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__") or name in _RESERVED:
                wrong.append((key, f"{name!r} is not a label name a rule may set"))
            leftover = _TEMPLATE.sub("", text)
            if "{{" in leftover or "}}" in leftover:
                wrong.append(
                    (
                        key,
                        f"{name}: only {{{{ $labels.NAME }}}} and {{{{ $value }}}} are "
                        "expanded; other templates are not",
                    )
                )
    if "severity" in entry.labels:
        wrong.append(("labels", "severity is set by the severity key"))
    if condition is None:
        return None
    return Rule(
        entry.name,
        condition,
        Severity(entry.severity),
        # to the millisecond, as `gpuconsole rules` prints them and Prometheus reads them
        for_s=_millis(entry.for_s),
        clear=clear,
        keep_firing_for_s=_millis(entry.keep_firing_for_s),
        labels=tuple(sorted(entry.labels.items())),
        annotations=tuple(sorted(entry.annotations.items())),
    )


def _millis(seconds: float) -> float:
    """Seconds to the millisecond, as `duration` writes them for Prometheus."""
    return round(seconds * 1000) / 1000


def _clear_problem(condition: Condition, clear: float) -> str | None:
    first = condition.first
    if first.op in (">", ">="):
        if clear > first.threshold:
            return f"{clear:g} is above the firing threshold {first.threshold:g}: it must not be"
        return None
    if first.op in ("<", "<="):
        if clear < first.threshold:
            return f"{clear:g} is below the firing threshold {first.threshold:g}: it must not be"
        return None
    return f"needs a condition led by >, >=, < or <= (this one uses {first.op})"
