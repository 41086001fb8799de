"""The in-memory backend (``memory://NAME``): a fast fake of the storage contract.

Every database is a Python structure of this process (:mod:`.database`), nothing is written
to disk, and a database lives as long as the process: stores opened on ``memory://x`` in one
process, one after the other or at once, share the same data (a module-level registry of
databases by name), so a test may close and reopen its database as it would a file. The
data goes with the process; there is no file to back up (no
:class:`~openwop_memory.storage.base.FileBackup`) and no other process can reach it (an
export or import in a CLI process of its own finds an empty process).

What it is for:

- **In-process service tests**: ``MemoryService`` over ``MemoryStorage(clock=...)`` runs
  with a clock the test moves, without a file, a thread or a server
  (``tests/service/test_service_clock.py``).
- **A litmus test of the contract.** It implements ``storage/base.py`` from its docstrings
  with no SQL at all, so every rule it has to copy from the SQL backends is a rule that
  lives in the backends rather than above them. Each such copy says so in a comment ("A
  rule copied from SQL"); they are candidates for ``domain.py`` or ``storage/base.py``.

How it keeps the promises: each method does its work in synchronous code between two
awaits, so each is one atomic step of the event loop. Commit order is the order those steps
run in, a write is "durable" (in this process) when it returns, and a failed write cannot
leave a trace because nothing in a write can fail halfway. ``seq`` is one counter per
database (as SQLite's clock row), so a snapshot is a position in the commits of every
tenant. Sweeps and forgets run in batches with a yield to the loop between them.

The serve lock (:meth:`MemoryStorage.lock_at_open`) is trivially held: an in-memory
database is this process's alone, so no other sidecar can serve it or import into it.
"""

from __future__ import annotations

import bisect
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import cast

from openwop_memory_client import UpstreamUnavailableError

from ...domain import NOT_NOW, NotNow, SweepHorizons
from ...timefmt import now_us as wall_clock_us
from ...token_count import estimate_tokens
from ..base import (
    PENDING_VECTOR,
    BeginResult,
    CandidateCheck,
    Change,
    EntryRow,
    FoundEntry,
    KeywordCandidates,
    ListFilter,
    PutRequest,
    PutResult,
    Revision,
    RevisionState,
    RunInfo,
    RunKey,
    RunRecord,
    Scope,
    ScopeInfo,
    Snapshot,
    StorageGauges,
    StorageHealth,
    StorageStartupError,
    StoredEntry,
    SweepCounts,
    VectorRow,
)
from ..batches import SweepBatch, sweep_steps, until_short
from . import database as registry
from . import writes
from .database import Database
from .maintenance import STEPS, Step, forget_batch, import_entries
from .queries import considered, keyword_candidates, newest_first

SCHEMA_VERSION = 1
"""The shape of what a database holds; there is one, and nothing to migrate."""


class MemoryStorage:
    """The in-memory backend. See :class:`~openwop_memory.storage.base.Storage` for
    contracts, and the module docstring for what is particular to it."""

    def __init__(
        self, name: str, *, create: bool = True, clock: Callable[[], int] = wall_clock_us
    ) -> None:
        """``name`` is the database's (``memory://NAME``); ``create``: :meth:`open` may
        make it when this process has none of that name. ``clock`` (µs since the epoch) is
        every time this store reads: createdAt, and what :meth:`clock_us` answers; the
        wall clock but in tests that move time."""
        self.name = name
        self.create = create
        self._clock = clock
        self._database: Database | None = None
        self._created = False  # open() made the database (see discard)
        self.commits = 0  # writes this store committed, for the gauges

    # -- lifecycle ---------------------------------------------------------------------

    def lock_at_open(self, *, exclusive: bool) -> None:
        """Nothing to lock: an in-memory database belongs to this process alone, so no
        other sidecar can serve it or import into it (the lock's purpose is met)."""

    async def open(self) -> None:
        if self._database is not None:
            return
        found = registry.named(self.name, create=self.create)
        if found is None:
            raise StorageStartupError(
                f"this process has no in-memory database {self.name!r} and create_database "
                "is false: a memory:// database lives only in the process that made it"
            )
        self._database, self._created = found
        self._database.open_stores += 1

    async def close(self) -> None:
        database, self._database = self._database, None
        if database is not None:
            database.open_stores -= 1

    async def discard(self) -> None:
        """Close, and forget the database if :meth:`open` made it and no other store of
        this process has it open (as SQLite removes a file it created)."""
        database = self._database
        await self.close()
        if database is not None and self._created and database.open_stores == 0:
            registry.drop(self.name, database)

    def _db(self) -> Database:
        """The open database.

        :raises UpstreamUnavailableError: the store is not open (closed, or never opened).
        """
        database = self._database
        if database is None:
            raise UpstreamUnavailableError(
                "the in-memory database is closed", {"backend": "memory", "reason": "closed"}
            )
        return database

    def _write(self) -> Database:
        """The open database, its clock moved to now for a write that begins."""
        database = self._db()
        database.advance(self._clock())
        self.commits += 1
        return database

    def clock_us(self) -> int:
        return self._clock()  # one process: its own clock, the one createdAt is taken from

    async def ref_key(self) -> bytes:
        return self._db().ref_key

    # -- runs --------------------------------------------------------------------------

    async def begin_run(
        self,
        *,
        run_id: str,
        tenant: str,
        replay: bool,
        now_us: int,
        retention_cutoff_us: int,
        as_of_us: int | None = None,
    ) -> BeginResult:
        return writes.begin_run(
            self._write(),
            run_id=run_id,
            tenant=tenant,
            replay=replay,
            now_us=now_us,
            retention_cutoff_us=retention_cutoff_us,
            as_of_us=as_of_us,
        )

    async def find_runs(self, *, run_id: str, retention_cutoff_us: int) -> Sequence[RunRecord]:
        by_tenant = self._db().runs.get(run_id, {})
        return [
            RunRecord(run_id, tenant, Snapshot(row.snapshot_seq), row.snapshot_us, row.as_of_us)
            for tenant, row in sorted(by_tenant.items(), key=lambda item: item[0])
            if row.snapshot_seq is not None and row.touched_us > retention_cutoff_us
        ]

    async def touch_runs(self, *, runs: Sequence[RunKey], now_us: int) -> None:
        if not runs:
            return
        database = self._write()
        for tenant, run_id in runs:
            row = database.runs.get(run_id, {}).get(tenant)
            if row is not None and row.snapshot_seq is not None:
                row.touched_us = now_us

    # -- writes ------------------------------------------------------------------------

    async def put(self, *, request: PutRequest, now_us: int) -> PutResult:
        tokens = estimate_tokens(request.content)
        return writes.put(self._write(), request, tokens=tokens, now_us=now_us)

    async def set_vectors(self, vectors: Sequence[tuple[str, bytes]]) -> None:
        if not vectors:
            return
        database = self._db()  # no clock and no change record: derived data only
        for entry_id, vector in vectors:
            row = database.by_id.get(entry_id)
            if row is not None and row.vector == PENDING_VECTOR:
                database.bytes_held += len(vector) - len(row.vector)
                row.vector = vector

    async def delete(self, *, scope: Scope, entry_id: str, now_us: int) -> bool:
        database = self._write()
        row = database.by_id.get(entry_id)
        if row is None or row.scope != scope or not row.live(now_us):
            return False
        seq, deleted_us = database.stamp()
        database.tombstone(row, seq, deleted_us)
        database.record(scope.tenant, scope.key, entry_id, "delete", deleted_us, seq)
        return True

    # -- reads -------------------------------------------------------------------------

    async def get_key(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_key: str
    ) -> tuple[EntryRow, int] | None:
        revisions = self._db().revisions.get((scope, entry_key), [])
        for row in reversed(revisions):
            if row.visible(cast(int, snapshot), now_us):
                assert row.revision is not None
                return row.entry, row.revision
        return None

    async def key_history(
        self, *, scope: Scope, now_us: int, entry_key: str, limit: int, before: int | None = None
    ) -> Sequence[Revision]:
        database = self._db()
        found: list[Revision] = []
        for row in reversed(database.revisions.get((scope, entry_key), [])):
            assert row.revision is not None
            expires = row.entry.expires_us
            if (before is not None and row.revision >= before) or (
                expires is not None and expires <= now_us
            ):
                continue
            if len(found) == limit:
                break
            if row.deleted_seq is None:
                state = RevisionState.CURRENT
            else:
                ender = database.by_seq.get(row.deleted_seq)
                keyed = ender is not None and ender.revision is not None
                state = RevisionState.SUPERSEDED if keyed else RevisionState.DELETED
            found.append(Revision(row.revision, row.entry, state))
        return found

    async def changes(self, *, tenant: str, after: int, limit: int) -> Sequence[Change]:
        records = self._db().changes
        found: list[Change] = []
        # The feed is in position order: start past ``after`` rather than at its oldest.
        for record in records[bisect.bisect_right(records, after, key=lambda c: c.pos) :]:
            if len(found) == limit:
                break
            if record.tenant == tenant:
                found.append(
                    Change(record.pos, record.scope_key, record.entry_id, record.op, record.at_us)
                )
        return found

    async def keyword_candidates(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        terms: Sequence[str],
        limit: int,
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
        rows: bool = True,
    ) -> KeywordCandidates:
        if not terms:
            return KeywordCandidates([])
        # The rows are at hand: they come with the hits whether asked for or not.
        return keyword_candidates(
            self._db(), scope, cast(int, snapshot), now_us, terms, limit, tag, max_tokens, where
        )

    async def vectors_after(self, *, scope: Scope, after: int) -> Sequence[VectorRow]:
        rows = self._db().scopes.get(scope, {})
        return [
            VectorRow(
                row.seq,
                row.entry.expires_us,
                row.vector,
                row.entry.content if row.vector == PENDING_VECTOR else None,
            )
            for row in rows.values()
            if row.seq > after and row.vector is not None
        ]

    async def check_candidates(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        seqs: Sequence[int],
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
        rows: bool = True,
    ) -> CandidateCheck:
        database = self._db()
        kept: dict[int, EntryRow] = {}
        stored: set[int] = set()
        for seq in seqs:
            row = database.by_seq.get(seq)
            if row is None or row.scope != scope:
                continue
            stored.add(seq)
            small = max_tokens is None or row.entry.tokens <= max_tokens
            if small and considered(row, cast(int, snapshot), now_us, tag, where):
                kept[seq] = row.entry
        return CandidateCheck(set(kept), stored, kept if rows else {})

    async def list(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        limit: int,
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
    ) -> list[EntryRow]:
        rows = newest_first(
            self._db(), scope, cast(int, snapshot), now_us, tag, where, max_tokens=max_tokens
        )
        found: list[EntryRow] = []
        for row in rows:
            if len(found) == limit:
                break
            found.append(row.entry)
        return found

    async def page(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        limit: int,
        tag: str | None,
        where: ListFilter | None,
        before: int | None,
    ) -> Sequence[tuple[int, EntryRow]]:
        snap = cast(int, snapshot)
        rows = newest_first(self._db(), scope, snap, now_us, tag, where, before=before)
        found: list[tuple[int, EntryRow]] = []
        for row in rows:
            if len(found) == limit:
                break
            found.append((row.seq, row.entry))
        return found

    async def count(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
    ) -> int:
        rows = newest_first(self._db(), scope, cast(int, snapshot), now_us, tag, where)
        return sum(1 for _ in rows)

    def get_now(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | NotNow | None:
        """What :meth:`get` answers: a read of this process's memory never waits (when the
        store is closed, :data:`NOT_NOW`, so that :meth:`get` raises)."""
        database = self._database
        if database is None:
            return NOT_NOW
        row = database.by_id.get(entry_id)
        if row is None or row.scope != scope or not row.visible(cast(int, snapshot), now_us):
            return None
        return row.entry

    async def get(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | None:
        self._db()
        found = self.get_now(scope=scope, snapshot=snapshot, now_us=now_us, entry_id=entry_id)
        return None if isinstance(found, NotNow) else found

    # -- maintenance -------------------------------------------------------------------

    async def sweep(self, *, horizons: SweepHorizons, batch_size: int) -> SweepCounts:
        def batch(step: Step) -> SweepBatch:
            async def run() -> int | None:
                return step(self._write(), horizons, batch_size)

            return run

        return await sweep_steps({name: batch(step) for name, step in STEPS.items()}, batch_size)

    async def forget(self, *, tenant: str, tag: str, batch_size: int) -> int:
        async def batch() -> tuple[int, int]:
            removed = forget_batch(self._write(), tenant, tag, batch_size)
            return removed, removed

        return await until_short(batch, batch_size)

    async def list_runs(self, *, limit: int) -> Sequence[RunInfo]:
        runs = [
            RunInfo(run_id, tenant, row.snapshot_us, row.touched_us, row.snapshot_seq is not None)
            for run_id, by_tenant in self._db().runs.items()
            for tenant, row in by_tenant.items()
        ]
        runs.sort(key=lambda run: run.touched_us, reverse=True)
        return runs[:limit]

    async def list_scopes(self, *, tenant: str, now_us: int) -> Sequence[ScopeInfo]:
        return [
            ScopeInfo(scope, sum(1 for row in rows.values() if row.live(now_us)))
            for scope, rows in sorted(self._db().scopes.items(), key=lambda item: item[0].key)
            if scope.tenant == tenant
        ]

    async def find_entry(self, *, entry_id: str) -> FoundEntry | None:
        database = self._db()
        row = database.by_id.get(entry_id)
        if row is None:
            return None
        ender = None if row.deleted_seq is None else database.by_seq.get(row.deleted_seq)
        superseded_by = None if ender is None else ender.entry.id
        return FoundEntry(row.scope, row.entry, row.deleted_seq is not None, superseded_by)

    async def export_entries(
        self, *, now_us: int, batch_size: int
    ) -> AsyncGenerator[Sequence[StoredEntry], None]:
        # Read at once, in commit order: one consistent point, whatever is written while
        # the batches are consumed (the rows' entries never change).
        live = [
            StoredEntry(row.scope, row.entry)
            for row in self._db().by_seq.values()
            if row.live(now_us)
        ]
        for start in range(0, len(live), batch_size):
            yield live[start : start + batch_size]

    async def adopt_ref_key(self, *, key: bytes) -> bool:
        database = self._write()
        if database.ref_key == key:
            return True
        if database.scopes or database.runs:
            return False
        database.ref_key = key
        return True

    async def import_entries(self, *, entries: Sequence[StoredEntry]) -> int:
        if not entries:
            return 0
        return import_entries(self._write(), entries)

    async def gauges(self) -> StorageGauges:
        """Exact counts kept as rows come and go; only the rows with an expiry are looked at
        (for those expired and not swept yet), as SQLite counts them off a partial index."""
        database = self._db()
        now = self._clock()
        expired = 0
        for seq in database.expiring:
            row = database.by_seq[seq]
            expires = row.entry.expires_us
            if row.deleted_seq is None and expires is not None and expires <= now:
                expired += 1
        return StorageGauges(
            database_bytes=database.bytes_held,
            entries=len(database.by_seq) - database.tombstones - expired,
            scopes=len(database.scopes),
            commits=self.commits,
            committed_writes=self.commits,
        )

    async def health(self) -> StorageHealth:
        """Never degraded while open: nothing here can fail but a closed store."""
        database = self._db()
        return StorageHealth(
            backend="memory",
            schema_version=SCHEMA_VERSION,
            properties={"commitSeq": database.seq},
        )
