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
    name: str
    value: float
    unit: str
    target: Target | None = None

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
    header = ("metric", "value", "unit", "target", "pass/fail")
    rows = [
        (
            m.name,
            _number(m.value),
            m.unit,
            "-" if m.target is None else str(m.target),
            {None: "-", True: "PASS", False: "FAIL"}[m.passed],
        )
        for m in metrics
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {1}  # numbers line up on their last digit

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


@dataclass
class SuiteResult:
    """What one benchmark suite reports: table rows, and free-text notes printed below."""

    metrics: list[Metric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
