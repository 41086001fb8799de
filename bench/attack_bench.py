"""The "under attack" table (issue 20): a bystander's gets and the sidecar's memory while
one party attacks it, beside the same bystander alone.

Each row is a fresh ``openwop-memory serve`` (so that one row's leftovers are not charged
to the next), started with a soft descriptor limit of 1024, what a shell or a systemd unit
without ``LimitNOFILE`` gives (the sidecar raises it towards ``max_connections`` + 64
itself). A bystander (a tenant of its own, a scope of ``bystander_entries`` entries, its own
run and connection) does ``memory.get`` one after another while the attack runs, in a
process of its own (:mod:`bench.attackers`), bounded in count and in time. A row gives the
bystander's gets (how many, p50, p99, p99 against the bystander alone in the first row),
the sidecar's peak RSS during the attack (VmHWM, reset when it starts) and its RSS once the
attacker's connections are closed and ``settle`` seconds have passed, and what the attacker
got: served, refused (by error code), closed. A refusal is an outcome, not a failure: the
table measures today's sidecar and one hardened against each attack alike; a sidecar that
dies under an attack is a finding of its row, too ("sidecar exited 1").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import attackers
from bench.attackers import answer_kind, request_line
from bench.bystander import Bystander, Gets
from bench.lean_client import LeanClient, RpcError
from bench.measure import BenchFailure, percentile
from bench.proc import ServerProcess
from bench.report import SuiteResult, Table
from bench.sidecar_bench import Content, SidecarBenchConfig, SidecarUnderTest, source_version

TITLE = "under attack: one bystander's gets while another party attacks (fresh sidecar a row)"
COLUMNS = (
    ("attack", "attack"),
    ("gets", "gets"),
    ("bystander get p50 ms", "getP50Ms"),
    ("p99 ms", "getP99Ms"),
    ("p99 / alone p99", "p99VsAlone"),
    ("RSS peak MiB", "rssPeakMiB"),
    ("RSS after MiB", "rssAfterMiB"),
    ("attacker outcome", "outcome"),
)
COMMON_WORD = "zebra"  # every entry of the other tenant's scope holds it
ABSENT_WORD = "quokka"  # no entry holds it
KIB_PER_MIB = 1024.0


@dataclass(frozen=True)
class Scale:
    """How big each attack is (the defaults: the issue's figures, or what keeps a row to a
    few seconds on two cores)."""

    metrics_connections: int = 1100  # past 1024 + 64 descriptors
    lists: int = 64
    list_limit: int = 1000
    list_entries: int = 200
    list_entry_chars: int = 60_000
    anchor_puts: int = 64
    begins: int = 5000
    max_open_runs: int = 4000  # the sidecar's, for that row: fewer than the begins
    trickle_connections: int = 1040  # past the default max_connections, 1024
    trickle_interval: float = 0.5
    health_requests: int = 24_500
    partial_connections: int = 300
    partial_line_bytes: int = (1 << 20) - 4096  # under the default max_request_bytes
    keyring_runs: int = 8
    keyring_secrets: int = 256  # the most a run may have
    keyring_chars: int = 64  # 256 x 64 = 16 KiB, the default max_run_secret_bytes
    word_entries: int = 10_000

    @classmethod
    def quick(cls) -> Scale:
        """Small enough for a smoke run, big enough that each attack still happens."""
        return cls(
            lists=8,
            list_entries=20,
            anchor_puts=4,
            begins=500,
            max_open_runs=400,
            health_requests=2000,
            partial_connections=20,
            partial_line_bytes=256 << 10,
            keyring_runs=2,
            word_entries=500,
        )


@dataclass(frozen=True)
class AttackBenchConfig:
    workdir: Path
    scale: Scale = field(default_factory=Scale)
    seconds: float = 4.0  # each attack, and the bystander alone
    grace: float = 2.0  # after ``seconds``, for answers still on their way
    settle: float = 1.0  # after the attacker has gone, before reading "RSS after"
    get_timeout: float = 10.0  # a get waiting longer counts as this long, on a new connection
    nofile: int = 1024
    bystander_entries: int = 100
    bystander_warmup: int = 200  # gets before each row's measured ones
    sidecar_exe: str = ""
    sidecar_args: tuple[str, ...] = ()
    startup_timeout: float = 60.0
    stop_timeout: float = 30.0
    seed: int = 20261202

    @classmethod
    def quick(cls, workdir: Path, **overrides: Any) -> AttackBenchConfig:
        """Smoke-run sizes and lengths; ``overrides`` win over both."""
        small: dict[str, Any] = {
            "scale": Scale.quick(),
            "seconds": 0.5,
            "grace": 1.0,
            "settle": 0.2,
            "bystander_warmup": 50,
        }
        return cls(workdir=workdir, **(small | overrides))


def _mib(kib: int | None) -> float:
    return math.nan if kib is None else kib / KIB_PER_MIB


@dataclass
class Row:
    """One row's sidecar and bystander, for an attack's setup and probes."""

    config: AttackBenchConfig
    sidecar: SidecarUnderTest
    bystander: Bystander
    admin_socket: str


Setup = Callable[[Row], Awaitable[dict[str, Any]]]  # more params for the attacker
Probe = Callable[[Row], Coroutine[Any, Any, str]]  # a few words for the outcome cell


@dataclass(frozen=True)
class Attack:
    label: str
    attacker: str  # a name in bench.attackers.ATTACKS; "" for the bystander alone
    params: dict[str, Any] = field(default_factory=dict)
    sidecar_args: tuple[str, ...] = ()
    admin_socket: bool = False
    setup: Setup | None = None
    during: Probe | None = None  # once the attacker holds what it holds
    after: Probe | None = None  # once the attacker has gone


# -- setups and probes -----------------------------------------------------------------------


async def _metrics_port(row: Row) -> dict[str, Any]:
    """The port the sidecar's metrics listener took (it is started on port 0)."""
    for line in row.sidecar.process.log_path.read_bytes().splitlines():
        if b"metrics_listening" in line:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                return {"port": int(str(orjson.loads(line)["address"]).rpartition(":")[2])}
    raise BenchFailure("the sidecar logged no metrics_listening line")


async def _put_until_stored(client: LeanClient, params: dict[str, Any]) -> None:
    """One put, sent again after ``retryAfterMs`` while it is ``rate_limited`` (a sidecar
    hardened against some attack may bound a setup's pace too).

    :raises BenchFailure: any other refusal, or still refused after a minute.
    """
    for _ in range(600):
        try:
            await client.call("memory.put", params)
            return
        except RpcError as exc:
            if exc.code != "rate_limited":
                raise BenchFailure(f"a setup put was refused: {exc}") from None
            details = exc.error.get("data", {}).get("details", {})
            await asyncio.sleep(min(1.0, max(0.01, details.get("retryAfterMs", 100) / 1000)))
    raise BenchFailure("a setup put was refused rate_limited for a minute")


async def _fill(row: Row, tenant: str, count: int, content: Callable[[], str]) -> str:
    """``count`` entries put into a new scope of ``tenant``, 4 connections with 8 in flight
    on each; returns its ref.

    :raises BenchFailure: a put was refused.
    """
    socket = row.sidecar.socket_path
    writer = f"{tenant}-writer"
    async with await LeanClient.connect(socket) as setup:
        issued = await setup.call("memory.issueRef", {"tenant": tenant, "agent": "a"})
        ref = str(issued["memoryRef"])
        await setup.call("run.begin", {"runId": writer, "tenant": tenant})
    clients = [await LeanClient.connect(socket, pipelined=True) for _ in range(4)]
    remaining = count

    async def worker(client: LeanClient) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            entry = {"content": content()}
            await _put_until_stored(client, {"runId": writer, "memoryRef": ref, "entry": entry})

    try:
        await asyncio.gather(*(worker(c) for c in clients for _ in range(8)))
    finally:
        for client in clients:
            await client.close()
    return ref


async def _big_scope(row: Row) -> dict[str, Any]:
    """A scope of large entries, and a run begun after them that sees them all."""
    scale = row.config.scale
    texts = Content(random.Random(row.config.seed), 300)

    def big() -> str:
        text = str(texts.next_entry()["content"])
        return (text * (scale.list_entry_chars // len(text) + 1))[: scale.list_entry_chars]

    tenant = "attack-lists"
    ref = await _fill(row, tenant, scale.list_entries, big)
    async with await LeanClient.connect(row.sidecar.socket_path) as setup:
        await setup.call("run.begin", {"runId": "attack-lists-reader", "tenant": tenant})
    return {"runId": "attack-lists-reader", "memoryRef": ref}


async def _word_scope(row: Row) -> dict[str, Any]:
    """Another tenant's scope where every entry holds :data:`COMMON_WORD`."""
    texts = Content(random.Random(row.config.seed), 200)
    count = row.config.scale.word_entries
    await _fill(
        row, "attack-owner", count, lambda: f"{COMMON_WORD} {texts.next_entry()['content']}"
    )
    return {}


async def _probe(path: str, method: str, params: dict[str, Any]) -> str:
    """What a newcomer gets: ``served``, an error code, ``closed``, or no answer."""
    try:
        async with asyncio.timeout(5):
            try:
                reader, writer = await asyncio.open_unix_connection(path)
            except OSError as exc:
                return f"cannot connect ({type(exc).__name__})"
            try:
                writer.write(request_line(1, method, params))
                # A refusal may come before the request is read, then the close: the line
                # is still there to read.
                answer = await reader.readline()
            except OSError:
                answer = b""
            finally:
                writer.transport.abort()
    except TimeoutError:
        return "no answer in 5 s"
    if not answer:
        return "closed"
    kind = answer_kind(answer)
    return "served" if kind == "answered" else kind


async def _newcomers(row: Row) -> str:
    worker = await _probe(row.sidecar.socket_path, "sidecar.health", {})
    admin = await _probe(row.admin_socket, "admin.runs", {"limit": 1})
    return f"a new worker: {worker}; admin socket: {admin}"


IDLE_RUN = "bystander-idle"


async def _idle_run(row: Row) -> dict[str, Any]:
    """A second run of the bystander's, open and idle during the attack (a worker between
    two steps): the one an eviction would take."""
    await row.bystander.begin(IDLE_RUN)
    return {}


async def _idle_run_put(row: Row) -> str:
    return f"bystander's idle run's put: {await row.bystander.put(IDLE_RUN)}"


def attacks(config: AttackBenchConfig) -> list[Attack]:
    """The rows, the bystander alone first (the floor of the others), by the issue's row."""
    s = config.scale
    kb = s.list_entry_chars // 1000
    return [
        Attack("bystander alone", ""),
        Attack(
            f"1 {s.metrics_connections:,} idle TCP connections to /metrics",
            "metrics_idle",
            {"connections": s.metrics_connections},
            sidecar_args=("--metrics-address", "127.0.0.1:0", "--log-level", "info"),
            setup=_metrics_port,
        ),
        Attack(
            f"2 {s.lists} list({s.list_limit}) over {s.list_entries} x {kb} KB, unread",
            "big_lists_unread",
            {"batch": s.lists, "limit": s.list_limit},
            setup=_big_scope,
        ),
        Attack(
            f'3 {s.anchor_puts} puts of "SK" * 32000, 4 at a time',
            "anchor_puts",
            {
                "tenant": "attack-anchors",
                "unit": "SK",
                "repeat": 32000,
                "count": s.anchor_puts,
                "window": 4,
            },
        ),
        Attack(
            f"5 another tenant begins {s.begins:,} runs (max {s.max_open_runs:,} open)",
            "many_begins",
            {"tenant": "attack-runs", "count": s.begins, "connections": 2, "window": 32},
            sidecar_args=("--max-open-runs", str(s.max_open_runs)),
            setup=_idle_run,
            after=_idle_run_put,
        ),
        Attack(
            f"6 {s.trickle_connections:,} idle connections, a byte each {s.trickle_interval:g} s",
            "trickle_idle",
            {"connections": s.trickle_connections, "interval": s.trickle_interval},
            admin_socket=True,
            during=_newcomers,
        ),
        Attack(
            f"7 {s.health_requests:,} pipelined sidecar.health, unread",
            "unread_health",
            {"count": s.health_requests},
        ),
        Attack(
            f"7 {s.partial_connections} connections with a {s.partial_line_bytes >> 10} KiB"
            " partial line",
            "partial_lines",
            {"connections": s.partial_connections, "line_bytes": s.partial_line_bytes},
        ),
        Attack(
            "fairness: 48 connections sending malformed frames",
            "malformed_frames",
            {"connections": 48},
        ),
        Attack(
            f"8 begin+put of {s.keyring_secrets} secrets x {s.keyring_chars} chars, one at a time",
            "keyring_compiles",
            {
                "tenant": "attack-keyrings",
                "count": s.keyring_runs,
                "secrets": s.keyring_secrets,
                "chars": s.keyring_chars,
            },
        ),
        Attack(
            f"12 keyword search for a word of another tenant's {s.word_entries:,} entries",
            "keyword_oracle",
            {
                "tenant": "attack-prober",
                "common": COMMON_WORD,
                "absent": ABSENT_WORD,
                "count": 10**6,
            },
            # Keywords alone, as the issue measured them (and the setup is quicker unembedded).
            sidecar_args=("--semantic-search", "false"),
            setup=_word_scope,
        ),
    ]


# -- running a row ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RowResult:
    label: str
    gets: Gets
    peak_kib: int | None
    after_kib: int | None
    outcome: str


async def _watch_peak(server: ServerProcess, stop: asyncio.Event, peak: list[int]) -> None:
    """RSS sampled until ``stop``, the highest kept in ``peak[0]``: the peak when VmHWM
    cannot be reset, or cannot be read because the sidecar died."""
    while not stop.is_set() and (memory := server.memory_if_alive()) is not None:
        peak[0] = max(peak[0], memory.rss_kib)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


class _Attacker:
    """The attacker's process (:mod:`bench.attackers`). Its stderr comes with its stdout:
    any line that is not the protocol's is kept, to quote if it fails."""

    def __init__(self, attack: Attack, params: dict[str, Any]) -> None:
        self.attack = attack
        self.params = params
        self.process: asyncio.subprocess.Process | None = None
        self.other_lines: list[bytes] = []

    async def start(self, within: float) -> None:
        """:raises BenchFailure: it did not say ``start``."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            attackers.__file__,
            self.attack.attacker,
            orjson.dumps(self.params).decode(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        if await self._line(within) != b"start":
            await self.stop()
            raise BenchFailure(f"the attacker {self.attack.attacker} did not start:\n{self._log()}")

    async def _line(self, within: float) -> bytes:
        assert self.process is not None
        assert self.process.stdout is not None
        while line := await asyncio.wait_for(self.process.stdout.readline(), within):
            if line.strip() in (b"start", b"ready") or line.startswith(b"{"):
                return line.strip()
            self.other_lines.append(line)
        return b""

    async def outcome(self, row: Row, within: float) -> str:
        """The attacker's summary, with the ``during`` probe's words once it is ready; if
        it overruns ``within`` seconds it is killed, and that is its outcome.

        :raises BenchFailure: it ended without a summary (a bug in the attacker).
        """
        probe: asyncio.Task[str] | None = None
        summary = ""
        try:
            async with asyncio.timeout(within):
                while line := await self._line(within):
                    if line == b"ready" and self.attack.during is not None and probe is None:
                        probe = asyncio.create_task(self.attack.during(row))
                    elif line.startswith(b"{"):
                        summary = str(orjson.loads(line)["summary"])
                        break
        except TimeoutError:
            summary = f"did not finish within {within:g} s (killed)"
        finally:
            await self.stop()
        if not summary:
            raise BenchFailure(f"the attacker ended without an outcome:\n{self._log()}")
        return summary if probe is None else f"{summary}; {await probe}"

    async def stop(self) -> None:
        if self.process is None:
            return
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.communicate()

    def _log(self) -> str:
        return b"".join(self.other_lines).decode(errors="replace")[-3000:] or "(nothing)"


def _sidecar_config(config: AttackBenchConfig, attack: Attack, workdir: Path) -> SidecarBenchConfig:
    # A short drain: a sidecar still busy with an attack's backlog stops in a second.
    args = ("--drain-timeout", "1s", *config.sidecar_args, *attack.sidecar_args)
    if attack.admin_socket:
        args += ("--admin-socket", str(workdir / "admin.sock"))
    return SidecarBenchConfig(
        workdir=workdir,
        sidecar_exe=config.sidecar_exe,
        sidecar_args=args,
        nofile=config.nofile,
        startup_timeout=config.startup_timeout,
        stop_timeout=config.stop_timeout,
    )


async def _attacked(row: Row, attack: Attack, params: dict[str, Any]) -> tuple[Gets, int, str]:
    """The bystander's gets and the sidecar's peak RSS (KiB; 0 if never read) from the
    attacker's start to its end (``seconds`` alone when there is no attacker), and the
    attacker's outcome."""
    config, server = row.config, row.sidecar.process
    attacker = _Attacker(attack, params) if attack.attacker else None
    stop = asyncio.Event()
    peak = [0]
    tasks: list[asyncio.Task[Any]] = []
    try:
        if attacker is not None:
            await attacker.start(config.startup_timeout)
        reset = server.reset_peak()
        tasks = [
            asyncio.create_task(row.bystander.gets(stop)),
            asyncio.create_task(_watch_peak(server, stop, peak)),
        ]
        if attacker is None:
            await asyncio.sleep(config.seconds)
            outcome = "-"
        else:
            outcome = await attacker.outcome(row, config.seconds + config.grace + 20)
        stop.set()
        gets, _ = await asyncio.gather(*tasks)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        if attacker is not None:
            await attacker.stop()
    memory = server.memory_if_alive()
    if reset and memory is not None:
        peak[0] = max(peak[0], memory.peak_kib)
    return gets, peak[0], outcome


async def run_row(config: AttackBenchConfig, attack: Attack, n: int) -> RowResult:
    """One attack (or none) on a fresh sidecar, the bystander's gets beside it.

    :raises BenchFailure: the setup or the attacker itself failed (not: the sidecar
        refused the attacker, or died of it).
    """
    workdir = config.workdir / f"row-{n}"
    workdir.mkdir()
    sidecar = SidecarUnderTest(_sidecar_config(config, attack, workdir))
    async with sidecar:
        bystander = Bystander(sidecar, config.get_timeout, random.Random(config.seed + n))
        try:
            await bystander.setup(config.bystander_entries, config.bystander_warmup)
            row = Row(config, sidecar, bystander, str(workdir / "admin.sock"))
            params = {**attack.params, "socket": sidecar.socket_path}
            params |= {"seconds": config.seconds, "grace": config.grace}
            if attack.setup is not None:
                params |= await attack.setup(row)
            gets, peak, outcome = await _attacked(row, attack, params)
            notes = [outcome]
            if attack.after is not None and bystander.alive():
                notes.append(await attack.after(row))
            await asyncio.sleep(config.settle)
            after = sidecar.process.memory_if_alive()
        finally:
            await bystander.close()
    if gets.problems:
        notes.append("bystander: " + ", ".join(f"{k} {v}" for k, v in gets.problems.items()))
    if after is None:
        code = sidecar.stopped.exit_code if sidecar.stopped is not None else None
        notes.append(f"sidecar exited {code}")
    gets.latencies.sort()
    after_kib = None if after is None else after.rss_kib
    return RowResult(attack.label, gets, peak or None, after_kib, "; ".join(notes))


def table(rows: list[RowResult]) -> Table:
    """The rows in the table's columns, each p99 against the first row's (the bystander
    alone)."""
    alone_p99 = percentile(rows[0].gets.latencies, 0.99) if rows else math.nan
    out = Table(TITLE, COLUMNS)
    for r in rows:
        p50, p99 = (percentile(r.gets.latencies, q) * 1000 for q in (0.5, 0.99))
        out.rows.append(
            (
                r.label,
                float(len(r.gets.latencies)),
                p50,
                p99,
                p99 / (alone_p99 * 1000) if alone_p99 else math.nan,
                _mib(r.peak_kib),
                _mib(r.after_kib),
                r.outcome,
            )
        )
    return out


async def run(config: AttackBenchConfig) -> SuiteResult:
    """Every row, the bystander alone first.

    :raises BenchFailure: a row could not be measured (see :func:`run_row`).
    """
    source = source_version()  # before the sidecars start: what they import
    load_before = os.getloadavg()[0]
    rows = [await run_row(config, attack, n) for n, attack in enumerate(attacks(config))]
    notes = [
        f"under attack: sidecar source {source}; 1-min load average {load_before:.2f} before,"
        f" {os.getloadavg()[0]:.2f} after",
        f"under attack: each attack {config.seconds:g} s (+{config.grace:g} s for answers"
        f" in flight), RSS after {config.settle:g} s more; each row a fresh sidecar with a soft"
        f" descriptor limit of {config.nofile} and --drain-timeout 1s; row 5 with"
        f" --max-open-runs {config.scale.max_open_runs}, row 12 with --semantic-search false;"
        " p99 / alone p99 against the first row, same run",
    ]
    return SuiteResult(notes=notes, tables=[table(rows)])
