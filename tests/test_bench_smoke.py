"""``bench/run.py --quick`` runs end to end and reports every metric.

Speed is deliberately not asserted (targets are for ``make bench`` on a quiet machine); only
that the harness works and the sidecar answered correctly and stopped cleanly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.sidecar import unmeasured

pytestmark = pytest.mark.backend_independent  # it runs both backends itself

ROOT = Path(__file__).resolve().parents[1]
ENTRIES = 2000

STARTS = 2  # --quick's
METRICS = [
    "server CPU per get, 16 connections",
    "server CPU per get: event loop",
    "server CPU per get: other threads",
    "echo floor CPU per request, 16 connections",
    "server CPU per get / echo floor's",
    "server CPU per put, 32 clients",
    "server CPU per put: event loop",
    "server CPU per put: writer and readers",
    "get throughput, 16 connections",
    "echo floor throughput, 16 connections",
    "get throughput / echo floor's",
    "echo floor round trip p50",
    "get p50, 1 client",
    "get p50 / echo floor p50",
    "put throughput, 32 clients",
    f"idle RSS right after start, median of {STARTS}",
    f"start to ready, median of {STARTS}",
    f"start to ready, best of {STARTS}",
    f"the libraries alone: RSS once imported, median of {STARTS}",
    "idle RSS above the libraries alone",
    f"the libraries alone: start to imported, median of {STARTS}",
    "start to ready above the libraries alone",
    "entries loaded into one scope",
    "load throughput, pipelined puts",
    "sidecar RSS after load",
    "sidecar peak RSS (VmHWM) after load",
    "echo floor round trip p99",
    "get p99, 1 client",
    "list(100) p50, 1 client",
    "list(100) p99, 1 client",
    "put p50, 1 client",
    "put p99, 1 client",
    "list(100) p50 / echo floor p50",
    "put p50 / echo floor p50",
    "get p50 alone (before the storm)",
    "get p50 in a malformed-frame storm on 50 connections",
    "get p99 in the storm",
    "get p50 in the storm / alone",
    "sidecar RSS at end",
    "sidecar peak RSS (VmHWM) at end",
    "sidecar stop after SIGTERM",
    "sidecar exit code after SIGTERM",
    "error or wrong answers",
    "sidecar error log lines",
]
# SQLite's own insert is the SQLite sidecar's floor; a forced WAL checkpoint is SQLite's.
SQLITE_ONLY = [
    "SQLite's own insert of the same rows, 32 a transaction",
    "put throughput / SQLite's own insert",
    "SQLite's own insert: CPU per row",
    "get p99 without a checkpoint",
    "get p99 during a forced checkpoint",
    "get p99 during a forced checkpoint / without",
    "gets during the forced checkpoints",
    "forced checkpoint (TRUNCATE), median",
]
POSTGRESQL_ONLY = [
    "put throughput, 1 sidecar(s) on one database, 32 tenants",
    "put throughput, 2 sidecar(s) on one database, 32 tenants",
    "put throughput, 4 sidecar(s) on one database, 32 tenants",
    "fleet put throughput, 4 sidecars / 1",
    "list(100) p50 on the big table",
    "list(100) p99 on the big table",
]
# In the table of its own, with the redactor's (the search extra is installed for tests).
RELEVANCE = [
    "embedding model load (first put or relevance list)",
    "RSS added by the embedding model (numpy, tokenizer, weights)",
    "relevance: entries in the scope searched",
    "relevance list(100) p50, hybrid",
    "relevance list(100) p99, hybrid",
    "relevance list(100) p50, meaning only",
    "relevance list(100) p50, keywords only",
    "relevance list(100) p50, hybrid, a common word",
    "relevance list(100) p50, keywords only, a common word",
    "first relevance list of the scope (loads its vectors)",
    "search cost p50, empty scope, a word common in another tenant",
    "search cost p50, empty scope, a word nobody wrote",
    "disk per 100k entries of 40 words (SQLite file)",
    "disk per 100k entries: full-text index",
    "disk per 100k entries: vectors",
    "vector cache per 100k entries (memory)",
    "put CPU, 1 KiB entry, no full-text index",
    "put CPU added by the full-text index, 1 KiB",
    "put CPU added by the embedding (computed and stored), 1 KiB",
    "put CPU added by index and embedding, 1 KiB",
    "embedding alone, 1 KiB (Embedder.vector)",
    "recall@10, labelled set, hybrid",
    "recall@10, labelled set, keyword",
    "recall@10, labelled set, semantic",
    "recall@10, paraphrase queries, hybrid",
    "recall@10, paraphrase queries, keyword",
    "recall@10, paraphrase queries, semantic",
]
# Correctness rows, not speed: these must pass on any machine.
MUST_PASS = ["sidecar exit code after SIGTERM", "error or wrong answers", "sidecar error log lines"]


def test_quick_bench_prints_every_metric() -> None:
    """Both backends' columns (PostgreSQL on a throwaway server), every row, and the
    correctness rows passing in each."""
    argv = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--json"]
    argv += ["--entries", str(ENTRIES), "--seconds", "1", "--samples", "200", "--warmup", "20"]
    # Unmeasured: tracing the benchmark's clients and servers would only slow the suite down
    # (the sidecar's code is measured by the tests that exercise it).
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        env=unmeasured(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["metric", "sqlite", "postgresql", "unit", "target", "pass/fail"]
    table_rows = {line.split("  ")[0] for line in lines[2:] if "  " in line}
    results = {(m["metric"], m["column"]): m for m in json.loads(lines[-1])["metrics"]}
    expected: list[tuple[str, str | None]] = [
        (name, column) for name in METRICS for column in ("sqlite", "postgresql")
    ]
    expected += [(name, "postgresql") for name in POSTGRESQL_ONLY]
    expected += [(name, "sqlite") for name in SQLITE_ONLY]
    expected += [(name, None) for name in RELEVANCE]
    for name, column in expected:
        assert name in table_rows, f"no table row {name!r}:\n{proc.stdout}"
        assert (name, column) in results, f"no JSON result {name!r} for {column}"
        assert results[name, column]["value"] is not None, f"{name!r} has no {column} value"
    for name in MUST_PASS:
        for column in ("sqlite", "postgresql"):
            result = results[name, column]
            assert result["pass"] is True, f"{name} ({column}): {result}\n{proc.stdout}"
    assert results["entries loaded into one scope", "sqlite"]["value"] == ENTRIES
    assert results["entries loaded into one scope", "postgresql"]["value"] == ENTRIES
    assert results["relevance: entries in the scope searched", None]["value"] == 2000
    # Meaning finds what keywords cannot: the paraphrase queries share no word.
    assert results["recall@10, paraphrase queries, keyword", None]["value"] == 0
    assert results["recall@10, paraphrase queries, hybrid", None]["value"] > 0.5
    # Every forced checkpoint ran while gets were being answered.
    assert results["gets during the forced checkpoints", "sqlite"]["value"] >= 2


def test_several_runs_print_min_max_and_how_often_each_target_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--runs N``: a cell is the lowest and highest value over the runs, a verdict says in
    how many of them the target was met."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.report import Metric, Target, format_runs

    at_most_40 = Target("<=", 40)
    runs = [
        [Metric("cpu per get", v, "us", at_most_40, "sqlite"), Metric("rss", r, "MiB")]
        for v, r in ((35.0, 30.0), (52.5, 30.0), (38.0, 30.0))
    ]
    lines = format_runs(runs).splitlines()
    assert lines[0].split() == ["metric", "sqlite", "value", "unit", "target", "pass/fail"]
    assert lines[2].split("  ")[0] == "cpu per get"
    assert "35-52.5" in lines[2]
    assert lines[2].endswith("PASS 2/3 / -")
    assert " 30 " in lines[3]
    assert "-" not in lines[3].split()[2]  # one value, not a range
