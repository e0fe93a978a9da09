"""The builder every exporter room writes into: metric families by name, in a stable order,
and the exposition text they make.

`text()` writes the same bytes prometheus_client's generate_latest would for these families
(labels sorted by name, its float formatting), several times faster: a node's body is
rendered on almost every real scrape, since the hub publishes a snapshot every second.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

Labels = tuple[str, ...]
Spec = tuple[str, str]  # (name, help), as names.py defines them

_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def _go_float(value: float) -> str:
    """A value as generate_latest writes it (prometheus_client's floatToGoString: Go's
    exponents from 1e+07, NaN, +Inf), in fewer steps: it runs per sample."""
    value = float(value)  # rooms may hand in an int reading
    text = repr(value)
    dot = text.find(".")
    if dot > 6 and value > 0:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return _SPECIAL.get(text, text) if dot < 0 else text


@dataclass(slots=True)
class _Family:
    name: str  # a counter's without _total, as prometheus_client keeps it
    doc: str
    kind: str
    sample_name: str  # what each sample line starts with: a counter's with _total
    samples: list[tuple[Labels, Labels, float]] = field(default_factory=list)


@functools.lru_cache(maxsize=1024)
def _order(labels: Labels) -> tuple[int, ...]:
    """The positions of `labels` in name order (the exposition sorts label names)."""
    return tuple(sorted(range(len(labels)), key=labels.__getitem__))


@functools.lru_cache(maxsize=1024)
def _counter_names(name: str) -> tuple[str, str]:
    """A counter family's name (without _total, as prometheus_client keeps it) and its
    samples' (with _total)."""
    family = name.removesuffix("_total")
    return family, f"{family}_total"


@functools.lru_cache(maxsize=4096)
def _wanted(only: frozenset[str], specs: tuple[Spec, ...]) -> bool:
    """Whether `only` keeps any of these families: rooms ask the same per port or GPU, and
    an evaluation builds a Families per node, so it is asked once for them all."""
    return any(s[0] in only or _counter_names(s[0])[1] in only for s in specs)


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

    def __init__(self, only: frozenset[str] | None = None) -> None:
        """`only`: keep the families of these names alone (what alert rules read)."""
        self._families: dict[str, _Family] = {}
        self._only = only

    def wants(self, *specs: Spec) -> bool:
        """Whether any of these families is kept: a room skips work none of them needs."""
        return self._only is None or _wanted(self._only, specs)

    def gauge(self, spec: Spec, labels: Labels, values: Labels, value: float) -> None:
        if self._only is not None and spec[0] not in self._only:
            return
        if len(labels) != len(values):
            raise ValueError(f"{spec[0]}: labels {labels} and values {values} differ in length")
        family = self._families.get(spec[0])
        if family is None:
            family = self._families[spec[0]] = _Family(spec[0], spec[1], "gauge", spec[0])
        family.samples.append((labels, values, value))

    def counter(self, spec: Spec, labels: Labels, values: Labels, value: float) -> None:
        name, sample_name = _counter_names(spec[0])
        if self._only is not None and sample_name not in self._only:
            return
        if len(labels) != len(values):
            raise ValueError(f"{spec[0]}: labels {labels} and values {values} differ in length")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, spec[1], "counter", sample_name)
        family.samples.append((labels, values, value))

    def counters(self, spec: Spec, rows: list[tuple[Labels, Labels, float]]) -> None:
        """Many samples of one counter family at once, each (label names, label values,
        value), all of one shape (the first is checked): a GPU's NVLink error counters,
        which a large fleet has by the 100,000."""
        if not rows:
            return
        name, sample_name = _counter_names(spec[0])
        if self._only is not None and sample_name not in self._only:
            return
        if len(rows[0][0]) != len(rows[0][1]):
            raise ValueError(f"{spec[0]}: labels {rows[0][0]} and values {rows[0][1]} differ")
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = _Family(name, spec[1], "counter", sample_name)
        family.samples.extend(rows)

    def by_family(self) -> Iterator[tuple[str, list[tuple[Labels, Labels, float]]]]:
        """Each family's sample name and samples (label names, label values, value): what
        alert rules are evaluated over, the very series a scrape would read."""
        for family in self._families.values():
            yield family.sample_name, family.samples

    def samples(self) -> Iterator[tuple[str, Labels, Labels, float]]:
        """Every sample as (sample name, label names, label values, value)."""
        for name, samples in self.by_family():
            for labels, values, value in samples:
                yield name, labels, values, value

    def __iter__(self) -> Iterator[Metric]:
        """The families as prometheus_client metrics (for a Collector)."""
        for family in self._families.values():
            metric = Metric(family.name, family.doc, family.kind)
            name = family.sample_name
            metric.samples = [
                Sample(name, dict(zip(labels, values, strict=True)), value)
                for labels, values, value in family.samples
            ]
            yield metric

    def text(self) -> bytes:
        """The Prometheus text exposition (version 0.0.4) of every family."""
        out: list[str] = []
        label_text, go_float = _label_text, _go_float
        for family in self._families.values():
            name = family.sample_name
            doc = family.doc.replace("\\", "\\\\").replace("\n", "\\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {family.kind}\n")
            out.extend(
                [
                    f"{name}{label_text(labels, values)} {go_float(value)}\n"
                    for labels, values, value in family.samples
                ]
            )
        return "".join(out).encode()
