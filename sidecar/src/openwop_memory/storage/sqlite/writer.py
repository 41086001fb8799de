"""Group commit for SQLite: on the event loop where that is cheap and safe, else on the
writer thread.

One plain sqlite3 connection applies every write of this process. Writes queue up, and one
commit takes all that are queued in one transaction (group commit); each caller is answered
only after its commit. One commit is in flight at a time, so commit order is queue order. A
whole transaction runs as one function, wherever it runs: a hand-off per statement (as
aiosqlite does) would cost more than the statements.

**Where a commit runs.** In WAL mode with ``synchronous = NORMAL`` a commit appends to the
WAL without an fsync, and a group commit is less work than handing it to a thread and back
(the hand-off and the GIL wake-ups on both sides cost more than the commit itself;
``make bench`` reports the CPU of a put). So a batch commits on the event loop by default,
in a callback queued behind what is already runnable, so that every request that reaches
its write in the same turn of the loop joins the batch. A batch goes to the writer thread
instead when:

- one of its ops is not *quick* (``write(fn)`` without ``quick=True``): sweeps, run
  touches, anything that may touch many rows or block;
- it is large (more than ``_LOOP_BATCH_MAX`` ops): its SQLite work alone would hold the
  loop for milliseconds, and the hand-off is a small share of it;
- commits fsync (``synchronous`` FULL or EXTRA): the storage then never commits on the
  loop (``commit_on_loop=False``);
- another connection holds the write lock: on the loop the connection never waits (busy
  timeout 0) and a batch that meets ``SQLITE_BUSY`` goes to the thread, which waits up to
  the busy timeout (``BEGIN IMMEDIATE`` serialises sidecars sharing the file);
- a checkpoint is running: its fsyncs can make WAL appends wait in the kernel, which
  outside checkpoints a commit on the loop almost never does;
- commits on the loop turned slow: one that took longer than a few milliseconds *and*
  blocked in the kernel meanwhile (a slow or saturated disk; merely losing the CPU to other
  processes does not count, the thread would be no faster) sends commits to the thread for
  a while, twice as long each time it happens again, so a bad disk stalls the loop now and
  then rather than on every write.

**How many writes a commit takes.** A commit costs about as much again as the rows it
writes (taking the lock, the WAL frames of every page it touched, the clock), so fewer,
larger commits cost less a write: the rows of a put's shape, 11 a transaction, took 17.6
µs of CPU a row, 22 a transaction 14.0. Under concurrent writers, a commit due is made to
wait one more turn of the loop, so that the writes of requests read in that turn join it
too: only once, only after a commit that carried more than one write (a lone sequential
writer never waits), and not when half a loop batch is already waiting. It is PostgreSQL's
``commit_delay`` with ``commit_siblings``, with a turn of the loop for the delay. With 32
clients putting, commits carried 21 writes where they carried 13, the loop's CPU per put
fell by about a tenth and throughput rose as much; the turn a write waits is shorter than
the share of the loop it saves the other writers.

The thread is fed through one queue and wakes the loop once per batch it commits; the
writer connection keeps a busy timeout of 0 while the loop uses it and the configured one
while the thread does.

**Checkpoints never run on the loop.** SQLite's automatic checkpoint runs inside the commit
that crosses its threshold and holds it for as long as its copying and fsyncs take, so it
is off on the writer connection (``make bench`` measures a ``get`` during a checkpoint).
Instead, once the WAL file has grown past ``checkpoint_bytes`` (looked at every few
commits), a checkpoint thread with a connection of its own checkpoints: PASSIVE (commits
and reads go on meanwhile), then RESTART with a short busy timeout, which holds the write
lock only to copy what was committed during the PASSIVE one and makes the next commit
start the WAL over. Without that second step, commits landing during every checkpoint would
keep the WAL from ever starting over. If a reader still needs the WAL, RESTART gives up
after that short wait, and the next try waits until the WAL has grown by another
``checkpoint_bytes``. The WAL starts over in place, not truncated: the commit that writes
its first frame cuts the file back to ``checkpoint_bytes`` (the writer connection's
``journal_size_limit``), and every commit after writes over pages the file already has,
where appending past its end cost the kernel twice as much a frame (allocating and zeroing
them). Emptying the file is for erasure: an expiry sweep and a forget TRUNCATE it
(:meth:`GroupCommit.empty_wal`), as shutdown does. The sweeper's PASSIVE runs there too.

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
import bisect
import contextlib
import functools
import math
import os
import resource
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import anyio
import structlog
from openwop_memory_client import MemoryServiceError, UpstreamUnavailableError

from ...timefmt import now_us as wall_clock_us
from ..base import Scope
from .errors import translate_errors
from .thread import WriterThread

# A commit on the loop that takes longer and waited for the disk meanwhile holds up every
# request: commits move to the writer thread for _OFF_LOOP_FIRST_S, twice as long after
# each further slow one (up to _OFF_LOOP_MAX_S), starting over once none was slow for
# _SLOW_FORGOTTEN_S.
_SLOW_COMMIT_S = 0.005
_OFF_LOOP_FIRST_S = 1.0
_OFF_LOOP_MAX_S = 64.0
_SLOW_FORGOTTEN_S = 60.0
# Larger batches go to the writer thread: their SQLite work would hold the loop for more
# than a few milliseconds, and the hand-off is a small share of it.
_LOOP_BATCH_MAX = 64
# A commit waits a turn of the loop for more writes only while fewer are waiting.
_GATHER_BELOW = _LOOP_BATCH_MAX // 2
# How long a checkpoint's last step (RESTART, or TRUNCATE to empty the WAL) may wait for the
# write lock, then for readers to leave the WAL, while holding writers up.
_LAST_STEP_WAIT_MS = 50
# Commits between two looks at the WAL's size (a stat).
_WAL_LOOK_EVERY = 16
# The WAL size that triggers a checkpoint, as SQLite's automatic one did here (4000 pages):
# fewer, larger checkpoints copy hot pages (the clock, index leaves) fewer times.
WAL_CHECKPOINT_BYTES = 16 << 20
# Upper bounds of the group-commit batch-size histogram's buckets (ops a commit carried).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

log = structlog.get_logger("openwop_memory.storage")


class EntryInsert(NamedTuple):
    """A row of ``entries`` an op adds, inserted with the others at commit."""

    seq: int
    id: str
    scope_pk: int
    content: str
    tags_json: bytes
    created_us: int
    expires_us: int | None
    tokens: int
    embedding: bytes | None = None


class KeyInsert(NamedTuple):
    """A row of ``idempotency`` an op adds, inserted with the others at commit."""

    scope_pk: int
    key: str
    digest: bytes
    entry_seq: int
    created_us: int


@dataclass
class Txn:
    """State of one group-commit transaction: the clock as the ops advance it.

    ``last_us`` is already the transaction's createdAt: the wall clock, pulled up to the
    latest createdAt committed before, so createdAt never goes backwards in commit order.
    ``start_seq`` is the clock as the transaction began: every row at or below it was
    committed before, and the ops' own rows (above it) are not all inserted until the end.
    """

    conn: sqlite3.Connection
    seq: int
    last_us: int
    limit: int
    start_seq: int
    # Rows the ops add, inserted with one executemany each just before COMMIT.
    entries: list[EntryInsert] = field(default_factory=list)
    tags: list[tuple[int, str, int]] = field(default_factory=list)  # scope_pk, tag, seq
    keys: list[KeyInsert] = field(default_factory=list)
    # Change-feed records, in order, inserted with one executemany after those rows.
    changes: list[tuple[str, int, str, str, int, int]] = field(default_factory=list)
    # Statements run after those inserts, in order (they may name the rows inserted).
    later: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    # Keyed puts of this transaction: (scope_pk, entry key) -> the latest revision's
    # (seq, revision, expires_us, id); seq -> revision.
    key_heads: dict[tuple[int, str], tuple[int, int, int | None, str]] = field(default_factory=dict)
    revisions: dict[int, int] = field(default_factory=dict)
    # Scope ids this transaction created: usable by its later ops, unknown to everyone
    # else until it commits (see SqliteStorage._scope_pk).
    new_scope_pks: dict[Scope, int] = field(default_factory=dict)
    # last_us -> seq, as each snapshot taken in this transaction left them (see
    # snapshot_taken): the writes of this transaction stamped at or before a time.
    snapshots: dict[int, int] = field(default_factory=dict)
    _after_commit: list[Callable[[], None]] = field(default_factory=list)

    def after_commit(self, effect: Callable[[], None]) -> None:
        """Run ``effect`` on the committing thread once this transaction has committed,
        never if it rolls back: the one way an op may change state outside the database."""
        self._after_commit.append(effect)

    def stamp(self) -> tuple[int, int]:
        """The next reserved sequence number, and the createdAt to go with it."""
        self.seq += 1
        assert self.seq <= self.limit
        return self.seq, self.last_us

    def snapshot_taken(self) -> None:
        """A snapshot was just taken at ``last_us``: every later stamp, in this transaction
        and after it, is past it (the clock is moved on at COMMIT), so a snapshot is
        exactly the writes stamped at or before its time (what a run as of a time needs)."""
        self.snapshots[self.last_us] = self.seq
        self.last_us += 1


OpFn = Callable[[Txn], Any]  # runs inside the transaction, on the loop or the writer thread

_INSERT_ENTRIES = (
    "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us, expires_us, tokens,"
    " embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_TAGS = "INSERT INTO entry_tags (scope_pk, tag, seq) VALUES (?, ?, ?)"
_INSERT_KEYS = (
    "INSERT INTO idempotency (scope_pk, key, digest, entry_seq, created_us) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_CHANGE = (
    "INSERT INTO changes (tenant, scope_pk, entry_id, op, at_us, seq) VALUES (?, ?, ?, ?, ?, ?)"
)


class _Op:
    __slots__ = ("done", "error", "fn", "quick", "result")

    def __init__(self, fn: OpFn, quick: bool, done: asyncio.Future[None]) -> None:
        self.fn = fn
        self.quick = quick
        self.done = done  # resolved (never failed) once ``result`` or ``error`` is final
        self.result: Any = None
        self.error: BaseException | None = None


class _LockBusy(Exception):
    """On the loop, another connection held the write lock: the ops of the batch from
    ``index`` on are not committed yet and must go to the writer thread."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


if hasattr(resource, "RUSAGE_THREAD"):

    def _waits() -> int:
        """How often this thread has blocked in the kernel (for I/O, mostly) so far."""
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

else:  # pragma: no cover - not Linux: count every slow commit as waiting for the disk

    def _waits() -> int:
        return time.monotonic_ns()


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # absent on errors raised by hand
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


Fault = Callable[[str], None]


class GroupCommit:
    """The writer connection, the queue of writes waiting for a commit, and the writer thread.

    ``before_statement`` is a test seam: called with the name of each statement of a group
    commit (``begin``, ``clock``, ``op``, ``entries``, ``tags``, ``keys``, ``commit``) just
    before it runs, and with ``checkpoint`` before each checkpoint, on the thread that runs
    it (the loop's or the writer thread); what it raises fails the commit or checkpoint as
    the database would. ``None`` (the default) costs one attribute test per statement.
    """

    def __init__(
        self,
        path: str,
        *,
        busy_timeout_ms: int,
        commit_on_loop: bool = True,
        max_batch: int = 512,
        checkpoint_bytes: int = WAL_CHECKPOINT_BYTES,
        clock: Callable[[], int] = wall_clock_us,
    ) -> None:
        # What createdAt is taken from (µs): the wall clock, or a test's.
        self.clock = clock
        self.max_batch = max_batch
        self.busy_timeout_ms = busy_timeout_ms
        self.commit_on_loop = commit_on_loop
        self.checkpoint_bytes = checkpoint_bytes
        self.before_statement: Fault | None = None
        # Write health, read by the event loop (see ``problems``).
        self._failing_since: float | None = None
        self._failure_reason = ""
        self.commits = 0  # transactions committed, for the metrics
        self.committed_ops = 0  # the ops they carried
        # How many commits carried how many ops: one count per bucket of BATCH_BUCKETS
        # (upper bounds, inclusive), then one for larger batches.
        self.batch_sizes = [0] * (len(BATCH_BUCKETS) + 1)
        self._commit_started: float | None = None
        self._thread = WriterThread("openwop-memory-writer")
        self._checkpoints = WriterThread("openwop-memory-checkpoint")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connect: Callable[[], sqlite3.Connection] | None = None
        self._conn: sqlite3.Connection | None = None
        self._conn_wait_ms = -1  # the busy timeout the writer connection has now
        self._checkpointer: sqlite3.Connection | None = None
        self._pending: list[_Op] = []
        self._scheduled = False  # a _flush is queued on the loop
        self._in_flight = False  # a batch is on the writer thread
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._off_loop_until = 0.0
        self._off_loop_for = _OFF_LOOP_FIRST_S
        self._last_slow = -math.inf
        self._wal_path = path + "-wal"
        self._commits = 0
        self._checkpoint_at = checkpoint_bytes
        self._checkpointing = 0  # checkpoints queued or running
        self._last_batch = 0  # writes the last commit carried
        self._waited = False  # the commit due now has waited its turn (_wait_a_turn)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the writer thread, after whatever is already queued there."""
        return await self._thread.run(fn, *args)

    async def start(self, connect: Callable[[], sqlite3.Connection]) -> sqlite3.Connection:
        """Open the writer connection with ``connect``, on the writer thread; the checkpoint
        thread opens its own with ``connect`` too, when first needed."""
        self._loop = asyncio.get_running_loop()
        self._connect = connect
        self._thread.start()
        self._checkpoints.start()
        conn: sqlite3.Connection = await self.run(connect)
        # A growth checkpoint restarts the WAL in place (see _checkpoint_wal); the commit that
        # writes its first frame then cuts the file back to this size.
        await self.run(conn.execute, f"PRAGMA journal_size_limit = {int(self.checkpoint_bytes)}")
        self._conn = conn
        return conn

    async def close(self) -> None:
        """Commit what is queued, checkpoint (truncating the WAL), close. Idempotent."""
        self._closed = True
        if self._loop is None:
            return
        while self._pending or self._scheduled or self._in_flight:
            waiter = self._loop.create_future()
            self._idle_waiters.append(waiter)
            await waiter
        with contextlib.suppress(MemoryServiceError):
            await self.checkpoint("TRUNCATE")
        for thread, conn in ((self._thread, self._conn), (self._checkpoints, self._checkpointer)):
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    await thread.run(conn.close)
        if self._connect is not None:  # started, and not stopped yet
            self._thread.stop()
            self._checkpoints.stop()
        self._conn = self._checkpointer = self._connect = None

    async def write(self, fn: OpFn, *, quick: bool = False) -> Any:
        """Run ``fn`` in the next group commit; its result once that commit is durable.

        ``quick=True`` promises that ``fn`` runs a few indexed statements and never blocks,
        so its commit may run on the event loop.

        :raises MemoryServiceError: what ``fn`` raised (it wrote nothing), or
            :class:`UpstreamUnavailableError` when the commit failed or the writer is closed.
        """
        loop = self._loop
        if self._closed or loop is None or self._conn is None:
            raise UpstreamUnavailableError("the sidecar is shutting down", {"backend": "sqlite"})
        op = _Op(fn, quick, loop.create_future())
        self._pending.append(op)
        if not (self._scheduled or self._in_flight):
            self._scheduled = True
            loop.call_soon(self._flush)
        # Cancelling the caller cancels only its wait: the op still commits with its batch.
        await op.done
        if op.error is not None:
            raise op.error
        return op.result

    # -- on the event loop -------------------------------------------------------------

    def _flush(self) -> None:
        """Commit the next batch, here or on the writer thread."""
        self._scheduled = False
        if self._pending and not self._in_flight and self._wait_a_turn():
            self._scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)
            return
        if self._pending and not self._in_flight:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            if self._may_commit_here(batch):
                self._commit_here(batch)
            else:
                self._commit_off_loop(batch)
            if self._pending and not self._in_flight:
                # One batch per turn of the loop: requests waiting for it go first.
                self._scheduled = True
                assert self._loop is not None
                self._loop.call_soon(self._flush)
        if not (self._pending or self._scheduled or self._in_flight):
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _wait_a_turn(self) -> bool:
        """Whether the commit due now waits one more turn of the loop for more writes:
        once, when the last commit carried more than one write (writers are concurrent, so
        more are on their way) and fewer than ``_GATHER_BELOW`` are waiting."""
        if self._waited:
            self._waited = False
            return False
        if self._last_batch > 1 and len(self._pending) < _GATHER_BELOW:
            self._waited = True
            return True
        return False

    def _may_commit_here(self, batch: list[_Op]) -> bool:
        if not self.commit_on_loop:
            return False
        if len(batch) > _LOOP_BATCH_MAX:
            return False
        if self._checkpointing:
            # A checkpoint's fsyncs can make WAL appends wait in the kernel for milliseconds.
            return False
        if self._off_loop_until and time.monotonic() < self._off_loop_until:
            return False
        return all(op.quick for op in batch)

    def _commit_here(self, batch: list[_Op]) -> None:
        waits = _waits()
        started = self._commit_started = time.monotonic()
        try:
            failure = self._commit_batch(batch, on_loop=True)
        except _LockBusy as busy:
            self._commit_started = None
            self._answer(batch[: busy.index])
            self._commit_off_loop(batch[busy.index :])
            return
        seconds = time.monotonic() - started
        self._commit_started = None
        self._settle(batch, failure)
        # Only a commit that blocked in the kernel (on the disk) counts: one that was slow
        # because other processes had the CPU would be no faster on the thread.
        if seconds > _SLOW_COMMIT_S and _waits() != waits:
            self._slow_here(seconds, started + seconds)

    def _slow_here(self, seconds: float, now: float) -> None:
        if now - self._last_slow > _SLOW_FORGOTTEN_S:
            self._off_loop_for = _OFF_LOOP_FIRST_S
        else:
            self._off_loop_for = min(2 * self._off_loop_for, _OFF_LOOP_MAX_S)
        self._last_slow = now
        self._off_loop_until = now + self._off_loop_for
        log.warning(
            "slow_commit_on_loop",
            ms=round(seconds * 1000, 1),
            commits_off_loop_for_s=self._off_loop_for,
        )

    def _commit_off_loop(self, batch: list[_Op]) -> None:
        assert self._loop is not None
        self._in_flight = True
        self._commit_started = time.monotonic()
        self._thread.submit(
            self._loop,
            self._commit_batch,
            (batch, False),
            functools.partial(self._landed, batch),
        )

    def _landed(
        self, batch: list[_Op], failure: MemoryServiceError | None, error: BaseException | None
    ) -> None:
        """A batch is back from the writer thread."""
        self._in_flight = False
        self._commit_started = None
        if error is not None:  # a bug below: fail the callers, never leave them waiting
            failure = UpstreamUnavailableError("the write failed", {"backend": "sqlite"})
            for op in batch:
                op.error, op.result = failure, None
        self._settle(batch, failure)
        if not self._scheduled:
            self._flush()

    def _settle(self, batch: list[_Op], failure: MemoryServiceError | None) -> None:
        """Record the health outcome of a committed batch and answer its callers."""
        if failure is None:
            self._failing_since = None
        else:
            self._failure_reason = str(failure.details.get("reason", failure.code))
            if self._failing_since is None:
                self._failing_since = time.monotonic()
        self._answer(batch)
        self._last_batch = len(batch)
        self._commits += 1
        if self._commits % _WAL_LOOK_EVERY == 0 and not self._checkpointing:
            self._look_at_wal()

    @staticmethod
    def _answer(ops: list[_Op]) -> None:
        for op in ops:
            if not op.done.done():  # done: its caller was cancelled
                op.done.set_result(None)

    def _look_at_wal(self) -> None:
        try:
            size = os.stat(self._wal_path).st_size
        except OSError:
            return
        # Strictly past: a restarted WAL keeps a file of checkpoint_bytes (see start).
        if size > self._checkpoint_at and self._conn is not None:
            assert self._loop is not None
            self._checkpointing += 1
            self._checkpoints.submit(
                self._loop, self._checkpoint_wal, ("RESTART",), self._checkpointed
            )

    def _checkpointed(self, emptied: bool, error: BaseException | None) -> None:
        self._checkpointing -= 1
        if error is None and emptied:
            self._checkpoint_at = self.checkpoint_bytes
            return
        if error is not None:
            reason = getattr(error, "sqlite_errorname", None) or type(error).__name__
            log.warning("checkpoint_failed", reason=reason)
        # A reader still needs the WAL (or the checkpoint failed): try again only once the
        # WAL has grown by another step, so writers are not held up on every look.
        try:
            size = os.stat(self._wal_path).st_size
        except OSError:
            size = 0
        self._checkpoint_at = size + self.checkpoint_bytes

    # -- on whichever thread commits ---------------------------------------------------

    def _commit_batch(self, batch: list[_Op], on_loop: bool) -> MemoryServiceError | None:
        """Commit ``batch`` in one transaction, or op by op if that fails; the error if
        every op failed.

        :raises _LockBusy: on the loop, when the write lock is taken.
        """
        failure = self._try(batch, 0, on_loop)
        if failure is None or len(batch) == 1:
            return failure
        # Whatever failed the group may belong to one op alone: give each its own
        # transaction, so the others still commit.
        failures = [self._try([op], index, on_loop) for index, op in enumerate(batch)]
        return failures[0] if all(failures) else None

    def _try(self, ops: list[_Op], index: int, on_loop: bool) -> MemoryServiceError | None:
        """Apply ``ops`` (from ``index`` of their batch) in one transaction; on failure,
        give each op the error and return it."""
        try:
            with translate_errors():
                try:
                    self._apply(ops, on_loop)
                except sqlite3.Error as exc:
                    if on_loop and _is_busy(exc):
                        raise _LockBusy(index) from None
                    raise
        except _LockBusy:
            raise
        except MemoryServiceError as exc:
            error = exc
        except Exception:  # noqa: BLE001 - a bug: fail the callers, never leave them waiting
            error = UpstreamUnavailableError("the write failed", {"backend": "sqlite"})
        else:
            return None
        for op in ops:
            op.error, op.result = error, None
        return error

    def _apply(self, batch: list[_Op], on_loop: bool) -> None:
        """Run the batch's ops in one transaction and commit it.

        An op's own refusal (a :class:`MemoryServiceError`) is its result and writes
        nothing; any other failure rolls the whole transaction back and propagates. After
        COMMIT, and only then, the ops' :meth:`Txn.after_commit` effects run.
        """
        conn = self._conn
        assert conn is not None
        # The loop must never wait for a lock; the writer thread may, up to the busy timeout.
        wait_ms = 0 if on_loop else self.busy_timeout_ms
        if self._conn_wait_ms != wait_ms:
            conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
            self._conn_wait_ms = wait_ms
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
                (len(batch), self.clock(), len(batch)),
            ).fetchall()[0]
            txn = Txn(conn, seq, last_us, limit=seq + len(batch), start_seq=seq)
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
                ("changes", _INSERT_CHANGE, txn.changes),
            ):
                if rows:
                    if fault is not None:
                        fault(name)
                    conn.executemany(sql, rows)
            for sql, params in txn.later:
                conn.execute(sql, params)
            if txn.last_us != last_us:
                conn.execute("UPDATE clock SET last_us = max(last_us, ?)", (txn.last_us,))
            if fault is not None:
                fault("commit")
            conn.execute("COMMIT")
            # Plain int updates: the GIL makes them safe from the writer thread too.
            self.commits += 1
            self.committed_ops += len(batch)
            self.batch_sizes[bisect.bisect_left(BATCH_BUCKETS, len(batch))] += 1
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        for effect in txn._after_commit:
            effect()

    # -- on the checkpoint thread ------------------------------------------------------

    def _checkpoint_connection(self) -> sqlite3.Connection:
        if self._checkpointer is None:
            assert self._connect is not None
            self._checkpointer = self._connect()
        return self._checkpointer

    def _checkpoint_wal(self, last: Literal["RESTART", "TRUNCATE"]) -> bool:
        """PASSIVE, then ``last`` with a short busy timeout; whether the WAL was emptied
        (every frame checkpointed, and the next commit starts it over)."""
        conn = self._checkpoint_connection()
        fault = self.before_statement
        if fault is not None:
            fault("checkpoint")
        _run_to_completion(conn, "PRAGMA wal_checkpoint(PASSIVE)")
        conn.execute(f"PRAGMA busy_timeout = {_LAST_STEP_WAIT_MS}")
        try:
            blocked = _run_to_completion(conn, f"PRAGMA wal_checkpoint({last})")[0][0]
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        return not blocked

    def _checkpoint_now(self, mode: str) -> None:
        conn = self._checkpoint_connection()
        fault = self.before_statement
        if fault is not None:
            fault("checkpoint")
        _run_to_completion(conn, f"PRAGMA wal_checkpoint({mode})")

    # -- health and maintenance --------------------------------------------------------

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
        """Checkpoint the WAL on the checkpoint thread. PASSIVE runs beside commits;
        TRUNCATE waits (up to the busy timeout) for the write lock and for readers to leave
        the WAL, and commits wait for it meanwhile.

        :raises MemoryServiceError: the checkpoint failed.
        """
        if self._conn is None:
            return
        self._checkpointing += 1
        try:
            with anyio.CancelScope(shield=True), translate_errors():
                await self._checkpoints.run(self._checkpoint_now, mode)
        finally:
            self._checkpointing -= 1

    async def empty_wal(self) -> bool:
        """Checkpoint as the WAL's growth does, but truncating it (PASSIVE, then TRUNCATE
        waiting at most a few tens of ms for readers), on the checkpoint thread; whether
        the WAL file is empty now, so that no frame older than the checkpoint is left in it.

        :raises MemoryServiceError: the checkpoint failed.
        """
        if self._conn is None:
            return False
        self._checkpointing += 1
        emptied = False
        try:
            with anyio.CancelScope(shield=True), translate_errors():
                emptied = await self._checkpoints.run(self._checkpoint_wal, "TRUNCATE")
        finally:
            self._checkpointing -= 1
        return emptied


def _run_to_completion(conn: sqlite3.Connection, sql: str) -> list[Any]:
    """Run ``sql`` to completion on this thread.

    A statement left unfinished keeps its read snapshot open on the connection, and the
    next ``BEGIN IMMEDIATE`` then fails at once with SQLITE_BUSY. Handing the cursor back
    to the event loop would leave it unfinished until the loop dropped it.
    """
    return conn.execute(sql).fetchall()
