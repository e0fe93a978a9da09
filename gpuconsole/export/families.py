"""The builder every exporter room writes into: metric families by name, in a stable order,
and the exposition text they make.

`text()` writes the same bytes prometheus_client's generate_latest would for these families
(labels sorted by name, its float formatting), several times faster: a node's body is
rendered on almost every real scrape, since the hub publishes a snapshot every second.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]
Spec = tuple[str, str]  # (name, help), as names.py defines them

# Go's float formatting, as generate_latest writes values (1.796e+09, NaN, +Inf)
_go_float: Callable[[float], str] = floatToGoString


@dataclass(slots=True)
class _Family:
    name: str  # a counter's without _total, as prometheus_client keeps it
    doc: str
    kind: str
    samples: list[tuple[str, Labels, Labels, float]] = field(default_factory=list)


@functools.lru_cache(maxsize=1024)
def _order(labels: Labels) -> tuple[int, ...]:
    """The positions of `labels` in name order (the exposition sorts label names)."""
    return tuple(sorted(range(len(labels)), key=labels.__getitem__))


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


@functools.lru_cache(maxsize=1 << 16)
def _label_text(labels: Labels, values: Labels) -> str:
    """'{a="1",b="x"}'; remembered, as the same label sets come back in every snapshot."""
    if not labels:
        return ""
    pairs = ",".join(f'{labels[i]}="{_escape(values[i])}"' for i in _order(labels))
    return "{" + pairs + "}"


class Families:
    """Metric families by name, created on first use, in a stable order.

    Samples carry their own label sets: a MIG instance's sample has the GPU's labels
    plus GPU_I_PROFILE and GPU_I_ID, and a pod's GPU has pod, namespace and container, in
    the same family, as dcgm-exporter emits them.
    """

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def _family(self, name: str, doc: str, kind: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, doc, kind)
        return family

    def gauge(self, spec: Spec, labels: Labels, values: Labels, value: float) -> None:
        if len(labels) != len(values):
            raise ValueError(f"{spec[0]}: labels {labels} and values {values} differ in length")
        self._family(spec[0], spec[1], "gauge").samples.append((spec[0], labels, values, value))

    def counter(self, spec: Spec, labels: Labels, values: Labels, value: float) -> None:
        if len(labels) != len(values):
            raise ValueError(f"{spec[0]}: labels {labels} and values {values} differ in length")
        name = spec[0].removesuffix("_total")
        family = self._family(name, spec[1], "counter")
        family.samples.append((f"{name}_total", labels, values, value))

    def __iter__(self) -> Iterator[Metric]:
        """The families as prometheus_client metrics (for a Collector)."""
        for family in self._families.values():
            metric = Metric(family.name, family.doc, family.kind)
            metric.samples = [
                Sample(name, dict(zip(labels, values, strict=True)), value)
                for name, labels, values, value in family.samples
            ]
            yield metric

    def text(self) -> bytes:
        """The Prometheus text exposition (version 0.0.4) of every family."""
        out: list[str] = []
        for family in self._families.values():
            shown = f"{family.name}_total" if family.kind == "counter" else family.name
            doc = family.doc.replace("\\", "\\\\").replace("\n", "\\n")
            out.append(f"# HELP {shown} {doc}\n# TYPE {shown} {family.kind}\n")
            out.extend(
                f"{name}{_label_text(labels, values)} {_go_float(value)}\n"
                for name, labels, values, value in family.samples
            )
        return "".join(out).encode()
