"""Group commit on a dedicated writer thread, for SQLite.

One plain sqlite3 connection, owned by one thread, applies every write of this process.
Writes queue up while a commit is in flight and the next commit takes them all in one
transaction (leader-follower group commit: the first waiting caller commits for everyone,
so there is no background task); each caller is answered only after its commit.

A whole transaction runs on the thread as one function: aiosqlite costs a hand-off
between the event loop and its thread per statement, and a group commit is five or more
statements. Each hand-off is also a point where the writer thread must win the GIL back
from a busy event loop, which capped write throughput well below what SQLite sustains.

The rule every op follows: **a failed commit leaves no trace.** An op changes nothing but
the transaction it is given; whatever in-memory state it derives from its writes (a new
scope's id, say) it registers with :meth:`Txn.after_commit`, which runs only once COMMIT
has succeeded. A rolled-back commit therefore cannot leave an id behind that the database
may later hand to something else. And one op cannot fail the others of its group: when a
group commit fails, each of its ops is retried in a transaction of its own, so only the op
that cannot commit (or every op, when the disk is full) gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from openwop_memory_client import MemoryServiceError, UpstreamUnavailableError

from ..timefmt import now_us as wall_clock_us
from .base import Scope
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
    # Scope ids this transaction created: usable by its later ops, unknown to everyone
    # else until it commits (see SqliteStorage._scope_pk).
    new_scope_pks: dict[Scope, int] = field(default_factory=dict)
    _after_commit: list[Callable[[], None]] = field(default_factory=list)

    def after_commit(self, effect: Callable[[], None]) -> None:
        """Run ``effect`` on the writer thread once this transaction has committed, never
        if it rolls back: the one way an op may change state outside the database."""
        self._after_commit.append(effect)

    def stamp(self) -> tuple[int, int]:
        """The next reserved sequence number, and the createdAt to go with it."""
        self.seq += 1
        assert self.seq <= self.limit
        return self.seq, self.last_us


OpFn = Callable[[Txn], Any]  # runs on the writer thread, inside the transaction

_INSERT_ENTRIES = (
    "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us, expires_us)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_TAGS = "INSERT INTO entry_tags (scope_pk, tag, seq) VALUES (?, ?, ?)"
_INSERT_KEYS = (
    "INSERT INTO idempotency (scope_pk, key, digest, entry_seq, created_us) VALUES (?, ?, ?, ?, ?)"
)


@dataclass
class _Op:
    fn: OpFn
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None


Fault = Callable[[str], None]


class GroupCommit:
    """The writer thread, its connection, and the queue of writes waiting for a commit.

    ``before_statement`` is a test seam: called on the writer thread with the name of each
    statement of a group commit (``begin``, ``clock``, ``op``, ``entries``, ``tags``,
    ``keys``, ``commit``) just before it runs; what it raises fails the commit as the
    database would. ``None`` (the default) costs one attribute test per statement.
    """

    def __init__(self, *, max_batch: int = 512) -> None:
        self.max_batch = max_batch
        self.before_statement: Fault | None = None
        # Write health, read by the event loop (see ``problems``).
        self._failing_since: float | None = None
        self._failure_reason = ""
        self._commit_started: float | None = None
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
        self._commit_started = time.monotonic()
        try:
            failure = await self._try(batch)
            if failure is not None and len(batch) > 1:
                # Whatever failed the group may belong to one op alone: give each its own
                # transaction, so the others still commit.
                failures = [await self._try([op]) for op in batch]
                failure = failures[0] if all(failures) else None
            if failure is None:
                self._failing_since = None
            else:
                self._failure_reason = str(failure.details.get("reason", failure.code))
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
        finally:
            self._commit_started = None
            for op in batch:
                op.done.set()

    async def _try(self, ops: list[_Op]) -> MemoryServiceError | None:
        """Apply ``ops`` in one transaction; on failure, give each op the error and return it."""
        try:
            with translate_errors():
                await self.run(self._apply, ops)
        except MemoryServiceError as exc:
            error = exc
        except Exception:  # noqa: BLE001 - a bug: fail the callers, never leave them waiting
            error = UpstreamUnavailableError("the write failed", {"backend": "sqlite"})
        else:
            return None
        for op in ops:
            op.error, op.result = error, None
        return error

    def _apply(self, batch: list[_Op]) -> None:
        """On the writer thread: run the batch's ops in one transaction and commit it.

        An op's own refusal (a :class:`MemoryServiceError`) is its result and writes
        nothing; any other failure rolls the whole transaction back and propagates. After
        COMMIT, and only then, the ops' :meth:`Txn.after_commit` effects run.
        """
        conn = self._conn
        assert conn is not None
        fault = self.before_statement
        if fault is not None:
            fault("begin")
        conn.execute("BEGIN IMMEDIATE")
        try:
            if fault is not None:
                fault("clock")
            # Reserve one sequence number per op up front (an op uses at most one; unused
            # ones leave harmless gaps), so the clock costs one statement.
            seq, last_us = conn.execute(
                "UPDATE clock SET seq = seq + ?, last_us = max(last_us, ?)"
                " RETURNING seq - ?, last_us",
                (len(batch), wall_clock_us(), len(batch)),
            ).fetchall()[0]
            txn = Txn(conn, seq, last_us, limit=seq + len(batch))
            for op in batch:
                op.error = None
                if fault is not None:
                    fault("op")
                try:
                    op.result = op.fn(txn)
                except MemoryServiceError as exc:
                    op.error = exc
            for name, sql, rows in (
                ("entries", _INSERT_ENTRIES, txn.entries),
                ("tags", _INSERT_TAGS, txn.tags),
                ("keys", _INSERT_KEYS, txn.keys),
            ):
                if rows:
                    if fault is not None:
                        fault(name)
                    conn.executemany(sql, rows)
            if fault is not None:
                fault("commit")
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        for effect in txn._after_commit:
            effect()

    def problems(self, stuck_after: float) -> list[str]:
        """What is wrong with writing now: ``writes_failing`` while the latest group commit
        failed for all its ops (until one succeeds), ``writer_stuck`` while a commit has
        been in flight for more than ``stuck_after`` seconds."""
        found = []
        if self._failing_since is not None:
            found.append("writes_failing")
        started = self._commit_started
        if started is not None and time.monotonic() - started > stuck_after:
            found.append("writer_stuck")
        return found

    @property
    def failure_reason(self) -> str:
        """The reason of the latest failed commit (``SQLITE_FULL``, ...), for health."""
        return self._failure_reason

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
