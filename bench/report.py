"""Benchmark results: metrics with optional targets, as an aligned table or as JSON."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Comparison = Literal["<", "<=", "==", ">=", ">"]
_COMPARE: dict[Comparison, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Target:
    comparison: Comparison
    threshold: float
    note: str = ""  # e.g. "x echo floor", when the unit alone does not say what it is against

    def met_by(self, value: float) -> bool:
        return not math.isnan(value) and _COMPARE[self.comparison](value, self.threshold)

    def __str__(self) -> str:
        text = f"{self.comparison} {_number(self.threshold)}"
        return f"{text} {self.note}" if self.note else text


@dataclass(frozen=True)
class Metric:
    """One measured value; metrics of one name in different ``column``s (say ``sqlite`` and
    ``postgresql``) share a table row."""

    name: str
    value: float
    unit: str
    target: Target | None = None
    column: str = ""

    @property
    def passed(self) -> bool | None:
        """None when the metric is informational (no target)."""
        return None if self.target is None else self.target.met_by(self.value)

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.name,
            "value": None if math.isnan(self.value) else self.value,
            "unit": self.unit,
            "target": None if self.target is None else str(self.target),
            "pass": self.passed,
            "column": self.column or None,
        }


def _number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if value == int(value):
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value else "0"


def format_table(metrics: Sequence[Metric]) -> str:
    """An aligned table: a row per metric name, a value column per ``Metric.column`` (one
    ``value`` column when no metric names one), and each column's verdict under pass/fail."""
    return format_runs([metrics])


def _span(values: list[float]) -> str:
    known = [v for v in values if not math.isnan(v)]
    if not known:
        return "n/a"
    low, high = min(known), max(known)
    return _number(low) if _number(low) == _number(high) else f"{_number(low)}-{_number(high)}"


def _verdict(passed: list[bool | None]) -> str:
    if passed[0] is None:
        return "-"
    wins = sum(1 for p in passed if p)
    if wins == len(passed):
        return "PASS"
    return "FAIL" if wins == 0 else f"PASS {wins}/{len(passed)}"


def _run_rows(
    runs: Sequence[Sequence[Metric]],
) -> tuple[tuple[str, ...], list[tuple[str, ...]], int]:
    """The header, the rows and the number of value columns of :func:`format_runs`."""
    metrics = [m for run in runs for m in run]
    columns = list(dict.fromkeys(m.column for m in metrics))
    by_name: dict[str, dict[str, list[Metric]]] = {}
    for m in metrics:
        by_name.setdefault(m.name, {}).setdefault(m.column, []).append(m)
    header = ("metric", *(c or "value" for c in columns), "unit", "target", "pass/fail")
    rows = []
    for name, cells in by_name.items():
        first = next(iter(cells.values()))[0]
        verdicts = [_verdict([m.passed for m in cells[c]]) if c in cells else "-" for c in columns]
        rows.append(
            (
                name,
                *(_span([m.value for m in cells[c]]) if c in cells else "-" for c in columns),
                first.unit,
                "-" if first.target is None else str(first.target),
                "-" if set(verdicts) == {"-"} else " / ".join(verdicts),
            )
        )
    return header, rows, len(columns)


def format_runs(runs: Sequence[Sequence[Metric]]) -> str:
    """:func:`format_table` over several runs of the same suites: each cell the lowest and
    highest value (``min-max``), each verdict ``PASS``, ``FAIL`` or ``PASS k/n``. A single
    run prints as a plain table."""
    header, rows, values = _run_rows(runs)
    # Numbers line up on their last digit.
    return _aligned(header, rows, right=set(range(1, 1 + values)))


def markdown_runs(runs: Sequence[Sequence[Metric]]) -> str:
    """The table of :func:`format_runs` as a Markdown table, value columns flush right."""
    header, rows, values = _run_rows(runs)
    return _markdown(header, rows, right=set(range(1, 1 + values)))


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """A GitHub Markdown table; a ``|`` in a cell is escaped so that it cannot split it."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """``header``, a rule, then ``rows``, in columns two spaces apart; the columns whose
    index is in ``right`` flush right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


Cell = float | str


@dataclass(frozen=True)
class Table:
    """A table of its own, for results that are not one value per metric (say a row per
    attack, with a number per column and a word of outcome): ``columns`` are
    ``(heading, json key)`` pairs; a row holds one cell per column, a float (printed like a
    metric's value, NaN as ``n/a``) or text."""

    title: str
    columns: tuple[tuple[str, str], ...]
    rows: list[tuple[Cell, ...]] = field(default_factory=list)

    def format(self) -> str:
        """The title, then the rows aligned under the headings, numbers flush right."""
        numeric = {i for row in self.rows for i, c in enumerate(row) if not isinstance(c, str)}
        cells = [tuple(c if isinstance(c, str) else _number(c) for c in row) for row in self.rows]
        body = _aligned([heading for heading, _ in self.columns], cells, right=numeric)
        return f"{self.title}\n{body}"

    def markdown(self) -> str:
        """The title in bold, then the rows as a Markdown table, numbers flush right."""
        numeric = {i for row in self.rows for i, c in enumerate(row) if not isinstance(c, str)}
        cells = [tuple(c if isinstance(c, str) else _number(c) for c in row) for row in self.rows]
        body = _markdown([heading for heading, _ in self.columns], cells, right=numeric)
        return f"**{self.title}**\n\n{body}"

    def as_json(self) -> list[dict[str, Any]]:
        """A row an object, by the columns' JSON keys (NaN as ``null``)."""
        return [
            {
                key: None if isinstance(c, float) and math.isnan(c) else c
                for (_, key), c in zip(self.columns, row, strict=True)
            }
            for row in self.rows
        ]


@dataclass
class SuiteResult:
    """What one benchmark suite reports: table rows, and free-text notes printed below."""

    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)  # printed after the metrics' tables


BEGIN_MARKER = "<!-- make bench --write-docs: begin (generated; edit bench/, not this) -->"
END_MARKER = "<!-- make bench --write-docs: end -->"


def replace_generated(page: str, generated: str) -> str:
    """``page`` with what lies between :data:`BEGIN_MARKER` and :data:`END_MARKER` replaced
    by ``generated``; the rest of the page is kept byte for byte. Raises ``ValueError`` when
    the page does not hold each marker exactly once, begin before end (a page without them
    is not one to write into)."""
    if page.count(BEGIN_MARKER) != 1 or page.count(END_MARKER) != 1:
        raise ValueError("the page must hold each generated-section marker exactly once")
    head, _, rest = page.partition(BEGIN_MARKER)
    if END_MARKER not in rest:
        raise ValueError("the generated section's end marker comes before its begin marker")
    tail = rest.partition(END_MARKER)[2]
    return f"{head}{BEGIN_MARKER}\n{generated.strip()}\n{END_MARKER}{tail}"
