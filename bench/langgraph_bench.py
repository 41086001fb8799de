"""The LangGraph store (``openwop_memory_client.langgraph_store.OpenWopStore``) against
LangGraph's own stores on the same machine and the same rows: on a SQLite sidecar against
``AsyncSqliteStore`` (the ``langgraph-checkpoint-sqlite`` package, a file of its own), on a
PostgreSQL sidecar against ``AsyncPostgresStore`` (``langgraph-checkpoint-postgres``), both
on one throwaway server (unless ``postgresql`` is off), and ``InMemoryStore`` (no
persistence, the floor). One caller's sequential ``aput``, ``aget`` and ``asearch`` (a
namespace of :data:`ITEMS` items, a filter on one field, limit 10), p50 of each, and the
ratio of ours to LangGraph's store on the same database. Each call of ours is one OpenWOP run (a
snapshot, the redaction of the value, a durable commit), which LangGraph's stores do not
have; the ratio is what that costs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.store.sqlite.aio import AsyncSqliteStore
from openwop_memory_client.langgraph_store import OpenWopStore
from support.postgres import PostgresServer

from bench.measure import percentile
from bench.proc import sqlite_sidecar
from bench.report import Metric, SuiteResult

ITEMS = 200
NAMESPACE = ("users", "ana", "memories")


async def run_langgraph(
    sidecar_exe: str, workdir: Path, calls: int, postgresql: bool = True
) -> SuiteResult:
    """The suite: ``calls`` sequential calls of each kind on each store."""
    ours = await _ours(sidecar_exe, workdir / "sqlite", None, calls)
    async with _langgraph_sqlite(workdir / "langgraph.db") as store:
        theirs = await _p50s(store, calls)
    floor = await _p50s(InMemoryStore(), calls)
    metrics = []
    for op in ("aput", "aget", "asearch"):
        metrics += [
            Metric(f"langgraph: {op} p50, OpenWopStore (SQLite sidecar)", ours[op] * 1e6, "us"),
            Metric(f"langgraph: {op} p50, LangGraph's AsyncSqliteStore", theirs[op] * 1e6, "us"),
            Metric(f"langgraph: {op} p50, LangGraph's InMemoryStore", floor[op] * 1e6, "us"),
            Metric(f"langgraph: {op} p50, ours / AsyncSqliteStore's", ours[op] / theirs[op], "x"),
        ]
    if not postgresql:
        return SuiteResult(metrics=metrics, notes=["langgraph: PostgreSQL rows not run"])
    server = await asyncio.to_thread(PostgresServer)
    try:
        await asyncio.to_thread(server.__enter__)
        ours_pg = await _ours(
            sidecar_exe, workdir / "postgresql", server.create_database("sidecar"), calls
        )
        async with _langgraph_postgres(server.create_database("langgraph")) as store:
            theirs_pg = await _p50s(store, calls)
    finally:
        await asyncio.to_thread(server.close)
    for op in ("aput", "aget", "asearch"):
        metrics += [
            Metric(
                f"langgraph: {op} p50, OpenWopStore (PostgreSQL sidecar)", ours_pg[op] * 1e6, "us"
            ),
            Metric(
                f"langgraph: {op} p50, LangGraph's AsyncPostgresStore", theirs_pg[op] * 1e6, "us"
            ),
            Metric(
                f"langgraph: {op} p50, ours / AsyncPostgresStore's",
                ours_pg[op] / theirs_pg[op],
                "x",
            ),
        ]
    return SuiteResult(metrics=metrics)


async def _ours(
    sidecar_exe: str, workdir: Path, database: str | None, calls: int
) -> dict[str, float]:
    await asyncio.to_thread(lambda: workdir.mkdir(parents=True, exist_ok=True))
    async with sqlite_sidecar(sidecar_exe, workdir, database) as (sock, _):
        store = OpenWopStore(str(sock), tenant="bench-langgraph")
        try:
            return await _p50s(store, calls)
        finally:
            store.close()


@asynccontextmanager
async def _langgraph_postgres(url: str) -> AsyncIterator[BaseStore]:
    from langgraph.store.postgres.aio import AsyncPostgresStore

    async with AsyncPostgresStore.from_conn_string(url) as store:
        await store.setup()
        yield store


@asynccontextmanager
async def _langgraph_sqlite(path: Path) -> AsyncIterator[AsyncSqliteStore]:
    async with AsyncSqliteStore.from_conn_string(str(path)) as store:
        await store.setup()
        yield store


async def _p50s(store: BaseStore, calls: int) -> dict[str, float]:
    """p50 seconds of ``aput``, ``aget`` and ``asearch`` on ``store``, after :data:`ITEMS`
    items were put (the first ``calls // 10`` of each kind unmeasured)."""
    for number in range(ITEMS):
        await store.aput(NAMESPACE, f"item{number}", _value(number))

    async def put(number: int) -> None:
        await store.aput(NAMESPACE, f"item{number % ITEMS}", _value(number))

    async def get(number: int) -> None:
        assert await store.aget(NAMESPACE, f"item{number % ITEMS}") is not None

    async def search(number: int) -> None:
        found = await store.asearch(NAMESPACE, filter={"topic": f"t{number % 5}"}, limit=10)
        assert found

    return {
        "aput": await _p50(put, calls),
        "aget": await _p50(get, calls),
        "asearch": await _p50(search, calls),
    }


def _value(number: int) -> dict[str, object]:
    return {"topic": f"t{number % 5}", "text": f"Ana mentioned thing number {number} today"}


async def _p50(call: Callable[[int], Awaitable[None]], calls: int) -> float:
    for number in range(max(5, calls // 10)):
        await call(number)
    latencies = []
    for number in range(calls):
        start = time.perf_counter()
        await call(number)
        latencies.append(time.perf_counter() - start)
    latencies.sort()
    return percentile(latencies, 0.5)
