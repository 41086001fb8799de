"""The PostgreSQL column: the sidecar suite's rows on a PostgreSQL database, put throughput of a
fleet of 1, 2 and 4 sidecars sharing one database, and ``list(100)`` on a 1M-entry table.

The server is a throwaway one (``tests/support/postgres.py``: its own data directory and
Unix socket, ``fsync`` off, ``synchronous_commit`` on), so its numbers are those of the
sidecar and PostgreSQL's CPU work, not of a disk. All of it shares the machine's cores with
the bench's own clients: on a 2-core machine a fleet of sidecars competes for the same two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from support.postgres import PostgresServer

from bench.lean_client import LeanClient
from bench.measure import percentile
from bench.report import Metric, SuiteResult, Target
from bench.sidecar_bench import SidecarBenchConfig, SidecarUnderTest
from bench.sidecar_bench import run as run_sidecar

COLUMN = "postgresql"
CONTENT = "the worker noted the plan for the next step of the task " * 5


@dataclass(frozen=True)
class PostgresqlBenchConfig:
    sidecar: SidecarBenchConfig
    fleet_sizes: tuple[int, ...] = (1, 2, 4)
    fleet_clients: int = 32  # each of its own tenant: a tenant's writes queue on its clock
    fleet_seconds: float = 5.0
    big_entries: int = 1_000_000
    list_samples: int = 1000


async def run(config: PostgresqlBenchConfig) -> SuiteResult:
    """The PostgreSQL suite; metrics in the ``postgresql`` column."""
    workdir = config.sidecar.workdir
    server = await asyncio.to_thread(PostgresServer)
    try:
        await asyncio.to_thread(server.__enter__)
        url = server.create_database("bench")
        profile = config.sidecar.profile
        sidecar_config = dataclasses.replace(
            config.sidecar,
            workdir=_subdir(workdir, "suite"),
            database_url=url,
            column=COLUMN,
            # Beside the SQLite column's profile, not over it.
            profile=None if profile is None else profile.with_name(f"{profile.name}-{COLUMN}"),
        )
        result = await run_sidecar(sidecar_config)
        result.notes[:] = [f"postgresql: {note}" for note in result.notes]
        rates = {}
        for size in config.fleet_sizes:
            rates[size] = await _fleet_put_rate(
                config, server.create_database(f"fleet{size}"), size
            )
            result.metrics.append(
                Metric(
                    f"put throughput, {size} sidecar(s) on one database,"
                    f" {config.fleet_clients} tenants",
                    rates[size],
                    "ops/s",
                    column=COLUMN,
                )
            )
        smallest, largest = min(config.fleet_sizes), max(config.fleet_sizes)
        result.metrics.append(
            Metric(
                f"fleet put throughput, {largest} sidecars / {smallest}",
                rates[largest] / rates[smallest],
                "x",
                Target(">", 1),
                column=COLUMN,
            )
        )
        result.metrics.extend(await _list_on_a_big_table(config, server))
    finally:
        await asyncio.to_thread(server.close)
    return result


def _subdir(workdir: Path, name: str) -> Path:
    path = workdir / name
    path.mkdir()
    return path


async def _fleet_put_rate(config: PostgresqlBenchConfig, url: str, size: int) -> float:
    """Puts per second of ``fleet_clients`` sequential clients, spread over ``size`` sidecars
    on the database ``url``, for ``fleet_seconds``."""
    workdir = config.sidecar.workdir
    sidecars = [
        SidecarUnderTest(
            dataclasses.replace(
                config.sidecar,
                workdir=_subdir(workdir, f"fleet{size}-{n}"),
                database_url=url,
                profile=None,
            )
        )
        for n in range(size)
    ]
    started: list[SidecarUnderTest] = []
    try:
        for sidecar in sidecars:
            started.append(await sidecar.__aenter__())
        deadline = time.monotonic() + config.fleet_seconds

        async def client(n: int) -> int:
            path = sidecars[n % size].socket_path
            async with await LeanClient.connect(path) as c:
                run, tenant = f"fleet-{n}", f"tenant-{n}"
                await c.call("run.begin", {"runId": run, "tenant": tenant})
                done = 0
                while time.monotonic() < deadline:
                    await c.call(
                        "memory.put",
                        {"runId": run, "memoryRef": "fleet", "entry": {"content": CONTENT}},
                    )
                    done += 1
                return done

        began = time.monotonic()
        counts = await asyncio.gather(*(client(n) for n in range(config.fleet_clients)))
        return sum(counts) / (time.monotonic() - began)
    finally:
        for sidecar in started:
            await sidecar.__aexit__(None, None, None)


async def _list_on_a_big_table(
    config: PostgresqlBenchConfig, server: PostgresServer
) -> list[Metric]:
    """``list(100)`` latency of one client on a scope of ``big_entries`` rows (written straight
    into the database: loading through the sidecar would take most of the run)."""
    database = "big"
    url = server.create_database(database)
    sidecar_config = dataclasses.replace(
        config.sidecar,
        workdir=_subdir(config.sidecar.workdir, "big"),
        database_url=url,
        profile=None,
    )
    async with (
        SidecarUnderTest(sidecar_config) as sidecar,
        await LeanClient.connect(sidecar.socket_path) as c,
    ):
        await c.call("run.begin", {"runId": "loader", "tenant": "big"})
        first = await c.call(
            "memory.put", {"runId": "loader", "memoryRef": "big", "entry": {"content": "first"}}
        )
        n = config.big_entries
        began = time.monotonic()
        await asyncio.to_thread(
            server.psql,
            "INSERT INTO entries (scope_pk, seq, id, content, tags, created_us)"
            f" SELECT e.scope_pk, e.seq + g, 'mem_bulk' || g,"
            f" convert_to(repeat('x', 300), 'UTF8'), '[]', e.created_us + g"
            f" FROM entries e, generate_series(1, {n - 1}) AS g WHERE e.id = '{first['id']}';"
            f" UPDATE tenant_clocks SET seq = seq + {n}, last_us = last_us + {n}"
            " WHERE tenant = 'big'; ANALYZE entries",
            database,
        )
        load_seconds = time.monotonic() - began
        await c.call("run.begin", {"runId": "reader", "tenant": "big"})
        params = {"runId": "reader", "memoryRef": "big", "options": {"limit": 100}}
        timings = []
        for i in range(config.list_samples + config.list_samples // 10):
            t0 = time.perf_counter()
            listed = await c.call("memory.list", params)
            if i >= config.list_samples // 10:  # the first tenth warms up
                timings.append(time.perf_counter() - t0)
            if len(listed) != 100:
                raise RuntimeError(f"list(100) on the big table returned {len(listed)} entries")
    timings.sort()
    return [
        Metric("entries in the big table", float(n), "entries", column=COLUMN),
        Metric("loading the big table (SQL, not the sidecar)", load_seconds, "s", column=COLUMN),
        Metric(
            "list(100) p50 on the big table",
            percentile(timings, 0.50) * 1e6,
            "us",
            Target("<", 2000),
            column=COLUMN,
        ),
        Metric(
            "list(100) p99 on the big table",
            percentile(timings, 0.99) * 1e6,
            "us",
            column=COLUMN,
        ),
    ]
