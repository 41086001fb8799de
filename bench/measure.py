"""Measuring a server from outside: calls checked and timed one at a time, in alternating
blocks, from many connections at once, pipelined, in a storm of malformed frames, and during
forced WAL checkpoints.

Every measurement here is bounded in count; the caller bounds it in time. Error answers and
wrong answers are counted in :class:`Errors`, not raised, because they are findings.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import checkpointer, flood
from bench.lean_client import LeanClient, RpcError
from bench.proc import ServerProcess, cpu_by_thread


class BenchFailure(Exception):
    """The benchmark could not produce its numbers (not: the numbers missed a target)."""


@dataclass
class Errors:
    """Error answers and wrong answers, by phase; the first few are kept for the report."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)

    def add(self, phase: str, what: str) -> None:
        self.counts[phase] = self.counts.get(phase, 0) + 1
        if len(self.samples) < 10:
            self.samples.append(f"{phase}: {what[:300]}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class Op:
    """One kind of request: fresh params per call, and a check of the result against them.

    ``check`` returns a description of what is wrong, or ``None``. Building params and
    checking results happen outside the timed region.
    """

    method: str
    params: Callable[[], dict[str, Any]]
    check: Callable[[dict[str, Any], Any], str | None]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def us(seconds: float) -> float:
    return seconds * 1e6


async def attempt(client: LeanClient, op: Op, phase: str, errors: Errors) -> float | None:
    """Seconds one call took, or ``None`` (counted in ``errors``) if it was not right."""
    params = op.params()
    try:
        started = time.perf_counter()
        result = await client.call(op.method, params)
        elapsed = time.perf_counter() - started
    except RpcError as exc:
        errors.add(phase, f"error answer {exc.code}: {exc}")
        return None
    problem = op.check(params, result)
    if problem is not None:
        errors.add(phase, problem)
        return None
    return elapsed


async def sequential_latencies(
    client: LeanClient, op: Op, *, warmup: int, samples: int, phase: str, errors: Errors
) -> list[float]:
    """Sorted seconds of ``samples`` correct calls in a row, after ``warmup`` unmeasured ones."""
    timings: list[float] = []
    for i in range(warmup + samples):
        elapsed = await attempt(client, op, phase, errors)
        if elapsed is not None and i >= warmup:
            timings.append(elapsed)
    timings.sort()
    return timings


async def interleaved_latencies(
    series: list[tuple[str, LeanClient, Op]],
    *,
    warmup: int,
    samples: int,
    blocks: int,
    errors: Errors,
) -> dict[str, list[float]]:
    """Sorted seconds per series, sampled in alternating blocks rather than one after another.

    On a shared host the background load drifts over minutes; taking every series a block at
    a time spreads each over the same stretch of time, so their ratios compare like with like.
    """
    timings: dict[str, list[float]] = {name: [] for name, _, _ in series}
    for name, client, op in series:
        await sequential_latencies(
            client, op, warmup=warmup, samples=0, phase=f"sequential {name}", errors=errors
        )
    for block in range(blocks):
        # Spread the remainder so the blocks add up to exactly ``samples``.
        count = samples // blocks + (1 if block < samples % blocks else 0)
        for name, client, op in series:
            timings[name] += await sequential_latencies(
                client, op, warmup=0, samples=count, phase=f"sequential {name}", errors=errors
            )
    for values in timings.values():
        values.sort()
    return timings


@dataclass(frozen=True)
class Throughput:
    ops: int
    seconds: float
    server_threads: dict[str, float]  # the server's CPU seconds in the phase, by thread group
    client_cpu: float  # seconds of this process's CPU during the phase

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else math.nan

    @property
    def server_cpu(self) -> float:
        """The server's CPU seconds in the phase, all its threads."""
        return sum(self.server_threads.values())

    def per_op_us(self, seconds: float) -> float:
        return us(seconds / self.ops) if self.ops else math.nan

    def __add__(self, other: Throughput) -> Throughput:
        threads = dict(self.server_threads)
        for name, cpu in other.server_threads.items():
            threads[name] = threads.get(name, 0.0) + cpu
        return Throughput(
            self.ops + other.ops,
            self.seconds + other.seconds,
            threads,
            self.client_cpu + other.client_cpu,
        )


async def throughput(
    server: ServerProcess,
    socket_path: str,
    op: Op,
    *,
    clients: int,
    seconds: float,
    max_ops_per_client: int,
    phase: str,
    errors: Errors,
) -> Throughput:
    """Correct calls per second with ``clients`` connections, each one request at a time,
    and the CPU the server's threads and this process spent meanwhile."""
    connections = [await LeanClient.connect(socket_path) for _ in range(clients)]
    ops = 0
    try:
        # One unmeasured call per connection first, so the phase starts in steady state.
        await asyncio.gather(*(attempt(c, op, phase, errors) for c in connections))
        deadline = time.perf_counter() + seconds

        async def worker(client: LeanClient) -> None:
            nonlocal ops
            for _ in range(max_ops_per_client):
                if time.perf_counter() >= deadline:
                    return
                if await attempt(client, op, phase, errors) is not None:
                    ops += 1

        threads0, own0, t0 = server.thread_cpu(), time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(c) for c in connections))
        elapsed = time.perf_counter() - t0
        threads1, own1 = server.thread_cpu(), time.process_time()
    finally:
        for c in connections:
            await c.close()
    spent = cpu_by_thread(server.pid, threads0, threads1)
    return Throughput(ops, elapsed, spent, own1 - own0)


async def pipelined(
    socket_path: str,
    op: Op,
    *,
    count: int,
    connections: int,
    window: int,
    phase: str,
    errors: Errors,
) -> tuple[list[Any], float]:
    """``count`` calls over ``connections`` connections with ``window`` in flight on each.

    Returns the correct results (in completion order) and the seconds it all took.
    """
    results: list[Any] = []
    remaining = count
    clients = [await LeanClient.connect(socket_path, pipelined=True) for _ in range(connections)]

    async def worker(client: LeanClient) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            params = op.params()
            try:
                result = await client.call(op.method, params)
            except RpcError as exc:
                errors.add(phase, f"error answer {exc.code}: {exc}")
                continue
            problem = op.check(params, result)
            if problem is None:
                results.append(result)
            else:
                errors.add(phase, problem)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in clients for _ in range(window)))
    finally:
        for c in clients:
            await c.close()
    return results, time.perf_counter() - started


async def storm_latencies(
    socket_path: str, client: LeanClient, op: Op, *, connections: int, samples: int, errors: Errors
) -> tuple[list[float], list[float]]:
    """Sorted seconds of ``samples`` sequential calls alone, then during a storm of malformed
    frames on ``connections`` other connections (:mod:`bench.flood`, a niced process of its
    own, so the storm does not take this process's CPU)."""
    alone = await sequential_latencies(
        client, op, warmup=0, samples=samples, phase="storm baseline", errors=errors
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        flood.__file__,
        socket_path,
        str(connections),
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=lambda: os.nice(10),
    )
    try:
        assert process.stdout is not None
        if (await process.stdout.readline()).strip() != b"ready":
            raise BenchFailure("the storm did not start")
        stormy = await sequential_latencies(
            client, op, warmup=0, samples=samples, phase="storm", errors=errors
        )
    finally:
        if process.returncode is None:
            process.terminate()
        await process.communicate()
    return alone, stormy


@dataclass(frozen=True)
class CheckpointReads:
    alone: list[float]  # sorted seconds of gets with no checkpoint running
    during: list[float]  # sorted seconds of gets begun while a checkpoint ran
    checkpoints: list[float]  # seconds each checkpoint took, in order
    unfinished: int  # checkpoints that could not truncate the WAL (busy)


async def checkpoint_latencies(
    database: Path,
    client: LeanClient,
    get: Op,
    fill: Callable[[], Awaitable[object]],
    *,
    rounds: int,
    samples: int,
    errors: Errors,
) -> CheckpointReads:
    """Sequential gets alone, then during forced checkpoints: each round ``fill()`` puts enough
    into the WAL to give a checkpoint work, then :mod:`bench.checkpointer` (a process of its
    own, as an operator's ``sqlite3`` would be) runs ``PRAGMA wal_checkpoint(TRUNCATE)`` on
    ``database`` while gets run back to back. A get counts as during if it began before the
    checkpoint was seen to end, so a get the checkpoint held up is never left out.

    :raises BenchFailure: the checkpointer did not run.
    """
    alone = await sequential_latencies(
        client, get, warmup=0, samples=samples, phase="checkpoint baseline", errors=errors
    )
    during: list[float] = []
    durations: list[float] = []
    unfinished = 0
    for _ in range(rounds):
        await fill()
        process = await asyncio.create_subprocess_exec(
            sys.executable, checkpointer.__file__, str(database), stdout=asyncio.subprocess.PIPE
        )
        try:
            assert process.stdout is not None
            if (await process.stdout.readline()).strip() != b"start":
                raise BenchFailure("the checkpointer did not start")
            done = asyncio.ensure_future(process.stdout.readline())
            while not done.done():
                elapsed = await attempt(client, get, "checkpoint", errors)
                if elapsed is not None:
                    during.append(elapsed)
            fields = (await done).split()
            if len(fields) != 5 or fields[0] != b"done":
                raise BenchFailure(f"the checkpointer failed: {b' '.join(fields)!r}")
            unfinished += fields[1] != b"0"
            durations.append(float(fields[4]))
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
            await process.communicate()
    during.sort()
    return CheckpointReads(alone, during, durations, unfinished)
