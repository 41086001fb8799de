"""``bench/run.py --quick`` runs end to end and reports every metric.

Speed is deliberately not asserted (targets are for ``make bench`` on a quiet machine); only
that the harness works and the sidecar answered correctly and stopped cleanly.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.sidecar import unmeasured

pytestmark = pytest.mark.backend_independent  # it runs both backends itself

ROOT = Path(__file__).resolve().parents[2]
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
# The deployment pages' time figures (moved here from tests/deploy/test_deployment.py's gate).
DEPLOYMENT = [
    "deployment: health probe wall time (quickest of 10)",
    "deployment: health probe CPU (median of 10)",
    "deployment: CPU per request, 8 clients put/get/list",
    "deployment: CPU off the event loop's thread",
    "deployment: peak RSS under that load",
]
MCP = [  # bench/mcp_bench.py: one column, like the relevance rows
    "mcp: raw socket get p50",
    "mcp: memory_get tool call p50 (HTTP, Unix socket)",
    "mcp: tool call p50 / raw get p50",
    "mcp: MCP server CPU per tool call",
    "mcp: sidecar CPU per raw get",
    "mcp: sidecar CPU per tool call",
]
MODEL = [  # bench/model_bench.py: one column (SQLite)
    "model: plain put p50, 1 client",
    "model: keyed put (supersede) p50, 1 client",
    "model: keyed put p50 / plain put p50",
    "model: sidecar CPU per plain put",
    "model: sidecar CPU per keyed put",
    "model: change feed records read",
    "model: change feed read throughput (pages of 1000)",
    "model: sidecar CPU per change record read",
    "model: puts whose record is in the first feed read after the answer",
    "model: change feed lag p50 (put answered to record read)",
]
LANGGRAPH = [  # bench/langgraph_bench.py: one column
    f"langgraph: {op} p50, {store}"
    for op in ("aput", "aget", "asearch")
    for store in (
        "OpenWopStore (SQLite sidecar)",
        "LangGraph's AsyncSqliteStore",
        "LangGraph's InMemoryStore",
        "ours / AsyncSqliteStore's",
        "OpenWopStore (PostgreSQL sidecar)",
        "LangGraph's AsyncPostgresStore",
        "ours / AsyncPostgresStore's",
    )
]
CONVERSATIONS = [  # bench/conversations.py: recall per mode, rows of a table of its own too
    "conversations: turns loaded",
    "conversations: questions asked",
    "conversations: recall@10, keyword",
    "conversations: recall@10, hybrid",
    "conversations: recall@10, fts5-bm25",
    "conversations: recall@10, meaning-only",
]
CONVERSATIONS_TITLE = "conversations: evidence recall of relevance lists (limit 10) on long chats"
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
    "first keyword list after loading (waits for the full-text index)",
    "first relevance list of the scope (loads its vectors)",
    "search cost p50, empty scope, a word common in another tenant",
    "search cost p50, empty scope, a word nobody wrote",
    "disk per 100k entries of 40 words (SQLite file)",
    "disk per 100k entries: full-text index",
    "disk per 100k entries: vectors",
    "vector cache per 100k entries (memory)",
    "put CPU, 1 KiB entry, no full-text index",
    "full-text indexing CPU per 1 KiB entry (batched, after the put's commit)",
    "put CPU added by the embedding (computed and stored), 1 KiB",
    "put CPU added by index and embedding, 1 KiB",
    "embedding alone, 1 KiB (Embedder.vector)",
    "recall@10, labelled set, hybrid",
    "recall@10, labelled set, keyword",
    "recall@10, labelled set, semantic",
    "recall@10, paraphrase queries, hybrid",
    "recall@10, paraphrase queries, keyword",
    "recall@10, paraphrase queries, semantic",
    "unrelated queries answered empty, hybrid",
]
# Correctness rows, not speed: these must pass on any machine.
MUST_PASS = ["sidecar exit code after SIGTERM", "error or wrong answers", "sidecar error log lines"]
# The "under attack" table: its title, and each row's attack by the row number.
ATTACK_TITLE = (
    "under attack: one bystander's gets while another party attacks (fresh sidecar a row)"
)
ATTACK_ROWS = ["bystander alone", "1 ", "2 ", "3 ", "5 ", "6 ", "7 ", "7 ", "fairness", "8 ", "12 "]
ATTACK_NUMBERS = ["gets", "getP50Ms", "getP99Ms", "p99VsAlone", "rssPeakMiB", "rssAfterMiB"]


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``bench/run.py ARGS`` to its end; asserts it exited 0."""
    # Unmeasured: tracing the benchmark's clients and servers would only slow the suite down
    # (the sidecar's code is measured by the tests that exercise it).
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), *args],
        cwd=ROOT,
        env=unmeasured(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def check_attack_table(stdout: str, rows: list[dict[str, Any]]) -> None:
    """The printed table and its JSON: a row per attack, in order, every number a number
    (``n/a``/null only where a sidecar died under the attack), an outcome for each."""
    lines = stdout.splitlines()
    start = lines.index(ATTACK_TITLE)
    printed = [re.split(r"\s{2,}", line) for line in lines[start + 3 : start + 3 + len(rows)]]
    assert len(rows) == len(ATTACK_ROWS), rows
    for expected, row, cells in zip(ATTACK_ROWS, rows, printed, strict=True):
        assert row["attack"].startswith(expected), row
        assert cells[0] == row["attack"], f"{cells} is not the row {row['attack']!r}:\n{stdout}"
        assert len(cells) == 2 + len(ATTACK_NUMBERS), cells
        died = "sidecar exited" in row["outcome"]
        for key, cell in zip(ATTACK_NUMBERS, cells[1:-1], strict=True):
            value = row[key]
            if value is None:
                assert died or (key != "rssAfterMiB" and row["gets"] == 0), row
                assert cell == "n/a", cells
            else:
                assert isinstance(value, float | int), row
                assert not math.isnan(value), row
                assert float(cell.replace(",", "")) == pytest.approx(value, rel=0.01, abs=0.001)
        assert row["outcome"], row
        assert cells[-1] == row["outcome"]
    alone = rows[0]
    assert alone["gets"] > 0
    assert alone["p99VsAlone"] == 1
    assert all(alone[key] is not None for key in ATTACK_NUMBERS)


# The suites whose smoke tests are their own (below): run once, not twice.
OWN_TESTS = {"attack", "conversations"}


# Every other suite on both backends: 50-70 s on a quiet 2-core machine, more beside the
# rest of the suite; the subprocess's own 300 s bound is the one that means "hung".
@pytest.mark.timeout(300)
def test_quick_bench_prints_every_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both backends' columns (PostgreSQL on a throwaway server), every row, and the
    correctness rows passing in each."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.run import SUITES

    suites = [name for name, _ in SUITES if name not in OWN_TESTS]
    assert {name for name, _ in SUITES} >= OWN_TESTS
    proc = run_bench(
        "--quick",
        "--json",
        *("--entries", str(ENTRIES), "--seconds", "0.5", "--samples", "200", "--warmup", "20"),
        *(f"--only={name}" for name in suites),
    )

    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["metric", "sqlite", "postgresql", "unit", "target", "pass/fail"]
    table_rows = {line.split("  ")[0] for line in lines[2:] if "  " in line}
    output = json.loads(lines[-1])
    results = {(m["metric"], m["column"]): m for m in output["metrics"]}
    expected: list[tuple[str, str | None]] = [
        (name, column) for name in METRICS for column in ("sqlite", "postgresql")
    ]
    expected += [(name, "postgresql") for name in POSTGRESQL_ONLY]
    expected += [(name, "sqlite") for name in SQLITE_ONLY]
    expected += [(name, None) for name in RELEVANCE]
    expected += [(name, None) for name in DEPLOYMENT]
    expected += [(name, None) for name in MCP]
    expected += [(name, None) for name in MODEL]
    expected += [(name, None) for name in LANGGRAPH]
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
    # Meaning finds what keywords cannot: the paraphrase queries share no word (the light
    # model finds about half of them).
    assert results["recall@10, paraphrase queries, keyword", None]["value"] == 0
    assert results["recall@10, paraphrase queries, hybrid", None]["value"] > 0.4
    # And a question about nothing stored comes back empty at least sometimes.
    assert results["unrelated queries answered empty, hybrid", None]["value"] > 0.3
    # Every forced checkpoint ran while gets were being answered.
    assert results["gets during the forced checkpoints", "sqlite"]["value"] >= 2


def test_only_runs_the_suites_named() -> None:
    """``--only SUITE``: that suite's rows and nothing else (here the quickest suite)."""
    proc = run_bench("--quick", "--json", "--only", "metrics")
    output = json.loads(proc.stdout.splitlines()[-1])
    names = {m["metric"] for m in output["metrics"]}
    assert names, proc.stdout
    assert all(name.startswith("metrics: ") for name in names), names
    assert "tables" not in output
    assert ATTACK_TITLE not in proc.stdout


def test_the_conversations_suite_scores_every_mode_and_kind() -> None:
    """``--only conversations --quick``: 2 chats through real sidecars, a row per mode, each
    recall a share, and every kind of question asked."""
    proc = run_bench("--quick", "--json", "--only", "conversations")
    lines = proc.stdout.splitlines()
    table_rows = {line.split("  ")[0] for line in lines if "  " in line}
    output = json.loads(lines[-1])
    metrics = {m["metric"]: m for m in output["metrics"]}
    for name in CONVERSATIONS:
        assert name in table_rows, f"no table row {name!r}:\n{proc.stdout}"
        assert metrics[name]["value"] is not None, name
    rows = {row["mode"]: row for row in output["tables"][CONVERSATIONS_TITLE]}
    assert {"keyword", "hybrid", "fts5-bm25", "meaning-only"} <= set(rows), rows
    for row in rows.values():
        recalls = [value for key, value in row.items() if key.startswith("recall")]
        assert len(recalls) == 6, row
        assert all(0 <= value <= 1 for value in recalls), row
        assert row["listP50Ms"] > 0, row
    for mode in ("keyword", "hybrid"):
        assert rows[mode]["putCpuUs"] > 0, rows[mode]
    names = {m["metric"]: m["value"] for m in output["metrics"]}
    assert names["conversations: questions asked"] == 24  # 3 of each kind in each of 2 chats


def test_a_table_of_its_own_prints_numbers_as_metrics_do_and_nan_as_null(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.report import Table

    table = Table("title", (("name", "name"), ("value ms", "valueMs"), ("what", "what")))
    table.rows.extend([("first", 1234.5, "ok"), ("second row", math.nan, "sidecar exited 1")])
    assert table.format().splitlines() == [
        "title",
        "name        value ms  what",
        "----------  --------  ----------------",
        "first          1,234  ok",
        "second row       n/a  sidecar exited 1",
    ]
    assert table.as_json()[1] == {"name": "second row", "valueMs": None, "what": "sidecar exited 1"}


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


def test_the_attack_table_takes_refusals_as_outcomes() -> None:
    """Against a sidecar that refuses the attackers (small limits set by flags, standing in
    for the fixes of issue 20), the table still comes out whole (a row per attack, every
    number a number), each refusal counted in its row's outcome, not raised."""
    proc = run_bench(
        *("--quick", "--json", "--only", "attack", "--attack-seconds", "0.5"),
        "--sidecar-arg=--max-connections=50",
        "--sidecar-arg=--max-inflight=3",
        "--sidecar-arg=--max-run-secret-bytes=1024",
    )
    rows = json.loads(proc.stdout.splitlines()[-1])["tables"][ATTACK_TITLE]
    check_attack_table(proc.stdout, rows)
    outcome = {row["attack"].split(" ")[0]: row["outcome"] for row in rows}
    assert "rate_limited" in outcome["5"], outcome  # more than 3 begins in flight
    assert "rate_limited" in outcome["6"], outcome  # past 50 connections
    assert "begin validation_error" in outcome["8"], outcome  # 16 KiB of secrets


# -- docs/benchmarks.md: the tables are written by the bench, between markers ---------------

BENCHMARKS_PAGE = ROOT / "docs" / "benchmarks.md"


def test_write_docs_puts_the_tables_between_the_markers_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--write-docs PAGE`` (as ``make bench-docs`` runs it, here on two in-process suites):
    the section between the markers becomes the run's tables as Markdown, with how they were
    made and no commit; every byte outside the markers stays as it was."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.report import BEGIN_MARKER, END_MARKER

    page = tmp_path / "benchmarks.md"
    original = BENCHMARKS_PAGE.read_text()
    page.write_text(original)
    run_bench("--quick", "--only", "metrics", "--write-docs", str(page))
    written = page.read_text()
    head, _, rest = original.partition(BEGIN_MARKER)
    tail = rest.partition(END_MARKER)[2]
    assert written.startswith(head + BEGIN_MARKER + "\n")
    assert written.endswith("\n" + END_MARKER + tail)
    section = written[len(head) : len(written) - len(tail)]
    assert section != BEGIN_MARKER + rest.partition(END_MARKER)[0] + END_MARKER
    assert "Written by `bench/run.py --quick --only metrics --write-docs" in section
    assert "CPUs (" in section and "load average" in section
    assert "A smoke run (`--quick`)" in section
    assert "| metric | value | unit | target | pass/fail |" in section
    assert re.search(
        r"^\| metrics: CPU per request added by timing \| [\d.]+ \| us \|", section, re.M
    )
    assert not re.search(r"\b[0-9a-f]{7,40}\b", section), "a commit stamp in the generated tables"


def test_write_docs_refuses_a_page_without_markers_before_measuring(tmp_path: Path) -> None:
    page = tmp_path / "notes.md"
    page.write_text("# Notes\n\nno markers here\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--write-docs", str(page)],
        cwd=ROOT,
        env=unmeasured(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "marker" in proc.stderr
    assert page.read_text() == "# Notes\n\nno markers here\n"


def test_the_markdown_tables_escape_bars_and_flush_numbers_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.report import (
        BEGIN_MARKER,
        END_MARKER,
        Metric,
        Table,
        markdown_runs,
        replace_generated,
    )

    table = Table("under attack", (("attack", "attack"), ("p99 ms", "p99")))
    table.rows.append(("a | b", 1.5))
    assert table.markdown().splitlines() == [
        "**under attack**",
        "",
        "| attack | p99 ms |",
        "|---|---:|",
        "| a \\| b | 1.5 |",
    ]
    runs = [[Metric("get p50", v, "us", column="sqlite")] for v in (98.0, 111.0)]
    assert markdown_runs(runs).splitlines()[2] == "| get p50 | 98-111 | us | - | - |"
    page = f"before\n{BEGIN_MARKER}\nold\n{END_MARKER}\nafter\n"
    assert replace_generated(page, "new\n") == f"before\n{BEGIN_MARKER}\nnew\n{END_MARKER}\nafter\n"
    with pytest.raises(ValueError, match="marker"):
        replace_generated(f"{END_MARKER}\n{BEGIN_MARKER}\n", "x")


def test_the_benchmarks_page_holds_its_markers_once() -> None:
    text = BENCHMARKS_PAGE.read_text()
    assert text.count("<!-- make bench --write-docs: begin") == 1
    assert text.count("<!-- make bench --write-docs: end -->") == 1
    assert "make bench-docs" in text
    assert "\nbench-docs: " in (ROOT / "Makefile").read_text()
