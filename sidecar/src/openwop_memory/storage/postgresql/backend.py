"""PostgreSQL storage (asyncpg, a bounded pool): one memory shared by many sidecars.

**Snapshots.** Every write of a tenant first takes that tenant's clock row
(``tenant_clocks``, see :mod:`.schema`) with an upsert that increments it, and
holds its lock until COMMIT. Sequence numbers of a tenant are therefore handed out in commit
order, and ``run.begin`` (which takes the same row) records the tenant's sequence number as
the run's snapshot: a write acknowledged before is at or below it, a write that commits
after is above it, whichever sidecars wrote. Tenants never queue behind each other.

**Lock order.** A write takes its tenant's clock row before anything else of that tenant
(a new scope row, say), and ``touch_runs`` locks runs in (tenant, id) order, so no two
transactions of this backend wait for each other in a cycle. Deadlocks and serialization
failures are retried (the transaction wrote nothing).

**Poolers.** No named prepared statements (``statement_cache_size=0``), no session state,
and only transaction-scoped advisory locks, so it runs behind PgBouncer in transaction mode.

**Failures.** Connection, protocol and server errors become ``upstream_unavailable`` in
:mod:`.errors`; a call never waits past ``command_timeout`` (plus
``connect_timeout`` for a new connection). After a connection error, the pool's idle
connections are replaced, so a restarted server costs one failed call, not one per pooled
connection. A failed commit leaves no trace: new scope ids are cached only once committed.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar, cast

import anyio
import asyncpg
import orjson
import structlog
from asyncpg.pool import PoolConnectionProxy
from openwop_memory_client import UpstreamUnavailableError

from ...domain import SweepHorizons, new_entry_id
from ...logs import describe_exception
from ...timefmt import now_us as wall_clock_us
from ...token_count import estimate_tokens
from ..base import (
    KEY_CONFLICT,
    PENDING_VECTOR,
    REFUSED,
    BeginOutcome,
    BeginResult,
    CandidateCheck,
    Change,
    EntryRow,
    FoundEntry,
    FoundRun,
    KeywordCandidates,
    ListFilter,
    PutOutcome,
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
    as_of_position,
    classify_run,
    refuse_as_of,
    replayed,
)
from ..batches import SweepBatch, sweep_steps, until_short
from ..keyword_sql import Dialect, best_matches
from ..migrations import migrations_to_run
from ..scope_cache import ScopeCache
from .errors import CONNECTION_ERRORS, is_retryable, startup_error, translate_errors
from .keywords import KeywordIndexer
from .schema import DB_NOW_US, LATEST_VERSION, MIGRATIONS, SEARCH_CONFIG
from .serve_lock import SERVE_LOCK, AdvisoryServeLock

T = TypeVar("T")
Effects = list[Callable[[], None]]
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"  # generic in the stubs only

# Transaction-scoped advisory lock keys (arbitrary constants of this application).
_MIGRATION_LOCK = 0x6F70_656E_776F_7001
_SWEEP_LOCK = 0x6F70_656E_776F_7002
# The session-level serve lock has a key of its own (serve_lock.py).
assert len({_MIGRATION_LOCK, _SWEEP_LOCK, SERVE_LOCK}) == 3, "advisory lock keys must differ"
_RETRIES = 3

_ENTRY_COLUMNS = "e.id, e.content, e.tags, e.created_us, e.expires_us, e.tokens"
_SCOPE_PK = "(SELECT scope_pk FROM scopes WHERE tenant = $1 AND key = $2)"
_VISIBLE = (
    "e.seq <= $3 AND (e.deleted_seq IS NULL OR e.deleted_seq > $3)"
    " AND (e.expires_us IS NULL OR e.expires_us > $4)"
)
# Reserve ``$2`` sequence numbers of tenant ``$1``; the row stays locked until COMMIT.
_TAKE_CLOCK = (
    f"INSERT INTO tenant_clocks AS c (tenant, seq, last_us) VALUES ($1, $2, {DB_NOW_US})"
    " ON CONFLICT (tenant) DO UPDATE SET seq = c.seq + $2,"
    f" last_us = greatest(c.last_us, {DB_NOW_US}) RETURNING seq, last_us"
)
# A snapshot's clock: as _TAKE_CLOCK for no sequence number, and every later write of the
# tenant is stamped past the snapshot's time (returned), so a snapshot is exactly the
# writes stamped at or before it (what a run as of a time needs).
_TAKE_SNAPSHOT = (
    f"INSERT INTO tenant_clocks AS c (tenant, seq, last_us) VALUES ($1, 0, {DB_NOW_US} + 1)"
    f" ON CONFLICT (tenant) DO UPDATE SET last_us = greatest(c.last_us, {DB_NOW_US}) + 1"
    " RETURNING seq, last_us - 1"
)
# Idempotency keys pin a deleted entry (the second put returns it even after the delete);
# they pin no expired one, which the sweep deletes whatever names it.
_UNPINNED = (
    "NOT EXISTS (SELECT 1 FROM idempotency i WHERE i.scope_pk = e.scope_pk AND i.entry_seq = e.seq)"
)

# One statement for every entry written (a put's, an import's): what an entry row holds is
# decided here once. Its full-text vector is not: keywords.py fills it in after the commit.
_INSERT_ENTRY = (
    "INSERT INTO entries (scope_pk, seq, id, content, tags, created_us, expires_us,"
    " tokens, embedding) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
)
_CHANGE = (
    "INSERT INTO changes (tenant, pos, scope_pk, entry_id, op, at_us)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
)
_INSERT_TAGS = (
    "INSERT INTO entry_tags (scope_pk, tag, seq) SELECT $1, tag, $3 FROM unnest($2::text[]) AS tag"
)

log = structlog.get_logger("openwop_memory.storage")


def _where_sql(where: ListFilter | None, args: list[Any]) -> str:
    """The conditions of ``where`` on entries ``e`` (each starting with `` AND``), their
    values appended to ``args`` as the next parameters; ``""`` for none."""
    if where is None:
        return ""
    sql = ""
    if where.tags_any:
        args.append(list(where.tags_any))
        sql += (
            " AND EXISTS (SELECT 1 FROM entry_tags ta WHERE ta.scope_pk = e.scope_pk"
            f" AND ta.seq = e.seq AND ta.tag = ANY(${len(args)}::text[]))"
        )
    if where.tags_all:
        # An entry's tags are distinct (the primary key), and so are these.
        args.append(list(where.tags_all))
        sql += (
            " AND (SELECT count(*) FROM entry_tags tl WHERE tl.scope_pk = e.scope_pk"
            f" AND tl.seq = e.seq AND tl.tag = ANY(${len(args)}::text[]))"
            f" = cardinality(${len(args)}::text[])"
        )
    if where.created_after_us is not None:
        args.append(where.created_after_us)
        sql += f" AND e.created_us > ${len(args)}"
    if where.created_before_us is not None:
        args.append(where.created_before_us)
        sql += f" AND e.created_us < ${len(args)}"
    return sql


# $7 (the budget) stays named without a budget: PostgreSQL must type every parameter.
_KEYWORD_SQL = Dialect(
    counts="(SELECT total FROM n), (SELECT string_agg(cnt::text, ',') FROM df)",
    limit="$5",
    budget="$7::integer",
    tokens="e.tokens",
    same_scope=f" AND e.scope_pk = {_SCOPE_PK}",
    unbudgeted="$7::integer IS NULL",
)


def _row(r: Any) -> EntryRow:
    return EntryRow(r[0], r[1].decode(), tuple(orjson.loads(r[2])), r[3], r[4], r[5])


class PostgresqlStorage:
    """The PostgreSQL backend. See :class:`~openwop_memory.storage.base.Storage`."""

    def __init__(
        self,
        dsn: str,
        *,
        create: bool = True,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        connect_timeout: float = 5.0,
        command_timeout: float = 10.0,
        scope_cache_size: int = 4096,
        prepared_statements: bool = True,
    ) -> None:
        self.dsn = dsn
        self.create = create
        self.pool_min_size = pool_min_size
        self.pool_max_size = pool_max_size
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.prepared_statements = prepared_statements
        self._pool: asyncpg.Pool | None = None
        self._scope_pks = ScopeCache(scope_cache_size)
        self._keywords = KeywordIndexer(self._write)
        self._schema_version = 0
        self._closed = False
        self._write_error: str | None = None  # the reason, while the latest write failed
        self._unreachable_since: float | None = None  # since a connection error, until a call works
        self._clock_offset_us = 0  # the database's clock minus this host's (see clock_us)
        self._lock: AdvisoryServeLock | None = None
        self._lock_exclusive = False

    @property
    def keywords(self) -> KeywordIndexer:
        """The keyword indexer of this store (its background switch)."""
        return self._keywords

    # -- lifecycle ---------------------------------------------------------------------

    def lock_at_open(self, *, exclusive: bool) -> None:
        self._lock = AdvisoryServeLock(self.dsn, connect_timeout=self.connect_timeout)
        self._lock_exclusive = exclusive

    async def open(self) -> None:
        try:
            if self._lock is not None:
                await self._lock.acquire(exclusive=self._lock_exclusive)
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=self.pool_min_size,
                max_size=self.pool_max_size,
                # Named prepared statements live in the server session, which a pooler in
                # transaction mode hands to other clients between transactions.
                statement_cache_size=256 if self.prepared_statements else 0,
                command_timeout=self.command_timeout,
                timeout=self.connect_timeout,
                server_settings={"application_name": "openwop-memory"},
            )
            async with self._pool.acquire(timeout=self.connect_timeout) as conn:
                created = await self._migrate(conn)
                await self._measure_clock(conn)
                where: Any = await conn.fetchrow(
                    "SELECT current_database() AS db, inet_server_addr()::text AS host,"
                    " inet_server_port() AS port"
                )
        except StorageStartupError:
            await self.close()
            raise
        except (asyncpg.PostgresError, *CONNECTION_ERRORS) as exc:
            await self.close()
            raise startup_error(exc, self.dsn) from None
        gauges = await self.gauges()
        # Exact, where a count could take seconds on a large table: whether a mistyped
        # database name started an empty memory is what an operator reads this line for.
        holds_entries = await self._read(
            lambda conn: conn.fetchval("SELECT EXISTS (SELECT 1 FROM entries)")
        )
        log.info(
            "database_opened",
            backend="postgresql",
            # Where the server says it is (a Unix socket has no address): never the URL,
            # which may carry a password.
            host=where["host"] or "unix socket",
            port=where["port"],
            database=where["db"],
            created=created,
            schema_version=self._schema_version,
            holds_entries=bool(holds_entries),
            entries_estimate=gauges.entries_estimate,
        )

    async def _migrate(self, conn: Conn) -> bool:
        """Bring the schema up to date under an advisory lock, so sidecars starting together
        migrate once; refuse a schema newer than this sidecar knows. True when the schema
        was created now (the database held none of ours).

        :raises StorageStartupError: the schema is newer than this build, or there is none
            and ``create`` is false.
        """
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS openwop_schema_migrations ("
                "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            current = await conn.fetchval("SELECT max(version) FROM openwop_schema_migrations")
            current = current or 0
            if current == 0 and not self.create:
                name = await conn.fetchval("SELECT current_database()")
                raise StorageStartupError(
                    f"the PostgreSQL database {name} holds no openwop-memory tables and "
                    "create_database is false: check that the URL names the right database, "
                    "or set create_database = true to make the tables there"
                )
            for version, statements in migrations_to_run(current, MIGRATIONS):
                for statement in statements:
                    if isinstance(statement, str):
                        await conn.execute(statement)
                    else:
                        await statement(conn)
                await conn.execute(
                    "INSERT INTO openwop_schema_migrations (version) VALUES ($1)", version
                )
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('ref_mac_key', $1)"
                " ON CONFLICT (key) DO NOTHING",
                secrets.token_bytes(32),
            )
        self._schema_version = LATEST_VERSION
        return current == 0

    def clock_us(self) -> int:
        """The database's clock, read as this host's clock plus the offset between them
        (measured at start-up and again at every sweep, to within half a round trip)."""
        return wall_clock_us() + self._clock_offset_us

    async def _measure_clock(self, conn: Conn) -> None:
        before = wall_clock_us()
        database = int(await conn.fetchval(f"SELECT {DB_NOW_US}"))
        after = wall_clock_us()
        self._clock_offset_us = database - (before + after) // 2

    async def close(self) -> None:
        await self._keywords.catch_up.close()
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            with anyio.move_on_after(self.command_timeout):
                await pool.close()
            pool.terminate()
        if self._lock is not None:
            await self._lock.release()

    async def discard(self) -> None:
        await self.close()  # the tables stay: a database is the operator's to drop

    # -- plumbing ------------------------------------------------------------------------

    def _acquire(self) -> Any:
        if self._closed or self._pool is None:
            raise _unavailable("closed")
        return self._pool.acquire(timeout=self.connect_timeout + self.command_timeout)

    async def _read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """``fn`` on a pooled connection (no transaction: one statement sees one snapshot)."""
        with translate_errors():
            try:
                async with self._acquire() as conn:
                    result = await fn(conn)
            except CONNECTION_ERRORS as exc:
                await self._connection_lost(exc)
                raise
        self._connection_works()
        return result

    async def _write(self, fn: Callable[[Conn, Effects], Awaitable[T]]) -> T:
        """``fn`` in a transaction of its own, retried on a deadlock or serialization failure;
        the effects ``fn`` registers run only after COMMIT succeeded."""
        try:
            result = await self._write_once(fn)
        except UpstreamUnavailableError as exc:
            self._write_error = str(exc.details.get("reason", exc.code))
            raise
        self._write_error = None
        return result

    async def _write_once(self, fn: Callable[[Conn, Effects], Awaitable[T]]) -> T:
        with translate_errors():
            for attempt in range(_RETRIES):
                effects: Effects = []
                try:
                    async with self._acquire() as conn, conn.transaction():
                        result = await fn(conn, effects)
                except asyncpg.PostgresError as exc:
                    if is_retryable(exc) and attempt + 1 < _RETRIES:
                        continue
                    raise
                except CONNECTION_ERRORS as exc:
                    await self._connection_lost(exc)
                    raise
                for effect in effects:
                    effect()
                self._connection_works()
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connection_lost(self, exc: BaseException) -> None:
        """After a connection error, replace every pooled connection on its next use: after a
        server restart they are all dead. The first error of an outage is logged (at error:
        the line an operator's alert keys on), the others are not: one line per outage."""
        if self._unreachable_since is None:
            self._unreachable_since = anyio.current_time()
            log.error("database_unreachable", backend="postgresql", error=describe_exception(exc))
        if self._pool is not None:
            await self._pool.expire_connections()

    def _connection_works(self) -> None:
        """A call went through: if an outage was logged, log its end."""
        if self._unreachable_since is not None:
            seconds = anyio.current_time() - self._unreachable_since
            self._unreachable_since = None
            log.warning(
                "database_reachable", backend="postgresql", unreachable_seconds=round(seconds, 1)
            )

    async def _scope_pk(self, conn: Conn, scope: Scope, effects: Effects) -> int:
        """The scope's id, creating the scope if new (the tenant's clock is already held).

        New ids are random (never reused after a rollback) and cached only once committed.
        """
        pk = self._scope_pks.get(scope)
        if pk is not None:
            return pk
        found = await conn.fetchval(
            "SELECT scope_pk FROM scopes WHERE tenant = $1 AND key = $2", scope.tenant, scope.key
        )
        if found is None:
            found = 1 + secrets.randbits(62)
            await conn.execute(
                "INSERT INTO scopes (scope_pk, tenant, key) VALUES ($1, $2, $3)",
                found,
                scope.tenant,
                scope.key,
            )
        pk = int(found)
        effects.append(lambda: self._scope_pks.put(scope, pk))
        return pk

    # -- writes --------------------------------------------------------------------------

    async def ref_key(self) -> bytes:
        value = await self._read(
            lambda conn: conn.fetchval("SELECT value FROM meta WHERE key = 'ref_mac_key'")
        )
        return bytes(value)

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
        async def op(conn: Conn, effects: Effects) -> BeginResult:
            # Twice at most: a first begin of the same run on another sidecar may insert it
            # between our look and our insert; then we classify the run it made.
            for _ in range(2):
                row = await conn.fetchrow(
                    "SELECT snapshot_seq, snapshot_us, touched_us, as_of_us FROM runs"
                    " WHERE tenant = $1 AND run_id = $2 FOR UPDATE",
                    tenant,
                    run_id,
                )
                found = None
                if row is not None:
                    found = FoundRun(
                        row["snapshot_seq"] is not None, row["touched_us"], row["as_of_us"]
                    )
                outcome = classify_run(
                    found,
                    tenant=tenant,
                    replay=replay,
                    retention_cutoff_us=retention_cutoff_us,
                    as_of_us=as_of_us,
                )
                if outcome is BeginOutcome.RESUMED:
                    assert row is not None
                    await conn.execute(
                        "UPDATE runs SET touched_us = $3 WHERE tenant = $1 AND run_id = $2",
                        tenant,
                        run_id,
                        now_us,
                    )
                    snapshot = Snapshot(row["snapshot_seq"])
                    run = RunRecord(run_id, tenant, snapshot, row["snapshot_us"], row["as_of_us"])
                    return BeginResult(outcome, run)
                if outcome is not BeginOutcome.CREATED:
                    return REFUSED[outcome]
                # Taking the clock waits for the tenant's writes in flight: entries inside
                # the snapshot have createdAt <= its time, later ones are stamped past it.
                # Found before the clock is taken, so that a long look back at the feed
                # does not hold the tenant's writers; what committed since, under it.
                newest = None if as_of_us is None else await _newest_at(conn, tenant, as_of_us)
                clock = await conn.fetchrow(_TAKE_SNAPSHOT, tenant)
                assert clock is not None  # an upsert with RETURNING returns its row
                seq, snap_us = int(clock[0]), int(clock[1])
                if as_of_us is not None:
                    since = await _history_since(conn)
                    refused = refuse_as_of(as_of_us, clock_us=snap_us, history_since_us=since)
                    if refused is not None:
                        return REFUSED[refused]
                    if as_of_us < snap_us:
                        seq = await _as_of_seq(conn, tenant, as_of_us, newest, seq)
                    snap_us = as_of_us
                if row is not None:  # past retention: a fresh snapshot on the locked row
                    await conn.execute(
                        "UPDATE runs SET snapshot_seq = $3, snapshot_us = $4, touched_us = $5,"
                        " as_of_us = $6 WHERE tenant = $1 AND run_id = $2",
                        tenant,
                        run_id,
                        seq,
                        snap_us,
                        now_us,
                        as_of_us,
                    )
                    inserted = True
                else:
                    inserted = await conn.fetchval(
                        "INSERT INTO runs (run_id, tenant, snapshot_seq, snapshot_us, touched_us,"
                        " as_of_us) VALUES ($1, $2, $3, $4, $5, $6)"
                        " ON CONFLICT (tenant, run_id) DO NOTHING RETURNING true",
                        run_id,
                        tenant,
                        seq,
                        snap_us,
                        now_us,
                        as_of_us,
                    )
                if inserted:
                    run = RunRecord(run_id, tenant, Snapshot(seq), snap_us, as_of_us)
                    return BeginResult(BeginOutcome.CREATED, run)
            raise AssertionError("a run row inserted by another sidecar vanished")

        return await self._write(op)

    async def touch_runs(self, *, runs: Sequence[RunKey], now_us: int) -> None:
        if not runs:
            return
        ordered = sorted(runs)
        await self._write(
            lambda conn, effects: conn.execute(
                "UPDATE runs SET touched_us = $3 WHERE (tenant, run_id) IN (SELECT tenant,"
                " run_id FROM runs WHERE (tenant, run_id) IN"
                " (SELECT * FROM unnest($1::text[], $2::text[])) AND snapshot_seq IS NOT NULL"
                " ORDER BY tenant, run_id FOR UPDATE)",
                [tenant for tenant, _ in ordered],
                [run_id for _, run_id in ordered],
                now_us,
            )
        )

    async def put(self, *, request: PutRequest, now_us: int) -> PutResult:
        scope = request.scope
        tokens = estimate_tokens(request.content)

        async def op(conn: Conn, effects: Effects) -> PutResult:
            seq, created_us = await _take_clock(conn, scope.tenant, 1)
            scope_pk = await self._scope_pk(conn, scope, effects)
            key = request.idempotency_key
            if key is not None:
                # The entry's columns are NULL once the sweep erased it.
                earlier = await conn.fetchrow(
                    f"SELECT i.digest, e.seq, {_ENTRY_COLUMNS} FROM idempotency i"
                    " LEFT JOIN entries e ON e.scope_pk = i.scope_pk AND e.seq = i.entry_seq"
                    " WHERE i.scope_pk = $1 AND i.key = $2",
                    scope_pk,
                    key,
                )
                if earlier is not None:
                    if bytes(earlier[0]) != request.digest:
                        return KEY_CONFLICT
                    kept = None if earlier[1] is None else _row(tuple(earlier)[2:])
                    answer = replayed(kept, now_us)
                    if request.entry_key is None or answer.entry is None:
                        return answer
                    revision = await conn.fetchval(
                        "SELECT revision FROM entry_keys WHERE scope_pk = $1 AND seq = $2",
                        scope_pk,
                        earlier[1],
                    )
                    return dataclasses.replace(answer, revision=revision)
            head: tuple[int, int, int | None, str | None] | None = None
            if request.entry_key is not None:
                # Under the tenant's clock lock: no other writer of the key runs meanwhile.
                found = await conn.fetchrow(
                    "SELECT k.revision, k.seq, e.id, e.deleted_seq IS NULL"
                    " AND (e.expires_us IS NULL OR e.expires_us > $3) FROM entry_keys k"
                    " JOIN entries e ON e.scope_pk = k.scope_pk AND e.seq = k.seq"
                    " WHERE k.scope_pk = $1 AND k.key = $2 ORDER BY k.revision DESC LIMIT 1",
                    scope_pk,
                    request.entry_key,
                    now_us,
                )
                if found is None:
                    head = (0, 0, None, None)
                elif found[3]:
                    head = (int(found[0]), int(found[0]), int(found[1]), str(found[2]))
                else:
                    head = (int(found[0]), 0, None, None)
                expected = request.expected_revision
                if expected is not None and expected != head[1]:
                    return PutResult(PutOutcome.REVISION_CONFLICT, revision=head[1])
            row = EntryRow(
                new_entry_id(created_us),
                request.content,
                request.tags,
                created_us,
                request.expires_us,
                tokens,
            )
            await conn.execute(
                _INSERT_ENTRY,
                scope_pk,
                seq,
                row.id,
                row.content.encode(),
                orjson.dumps(row.tags).decode(),
                created_us,
                row.expires_us,
                tokens,
                request.vector,
            )
            if request.tags:
                await conn.execute(_INSERT_TAGS, scope_pk, list(request.tags), seq)
            if key is not None:
                await conn.execute(
                    "INSERT INTO idempotency (scope_pk, key, digest, entry_seq, created_us)"
                    " VALUES ($1, $2, $3, $4, $5)",
                    scope_pk,
                    key,
                    request.digest,
                    seq,
                    now_us,
                )
            if head is None:
                await conn.execute(
                    _CHANGE, scope.tenant, seq * 4, scope_pk, row.id, "put", created_us
                )
                return PutResult(PutOutcome.STORED, row)
            latest, _, current_seq, current_id = head
            await conn.execute(
                "INSERT INTO entry_keys (scope_pk, seq, key, revision) VALUES ($1, $2, $3, $4)",
                scope_pk,
                seq,
                request.entry_key,
                latest + 1,
            )
            if current_seq is not None:
                # The supersede: the old revision ends at the new one's commit position.
                await conn.execute(
                    "UPDATE entries SET deleted_seq = $3, deleted_us = $4"
                    " WHERE scope_pk = $1 AND seq = $2",
                    scope_pk,
                    current_seq,
                    seq,
                    created_us,
                )
                await conn.execute(
                    "UPDATE entry_keys SET ended_us = $3 WHERE scope_pk = $1 AND seq = $2",
                    scope_pk,
                    current_seq,
                    created_us,
                )
                await conn.execute(
                    _CHANGE, scope.tenant, seq * 4, scope_pk, current_id, "supersede", created_us
                )
            await conn.execute(
                _CHANGE, scope.tenant, seq * 4 + 1, scope_pk, row.id, "put", created_us
            )
            return PutResult(PutOutcome.STORED, row, latest + 1, current_id)

        result = await self._write(op)
        if result.outcome is PutOutcome.STORED:
            self._keywords.catch_up.note_put()
        return result

    async def set_vectors(self, vectors: Sequence[tuple[str, bytes]]) -> None:
        async def op(conn: Conn, effects: Effects) -> None:
            await conn.executemany(
                "UPDATE entries SET embedding = $2 WHERE id = $1 AND embedding = $3",
                [(entry_id, vector, PENDING_VECTOR) for entry_id, vector in vectors],
            )

        if vectors:
            await self._write(op)

    async def delete(self, *, scope: Scope, entry_id: str, now_us: int) -> bool:
        async def op(conn: Conn, effects: Effects) -> bool:
            seq, deleted_us = await _take_clock(conn, scope.tenant, 1)
            found = await conn.fetchrow(
                "UPDATE entries SET deleted_seq = $3, deleted_us = $6"
                f" WHERE id = $4 AND scope_pk = {_SCOPE_PK}"
                " AND deleted_seq IS NULL AND (expires_us IS NULL OR expires_us > $5)"
                " RETURNING scope_pk, seq",
                scope.tenant,
                scope.key,
                seq,
                entry_id,
                now_us,
                deleted_us,
            )
            if found is None:
                return False
            # A keyed revision's end, from which its history is kept for the retention.
            await conn.execute(
                "UPDATE entry_keys SET ended_us = $3 WHERE scope_pk = $1 AND seq = $2",
                found[0],
                found[1],
                deleted_us,
            )
            await conn.execute(
                _CHANGE, scope.tenant, seq * 4, found[0], entry_id, "delete", deleted_us
            )
            return True

        return await self._write(op)

    # -- reads ---------------------------------------------------------------------------

    async def find_runs(self, *, run_id: str, retention_cutoff_us: int) -> Sequence[RunRecord]:
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT tenant, snapshot_seq, snapshot_us, as_of_us FROM runs WHERE run_id = $1"
                " AND snapshot_seq IS NOT NULL AND touched_us > $2 ORDER BY tenant",
                run_id,
                retention_cutoff_us,
            )
        )
        return [RunRecord(run_id, row[0], Snapshot(row[1]), row[2], row[3]) for row in rows]

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
        await self._keywords.through(
            tenant=scope.tenant, scope_key=scope.key, snapshot=cast(int, snapshot)
        )
        # plainto_tsquery reads each term as plain words (no query syntax); a stop word
        # becomes an empty query, which matches nothing.
        args: list[Any] = [scope.tenant, scope.key, cast(int, snapshot), now_us, limit]
        args += [list(terms), max_tokens, tag]
        conditions = _where_sql(where, args)
        budget = max_tokens is not None
        sql = (
            f"WITH q (term, query) AS (SELECT ord, plainto_tsquery('{SEARCH_CONFIG}', word)"
            " FROM unnest($6::text[]) WITH ORDINALITY AS u (word, ord)),"
            " v (seq, term) AS (SELECT e.seq, q.term FROM entries e JOIN q"
            f" ON e.search @@ q.query WHERE e.scope_pk = {_SCOPE_PK} AND {_VISIBLE}"
            " AND ($8::text IS NULL OR EXISTS (SELECT 1 FROM entry_tags t"
            f" WHERE t.scope_pk = e.scope_pk AND t.tag = $8 AND t.seq = e.seq)){conditions}),"
            " n (total) AS (SELECT count(DISTINCT seq) FROM v),"
            " df (term, cnt) AS (SELECT term, count(*) FROM v GROUP BY term),"
            " s (seq, score) AS (SELECT v.seq, round(sum(ln(1.0 + ((SELECT total FROM n)"
            " - df.cnt + 0.5) / (df.cnt + 0.5)))::numeric, 9) FROM v JOIN df"
            " ON df.term = v.term GROUP BY v.seq)"
            f" SELECT {best_matches(_KEYWORD_SQL, _ENTRY_COLUMNS, rows=rows, budget=budget)}"
        )
        found = await self._read(lambda conn: conn.fetch(sql, *args))
        if not found:
            return KeywordCandidates([])
        counts = tuple(int(n) for n in found[0][3].split(","))
        hits = [(r[0], float(r[1])) for r in found]
        read = {r[0]: _row(tuple(r)[4:]) for r in found} if rows else {}
        return KeywordCandidates(hits, found[0][2], counts, read)

    async def vectors_after(self, *, scope: Scope, after: int) -> Sequence[VectorRow]:
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT e.seq, e.expires_us, e.embedding, CASE WHEN e.embedding = $4"
                " THEN e.content END FROM entries e"
                f" WHERE e.scope_pk = {_SCOPE_PK} AND e.seq > $3"
                " AND e.embedding IS NOT NULL ORDER BY e.seq",
                scope.tenant,
                scope.key,
                after,
                PENDING_VECTOR,
            )
        )
        # Content is stored as bytes here.
        return [VectorRow(r[0], r[1], r[2], None if r[3] is None else r[3].decode()) for r in rows]

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
        args: list[Any] = [scope.tenant, scope.key, cast(int, snapshot), now_us, list(seqs)]
        args += [max_tokens, tag]
        conditions = _where_sql(where, args)
        columns = f", {_ENTRY_COLUMNS}" if rows else ""
        sql = (
            f"SELECT e.seq, {_VISIBLE} AND ($6::integer IS NULL OR e.tokens <= $6)"
            " AND ($7::text IS NULL OR EXISTS (SELECT 1 FROM entry_tags t"
            f" WHERE t.scope_pk = e.scope_pk AND t.tag = $7 AND t.seq = e.seq)){conditions}"
            f"{columns} FROM entries e WHERE e.scope_pk = {_SCOPE_PK}"
            " AND e.seq = ANY($5::bigint[])"
        )
        found = await self._read(lambda conn: conn.fetch(sql, *args))
        kept = {r[0] for r in found if r[1]}
        hydrated = {r[0]: _row(tuple(r)[2:]) for r in found if r[1]} if rows else {}
        return CandidateCheck(kept, {r[0] for r in found}, hydrated)

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
        args: list[Any] = [scope.tenant, scope.key, cast(int, snapshot), now_us, limit]
        # Only a budgeted list pays for the condition; the plain one keeps its plan.
        small = ""
        if max_tokens is not None:
            args.append(max_tokens)
            small = f" AND e.tokens <= ${len(args)}"
        small += _where_sql(where, args)
        if tag is None:
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM entries e WHERE e.scope_pk = {_SCOPE_PK}"
                f" AND {_VISIBLE}{small} ORDER BY e.seq DESC LIMIT $5"
            )
        else:
            args.append(tag)
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM entry_tags t JOIN entries e"
                " ON e.scope_pk = t.scope_pk AND e.seq = t.seq"
                f" WHERE t.scope_pk = {_SCOPE_PK} AND t.tag = ${len(args)} AND t.seq <= $3"
                f" AND {_VISIBLE}{small} ORDER BY t.seq DESC LIMIT $5"
            )
        rows = await self._read(lambda conn: conn.fetch(sql, *args))
        return [_row(r) for r in rows]

    @staticmethod
    def _selection(
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
    ) -> tuple[str, builtins.list[Any]]:
        """``FROM ... WHERE ...`` of the entries a list considers, and its arguments."""
        args: list[Any] = [scope.tenant, scope.key, cast(int, snapshot), now_us]
        if tag is None:
            sql = f"FROM entries e WHERE e.scope_pk = {_SCOPE_PK} AND {_VISIBLE}"
        else:
            args.append(tag)
            sql = (
                "FROM entry_tags t JOIN entries e ON e.scope_pk = t.scope_pk AND e.seq = t.seq"
                f" WHERE t.scope_pk = {_SCOPE_PK} AND t.tag = $5 AND t.seq <= $3 AND {_VISIBLE}"
            )
        return sql + _where_sql(where, args), args

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
        selection, args = self._selection(scope, snapshot, now_us, tag, where)
        args += [2**62 if before is None else before, limit]
        sql = (
            f"SELECT e.seq, {_ENTRY_COLUMNS} {selection} AND e.seq < ${len(args) - 1}"
            f" ORDER BY e.seq DESC LIMIT ${len(args)}"
        )
        rows = await self._read(lambda conn: conn.fetch(sql, *args))
        return [(int(r[0]), _row(tuple(r)[1:])) for r in rows]

    async def count(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
    ) -> int:
        selection, args = self._selection(scope, snapshot, now_us, tag, where)
        value = await self._read(lambda conn: conn.fetchval(f"SELECT count(*) {selection}", *args))
        return int(value)

    async def changes(self, *, tenant: str, after: int, limit: int) -> Sequence[Change]:
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT c.pos, s.key, c.entry_id, c.op, c.at_us FROM changes c"
                " JOIN scopes s ON s.scope_pk = c.scope_pk WHERE c.tenant = $1 AND c.pos > $2"
                " ORDER BY c.pos LIMIT $3",
                tenant,
                after,
                limit,
            )
        )
        return [Change(*r) for r in rows]

    async def get_key(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_key: str
    ) -> tuple[EntryRow, int] | None:
        async def read(conn: Conn) -> Any:
            return await conn.fetchrow(
                f"SELECT {_ENTRY_COLUMNS}, k.revision FROM entry_keys k JOIN entries e"
                " ON e.scope_pk = k.scope_pk AND e.seq = k.seq"
                f" WHERE k.scope_pk = {_SCOPE_PK} AND k.key = $5 AND {_VISIBLE}"
                " ORDER BY k.revision DESC LIMIT 1",
                scope.tenant,
                scope.key,
                cast(int, snapshot),
                now_us,
                entry_key,
            )

        row = await self._read(read)
        return None if row is None else (_row(tuple(row)[:6]), int(row[6]))

    async def key_history(
        self, *, scope: Scope, now_us: int, entry_key: str, limit: int, before: int | None = None
    ) -> Sequence[Revision]:
        async def read(conn: Conn) -> Any:
            return await conn.fetch(
                f"SELECT {_ENTRY_COLUMNS}, k.revision, e.deleted_seq IS NULL,"
                " EXISTS (SELECT 1 FROM entry_keys k2 WHERE k2.scope_pk = e.scope_pk"
                " AND k2.seq = e.deleted_seq) FROM entry_keys k JOIN entries e"
                " ON e.scope_pk = k.scope_pk AND e.seq = k.seq"
                f" WHERE k.scope_pk = {_SCOPE_PK} AND k.key = $3"
                " AND (e.expires_us IS NULL OR e.expires_us > $4) AND k.revision < $6"
                " ORDER BY k.revision DESC LIMIT $5",
                scope.tenant,
                scope.key,
                entry_key,
                now_us,
                limit,
                2**62 if before is None else before,
            )

        revisions = []
        for r in await self._read(read):
            if r[7]:
                state = RevisionState.CURRENT
            else:
                state = RevisionState.SUPERSEDED if r[8] else RevisionState.DELETED
            revisions.append(Revision(int(r[6]), _row(tuple(r)[:6]), state))
        return revisions

    async def get(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | None:
        row = await self._read(
            lambda conn: conn.fetchrow(
                f"SELECT {_ENTRY_COLUMNS} FROM entries e WHERE e.id = $5"
                f" AND e.scope_pk = {_SCOPE_PK} AND {_VISIBLE}",
                scope.tenant,
                scope.key,
                cast(int, snapshot),
                now_us,
                entry_id,
            )
        )
        return None if row is None else _row(row)

    # -- maintenance ---------------------------------------------------------------------

    async def sweep(self, *, horizons: SweepHorizons, batch_size: int) -> SweepCounts:
        """Each batch is a short transaction of its own holding the sweep advisory lock; when
        another sidecar holds it, this pass stops (one sidecar sweeps at a time)."""
        with contextlib.suppress(UpstreamUnavailableError):  # the clocks drift apart slowly
            await self._read(self._measure_clock)

        def statement(sql: str, *params: Any) -> SweepBatch:
            return lambda: self._write(_sweep_batch(sql, params))

        return await sweep_steps(
            {
                "expired_entries": lambda: self._write(_expiry(horizons.now_us, batch_size)),
                "purged_changes": statement(
                    "DELETE FROM changes WHERE (tenant, pos) IN (SELECT tenant, pos FROM changes"
                    " WHERE at_us <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    horizons.key_cutoff_us,
                    batch_size,
                ),
                "purged_idempotency_keys": statement(
                    "DELETE FROM idempotency WHERE (scope_pk, key) IN (SELECT scope_pk, key"
                    " FROM idempotency WHERE created_us <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    horizons.key_cutoff_us,
                    batch_size,
                ),
                "expired_runs": statement(
                    "UPDATE runs SET snapshot_seq = NULL WHERE (tenant, run_id) IN (SELECT"
                    " tenant, run_id FROM runs WHERE snapshot_seq IS NOT NULL"
                    " AND touched_us <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
                    horizons.run_cutoff_us,
                    batch_size,
                ),
                "purged_runs": statement(
                    "DELETE FROM runs WHERE (tenant, run_id) IN (SELECT tenant, run_id FROM runs"
                    " WHERE snapshot_seq IS NULL AND touched_us <= $1 LIMIT $2"
                    " FOR UPDATE SKIP LOCKED)",
                    horizons.marker_cutoff_us,
                    batch_size,
                ),
                # A tombstone can go once every retained snapshot of its tenant is at or
                # past its delete (a new snapshot is always at or past it), and the delete
                # is past the replay retention (a run as of a time before it still sees it).
                "purged_tombstones": statement(
                    "DELETE FROM entries WHERE (scope_pk, seq) IN (SELECT e.scope_pk, e.seq"
                    " FROM entries e JOIN scopes s ON s.scope_pk = e.scope_pk"
                    " WHERE e.deleted_seq IS NOT NULL AND e.deleted_seq <= coalesce("
                    "(SELECT min(r.snapshot_seq) FROM runs r WHERE r.tenant = s.tenant"
                    " AND r.snapshot_seq IS NOT NULL),"
                    " (SELECT c.seq FROM tenant_clocks c WHERE c.tenant = s.tenant))"
                    f" AND coalesce(e.deleted_us, 0) <= $2 AND {_UNPINNED}"
                    " AND NOT EXISTS (SELECT 1 FROM entry_keys k"
                    " WHERE k.scope_pk = e.scope_pk AND k.seq = e.seq AND k.ended_us > $2)"
                    " LIMIT $1 FOR UPDATE OF e SKIP LOCKED)",
                    batch_size,
                    horizons.run_cutoff_us,
                ),
            },
            batch_size,
        )

    async def forget(self, *, tenant: str, tag: str, batch_size: int) -> int:
        async def op(conn: Conn, effects: Effects) -> tuple[int, int]:
            rows = await conn.fetch(
                "SELECT t.scope_pk, t.seq FROM scopes s JOIN entry_tags t"
                " ON t.scope_pk = s.scope_pk AND t.tag = $2 WHERE s.tenant = $1 LIMIT $3",
                tenant,
                tag,
                batch_size,
            )
            if rows:
                pks = [r[0] for r in rows]
                seqs = [r[1] for r in rows]
                await conn.execute(
                    "DELETE FROM idempotency WHERE (scope_pk, entry_seq) IN"
                    " (SELECT * FROM unnest($1::bigint[], $2::bigint[]))",
                    pks,
                    seqs,
                )
                # Everything kept per entry is in its row (the full-text vector, say) or
                # cascades from it (entry_tags).
                gone = await conn.fetch(
                    "DELETE FROM entries WHERE (scope_pk, seq) IN"
                    " (SELECT * FROM unnest($1::bigint[], $2::bigint[])) RETURNING scope_pk, id",
                    pks,
                    seqs,
                )
                await _record(conn, tenant, [(r[0], r[1]) for r in gone], "forget")
                # A sweep of another sidecar may have taken some of them meanwhile.
                return len(rows), len(gone)
            return 0, 0

        return await until_short(lambda: self._write(op), batch_size)

    async def list_runs(self, *, limit: int) -> Sequence[RunInfo]:
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT run_id, tenant, snapshot_us, touched_us, snapshot_seq IS NOT NULL"
                " FROM runs ORDER BY touched_us DESC LIMIT $1",
                limit,
            )
        )
        return [RunInfo(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows]

    async def list_scopes(self, *, tenant: str, now_us: int) -> Sequence[ScopeInfo]:
        rows = await self._read(
            lambda conn: conn.fetch(
                "SELECT s.key, count(e.seq) FROM scopes s LEFT JOIN entries e"
                " ON e.scope_pk = s.scope_pk AND e.deleted_seq IS NULL"
                " AND (e.expires_us IS NULL OR e.expires_us > $1)"
                " WHERE s.tenant = $2 GROUP BY s.scope_pk, s.key ORDER BY s.key",
                now_us,
                tenant,
            )
        )
        return [ScopeInfo(Scope(tenant, r[0]), int(r[1])) for r in rows]

    async def find_entry(self, *, entry_id: str) -> FoundEntry | None:
        row = await self._read(
            lambda conn: conn.fetchrow(
                f"SELECT {_ENTRY_COLUMNS}, s.tenant, s.key, e.deleted_seq IS NOT NULL,"
                # A supersede ends a revision at the seq of the row that replaced it.
                " (SELECT n.id FROM entries n WHERE n.scope_pk = e.scope_pk"
                " AND n.seq = e.deleted_seq)"
                " FROM entries e JOIN scopes s ON s.scope_pk = e.scope_pk WHERE e.id = $1",
                entry_id,
            )
        )
        if row is None:
            return None
        # The entry's columns first (six, tokens included), then the scope and tombstone.
        return FoundEntry(Scope(row[6], row[7]), _row(row), bool(row[8]), row[9])

    async def export_entries(
        self, *, now_us: int, batch_size: int
    ) -> AsyncGenerator[Sequence[StoredEntry], None]:
        # One repeatable-read transaction: every batch is read as of its first statement.
        with translate_errors():
            async with (
                self._acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                batch: list[StoredEntry] = []
                async for r in conn.cursor(
                    f"SELECT s.tenant, s.key, {_ENTRY_COLUMNS} FROM entries e"
                    " JOIN scopes s ON s.scope_pk = e.scope_pk WHERE e.deleted_seq IS NULL"
                    " AND (e.expires_us IS NULL OR e.expires_us > $1) ORDER BY s.tenant, e.seq",
                    now_us,
                    prefetch=batch_size,
                ):
                    batch.append(StoredEntry(Scope(r[0], r[1]), _row(tuple(r)[2:])))
                    if len(batch) == batch_size:
                        yield batch
                        batch = []
                if batch:
                    yield batch

    async def adopt_ref_key(self, *, key: bytes) -> bool:
        async def op(conn: Conn, effects: Effects) -> bool:
            # The migration lock: no sidecar starting now reads the key halfway.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            current = await conn.fetchval("SELECT value FROM meta WHERE key = 'ref_mac_key'")
            if current is not None and bytes(current) == key:
                return True
            if await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM scopes) OR EXISTS (SELECT 1 FROM runs)"
            ):
                return False
            await conn.execute(
                "INSERT INTO meta (key, value) VALUES ('ref_mac_key', $1)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                key,
            )
            return True

        return await self._write(op)

    async def import_entries(self, *, entries: Sequence[StoredEntry]) -> int:
        if not entries:
            return 0
        counted = [estimate_tokens(e.entry.content) for e in entries]

        async def op(conn: Conn, effects: Effects) -> int:
            found = await conn.fetch(
                "SELECT id FROM entries WHERE id = ANY($1::text[])", [e.entry.id for e in entries]
            )
            seen = {r[0] for r in found}
            by_tenant: dict[str, list[tuple[StoredEntry, int]]] = {}
            for item, tokens in zip(entries, counted, strict=True):
                if item.entry.id not in seen:
                    seen.add(item.entry.id)
                    by_tenant.setdefault(item.scope.tenant, []).append((item, tokens))
            stored = 0
            # Clocks in tenant order, so two imports cannot wait for each other in a cycle.
            for tenant in sorted(by_tenant):
                fresh = by_tenant[tenant]
                last, _ = await _take_clock(conn, tenant, len(fresh))
                at_us = await conn.fetchval(
                    "UPDATE tenant_clocks SET last_us = greatest(last_us, $2) WHERE tenant = $1"
                    " RETURNING last_us",
                    tenant,
                    max(i.entry.created_us for i, _ in fresh),
                )
                first = last - len(fresh)
                for offset, (item, tokens) in enumerate(fresh, start=1):
                    row, seq = item.entry, first + offset
                    scope_pk = await self._scope_pk(conn, item.scope, effects)
                    await conn.execute(
                        _INSERT_ENTRY,
                        scope_pk,
                        seq,
                        row.id,
                        row.content.encode(),
                        orjson.dumps(row.tags).decode(),
                        row.created_us,
                        row.expires_us,
                        tokens,
                        item.embedding,
                    )
                    if row.tags:
                        await conn.execute(_INSERT_TAGS, scope_pk, list(row.tags), seq)
                    # A put record at the import's time (the entry keeps its createdAt):
                    # the feed tells of it, and a run as of a time before the import does
                    # not see it, as no run begun then did.
                    await conn.execute(_CHANGE, tenant, seq * 4, scope_pk, row.id, "put", at_us)
                stored += len(fresh)
            return stored

        stored: int = await self._write(op)
        # An import is an operator's offline step: it indexes what it wrote, so the first
        # search after it does not.
        await self._keywords.catch_up.everything()
        return stored

    async def gauges(self) -> StorageGauges:
        async def read(conn: Conn) -> Any:
            # reltuples is the planner's estimate of the rows (-1 before the table's first
            # ANALYZE): an exact count would scan the table at every scrape.
            return await conn.fetchrow(
                "SELECT pg_database_size(current_database()) AS size,"
                " (SELECT reltuples FROM pg_class WHERE oid = 'entries'::regclass) AS entries,"
                " (SELECT reltuples FROM pg_class WHERE oid = 'scopes'::regclass) AS scopes"
            )

        row = await self._read(read)

        def estimate(value: float) -> int | None:
            return None if value < 0 else int(value)

        return StorageGauges(
            database_bytes=int(row["size"]),
            entries_estimate=estimate(row["entries"]),
            scopes_estimate=estimate(row["scopes"]),
        )

    async def health(self) -> StorageHealth:
        """``writes_failing`` (and ``lastWriteError``) while the latest write failed; a health
        check then tries an empty write first, so health turns ok by itself."""

        async def probe(conn: Conn) -> Any:
            return await conn.fetchval("SELECT current_setting('server_version_num')::int")

        version = await self._read(probe)
        if self._write_error is not None:
            with contextlib.suppress(UpstreamUnavailableError):
                await self._write(_empty_write)
        problems = () if self._write_error is None else ("writes_failing",)
        failure = {} if self._write_error is None else {"lastWriteError": self._write_error}
        pool = self._pool
        return StorageHealth(
            backend="postgresql",
            schema_version=self._schema_version,
            problems=problems,
            properties={
                **failure,
                "serverVersion": int(version),
                "poolSize": pool.get_size() if pool is not None else 0,
                "poolIdle": pool.get_idle_size() if pool is not None else 0,
            },
        )


async def _empty_write(conn: Conn, effects: Effects) -> None:
    """A write that changes nothing: whether the database takes writes at all."""
    await conn.execute("UPDATE meta SET value = value WHERE key = 'ref_mac_key'")


async def _record(conn: Conn, tenant: str, ended: Sequence[tuple[int, str]], op: str) -> None:
    """Change records of ``tenant`` for the entries ``(scope_pk, id)`` that ``op`` ended,
    at sequence numbers of their own (the tenant's clock is taken here, if not already)."""
    if not ended:
        return
    last, at_us = await _take_clock(conn, tenant, len(ended))
    first = last - len(ended) + 1
    await conn.executemany(
        _CHANGE,
        [
            (tenant, (first + n) * 4, scope_pk, entry_id, op, at_us)
            for n, (scope_pk, entry_id) in enumerate(ended)
        ],
    )


def _expiry(now_us: int, batch_size: int) -> Callable[[Conn, Effects], Awaitable[int | None]]:
    """A batch of the expired entries' removal with a change record for each that was live
    (a deleted or superseded one had its record when it ended), under the sweep lock."""

    async def op(conn: Conn, effects: Effects) -> int | None:
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", _SWEEP_LOCK):
            return None
        gone = await conn.fetch(
            "DELETE FROM entries e WHERE (e.scope_pk, e.seq) IN (SELECT x.scope_pk, x.seq"
            " FROM entries x WHERE x.expires_us <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)"
            " RETURNING e.scope_pk, e.id, e.deleted_seq IS NULL,"
            " (SELECT s.tenant FROM scopes s WHERE s.scope_pk = e.scope_pk)",
            now_us,
            batch_size,
        )
        by_tenant: dict[str, list[tuple[int, str]]] = {}
        for scope_pk, entry_id, live, tenant in gone:
            if live:
                by_tenant.setdefault(tenant, []).append((scope_pk, entry_id))
        for tenant in sorted(by_tenant):  # clocks in one order: no cycle between sweepers
            await _record(conn, tenant, by_tenant[tenant], "expire")
        return len(gone)

    return op


async def _take_clock(conn: Conn, tenant: str, count: int) -> tuple[int, int]:
    """Reserve ``count`` sequence numbers of ``tenant`` (locking its clock until COMMIT): the
    last one reserved, and the createdAt that goes with them."""
    row = await conn.fetchrow(_TAKE_CLOCK, tenant, count)
    assert row is not None  # an upsert with RETURNING returns its row
    return int(row[0]), int(row[1])


def _sweep_batch(
    sql: str, params: tuple[Any, ...]
) -> Callable[[Conn, Effects], Awaitable[int | None]]:
    async def op(conn: Conn, effects: Effects) -> int | None:
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", _SWEEP_LOCK):
            return None
        status = await conn.execute(sql, *params)
        return int(status.rsplit(" ", 1)[-1])

    return op


def _unavailable(reason: str) -> UpstreamUnavailableError:
    return UpstreamUnavailableError(
        "the PostgreSQL database is unavailable", {"backend": "postgresql", "reason": reason}
    )


async def _history_since(conn: Conn) -> int:
    """The earliest time a run as of a time is exact from (see the schema, version 8)."""
    value = await conn.fetchval("SELECT value FROM meta WHERE key = 'history_since_us'")
    return 0 if value is None else int(bytes(value).decode())


async def _newest_at(conn: Conn, tenant: str, as_of_us: int) -> int | None:
    """The position of ``tenant``'s newest change record committed so far at or before
    ``as_of_us`` (through the feed's time index, without the tenant's clock)."""
    found = await conn.fetchval(
        "SELECT pos FROM changes WHERE tenant = $1 AND at_us <= $2"
        " ORDER BY at_us DESC, pos DESC LIMIT 1",
        tenant,
        as_of_us,
    )
    return None if found is None else int(found)


async def _as_of_seq(conn: Conn, tenant: str, as_of_us: int, newest: int | None, clock: int) -> int:
    """Holding ``tenant``'s clock, which is past ``as_of_us``: the snapshot of a run of the
    tenant begun then (see :func:`~storage.base.as_of_position`), from ``newest`` (see
    :func:`_newest_at`) and the records committed after it, which the clock's lock waited
    for; they come after it in position, so a short walk forward finds the last one at
    or before ``as_of_us``, or the first after it. A change record's position is its
    write's sequence number times 4 plus its index in the write."""
    after = -1 if newest is None else newest
    first_after = None
    while first_after is None:
        rows = await conn.fetch(
            "SELECT pos, at_us FROM changes WHERE tenant = $1 AND pos > $2 ORDER BY pos LIMIT 64",
            tenant,
            after,
        )
        for pos, at_us in rows:
            if at_us > as_of_us:
                first_after = int(pos)
                break
            newest = after = int(pos)
        if len(rows) < 64:
            break
    return as_of_position(
        at_or_before=None if newest is None else newest // 4,
        first_after=None if first_after is None else first_after // 4,
        clock=clock,
    )
