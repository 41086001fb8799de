"""The metrics benchmark, in process: what counting and timing a request costs, and what
building the metrics page costs.

Every request is counted and timed in memory whether or not anything scrapes (``sidecar.stats``
shows the counts, the metrics page the durations): :meth:`Stats.observe` is the whole of what
metrics add to a request. It is measured against :meth:`Stats.count` (the counting alone, what
a request cost before durations were kept) as CPU µs per call over many calls, alternating
batches; the difference is the added cost. Target: at most 3 µs a request. Building the page
(prometheus_client's exposition of every method's histogram plus the process collector) is
paid per scrape, reported for information.
"""

from __future__ import annotations

import time

from openwop_memory.service.metrics import render
from openwop_memory.service.stats import KeyringGauges, Stats
from openwop_memory.storage.base import StorageGauges

from bench.report import Metric, SuiteResult, Target

_METHODS = ("memory.get", "memory.put", "memory.list", "run.begin", "memory.delete")


def _cpu_us_per_call(calls: int, fn: object) -> float:
    assert callable(fn)
    started = time.process_time()
    for i in range(calls):
        fn(_METHODS[i % 5], "ok", 0.0003)
    return (time.process_time() - started) / calls * 1e6


def measure(calls: int, batches: int) -> SuiteResult:
    stats = Stats()
    observe, count = [], []
    for _ in range(batches):
        observe.append(_cpu_us_per_call(calls, stats.observe))
        count.append(_cpu_us_per_call(calls, lambda m, o, s: stats.count(m, o)))
    # The lambda around count costs a call of its own: measure it alone and take it off.
    frame = min(_cpu_us_per_call(calls, lambda m, o, s: None) for _ in range(batches))
    added = min(observe) - (min(count) - frame)
    pages = []
    for _ in range(20):
        started = time.perf_counter()
        page = render(
            stats, open_runs=3, keyrings=KeyringGauges(0, 0, 0), storage=StorageGauges(0, 0, 0, 0)
        )
        pages.append(time.perf_counter() - started)
    return SuiteResult(
        metrics=[
            Metric("metrics: CPU per request (Stats.observe)", min(observe), "us"),
            Metric(
                "metrics: CPU per request added by timing",
                added,
                "us",
                Target("<=", 3),
            ),
            Metric("metrics: building the page", sorted(pages)[len(pages) // 2] * 1e3, "ms"),
            Metric("metrics: page size", len(page) / 1024, "KiB"),
        ]
    )


async def run(quick: bool) -> SuiteResult:
    """The suite, for ``bench/run.py`` (CPU-bound, on the loop's thread: nothing else runs)."""
    return measure(calls=20_000 if quick else 200_000, batches=3 if quick else 5)
