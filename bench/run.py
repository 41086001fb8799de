"""``make bench``: run every benchmark suite and print one table of results.

Exit status 0 whatever the numbers are (this is a report; targets show as PASS/FAIL), 1 when
a benchmark could not run to the end, 2 on bad options. A new suite is one more entry in
:data:`SUITES`: an async function of the :class:`Options` and a fresh temporary directory,
returning a :class:`~bench.report.SuiteResult`.

Runs as ``python bench/run.py`` or ``python -m bench.run``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

if not __package__:
    # Run as a script, sys.path[0] is bench/ itself; the suites import each other as bench.*.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The throwaway PostgreSQL server is the tests' (tests/support/postgres.py); the deployment
# figures are measured as tests/deploy/test_deployment.py measures them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "deploy"))

import orjson

from bench.attack_bench import AttackBenchConfig
from bench.attack_bench import run as run_attack
from bench.conversations import ConversationBenchConfig
from bench.conversations import run as run_conversations
from bench.deployment_bench import run as run_deployment
from bench.lean_client import ProtocolFailure, RpcError
from bench.measure import BenchFailure
from bench.metrics_bench import run as run_metrics
from bench.postgresql_bench import PostgresqlBenchConfig
from bench.postgresql_bench import run as run_postgresql
from bench.proc import ServerFailed
from bench.redaction_bench import RedactionBenchConfig
from bench.redaction_bench import run as run_redaction
from bench.relevance_bench import RelevanceBenchConfig
from bench.relevance_bench import run as run_relevance
from bench.report import (
    Metric,
    SuiteResult,
    Table,
    format_runs,
    markdown_runs,
    replace_generated,
)
from bench.sidecar_bench import SidecarBenchConfig
from bench.sidecar_bench import run as run_sidecar
from bench.workdir import bench_workdir


@dataclass(frozen=True)
class Options:
    entries: int
    seconds: float
    samples: int
    warmup: int
    clients: int
    get_clients: int
    pin: bool
    quick: bool
    json: bool
    keep: bool
    profile: Path | None
    profile_clock: Literal["wall", "cpu"]
    sidecar_exe: str
    sidecar_args: tuple[str, ...]
    postgresql: bool
    runs: int
    attack_seconds: float | None = None  # None: 4 s, 0.5 with --quick
    only: tuple[str, ...] = ()  # suite names; empty: every suite
    write_docs: Path | None = None  # a page whose generated section gets the tables
    argv: tuple[str, ...] = ()  # the options as given, for the page to say how it was made


def _sidecar_config(options: Options, workdir: Path, column: str) -> SidecarBenchConfig:
    return SidecarBenchConfig(
        workdir=workdir,
        entries=options.entries,
        seconds=options.seconds,
        samples=options.samples,
        warmup=options.warmup,
        latency_blocks=10 if options.samples >= 100 else 1,
        clients=options.clients,
        get_clients=options.get_clients,
        throughput_blocks=1 if options.quick else 2,
        starts=2 if options.quick else 5,
        checkpoint_fill=500 if options.quick else 3000,
        checkpoint_rounds=2 if options.quick else 5,
        pin=options.pin,
        storm_connections=50 if options.quick else 200,
        sidecar_exe=options.sidecar_exe,
        sidecar_args=options.sidecar_args,
        profile=options.profile,
        profile_clock=options.profile_clock,
        column=column,
    )


async def sidecar_suite(options: Options, workdir: Path) -> SuiteResult:
    return await run_sidecar(_sidecar_config(options, workdir, "sqlite"))


async def postgresql_suite(options: Options, workdir: Path) -> SuiteResult:
    """The sidecar suite again on PostgreSQL, plus the fleet and big-table rows."""
    if not options.postgresql:
        return SuiteResult(notes=["postgresql: not run (--no-postgresql)"])
    config = PostgresqlBenchConfig(
        sidecar=_sidecar_config(options, workdir, "postgresql"),
        fleet_seconds=options.seconds,
        big_entries=20_000 if options.quick else 1_000_000,
        list_samples=100 if options.quick else 1000,
    )
    return await run_postgresql(config)


async def redaction_suite(options: Options, workdir: Path) -> SuiteResult:
    """The redactor in process (``workdir`` is not needed: it writes no files)."""
    config = RedactionBenchConfig.quick() if options.quick else RedactionBenchConfig()
    return await run_redaction(config)


async def relevance_suite(options: Options, workdir: Path) -> SuiteResult:
    """Relevance through the SQLite storage API, in process: a scope of 100k entries (2,000
    with --quick), the cost per put, disk, and recall on the labelled set."""
    config = RelevanceBenchConfig.quick() if options.quick else RelevanceBenchConfig()
    return await run_relevance(config, workdir)


async def metrics_suite(options: Options, workdir: Path) -> SuiteResult:
    """Counting and timing a request, in process (no files either)."""
    return await run_metrics(options.quick)


async def attack_suite(options: Options, workdir: Path) -> SuiteResult:
    """The "under attack" table: a bystander's gets and the sidecar's RSS during each
    attack of issue 20, each row on a fresh SQLite sidecar."""
    common: dict[str, Any] = {
        "sidecar_exe": options.sidecar_exe,
        "sidecar_args": options.sidecar_args,
    }
    if options.attack_seconds is not None:
        common["seconds"] = options.attack_seconds
    if options.quick:
        # Smoke-run sizes, and no embedding model to load in every row's sidecar.
        common["sidecar_args"] = ("--semantic-search", "false", *options.sidecar_args)
        config = AttackBenchConfig.quick(workdir, **common)
    else:
        config = AttackBenchConfig(workdir=workdir, **common)
    return await run_attack(config)


async def deployment_suite(options: Options, workdir: Path) -> SuiteResult:
    """The probe's cost and the CPU per request that systemd/ and kubernetes/ quote."""
    return await run_deployment(workdir)


async def mcp_suite(options: Options, workdir: Path) -> SuiteResult:
    """A tool call through `openwop-memory mcp` against the same get on the raw socket."""
    from bench.mcp_bench import run_mcp  # the [mcp] extra: imported only when this suite runs

    return await run_mcp(options.sidecar_exe, workdir, 200 if options.quick else 2000)


async def model_suite(options: Options, workdir: Path) -> SuiteResult:
    """A keyed put against a plain one, and the change feed's throughput and lag."""
    from bench.model_bench import run_model

    return await run_model(
        options.sidecar_exe,
        workdir,
        100 if options.quick else 1000,
        scope_entries=2_000 if options.quick else 100_000,
    )


async def langgraph_suite(options: Options, workdir: Path) -> SuiteResult:
    """The LangGraph store against LangGraph's own SQLite and in-memory stores."""
    from bench.langgraph_bench import run_langgraph  # the client's [langgraph] extra

    return await run_langgraph(
        options.sidecar_exe, workdir, 50 if options.quick else 500, options.postgresql
    )


async def conversations_suite(options: Options, workdir: Path) -> SuiteResult:
    """Evidence recall on long multi-session chats through a real sidecar, per mode (keyword,
    hybrid, and the in-process FTS5 and meaning-only baselines) and kind of question."""
    exe, args = options.sidecar_exe, options.sidecar_args
    if options.quick:
        config = ConversationBenchConfig.quick(exe, args)
    else:
        config = ConversationBenchConfig(sidecar_exe=exe, sidecar_args=args)
    return await run_conversations(config, workdir)


Suite = Callable[[Options, Path], Awaitable[SuiteResult]]
SUITES: list[tuple[str, Suite]] = [
    ("sidecar", sidecar_suite),
    ("postgresql", postgresql_suite),
    ("redaction", redaction_suite),
    ("relevance", relevance_suite),
    ("metrics", metrics_suite),
    ("attack", attack_suite),
    ("deployment", deployment_suite),
    ("mcp", mcp_suite),
    ("model", model_suite),
    ("langgraph", langgraph_suite),
    ("conversations", conversations_suite),
]


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="bench/run.py", description=__doc__.split("\n")[0] if __doc__ else None
    )
    parser.add_argument("--entries", type=int, help="entries loaded into one scope (100000)")
    parser.add_argument("--seconds", type=float, help="length of each throughput phase (5)")
    parser.add_argument("--samples", type=int, help="sequential latency samples per method (3000)")
    parser.add_argument("--warmup", type=int, help="unmeasured calls before each latency phase")
    parser.add_argument("--clients", type=int, default=32, help="connections putting at once")
    parser.add_argument(
        "--get-clients", type=int, default=16, help="connections getting at once (and echoing)"
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="do not pin the client and the servers to separate CPUs for sequential latencies",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run everything this many times and print each value as min-max over the runs",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes for a smoke run (2000 entries, 1 s)"
    )
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument(
        "--no-postgresql",
        action="store_true",
        help="skip the PostgreSQL column (it starts a throwaway server)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[name for name, _ in SUITES],
        default=[],
        metavar="SUITE",
        help="run this suite alone, repeatable: --only attack (suites: "
        + ", ".join(name for name, _ in SUITES)
        + ")",
    )
    parser.add_argument(
        "--attack-seconds",
        type=float,
        help="length of each attack of the attack suite, and of the bystander alone (4)",
    )
    parser.add_argument(
        "--write-docs",
        type=Path,
        metavar="PAGE",
        help="also write the tables into PAGE between its generated-section markers"
        " (docs/benchmarks.md)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the sidecar under cProfile: PATH.get and PATH.put hold the get and put"
        " throughput phases, PATH.setup what came before, PATH the rest",
    )
    parser.add_argument(
        "--profile-clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what --profile charges: elapsed time, or the thread's CPU time",
    )
    parser.add_argument(
        "--sidecar-exe",
        default="",
        help="the openwop-memory executable to measure (default: the one in this venv)",
    )
    parser.add_argument(
        "--sidecar-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `openwop-memory serve` argument, repeatable: --sidecar-arg=--log-level=error",
    )
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    options = Options(
        entries=args.entries if args.entries is not None else (2000 if quick else 100_000),
        seconds=args.seconds if args.seconds is not None else (1.0 if quick else 5.0),
        samples=args.samples if args.samples is not None else (300 if quick else 3000),
        warmup=args.warmup if args.warmup is not None else (30 if quick else 200),
        clients=args.clients,
        get_clients=args.get_clients,
        pin=not args.no_pin,
        quick=quick,
        json=bool(args.json),
        keep=bool(args.keep),
        profile=args.profile.resolve() if args.profile else None,
        profile_clock=args.profile_clock,
        sidecar_exe=args.sidecar_exe,
        sidecar_args=tuple(args.sidecar_arg),
        postgresql=not args.no_postgresql,
        runs=args.runs,
        attack_seconds=args.attack_seconds,
        only=tuple(args.only),
        write_docs=args.write_docs,
        argv=tuple(sys.argv[1:] if argv is None else argv),
    )
    counts = (options.entries, options.samples, options.clients, options.get_clients, options.runs)
    if min(counts) < 1 or options.warmup < 0:
        parser.error(
            "--entries, --samples, --clients, --get-clients and --runs must be positive,"
            " --warmup >= 0"
        )
    if options.write_docs is not None:
        try:
            replace_generated(options.write_docs.read_text(), "")
        except (OSError, ValueError) as exc:  # refused before an hour of measuring, not after
            parser.error(f"--write-docs {options.write_docs}: {exc}")
    if not 0 < options.seconds <= 600:
        parser.error("--seconds must be in (0, 600]")
    if options.attack_seconds is not None and not 0 < options.attack_seconds <= 60:
        parser.error("--attack-seconds must be in (0, 60]")
    return options


async def run_suites(options: Options) -> SuiteResult:
    """Every suite (or those of ``--only``) one after another, their results together."""
    result = SuiteResult()
    for name, suite in SUITES:
        if options.only and name not in options.only:
            continue
        with bench_workdir(name, keep=options.keep) as workdir:
            one = await suite(options, workdir)
        result.metrics.extend(one.metrics)
        result.notes.extend(one.notes)
        result.tables.extend(one.tables)
    return result


def _tables(runs: list[list[Metric]], tables: list[Table]) -> str:
    """The backends' suites side by side, then the rest (the redactor) in a table of its own,
    then the suites' own tables."""
    by_backend = [[m for m in run if m.column] for run in runs]
    others = [[m for m in run if not m.column] for run in runs]
    parts = [format_runs(group) for group in (by_backend, others) if group[0]]
    return "\n\n".join(parts + [t.format() for t in tables])


def _machine() -> str:
    """What the page says of the machine: no commit, no host name; the CPU, how many, and
    how busy it was (absolute numbers differ between machines by 2x or more)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            names = [
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            ]
        model = names[0] if names else model
    except OSError:
        pass
    load = os.getloadavg()[0]
    return f"{os.cpu_count()} CPUs ({model}), 1-minute load average {load:.2f} at the end"


def docs_section(options: Options, runs: list[SuiteResult]) -> str:
    """The Markdown that ``--write-docs`` puts between the page's markers: how it was made,
    then the tables of :func:`_tables` as Markdown, then the notes."""
    made = " ".join(["bench/run.py", *options.argv])
    lines = [
        f"Written by `{made}` on {_machine()}, Python {platform.python_version()}.",
    ]
    if options.quick:
        lines.append(
            "**A smoke run (`--quick`)**: sizes far below the targets' own, so no figure"
            " here says anything of the sidecar's speed."
        )
    if options.runs > 1:
        lines.append(
            f"Each value is the lowest-highest of {options.runs} runs; PASS k/n: passed in"
            " k of n. Tables of their own are the last run's."
        )
    metrics = [r.metrics for r in runs]
    by_backend = [[m for m in run if m.column] for run in metrics]
    others = [[m for m in run if not m.column] for run in metrics]
    parts = [" ".join(lines)]
    parts += [markdown_runs(group) for group in (by_backend, others) if group[0]]
    parts += [t.markdown() for t in runs[-1].tables]
    notes = [n for r in runs for n in r.notes]
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def _json(result: SuiteResult) -> dict[str, Any]:
    out: dict[str, Any] = {"metrics": [m.as_json() for m in result.metrics]}
    if result.tables:
        out["tables"] = {t.title: t.as_json() for t in result.tables}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    runs: list[SuiteResult] = []
    notes: list[str] = []
    try:
        for n in range(options.runs):
            if options.runs > 1:
                print(f"bench: run {n + 1} of {options.runs}", file=sys.stderr, flush=True)
            result = asyncio.run(run_suites(options))
            runs.append(result)
            if options.runs > 1:
                # Each run's own table as it ends, so a later run's failure loses none of it.
                print(_tables([result.metrics], result.tables), file=sys.stderr, flush=True)
            notes.extend(
                result.notes if options.runs == 1 else [f"run {n + 1}: {x}" for x in result.notes]
            )
    except (BenchFailure, ServerFailed, ProtocolFailure, RpcError, TimeoutError, OSError) as exc:
        print(f"bench: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception:  # a bug in the bench itself: still a failed run, with its traceback
        traceback.print_exc()
        print("bench: FAILED", file=sys.stderr)
        return 1
    # Tables of their own are not min-max'ed over runs: each run's is shown, the last here.
    print(_tables([r.metrics for r in runs], runs[-1].tables))
    if options.runs > 1:
        print(f"each value: lowest-highest of {options.runs} runs; PASS k/n: passed in k of n")
        if runs[-1].tables:
            print("tables of their own: the last run's (every run's is printed as it ends)")
    for note in notes:
        print(note)
    if options.write_docs is not None:
        page = options.write_docs
        page.write_text(replace_generated(page.read_text(), docs_section(options, runs)))
        print(f"bench: wrote the tables into {page}", file=sys.stderr)
    if options.json:
        if options.runs == 1:
            print(orjson.dumps(_json(runs[0])).decode())
        else:
            print(orjson.dumps({"runs": [_json(r) for r in runs]}).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
