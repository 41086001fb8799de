"""Group commit on a dedicated writer thread, for SQLite.

One plain sqlite3 connection, owned by one thread, applies every write of this process.
Writes queue up while a commit is in flight and the next commit takes them all in one
transaction (leader-follower group commit: the first waiting caller commits for everyone,
so there is no background task); each caller is answered only after its commit.

A whole transaction runs on the thread as one function: aiosqlite costs a hand-off
between the event loop and its thread per statement, and a group commit is five or more
statements. Each hand-off is also a point where the writer thread must win the GIL back
from a busy event loop, which capped write throughput well below what SQLite sustains.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from openwop_memory_client import MemoryServiceError, UpstreamUnavailableError

from ..timefmt import now_us as wall_clock_us
from .sqlite_errors import translate_errors


@dataclass
class Txn:
    """State of one group-commit transaction: the clock as the ops advance it.

    ``last_us`` is already the transaction's createdAt: the wall clock, pulled up to the
    latest createdAt committed before, so createdAt never goes backwards in commit order.
    """

    conn: sqlite3.Connection
    seq: int
    last_us: int
    limit: int
    entries: list[tuple[Any, ...]] = field(default_factory=list)
    tags: list[tuple[Any, ...]] = field(default_factory=list)
    keys: list[tuple[Any, ...]] = field(default_factory=list)

    def stamp(self) -> tuple[int, int]:
        """The next reserved sequence number, and the createdAt to go with it."""
        self.seq += 1
        assert self.seq <= self.limit
        return self.seq, self.last_us


OpFn = Callable[[Txn], Any]  # runs on the writer thread, inside the transaction


@dataclass
class _Op:
    fn: OpFn
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None


class GroupCommit:
    """The writer thread, its connection, and the queue of writes waiting for a commit."""

    def __init__(self, *, max_batch: int = 512) -> None:
        self.max_batch = max_batch
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="openwop-memory-writer")
        self._pending: list[_Op] = []
        self._committing = False
        self._idle = anyio.Event()
        self._idle.set()
        self._closed = False

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the writer thread, after whatever is already queued there."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def start(self, connect: Callable[[], sqlite3.Connection]) -> sqlite3.Connection:
        """Open the writer connection with ``connect``, on the writer thread."""
        conn: sqlite3.Connection = await self.run(connect)
        self._conn = conn
        return conn

    async def close(self) -> None:
        """Commit what is queued, checkpoint (truncating the WAL), close. Idempotent."""
        self._closed = True
        await self._idle.wait()  # the commit in flight, and those queued behind it
        with contextlib.suppress(MemoryServiceError):
            await self.checkpoint("TRUNCATE")
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                await self.run(conn.close)
        self._thread.shutdown(wait=False)

    async def write(self, fn: OpFn) -> Any:
        """Run ``fn`` in the next group commit; its result once that commit is durable.

        :raises MemoryServiceError: what ``fn`` raised (it wrote nothing), or
            :class:`UpstreamUnavailableError` when the commit failed or the writer is closed.
        """
        if self._closed or self._conn is None:
            raise UpstreamUnavailableError("the sidecar is shutting down", {"backend": "sqlite"})
        op = _Op(fn)
        self._pending.append(op)
        if not self._committing:
            self._committing = True
            self._idle = anyio.Event()
            # Shielded: the leader commits for others too, so its caller going away must
            # not abandon a half-applied batch.
            with anyio.CancelScope(shield=True):
                try:
                    while self._pending:
                        batch = self._pending[: self.max_batch]
                        del self._pending[: self.max_batch]
                        await self._commit(batch)
                finally:
                    self._committing = False
                    self._idle.set()
        await op.done.wait()
        if op.error is not None:
            raise op.error
        return op.result

    async def _commit(self, batch: list[_Op]) -> None:
        try:
            with translate_errors():
                await self.run(self._apply, batch)
        except MemoryServiceError as exc:
            for op in batch:
                op.error = exc
                op.result = None
        except Exception:  # noqa: BLE001 - a bug: fail the batch's callers, never leave them waiting
            for op in batch:
                op.error = UpstreamUnavailableError("the write failed", {"backend": "sqlite"})
                op.result = None
        finally:
            for op in batch:
                op.done.set()

    def _apply(self, batch: list[_Op]) -> None:
        """On the writer thread: run the batch's ops in one transaction and commit it.

        An op's own refusal (a :class:`MemoryServiceError`) is its result and writes
        nothing; any other failure rolls the whole transaction back and propagates.
        """
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Reserve one sequence number per op up front (an op uses at most one; unused
            # ones leave harmless gaps), so the clock costs one statement.
            seq, last_us = conn.execute(
                "UPDATE clock SET seq = seq + ?, last_us = max(last_us, ?)"
                " RETURNING seq - ?, last_us",
                (len(batch), wall_clock_us(), len(batch)),
            ).fetchall()[0]
            txn = Txn(conn, seq, last_us, limit=seq + len(batch))
            for op in batch:
                try:
                    op.result = op.fn(txn)
                except MemoryServiceError as exc:
                    op.error = exc
            if txn.entries:
                conn.executemany(
                    "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us,"
                    " expires_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    txn.entries,
                )
            if txn.tags:
                conn.executemany(
                    "INSERT INTO entry_tags (scope_pk, tag, seq) VALUES (?, ?, ?)", txn.tags
                )
            if txn.keys:
                conn.executemany(
                    "INSERT INTO idempotency (scope_pk, key, digest, entry_seq, created_us)"
                    " VALUES (?, ?, ?, ?, ?)",
                    txn.keys,
                )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    async def checkpoint(self, mode: Literal["PASSIVE", "TRUNCATE"]) -> None:
        """Checkpoint the WAL. The writer thread runs whole transactions one at a time, so
        this lands between two commits (a checkpoint cannot run inside a transaction)."""
        conn = self._conn
        if conn is None:
            return
        with anyio.CancelScope(shield=True), translate_errors():
            await self.run(_finish, conn, f"PRAGMA wal_checkpoint({mode})")


def _finish(conn: sqlite3.Connection, sql: str) -> list[Any]:
    """Run ``sql`` to completion on this (the writer) thread.

    A statement left unfinished keeps its read snapshot open on the connection, and the
    next ``BEGIN IMMEDIATE`` then fails at once with SQLITE_BUSY. Handing the cursor back
    to the event loop would leave it unfinished until the loop dropped it.
    """
    return conn.execute(sql).fetchall()
