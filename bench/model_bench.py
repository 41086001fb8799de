"""The memory model's costs through a real SQLite sidecar: a keyed put (``memory.putKeyed``,
superseding the key's revision) against a plain put, one client's sequential calls, p50 and
the sidecar's CPU per call, in alternating rounds (the machine is shared); then the change
feed: reading every record back in pages of 1000 (records per second, sidecar CPU per
record), and its lag: how soon after a put's answer its record is in the feed (it is
written in the put's transaction, so on the first read after the answer); and paging: a
scope of ``scope_entries`` entries (100,000 in a full run) read page by page in one run
while a writer keeps putting into it, each entry of the snapshot exactly once."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from openwop_memory_client import AsyncMemoryClient, AsyncMemoryRun

from bench.measure import percentile
from bench.proc import process_cpu_seconds, sqlite_sidecar
from bench.report import Metric, SuiteResult

TENANT = "bench-model"
KEYS = 50  # keys the keyed puts cycle through: after the first round every put supersedes
ROUNDS = 3


async def run_model(
    sidecar_exe: str, workdir: Path, puts: int, scope_entries: int = 100_000
) -> SuiteResult:
    """The suite: ``puts`` keyed and ``puts`` plain puts in each of :data:`ROUNDS` rounds,
    then the feed, then paging a scope of ``scope_entries`` under a writer."""
    async with sqlite_sidecar(sidecar_exe, workdir) as (sock, sidecar):
        result = await _measure(sock, puts, sidecar.pid)
        async with AsyncMemoryClient(sock) as client:
            result.metrics.extend(await _paging(client, scope_entries))
        return result


async def _timed(
    call: Callable[[int], Awaitable[object]], calls: int, pid: int
) -> tuple[list[float], float]:
    """The latencies of ``calls`` sequential calls and the sidecar's CPU seconds per call."""
    before = process_cpu_seconds(pid)
    latencies: list[float] = []
    for number in range(calls):
        start = time.perf_counter()
        await call(number)
        latencies.append(time.perf_counter() - start)
    return latencies, (process_cpu_seconds(pid) - before) / calls


async def _measure(sock: Path, puts: int, pid: int) -> SuiteResult:
    text = "a note of about the length agents write, with a date and a name: Ana, 3 May"
    async with AsyncMemoryClient(sock) as client:
        ref = await client.issue_ref(TENANT, "bench")
        async with client.run("bench-model-writer", TENANT) as run:
            for key in range(KEYS):  # warm-up, and every key has a revision to supersede
                await run.put_keyed(ref, f"k{key}", text)
                await run.put(ref, text)
            plain: list[float] = []
            keyed: list[float] = []
            plain_cpu, keyed_cpu = [], []
            for _ in range(ROUNDS):
                lat, cpu = await _timed(lambda n: run.put(ref, text), puts, pid)
                plain += lat
                plain_cpu.append(cpu)
                lat, cpu = await _timed(
                    lambda n: run.put_keyed(ref, f"k{n % KEYS}", text), puts, pid
                )
                keyed += lat
                keyed_cpu.append(cpu)
            feed_metrics = await _feed(client, pid)
            lag_metrics = await _lag(client, run, ref, max(50, puts // 10))
    plain.sort()
    keyed.sort()
    plain_p50, keyed_p50 = percentile(plain, 0.5), percentile(keyed, 0.5)
    return SuiteResult(
        metrics=[
            Metric("model: plain put p50, 1 client", plain_p50 * 1e6, "us"),
            Metric("model: keyed put (supersede) p50, 1 client", keyed_p50 * 1e6, "us"),
            Metric("model: keyed put p50 / plain put p50", keyed_p50 / plain_p50, "x"),
            Metric("model: sidecar CPU per plain put", min(plain_cpu) * 1e6, "us"),
            Metric("model: sidecar CPU per keyed put", min(keyed_cpu) * 1e6, "us"),
            *feed_metrics,
            *lag_metrics,
        ]
    )


async def _feed(client: AsyncMemoryClient, pid: int) -> list[Metric]:
    """Every record of the tenant's feed, read in pages of 1000."""
    before_cpu, started = process_cpu_seconds(pid), time.perf_counter()
    records, cursor = 0, None
    while True:
        page = await client.changes(TENANT, cursor=cursor, limit=1000)
        records += len(page.changes)
        if not page.changes:
            break
        cursor = page.next_cursor
    elapsed, cpu = time.perf_counter() - started, process_cpu_seconds(pid) - before_cpu
    return [
        Metric("model: change feed records read", records, "records"),
        Metric(
            "model: change feed read throughput (pages of 1000)", records / elapsed, "records/s"
        ),
        Metric("model: sidecar CPU per change record read", cpu / records * 1e6, "us"),
    ]


async def _lag(client: AsyncMemoryClient, run: AsyncMemoryRun, ref: str, puts: int) -> list[Metric]:
    """For ``puts`` puts: is its record in the first feed read after its answer, and how
    long from the answer until a read returned it."""
    cursor = await _feed_end(client)
    first_read, delays = 0, []
    for _ in range(puts):
        entry = await run.put(ref, "a note to follow in the feed")
        answered = time.perf_counter()
        page = await client.changes(TENANT, cursor=cursor, limit=1000)
        first_read += entry.id in {change.id for change in page.changes}
        while entry.id not in {change.id for change in page.changes}:
            page = await client.changes(TENANT, cursor=page.next_cursor, limit=1000)
        delays.append(time.perf_counter() - answered)
        cursor = page.next_cursor
    delays.sort()
    return [
        Metric(
            "model: puts whose record is in the first feed read after the answer",
            100 * first_read / puts,
            "%",
        ),
        Metric(
            "model: change feed lag p50 (put answered to record read)",
            percentile(delays, 0.5) * 1e6,
            "us",
        ),
    ]


async def _feed_end(client: AsyncMemoryClient) -> str:
    """The cursor after the tenant's last record."""
    cursor = None
    while True:
        page = await client.changes(TENANT, cursor=cursor, limit=1000)
        if not page.changes:
            return page.next_cursor
        cursor = page.next_cursor


async def _paging(client: AsyncMemoryClient, entries: int) -> list[Metric]:
    """Fill a scope with ``entries`` entries (32 puts in flight), begin a run, and page
    through its snapshot (pages of 1000) while a writer keeps putting into the scope.

    :raises AssertionError: an entry of the snapshot was missed or returned twice, or a
        page held one written after the snapshot.
    """
    ref = await client.issue_ref(TENANT, "bench-pages")
    async with client.run("bench-pages-writer", TENANT) as writer:
        pending = iter(range(entries))

        async def fill() -> None:
            for n in pending:
                await writer.put(ref, f"entry {n} of a large scope")

        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(fill)
        async with client.run("bench-pages-reader", TENANT) as reader:
            expected = await reader.count(ref)
            seen: list[str] = []
            meanwhile: set[str] = set()
            done = anyio.Event()

            async def write_meanwhile() -> None:
                while not done.is_set():
                    meanwhile.add((await writer.put(ref, "written while the reader pages")).id)

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_meanwhile)
                cursor = None
                while True:
                    page = await reader.page(ref, limit=1000, cursor=cursor)
                    seen.extend(entry.id for entry in page.entries)
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
                done.set()
            elapsed = time.perf_counter() - started
    assert expected == entries, (expected, entries)
    assert len(seen) == len(set(seen)) == expected, (len(seen), len(set(seen)), expected)
    assert meanwhile, "nothing was written while the reader paged"
    assert not meanwhile & set(seen), "a page held an entry put after the snapshot"
    return [
        Metric("model: scope paged under a writer (each entry once)", expected, "entries"),
        Metric("model: puts written while it was paged (none seen)", len(meanwhile), "puts"),
        Metric("model: paging throughput (pages of 1000)", expected / elapsed, "entries/s"),
    ]
