"""A rule's condition: a small, strict subset of PromQL, so that the same text is evaluated
here over the exporter's samples and printed for Prometheus unchanged.

    condition := comparison ( "and" [ "on" "(" label, ... ")" ] comparison )*
    comparison := term ( "+" term )* OP number
    term := selector | "increase" "(" selector "[" duration "]" ")"
    selector := metric [ "{" label ("=" | "!=" | "=~" | "!~") "string", ... "}" ]
    OP := ">" | ">=" | "<" | "<=" | "==" | "!="

A comparison keeps the samples it holds for (their labels and value), as PromQL's filter
comparison does; `and` keeps the left side's samples that have a match on the right (by
every label but the metric name, or by the labels `on` names). `+` adds the samples of its
terms that carry the same labels, as PromQL's one-to-one matching does. `increase` is a
counter's growth over the window, reckoned as Prometheus reckons it (resets added back,
extrapolated to the window's edges) from the samples the evaluator kept
(gpuconsole.alerts.window). Regular expressions are anchored at both ends, as PromQL's are.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs, the metric name left out


class Sample(NamedTuple):
    """One sample of one series: its metric name, its labels, its value (a tuple: an
    evaluation makes one per series, hundreds of thousands on a large fleet)."""

    name: str
    labels: Labels
    value: float


class ConditionError(ValueError):
    """A condition outside the subset: says what was expected, and where."""


# Each comparison as a filter of samples (their value's place written out): it runs over
# every sample of a large fleet's metric, where a call of operator's function per sample
# was most of the cost
_FILTERS: dict[str, Callable[[Iterable[Sample], float], list[Sample]]] = {
    ">": lambda found, threshold: [s for s in found if s[2] > threshold],
    ">=": lambda found, threshold: [s for s in found if s[2] >= threshold],
    "<": lambda found, threshold: [s for s in found if s[2] < threshold],
    "<=": lambda found, threshold: [s for s in found if s[2] <= threshold],
    "==": lambda found, threshold: [s for s in found if s[2] == threshold],
    "!=": lambda found, threshold: [s for s in found if s[2] != threshold],
}
_MATCH_OPS = ("=~", "!~", "!=", "=")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ON = re.compile(r"on\s*\(")
_KEYWORDS = frozenset({"and", "or", "unless", "on", "ignoring", "by", "without", "bool"})


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str

    def holds(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        # ASCII: Go's \d, \w, \s and \b, which Prometheus matches with, are
        found = re.fullmatch(self.value, value, re.ASCII) is not None
        return found if self.op == "=~" else not found

    def text(self) -> str:
        # a JSON string is a PromQL one: every escape JSON writes, Go's strings read
        return f"{self.label}{self.op}{json.dumps(self.value, ensure_ascii=False)}"


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: 90 -> 1m30s, 0.5 -> 500ms."""
    millis = round(seconds * 1000)
    if millis % 1000:
        return f"{millis}ms"
    whole = millis // 1000
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{secs}s" if secs or not out else "")


@dataclass(frozen=True, slots=True)
class Term:
    """`metric{matchers}`, or with `range_s` its `increase(metric{matchers}[range])`."""

    metric: str
    matchers: tuple[Matcher, ...] = ()
    range_s: float | None = None

    @property
    def key(self) -> str:
        """Where an evaluation finds this term's samples: the metric's name, or for an
        increase the name gpuconsole.alerts.window files the metric's increases under."""
        return self.metric if self.range_s is None else increase_key(self.metric, self.range_s)

    def text(self) -> str:
        selector = self.metric
        if self.matchers:
            selector += "{" + ", ".join(m.text() for m in self.matchers) + "}"
        if self.range_s is None:
            return selector
        return f"increase({selector}[{duration(self.range_s)}])"

    def select(self, samples: Iterable[Sample]) -> list[Sample]:
        """The samples its matchers keep."""
        if not self.matchers:
            return list(samples)
        if all(m.op in ("=", "!=") and m.value for m in self.matchers):
            # a pair a series carries is in its labels as it is: no dict of them needed
            # (an empty value also matches a label the series lacks: not this way)
            has = [(m.label, m.value) for m in self.matchers if m.op == "="]
            lacks = [(m.label, m.value) for m in self.matchers if m.op == "!="]
            if len(has) == 1 and not lacks:
                [pair] = has
                return [s for s in samples if pair in s.labels]
            return [
                s
                for s in samples
                if all(p in s.labels for p in has) and not any(p in s.labels for p in lacks)
            ]
        found = []
        for sample in samples:
            labels = dict(sample.labels)
            if all(m.holds(labels.get(m.label, "")) for m in self.matchers):
                found.append(sample)
        return found


def increase_key(metric: str, range_s: float) -> str:
    return f"increase({metric}[{duration(range_s)}])"


@dataclass(frozen=True, slots=True)
class Comparison:
    """`term + term ... OP threshold`."""

    terms: tuple[Term, ...]
    op: str
    threshold: float

    @property
    def metric(self) -> str:
        return self.terms[0].metric

    def text(self, threshold: float | None = None) -> str:
        value = self.threshold if threshold is None else threshold
        return f"{' + '.join(t.text() for t in self.terms)} {self.op} {_number(value)}"

    def select(self, by_name: Mapping[str, list[Sample]]) -> list[Sample]:
        """The samples (of the first term, with the terms' sum as value) its comparison
        keeps."""
        first, *others = self.terms
        held = _FILTERS[self.op]
        if not others:
            # the comparison first, then the matchers: the same samples, and most of a
            # large fleet's fail the comparison (an increase of 0), at less than a matcher
            found = held(by_name.get(first.key, ()), self.threshold)
            return first.select(found) if first.matchers else found
        found = first.select(by_name.get(first.key, ()))
        for term in others:
            values = {s.labels: s.value for s in term.select(by_name.get(term.key, ()))}
            found = [
                Sample(s.name, s.labels, s.value + values[s.labels])
                for s in found
                if s.labels in values
            ]
        return held(found, self.threshold)


@dataclass(frozen=True, slots=True)
class Condition:
    """Comparisons joined by `and` (with the labels each `and` matches on; None: all)."""

    first: Comparison
    rest: tuple[tuple[tuple[str, ...] | None, Comparison], ...] = ()

    def text(self, threshold: float | None = None) -> str:
        """The condition as PromQL; `threshold` in place of the first comparison's."""
        out = self.first.text(threshold)
        for on, comparison in self.rest:
            joined = "and" if on is None else f"and on({', '.join(on)})"
            out += f" {joined} {comparison.text()}"
        return out

    @property
    def comparisons(self) -> tuple[Comparison, ...]:
        return (self.first, *(c for _, c in self.rest))

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics its terms read (an increase's too: its samples are kept over time)."""
        return tuple(t.metric for c in self.comparisons for t in c.terms)

    @property
    def ranges(self) -> tuple[tuple[str, float], ...]:
        """(metric, window) of each increase: what an evaluator keeps samples of."""
        return tuple((t.metric, t.range_s) for c in self.comparisons for t in c.terms if t.range_s)

    def evaluate(
        self, by_name: Mapping[str, list[Sample]], threshold: float | None = None
    ) -> list[Sample]:
        """The samples for which the condition holds (`threshold` in place of the first
        comparison's, for a rule's clear threshold)."""
        first = self.first
        if threshold is not None:
            first = Comparison(first.terms, first.op, threshold)
        kept = first.select(by_name)
        for on, comparison in self.rest:
            right = comparison.select(by_name)
            keys = {_key(s.labels, on) for s in right}
            kept = [s for s in kept if _key(s.labels, on) in keys]
        return kept


def _key(labels: Labels, on: tuple[str, ...] | None) -> Labels:
    if on is None:
        return labels
    found = dict(labels)
    return tuple((name, found.get(name, "")) for name in on)


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def fail(self, expected: str) -> ConditionError:
        rest = self.text[self.at :]
        found = repr(rest[:20]) if rest else "the end"
        return ConditionError(f"at character {self.at + 1}: expected {expected}, found {found}")

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\n":
            self.at += 1

    def take(self, pattern: re.Pattern[str], expected: str) -> re.Match[str]:
        self.skip()
        found = pattern.match(self.text, self.at)
        if found is None:
            raise self.fail(expected)
        self.at = found.end()
        return found

    def peek(self, literal: str) -> bool:
        self.skip()
        return self.text.startswith(literal, self.at)

    def expect(self, literal: str) -> None:
        if not self.peek(literal):
            raise self.fail(repr(literal))
        self.at += len(literal)

    def done(self) -> bool:
        self.skip()
        return self.at >= len(self.text)


def parse(text: str) -> Condition:
    """A Condition from its text; ConditionError says what does not fit the subset."""
    if not text.strip():
        raise ConditionError("empty: write a comparison such as gpuconsole_gpu_lost == 1")
    reader = _Reader(text)
    first = _comparison(reader)
    rest: list[tuple[tuple[str, ...] | None, Comparison]] = []
    while not reader.done():
        word = reader.take(_LABEL, "'and' or the end")
        if word.group() != "and":
            reader.at = word.start()
            raise reader.fail("'and' (the only operator between comparisons) or the end")
        on: tuple[str, ...] | None = None
        reader.skip()
        opening = _ON.match(text, reader.at)
        if opening is not None:
            reader.at = opening.end()
            names = [reader.take(_LABEL, "a label name").group()]
            while reader.peek(","):
                reader.expect(",")
                names.append(reader.take(_LABEL, "a label name").group())
            reader.expect(")")
            on = tuple(names)
        rest.append((on, _comparison(reader)))
    return Condition(first, tuple(rest))


_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_DURATION_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_FUNCTION = re.compile(r"increase\s*\(")


def _comparison(reader: _Reader) -> Comparison:
    terms = [_term(reader)]
    while reader.peek("+"):
        reader.expect("+")
        terms.append(_term(reader))
    reader.skip()
    op = next((o for o in (">=", "<=", "==", "!=", ">", "<") if reader.peek(o)), None)
    if op is None:
        raise reader.fail("a comparison (>, >=, <, <=, ==, !=) with a number")
    reader.at += len(op)
    number = reader.take(_NUMBER, "a number")
    threshold = float(number.group())
    if not math.isfinite(threshold):
        raise ConditionError(f"{number.group()} is not a finite number")
    return Comparison(tuple(terms), op, threshold)


def _term(reader: _Reader) -> Term:
    reader.skip()
    opening = _FUNCTION.match(reader.text, reader.at)
    if opening is None:
        return _selector(reader)
    reader.at = opening.end()
    selector = _selector(reader)
    reader.expect("[")
    reader.skip()
    found = _DURATION.match(reader.text, reader.at)
    if found is None:
        raise reader.fail("a duration such as 10m")
    reader.at = found.end()
    range_s = sum(int(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(found.group()))
    if range_s <= 0:
        raise ConditionError(f"{found.group()} is not a window: give one longer than 0")
    reader.expect("]")
    reader.expect(")")
    return Term(selector.metric, selector.matchers, float(range_s))


def _selector(reader: _Reader) -> Term:
    name = reader.take(_NAME, "a metric name").group()
    if name in _KEYWORDS:
        reader.at -= len(name)
        raise reader.fail("a metric name")
    matchers: list[Matcher] = []
    if reader.peek("{"):
        reader.expect("{")
        while not reader.peek("}"):
            label = reader.take(_LABEL, "a label name or '}'").group()
            reader.skip()
            op = next((o for o in _MATCH_OPS if reader.text.startswith(o, reader.at)), None)
            if op is None:
                raise reader.fail("=, !=, =~ or !~")
            reader.at += len(op)
            value = _unquote(reader.take(_STRING, 'a "quoted" value').group(1), label)
            if op in ("=~", "!~"):
                problem = _not_re2(value)
                if problem:
                    raise ConditionError(
                        f"label {label}: {problem} is not in Prometheus's regular expressions "
                        "(Go's RE2), which read `gpuconsole rules`"
                    )
                try:
                    re.compile(value, re.ASCII)
                except re.error as exc:
                    raise ConditionError(f"label {label}: bad regular expression: {exc}") from None
            matchers.append(Matcher(label, op, value))
            if not reader.peek("}"):
                reader.expect(",")
        reader.expect("}")
    return Term(name, tuple(matchers))


# PromQL's escapes in a double-quoted string, as Go reads them
_ESCAPE = re.compile(
    r'\\(?:([abfnrtv\\"])|x([0-9a-fA-F]{2})|([0-7]{3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.?))',
    re.DOTALL,
)
_ESCAPED = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _unquote(raw: str, label: str) -> str:
    """A quoted label value's text as PromQL reads it; an escape it does not know is an
    error there, and so here (never a backslash quietly dropped)."""
    if "\n" in raw:
        raise ConditionError(f"label {label}: a newline in a quoted value: write it as \\n")

    def one(found: re.Match[str]) -> str:
        simple, hex2, octal, hex4, hex8, other = found.groups()
        if simple is not None:
            return _ESCAPED.get(simple, simple)
        code = int(octal, 8) if octal is not None else int(hex2 or hex4 or hex8 or "-1", 16)
        if 0 <= code <= (0xFF if octal is not None else 0x10FFFF):
            return chr(code)
        said = other if other is not None else found.group()[1:]
        raise ConditionError(f"label {label}: unknown escape sequence \\{said}")

    return _ESCAPE.sub(one, raw)


# What Python's regular expressions read and Go's RE2 (Prometheus's) refuses or reads
# otherwise: (pattern, what to call it).
_PYTHON_ONLY = (
    (re.compile(r"\(\?(?:=|!|<=|<!)"), "lookaround"),
    (re.compile(r"\(\?>"), "an atomic group"),
    (re.compile(r"\(\?P="), "a back reference"),
    (re.compile(r"\(\?\("), "a conditional group"),
    (re.compile(r"\(\?#"), "a comment"),
    (re.compile(r"\\[1-9]"), "a back reference"),
    (re.compile(r"\(\?[a-zA-Z-]*[aLux][a-zA-Z-]*[:)]"), "a flag Go does not know"),
    (re.compile(r"\\[ZuUN]"), "an escape Go does not know"),
    (re.compile(r"(?:[*+?]|\})\+"), "a possessive repeat"),
)


def _not_re2(pattern: str) -> str | None:
    """What in `pattern` Prometheus cannot read as Python does (quoted with what it is), or
    None. Escaped characters are passed over; inside a [class] only a POSIX class is
    looked for (Go reads [[:digit:]] as a digit, Python as the characters [:digt)."""
    at, first = 0, -1  # first: where the [class] being read began its members; -1: none
    while at < len(pattern):
        char = pattern[at]
        if char == "\\":
            if first < 0:
                for found, what in _PYTHON_ONLY:
                    if found.match(pattern, at):
                        return f"{pattern[at : at + 2]} ({what})"
            at += 2
            continue
        if first >= 0:
            if pattern.startswith("[:", at):
                return "[: (a POSIX class, which Python reads as characters)"
            if char == "]" and at != first:  # a ] first in the class is one of its members
                first = -1
        elif char == "[":
            first = at + 2 if pattern.startswith("^", at + 1) else at + 1
        else:
            for found, what in _PYTHON_ONLY:
                hit = found.match(pattern, at)
                if hit:
                    return f"{hit.group()} ({what})"
        at += 1
    return None
