"""A minimal PromQL evaluator over scraped samples: enough for every panel of the Grafana dashboard.

No Prometheus or Grafana renderer is available from the package registries, so
``bench/dashboard_png.py`` evaluates the dashboard's own queries here, over the expositions it
scraped during a real run. Queries are parsed by promql-parser (the Rust parser's binding, as in
``tests/deploy/test_grafana_dashboard.py``); this module only walks the AST.

Supported: instant and range selectors with ``=``, ``!=``, ``=~``, ``!~`` matchers (staleness as in
Prometheus: a series absent from its target's next scrape ends there; otherwise a 5-minute
lookback); ``rate``, ``irate``, ``increase``, ``clamp_min``, ``clamp_max``, ``histogram_quantile``;
``sum``, ``avg``, ``min``, ``max``, ``count`` with ``by``/``without``; ``+ - * /`` between vectors
(one-to-one on all labels), a vector and a scalar, or two scalars; parentheses and unary minus.
Anything else raises :class:`Unsupported`.

One simplification, on purpose: ``rate`` is the increase between the first and the last sample in
the window (a counter reset counts the new value as the increase) over the seconds between them,
and ``increase`` is that raw increase; Prometheus also extrapolates both to the window's edges.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise

import promql_parser as pp
from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs; ``__name__`` until a function drops it
Vector = dict[Labels, float]
Value = Vector | float
LOOKBACK = 300.0  # seconds, Prometheus's default lookback delta
NAME = "__name__"


class Unsupported(ValueError):
    """A PromQL construct this evaluator does not implement."""


def labels_of(mapping: Mapping[str, str]) -> Labels:
    return tuple(sorted(mapping.items()))


def _drop_name(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] != NAME)


@dataclass
class _Series:
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)  # NaN = a stale marker


@dataclass
class Store:
    """Samples of several scrape targets over time, in scrape order (times must not go back)."""

    series: dict[Labels, _Series] = field(default_factory=dict)
    _live: dict[Labels, set[Labels]] = field(default_factory=dict)  # target -> series of its last scrape

    def add(self, t: float, target: Mapping[str, str], exposition: str | None) -> None:
        """Record one scrape of ``target`` (its labels, e.g. job and instance) at ``t`` seconds.

        ``exposition`` is the text format, or None when the scrape failed: every series the target
        had then ends (a stale marker), as Prometheus does for a target that stopped answering.
        """
        key = labels_of(target)
        seen: set[Labels] = set()
        if exposition is not None:
            for family in text_string_to_metric_families(exposition):
                for sample in family.samples:
                    labels = labels_of({**sample.labels, **target, NAME: sample.name})
                    self._append(labels, t, float(sample.value))
                    seen.add(labels)
        for gone in self._live.get(key, set()) - seen:
            self._append(gone, t, math.nan)
        self._live[key] = seen

    def _append(self, labels: Labels, t: float, value: float) -> None:
        s = self.series.setdefault(labels, _Series())
        s.times.append(t)
        s.values.append(value)

    def _matching(self, selector: pp.VectorSelector) -> Iterable[tuple[Labels, _Series]]:
        tests = [_matcher(m) for m in selector.matchers.matchers]
        if selector.matchers.or_matchers:
            raise Unsupported("'or' label matchers")
        for labels, s in self.series.items():
            d = dict(labels)
            if selector.name and d.get(NAME) != selector.name:
                continue
            if all(test(d.get(name, "")) for name, test in tests):
                yield labels, s

    def instant(self, selector: pp.VectorSelector, t: float) -> Vector:
        """Each matching series' latest value at or before ``t`` (within the lookback, not stale)."""
        _no_offset(selector)
        out: Vector = {}
        for labels, s in self._matching(selector):
            i = bisect.bisect_right(s.times, t) - 1
            if i >= 0 and t - s.times[i] <= LOOKBACK and not math.isnan(s.values[i]):
                out[labels] = s.values[i]
        return out

    def window(self, selector: pp.VectorSelector, t: float, seconds: float) -> dict[Labels, list[tuple[float, float]]]:
        """Each matching series' samples in ``(t - seconds, t]``, stale markers left out."""
        _no_offset(selector)
        out: dict[Labels, list[tuple[float, float]]] = {}
        for labels, s in self._matching(selector):
            lo, hi = bisect.bisect_right(s.times, t - seconds), bisect.bisect_right(s.times, t)
            points = [(s.times[i], s.values[i]) for i in range(lo, hi) if not math.isnan(s.values[i])]
            if points:
                out[labels] = points
        return out


def _no_offset(selector: pp.VectorSelector) -> None:
    if selector.offset is not None or selector.at is not None:
        raise Unsupported("offset and @ modifiers")


def _matcher(m: pp.Matcher) -> tuple[str, Callable[[str], bool]]:
    value = m.value
    if m.op == pp.MatchOp.Equal:
        return m.name, lambda v: v == value
    if m.op == pp.MatchOp.NotEqual:
        return m.name, lambda v: v != value
    pattern = re.compile(value)  # PromQL regexes are anchored at both ends
    if m.op == pp.MatchOp.Re:
        return m.name, lambda v: pattern.fullmatch(v) is not None
    return m.name, lambda v: pattern.fullmatch(v) is None


# ---- range functions --------------------------------------------------------------------------

def counter_increase(points: list[tuple[float, float]]) -> float:
    """The counter's increase over ``points``; after a reset the new value is the increase."""
    return sum(b - a if b >= a else b for (_, a), (_, b) in pairwise(points))


def _rate(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    return counter_increase(points) / (points[-1][0] - points[0][0])


def _irate(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    (ta, a), (tb, b) = points[-2:]
    return (b - a if b >= a else b) / (tb - ta)


def _increase(points: list[tuple[float, float]]) -> float | None:
    return counter_increase(points) if len(points) >= 2 else None


RANGE_FUNCTIONS: dict[str, Callable[[list[tuple[float, float]]], float | None]] = {
    "rate": _rate, "irate": _irate, "increase": _increase}


# ---- histogram_quantile -----------------------------------------------------------------------

def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's ``histogram_quantile`` over (upper bound, cumulative count) pairs.

    Linear interpolation inside the bucket the rank falls in (the first bucket starts at 0 when
    its bound is positive); a rank in the ``+Inf`` bucket answers the highest finite bound.
    """
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return math.nan
    counts = [c for _, c in buckets]
    for i in range(1, len(counts)):  # counts must not fall (scrape races can make them)
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = q * total
    b = bisect.bisect_left(counts, rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, below = (0.0, 0.0) if b == 0 else (buckets[b - 1][0], counts[b - 1])
    end, count = buckets[b][0], counts[b]
    return start + (end - start) * (rank - below) / (count - below) if count > below else end


def _histogram_quantile(q: float, vector: Vector) -> Vector:
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, value in vector.items():
        d = dict(_drop_name(labels))
        le = d.pop("le", None)
        if le is None:
            continue
        groups.setdefault(labels_of(d), []).append((float(le), value))
    return {labels: bucket_quantile(q, buckets) for labels, buckets in groups.items()}


# ---- the evaluator ----------------------------------------------------------------------------

AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "avg": lambda xs: sum(xs) / len(xs), "min": min, "max": max, "count": lambda xs: float(len(xs))}


def _divide(a: float, b: float) -> float:
    if b != 0:
        return a / b
    return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)


ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _divide}


def evaluate(expr: str | pp.Expr, store: Store, t: float) -> Value:
    """The value of ``expr`` at ``t``: a vector (labels -> value) or a scalar."""
    node = pp.parse(expr) if isinstance(expr, str) else expr
    return _Eval(store, t).eval(node)


@dataclass
class _Eval:
    store: Store
    t: float

    def eval(self, node: pp.Expr) -> Value:
        if isinstance(node, pp.NumberLiteral):
            return float(node.val)
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr)
        if isinstance(node, pp.UnaryExpr):
            return self._binary("*", -1.0, self.eval(node.expr))
        if isinstance(node, pp.VectorSelector):
            return self.store.instant(node, self.t)
        if isinstance(node, pp.Call):
            return self._call(node)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node)
        if isinstance(node, pp.BinaryExpr):
            if node.modifier is not None:
                raise Unsupported(f"binary modifiers ({node.modifier})")
            return self._binary(str(node.op), self.eval(node.lhs), self.eval(node.rhs))
        raise Unsupported(type(node).__name__)

    def _vector(self, node: pp.Expr) -> Vector:
        value = self.eval(node)
        if isinstance(value, float):
            raise Unsupported(f"a scalar where a vector is expected: {node}")
        return value

    def _scalar(self, node: pp.Expr) -> float:
        value = self.eval(node)
        if not isinstance(value, float):
            raise Unsupported(f"a vector where a scalar is expected: {node}")
        return value

    def _call(self, node: pp.Call) -> Value:
        name, args = node.func.name, list(node.args)
        if name in RANGE_FUNCTIONS:
            matrix = args[0]
            if not isinstance(matrix, pp.MatrixSelector):
                raise Unsupported(f"{name} over {type(matrix).__name__}")
            fn = RANGE_FUNCTIONS[name]
            out: Vector = {}
            for labels, points in self.store.window(matrix.vector_selector, self.t,
                                                    matrix.range.total_seconds()).items():
                value = fn(points)
                if value is not None:
                    out[_drop_name(labels)] = value
            return out
        if name in ("clamp_min", "clamp_max"):
            vector, bound = self._vector(args[0]), self._scalar(args[1])
            pick = max if name == "clamp_min" else min
            return {_drop_name(labels): pick(v, bound) for labels, v in vector.items()}
        if name == "histogram_quantile":
            return _histogram_quantile(self._scalar(args[0]), self._vector(args[1]))
        raise Unsupported(f"function {name}")

    def _aggregate(self, node: pp.AggregateExpr) -> Vector:
        op = str(node.op)
        if op not in AGGREGATIONS or node.param is not None:
            raise Unsupported(f"aggregation {op}")
        keep: Callable[[str], bool]
        modifier = node.modifier
        if modifier is None:
            keep = lambda _name: False  # noqa: E731
        elif modifier.type == pp.AggModifierType.By:
            by = set(modifier.labels)
            keep = lambda name: name in by  # noqa: E731
        else:
            without = set(modifier.labels) | {NAME}
            keep = lambda name: name not in without  # noqa: E731
        groups: dict[Labels, list[float]] = {}
        for labels, value in self._vector(node.expr).items():
            groups.setdefault(tuple(kv for kv in labels if kv[0] != NAME and keep(kv[0])), []).append(value)
        return {labels: AGGREGATIONS[op](values) for labels, values in groups.items()}

    def _binary(self, op: str, lhs: Value, rhs: Value) -> Value:
        if op not in ARITHMETIC:
            raise Unsupported(f"operator {op}")
        fn = ARITHMETIC[op]
        if isinstance(lhs, float) and isinstance(rhs, float):
            return fn(lhs, rhs)
        if isinstance(rhs, float):
            assert not isinstance(lhs, float)
            return {_drop_name(labels): fn(v, rhs) for labels, v in lhs.items()}
        if isinstance(lhs, float):
            return {_drop_name(labels): fn(lhs, v) for labels, v in rhs.items()}
        right = {_drop_name(labels): v for labels, v in rhs.items()}
        out: Vector = {}
        for labels, v in lhs.items():
            key = _drop_name(labels)
            if key in right:
                out[key] = fn(v, right[key])
        return out
