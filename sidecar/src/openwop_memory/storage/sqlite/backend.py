"""SQLite storage (aiosqlite, WAL mode) with group commit.

One writer connection applies every write of this process, each caller answered only after
its commit. Reads go to a small pool of read-only aiosqlite connections, which WAL lets run
beside the writer.

Writes go through group commit (:mod:`.writer`): puts, deletes and run begins commit
on the event loop when ``synchronous`` is NORMAL (no fsync per commit), anything else on the
writer thread; a thread of its own checkpoints the WAL.

Point reads (an entry by id, a run by id) go the other way: by default they run inline on
the event loop, on a read-only connection that never waits for a lock, because such a
lookup costs less than the hand-off to a reader thread and back (``make bench`` measures
``get``; ``[sqlite] inline_point_reads = false`` sends every read to the threads, to
compare). If the database is busy, the read falls back to a reader thread. Lists, which
can touch many pages, always go to reader threads.

Several processes may share the file: ``BEGIN IMMEDIATE`` plus ``busy_timeout`` serialise
their writers, and the clock row lives in the database, so commit order is global.

The database and a directory created for it are private to the sidecar's user (0600 and
0700, whatever the umask; SQLite gives the WAL and shared-memory files the database's
mode): whoever can read the file can read every tenant's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sqlite3
import stat
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Literal, cast

import aiosqlite
import anyio
import anyio.lowlevel
import anyio.to_thread
import orjson
import structlog
from openwop_memory_client import MemoryServiceError, UpstreamUnavailableError, ValidationError

from ...domain import NOT_NOW, NotNow, SweepHorizons, new_entry_id
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
from .errors import translate_errors, translated
from .keywords import TOKEN_FUNCTION, TOKENS_SQL, KeywordIndexer, counted, tokens_to_store
from .schema import LATEST_VERSION, MIGRATIONS
from .serve_lock import FileServeLock
from .tags import HAS_TAG_SQL, index_tags, tagged_union
from .writer import (
    BATCH_BUCKETS,
    WAL_CHECKPOINT_BYTES,
    EntryInsert,
    GroupCommit,
    KeyInsert,
    OpFn,
    Txn,
)

Synchronous = Literal["NORMAL", "FULL", "EXTRA"]

_ENTRY_COLUMNS = "e.id, e.content, e.tags, e.created_us, e.expires_us, e.tokens"
_VISIBLE = (
    "e.seq <= :snap AND (e.deleted_seq IS NULL OR e.deleted_seq > :snap)"
    " AND (e.expires_us IS NULL OR e.expires_us > :now)"
)
_SCOPE_PK = "(SELECT scope_pk FROM scopes WHERE tenant = :tenant AND key = :key)"
_KEYWORD_SQL = Dialect(
    counts="(SELECT total FROM n), (SELECT group_concat(cnt) FROM df)",
    limit=":limit",
    budget=":max_tokens",
    tokens=TOKENS_SQL,
)
_GET_SQL = (
    f"SELECT {_ENTRY_COLUMNS} FROM entries e WHERE e.id = :id"
    f" AND e.scope_pk = {_SCOPE_PK} AND {_VISIBLE}"
)
# The relevance of the visible matches ``v (seq, term)``: the sum, over the query terms an
# entry matches, of the term's inverse document frequency among the entries the snapshot
# shows in the scope (BM25's IDF), rounded so that both backends order the same way. It
# depends on nothing outside the snapshot, so a replay ranks as the original run did.
_SCORES = (
    "n (total) AS (SELECT count(DISTINCT seq) FROM v),"
    " df (term, cnt) AS (SELECT term, count(*) FROM v GROUP BY term),"
    " s (seq, score) AS (SELECT v.seq, round(sum(ln(1.0 + ((SELECT total FROM n) - df.cnt"
    " + 0.5) / (df.cnt + 0.5))), 9) FROM v JOIN df ON df.term = v.term GROUP BY v.seq)"
)
# Merges every segment of the full-text index into one, dropping deleted rows' terms.
_FTS_OPTIMIZE = "INSERT INTO entries_fts (entries_fts) VALUES ('optimize')"
# Idempotency keys pin a deleted entry (the second put returns it even after the delete);
# they pin no expired one, which the sweep erases whatever names it.
_UNPINNED = "NOT EXISTS (SELECT 1 FROM idempotency i WHERE i.entry_seq = entries.seq)"
# A keyed revision's tombstone stays for the replay retention after it ended (its history).
_HISTORY_PAST = (
    "NOT EXISTS (SELECT 1 FROM entry_keys k WHERE k.seq = entries.seq AND k.ended_us > ?)"
)
_KEY_GET_SQL = (
    f"SELECT {_ENTRY_COLUMNS}, k.revision FROM entry_keys k JOIN entries e ON e.seq = k.seq"
    f" WHERE k.scope_pk = {_SCOPE_PK} AND k.key = :ekey AND {_VISIBLE}"
    " ORDER BY k.revision DESC LIMIT 1"
)
_HISTORY_SQL = (
    f"SELECT {_ENTRY_COLUMNS}, k.revision, e.deleted_seq IS NULL,"
    " EXISTS (SELECT 1 FROM entry_keys k2 WHERE k2.seq = e.deleted_seq)"
    " FROM entry_keys k JOIN entries e ON e.seq = k.seq"
    f" WHERE k.scope_pk = {_SCOPE_PK} AND k.key = :ekey"
    " AND (e.expires_us IS NULL OR e.expires_us > :now) AND k.revision < :before"
    " ORDER BY k.revision DESC LIMIT :limit"
)
# The live entries and the scopes, exactly. Every row is counted off the narrowest index
# (about 7 ms for a million entries), then the tombstones and the expired rows the sweep
# has not erased yet are taken off through their partial indexes, which hold few rows.
_COUNTS_SQL = (
    "SELECT (SELECT count(*) FROM entries)"
    " - (SELECT count(*) FROM entries WHERE deleted_seq IS NOT NULL)"
    " - (SELECT count(*) FROM entries WHERE expires_us <= ?1 AND deleted_seq IS NULL),"
    " (SELECT count(*) FROM scopes)"
)
# Below this much free space on the database's file system, health reports ``disk_full``:
# one WAL cycle between checkpoints (WAL_CHECKPOINT_BYTES) needs about this much.
_LOW_DISK_BYTES = 16 << 20
# How long a degraded health answer may spend checking whether writes work again.
_PROBE_SECONDS = 2.0

log = structlog.get_logger("openwop_memory.storage")


async def _fetch(conn: aiosqlite.Connection, sql: str, params: Any = ()) -> list[Any]:
    return list(await conn.execute_fetchall(sql, params))


def _get_params(scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str) -> dict[str, Any]:
    return {
        "id": entry_id,
        "tenant": scope.tenant,
        "key": scope.key,
        "snap": cast(int, snapshot),
        "now": now_us,
    }


def _where_sql(where: ListFilter | None, params: dict[str, Any]) -> str:
    """The conditions of ``where`` on entries ``e`` (each starting with `` AND``), their
    values added to ``params``; ``""`` for none."""
    if where is None:
        return ""
    sql = ""
    if where.tags_any:
        params["tags_any"] = orjson.dumps(where.tags_any).decode()
        # By the row's tags column: exact whether or not the tag index has the row yet.
        sql += (
            " AND EXISTS (SELECT 1 FROM json_each(e.tags) ta"
            " WHERE ta.value IN (SELECT value FROM json_each(:tags_any)))"
        )
    if where.tags_all:
        # These are distinct, and so are an entry's tags (a put drops repeats); DISTINCT
        # all the same, so a repeated tag in a row could never count twice.
        params["tags_all"] = orjson.dumps(where.tags_all).decode()
        params["tags_all_count"] = len(where.tags_all)
        sql += (
            " AND (SELECT count(DISTINCT tl.value) FROM json_each(e.tags) tl"
            " WHERE tl.value IN (SELECT value FROM json_each(:tags_all))) = :tags_all_count"
        )
    if where.created_after_us is not None:
        params["created_after"] = where.created_after_us
        sql += " AND e.created_us > :created_after"
    if where.created_before_us is not None:
        params["created_before"] = where.created_before_us
        sql += " AND e.created_us < :created_before"
    return sql


# In a scope of more than _BIG_SCOPE entries, a term in at most _RARE_TERM entries of the
# whole database is looked up without its scope (see _keyword_query). Joining a hit to its
# entry costs about 1.4 µs, reading a posting of the scope's doclist about 6 ns: so at
# worst (a scope just past _BIG_SCOPE, a term with _RARE_TERM hits elsewhere) the lookup
# alone costs about 0.3 ms more than within the scope, the most another tenant's writing
# can add to a search; in a scope of 100,000 it saves most of 0.6 ms a term.
_BIG_SCOPE = 4096
_RARE_TERM = 256


def _more_than(match: str, n: int) -> str:
    """SQL: whether the FTS5 query ``match`` (an SQL expression) has more than ``n`` hits,
    reading at most ``n + 1`` of them."""
    return (
        "((SELECT count(*) FROM (SELECT 1 FROM entries_fts WHERE entries_fts MATCH"
        f" ({match}) LIMIT {n + 1})) > {n})"
    )


def _keyword_query(
    scope: Scope,
    snapshot: Snapshot,
    now_us: int,
    terms: Sequence[str],
    limit: int,
    tag: str | None,
    max_tokens: int | None,
    where: ListFilter | None,
    rows: bool = True,
) -> tuple[str, dict[str, Any]]:
    """The statement of a keyword search (see :meth:`Storage.keyword_candidates`) and its
    parameters; each row is an entry's ``seq``, its score, the counts and, with ``rows``,
    its :data:`_ENTRY_COLUMNS`, best first. ``terms`` is not empty."""
    params: dict[str, Any] = {
        "tenant": scope.tenant,
        "key": scope.key,
        "snap": cast(int, snapshot),
        "now": now_us,
        "limit": limit,
        "tag": tag,
        "max_tokens": max_tokens,
    }
    # One index lookup per term, each as a quoted FTS5 string (a term is letters, digits
    # and underscores only, so no query syntax reaches FTS5), ANDed with the scope's
    # column: FTS5 then reads the scope's doclist and only seeks into the term's, so
    # another tenant's use of the word costs this search nothing. But a big scope's
    # doclist is long (100,000 entries: 0.6 ms a term), and a rare term is cheaper looked
    # up alone, its few hits of other scopes dropped by the join below (see _BIG_SCOPE).
    # Two probes decide, the scope's own first: a small scope pays nothing for another
    # tenant's words. Either way the scope's hits are the same. A scope not stored yet
    # matches scope_pk 0, which no scope has.
    scope_term = (
        "'scope_pk : ' || (SELECT coalesce(max(scope_pk), 0) FROM scopes"
        " WHERE tenant = :tenant AND key = :key)"
    )
    big_scope = _more_than(scope_term, _BIG_SCOPE)
    budget = max_tokens is not None
    matches = []
    for number, term in enumerate(terms):
        params[f"t{number}"] = f'"{term}"'
        alone = f"'content : ' || :t{number}"
        matches.append(
            f"SELECT rowid, {number} FROM entries_fts WHERE entries_fts MATCH (CASE WHEN"
            f" (SELECT big FROM b) AND NOT {_more_than(alone, _RARE_TERM)} THEN {alone}"
            f" ELSE {scope_term} || ' AND ' || {alone} END)"
        )
    sql = (
        # The scope's probe once, whatever the number of terms.
        f"WITH b (big) AS MATERIALIZED (SELECT {big_scope}),"
        f" m (seq, term) AS ({' UNION ALL '.join(matches)}),"
        # CROSS JOIN keeps the matches as the outer loop: otherwise the planner may read
        # the whole scope and look each entry up among the matches.
        " v (seq, term) AS (SELECT m.seq, m.term FROM m CROSS JOIN entries e ON e.seq = m.seq"
        f" WHERE e.scope_pk = {_SCOPE_PK} AND {_VISIBLE} AND (:tag IS NULL OR {HAS_TAG_SQL})"
        f"{_where_sql(where, params)}),"
        f" {_SCORES}"
        f" SELECT {best_matches(_KEYWORD_SQL, _ENTRY_COLUMNS, rows=rows, budget=budget)}"
    )
    return sql, params


def _check_query(
    scope: Scope,
    snapshot: Snapshot,
    now_us: int,
    seqs: Sequence[int],
    tag: str | None,
    max_tokens: int | None,
    where: ListFilter | None,
    rows: bool,
) -> tuple[str, dict[str, Any]]:
    """The statement of a candidate check (see :meth:`Storage.check_candidates`) and its
    parameters: a row per candidate still stored, its ``seq``, whether the search keeps
    it, and with ``rows`` its :data:`_ENTRY_COLUMNS`."""
    params: dict[str, Any] = {
        "tenant": scope.tenant,
        "key": scope.key,
        "snap": cast(int, snapshot),
        "now": now_us,
        "tag": tag,
        "max_tokens": max_tokens,
        "seqs": orjson.dumps(list(seqs)).decode(),
    }
    conditions = _where_sql(where, params)
    columns = f", {_ENTRY_COLUMNS}" if rows else ""
    sql = (
        f"SELECT e.seq, {_VISIBLE}"
        f" AND (:max_tokens IS NULL OR {TOKENS_SQL} <= :max_tokens)"
        f" AND (:tag IS NULL OR {HAS_TAG_SQL}){conditions}{columns}"
        " FROM entries e WHERE e.seq IN (SELECT value FROM json_each(:seqs))"
        # "+": each candidate by its rowid, the scope checked on the row. Through the
        # scope's index, each was two lookups (a check of 187: 0.70 ms against 0.47).
        f" AND +e.scope_pk = {_SCOPE_PK}"
    )
    return sql, params


def _row(r: Any) -> EntryRow:
    """An entry from a row of :data:`_ENTRY_COLUMNS`."""
    entry_id, content, tags_json, created_us, expires_us, tokens = r
    tags = tuple(orjson.loads(tags_json))
    return EntryRow(entry_id, content, tags, created_us, expires_us, counted(tokens, content))


def _revision(r: Any) -> Revision:
    """A revision from a row of :data:`_ENTRY_COLUMNS`, its number, whether it is not
    deleted, and whether a revision of its key superseded it."""
    if r[7]:
        state = RevisionState.CURRENT
    else:
        state = RevisionState.SUPERSEDED if r[8] else RevisionState.DELETED
    return Revision(int(r[6]), _row(r[:6]), state)


class SqliteStorage:
    """The SQLite backend. See :class:`~openwop_memory.storage.base.Storage` for contracts."""

    def __init__(
        self,
        path: str,
        *,
        create: bool = True,
        synchronous: Synchronous = "NORMAL",
        busy_timeout_ms: int = 5000,
        read_connections: int = 2,
        inline_point_reads: bool = True,
        max_batch: int = 512,
        scope_cache_size: int = 4096,
        stuck_after: float | None = None,
        checkpoint_bytes: int = WAL_CHECKPOINT_BYTES,
        clock: Callable[[], int] = wall_clock_us,
    ) -> None:
        """``clock`` (µs since the epoch) is every time this store reads: createdAt, and
        what :meth:`clock_us` answers; the wall clock but in tests that move time."""
        self.path = path
        self._clock = clock
        self.create = create
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self.read_connections = read_connections
        self.inline_point_reads = inline_point_reads
        self._inline: sqlite3.Connection | None = None
        self.max_batch = max_batch
        # With NORMAL a commit does not fsync, so it is cheap enough for the event loop;
        # FULL and EXTRA fsync on every commit, which must not stall the loop.
        self._writer = GroupCommit(
            path,
            busy_timeout_ms=busy_timeout_ms,
            commit_on_loop=synchronous == "NORMAL",
            max_batch=max_batch,
            checkpoint_bytes=checkpoint_bytes,
            clock=clock,
        )
        self._keywords = KeywordIndexer(self._writer)
        self._readers: list[aiosqlite.Connection] = []
        self._reading: list[int] = []  # statements under way on each reader
        self._closed = False
        self._scope_pks = ScopeCache(scope_cache_size)
        # A commit in flight longer than this is stuck: waiting for another process's
        # lock ends in an error after busy_timeout, so nothing legitimate takes much longer.
        self.stuck_after = busy_timeout_ms / 1000 + 10 if stuck_after is None else stuck_after
        self._schema_version = 0
        # Set while frames of rows a sweep or a forget erased may still be in the WAL.
        self._wal_holds_erased = False
        self._lock: FileServeLock | None = None
        self._lock_exclusive = False
        self._created = False  # open() made the file, under the exclusive lock (see discard)

    @property
    def keywords(self) -> KeywordIndexer:
        """The keyword indexer of this store (its counters, its background switch)."""
        return self._keywords

    # -- lifecycle ---------------------------------------------------------------------

    def lock_at_open(self, *, exclusive: bool) -> None:
        self._lock = FileServeLock(self.path)
        self._lock_exclusive = exclusive

    async def open(self) -> None:
        if self.path == ":memory:" or self.path.startswith("file::memory:"):
            raise StorageStartupError("an in-memory SQLite database cannot be shared or use WAL")
        created = self._create_private()
        if self._lock is not None:
            self._lock.acquire(exclusive=self._lock_exclusive)
            # Only what was made under the exclusive lock is this process's to remove.
            self._created = created and self._lock_exclusive
        try:
            await self._writer.run(self._migrate, await self._writer.start(self._open_writer))
            for _ in range(self.read_connections):
                self._readers.append(await self._connect_reader())
            if self.inline_point_reads:
                self._inline = self._open_inline_reader()
        except sqlite3.Error as exc:
            await self.close()
            raise StorageStartupError(f"cannot open SQLite database {self.path}: {exc}") from None
        except StorageStartupError:
            await self.close()
            raise
        self._reading = [0] * len(self._readers)
        gauges = await self.gauges()
        log.info(
            "database_opened",
            backend="sqlite",
            path=os.path.abspath(self.path),  # noqa: ASYNC240 - no I/O: a string operation
            created=created,
            schema_version=LATEST_VERSION,
            entries=gauges.entries,
            scopes=gauges.scopes,
        )

    def _create_private(self) -> bool:
        """Create the database's directory (0700) and file (0600) if missing, so no umask
        can make them readable by others; warn about an existing file that is. True when
        the file was created now.

        :raises StorageStartupError: the directory or file cannot be created, or is missing
            and ``create`` is false.
        """
        path = os.path.abspath(self.path)
        if not self.create and not os.path.exists(path):
            raise StorageStartupError(
                f"the database {path} does not exist and create_database is false: check "
                "the path (a mistyped one would start an empty memory), or set "
                "create_database = true to make a new database there"
            )
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            created = not os.path.exists(self.path)
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            try:
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageStartupError(
                f"cannot create the database {self.path}: {exc.strerror}"
            ) from None
        if mode & 0o077:
            log.warning(
                "database_readable_by_others",
                path=self.path,
                mode=f"{mode:04o}",
                hint="anyone who can read the file reads every tenant's memory; chmod 600 it",
            )
        return created

    def _pragmas(self) -> list[str]:
        return [
            f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}",
            "PRAGMA foreign_keys = ON",
            f"PRAGMA synchronous = {self.synchronous}",
            # Deleted and expired content is overwritten, not left in free pages.
            "PRAGMA secure_delete = ON",
            "PRAGMA journal_size_limit = 67108864",
        ]

    def _check_wal(self, mode: object) -> None:
        if str(mode).lower() != "wal":
            raise StorageStartupError(
                f"SQLite refused WAL mode for {self.path} (journal_mode is {mode!r}); "
                "put the database on a local filesystem that supports shared memory"
            )

    def _open_writer(self) -> sqlite3.Connection:
        """On the writer thread: the writer connection (transactions opened explicitly),
        used by the loop and the writer thread in turn; also the checkpoint connection."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            self._check_wal(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            for pragma in self._pragmas():
                conn.execute(pragma)
            # SQLite's own checkpoint would run inside a commit, possibly on the loop; the
            # checkpoint thread checkpoints instead (see writer.py).
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_inline_reader(self) -> sqlite3.Connection:
        """The event loop's own read-only connection: it must never wait, so no busy timeout."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._check_wal(conn.execute("PRAGMA journal_mode").fetchone()[0])
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _read_inline(self, sql: str, params: Any) -> list[Any] | NotNow:
        """Rows of a lookup by key on the loop's own connection, or ``NOT_NOW`` when that
        connection is off or busy (the read must then wait for a reader thread).

        :raises UpstreamUnavailableError: the database failed.
        """
        inline = self._inline
        if inline is None or self._closed:
            return NOT_NOW
        try:
            return inline.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return NOT_NOW
            raise translated(exc) from None
        except sqlite3.Error as exc:
            raise translated(exc) from None

    async def _point_read(self, sql: str, params: Any) -> list[Any]:
        """Rows of a lookup by key: inline when possible, else on a reader thread."""
        rows = self._read_inline(sql, params)
        if not isinstance(rows, NotNow):
            return rows
        with translate_errors():
            return await self._read(sql, params)

    async def _connect_reader(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            self._check_wal((await _fetch(conn, "PRAGMA journal_mode = WAL"))[0][0])
            for pragma in [*self._pragmas(), "PRAGMA query_only = ON"]:
                await conn.execute(pragma)
            # Budgets count the rows whose count is not stored yet (keywords.TOKENS_SQL).
            await conn.create_function(TOKEN_FUNCTION, 1, estimate_tokens, deterministic=True)
        except BaseException:
            await conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """On the writer thread: bring the schema up to date, or refuse a newer one."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, applied_us INTEGER NOT NULL)"
            )
            rows = conn.execute("SELECT max(version) FROM schema_migrations").fetchall()
            current = rows[0][0] or 0
            for version, statements in migrations_to_run(current, MIGRATIONS):
                for statement in statements:
                    if isinstance(statement, str):
                        conn.execute(statement)
                    else:
                        statement(conn)
                conn.execute(
                    "INSERT INTO schema_migrations (version, applied_us) VALUES (?, ?)",
                    (version, self._clock()),
                )
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('ref_mac_key', ?)",
                (secrets.token_bytes(32),),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._schema_version = LATEST_VERSION

    async def close(self) -> None:
        await self._disconnect()
        if self._lock is not None:
            self._lock.release()

    async def discard(self) -> None:
        await self._disconnect()
        if self._created:
            for suffix in ("-wal", "-shm", "-journal", ""):  # the database last: it names them
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path + suffix)
        if self._lock is not None:
            self._lock.release()

    async def _disconnect(self) -> None:
        self._closed = True
        await self._keywords.catch_up.close()
        await self._writer.close()
        for conn in self._readers:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.close()
        self._readers.clear()
        if self._inline is not None:
            self._inline.close()
            self._inline = None

    def _scope_pk(self, txn: Txn, scope: Scope) -> int:
        """On the writer thread: the scope's id, creating the scope if it is new.

        Only committed ids enter the cache: a new scope's id is known to the rest of its
        transaction and published when that commits. Had a rolled-back id stayed cached,
        the database could hand the same id to another tenant's scope, and this scope's
        next put would land there. New ids are random rather than the next rowid, so
        even a stale id could not name another scope (AUTOINCREMENT would not do: its
        counter rolls back with the transaction that used it).
        """
        pk = self._scope_pks.get(scope)
        if pk is not None:
            return pk
        pk = txn.new_scope_pks.get(scope)
        if pk is not None:
            return pk
        rows = txn.conn.execute(
            "SELECT scope_pk FROM scopes WHERE tenant = ? AND key = ?", (scope.tenant, scope.key)
        ).fetchall()
        if rows:  # committed before this transaction began (it holds the write lock)
            pk = int(rows[0][0])
            self._scope_pks.put(scope, pk)
            return pk
        pk = 1 + secrets.randbits(62)
        txn.conn.execute(
            "INSERT INTO scopes (scope_pk, tenant, key) VALUES (?, ?, ?)",
            (pk, scope.tenant, scope.key),
        )
        txn.new_scope_pks[scope] = pk
        txn.after_commit(lambda: self._scope_pks.put(scope, pk))
        return pk

    # -- writes --------------------------------------------------------------------------

    def clock_us(self) -> int:
        return self._clock()  # one host: its own clock, the one createdAt is taken from

    async def ref_key(self) -> bytes:
        with translate_errors():
            rows = await self._read("SELECT value FROM meta WHERE key = 'ref_mac_key'")
        return bytes(rows[0][0])

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
        def op(txn: Txn) -> BeginResult:
            rows = txn.conn.execute(
                "SELECT snapshot_seq, snapshot_us, touched_us, as_of_us FROM runs"
                " WHERE tenant = ? AND run_id = ?",
                (tenant, run_id),
            ).fetchall()
            found = None
            if rows:
                snapshot_seq, snapshot_us, touched_us, found_as_of = rows[0]
                found = FoundRun(snapshot_seq is not None, touched_us, found_as_of)
            outcome = classify_run(
                found,
                tenant=tenant,
                replay=replay,
                retention_cutoff_us=retention_cutoff_us,
                as_of_us=as_of_us,
            )
            if outcome is BeginOutcome.RESUMED:  # so a row was found, and unpacked above
                txn.conn.execute(
                    "UPDATE runs SET touched_us = ? WHERE tenant = ? AND run_id = ?",
                    (now_us, tenant, run_id),
                )
                snapshot = Snapshot(snapshot_seq)
                run = RunRecord(run_id, tenant, snapshot, snapshot_us, found_as_of)
                return BeginResult(outcome, run)
            if outcome is not BeginOutcome.CREATED:
                return REFUSED[outcome]
            # Taken from the clock, so every entry inside the snapshot has createdAt <=
            # snapshotAt and every later one has createdAt > snapshotAt.
            snap_us, snap_seq = txn.last_us, txn.seq
            if as_of_us is not None:
                since = self._history_since(txn)
                refused = refuse_as_of(as_of_us, clock_us=snap_us, history_since_us=since)
                if refused is not None:
                    return REFUSED[refused]
                if as_of_us < snap_us:
                    snap_seq = _as_of_seq(txn, as_of_us)
                snap_us = as_of_us
            txn.snapshot_taken()
            txn.conn.execute(
                "INSERT INTO runs (run_id, tenant, snapshot_seq, snapshot_us, touched_us,"
                " as_of_us) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, run_id) DO UPDATE"
                " SET snapshot_seq = excluded.snapshot_seq, snapshot_us = excluded.snapshot_us,"
                " touched_us = excluded.touched_us, as_of_us = excluded.as_of_us",
                (run_id, tenant, snap_seq, snap_us, now_us, as_of_us),
            )
            run = RunRecord(run_id, tenant, Snapshot(snap_seq), snap_us, as_of_us)
            return BeginResult(BeginOutcome.CREATED, run)

        result: BeginResult = await self._writer.write(op, quick=True)
        return result

    @staticmethod
    def _history_since(txn: Txn) -> int:
        rows = txn.conn.execute("SELECT value FROM meta WHERE key = 'history_since_us'").fetchall()
        return int(rows[0][0]) if rows else 0

    async def touch_runs(self, *, runs: Sequence[RunKey], now_us: int) -> None:
        if not runs:
            return

        def op(txn: Txn) -> None:
            txn.conn.executemany(
                "UPDATE runs SET touched_us = ? WHERE tenant = ? AND run_id = ?"
                " AND snapshot_seq IS NOT NULL",
                [(now_us, tenant, run_id) for tenant, run_id in runs],
            )

        await self._writer.write(op)

    async def put(self, *, request: PutRequest, now_us: int) -> PutResult:
        tokens = tokens_to_store(request.content)  # outside the transaction: it may be long

        def op(txn: Txn) -> PutResult:
            scope_pk = self._scope_pk(txn, request.scope)
            key = request.idempotency_key
            if key is not None:
                earlier = self._keyed_entry(txn, scope_pk, key)
                if earlier is not None:
                    digest, row = earlier
                    if digest != request.digest:
                        return KEY_CONFLICT
                    answer = replayed(row, now_us)
                    if request.entry_key is None or answer.entry is None:
                        return answer
                    revision = self._revision_of(txn, answer.entry.id)
                    return dataclasses.replace(answer, revision=revision)
            head = None
            if request.entry_key is not None:
                head = self._key_head(txn, scope_pk, request.entry_key, now_us)
                expected = request.expected_revision
                if expected is not None and expected != head[1]:
                    return PutResult(PutOutcome.REVISION_CONFLICT, revision=head[1])
            seq, created_us = txn.stamp()
            row = EntryRow(
                id=new_entry_id(created_us),
                content=request.content,
                tags=request.tags,
                created_us=created_us,
                expires_us=request.expires_us,
                tokens=tokens,
            )
            txn.entries.append(
                EntryInsert(
                    seq,
                    row.id,
                    scope_pk,
                    row.content,
                    orjson.dumps(row.tags),
                    created_us,
                    row.expires_us,
                    tokens,
                    request.vector,
                )
            )
            # The tags are in the row's column; the tag index takes them later (tags.py).
            if key is not None:
                txn.keys.append(KeyInsert(scope_pk, key, request.digest, seq, now_us))
            if head is None or request.entry_key is None:
                txn.changes.append((request.scope.tenant, scope_pk, row.id, "put", created_us, seq))
                return PutResult(PutOutcome.STORED, row)
            latest, _, current_seq, current_id = head
            revision = latest + 1
            txn.later.append(
                (
                    "INSERT INTO entry_keys (seq, scope_pk, key, revision) VALUES (?, ?, ?, ?)",
                    (seq, scope_pk, request.entry_key, revision),
                )
            )
            if current_seq is not None:
                # The supersede: the old revision ends at the new one's commit position.
                txn.later.append(
                    (
                        "UPDATE entries SET deleted_seq = ?, deleted_us = ? WHERE seq = ?",
                        (seq, created_us, current_seq),
                    )
                )
                txn.later.append(
                    ("UPDATE entry_keys SET ended_us = ? WHERE seq = ?", (created_us, current_seq))
                )
                assert current_id is not None
                change = (request.scope.tenant, scope_pk, current_id, "supersede", created_us, seq)
                txn.changes.append(change)
            change = (request.scope.tenant, scope_pk, row.id, "put", created_us, seq)
            txn.changes.append(change)
            txn.key_heads[(scope_pk, request.entry_key)] = (seq, revision, row.expires_us, row.id)
            txn.revisions[seq] = revision
            return PutResult(PutOutcome.STORED, row, revision, current_id)

        result: PutResult = await self._writer.write(op, quick=True)
        if result.outcome is PutOutcome.STORED:
            self._keywords.catch_up.note_put()
        return result

    def _key_head(
        self, txn: Txn, scope_pk: int, entry_key: str, now_us: int
    ) -> tuple[int, int, int | None, str | None]:
        """The key's latest revision number (0: none stored), its current revision (0:
        none, as when the latest is deleted or expired at ``now_us``), and the current
        one's ``seq`` and id."""
        head = txn.key_heads.get((scope_pk, entry_key))  # put earlier in this transaction
        if head is not None:
            seq, revision, expires_us, entry_id = head
            if expires_us is None or expires_us > now_us:
                return revision, revision, seq, entry_id
            return revision, 0, None, None
        rows = txn.conn.execute(
            "SELECT k.revision, k.seq, e.id, e.deleted_seq IS NULL"
            " AND (e.expires_us IS NULL OR e.expires_us > ?) FROM entry_keys k"
            " JOIN entries e ON e.seq = k.seq WHERE k.scope_pk = ? AND k.key = ?"
            " ORDER BY k.revision DESC LIMIT 1",
            (now_us, scope_pk, entry_key),
        ).fetchall()
        if not rows:
            return 0, 0, None, None
        revision, seq, entry_id, live = rows[0]
        if live:
            return revision, revision, seq, entry_id
        return revision, 0, None, None

    def _revision_of(self, txn: Txn, entry_id: str) -> int | None:
        """The revision number of the keyed entry ``entry_id`` (None: not keyed)."""
        for e in txn.entries:
            if e.id == entry_id:
                return txn.revisions.get(e.seq)
        rows = txn.conn.execute(
            "SELECT k.revision FROM entries e JOIN entry_keys k ON k.seq = e.seq WHERE e.id = ?",
            (entry_id,),
        ).fetchall()
        return int(rows[0][0]) if rows else None

    def _keyed_entry(
        self, txn: Txn, scope_pk: int, key: str
    ) -> tuple[bytes, EntryRow | None] | None:
        """The digest kept for ``key`` and its entry (``None`` once the sweep erased it), or
        ``None`` when the key is not kept."""
        # Keys written earlier in this same (uncommitted) batch are still in txn.keys.
        for kept in txn.keys:
            if kept.scope_pk == scope_pk and kept.key == key:
                e = next(e for e in txn.entries if e.seq == kept.entry_seq)
                tags = tuple(orjson.loads(e.tags_json))
                tokens = counted(e.tokens, e.content)
                row = EntryRow(e.id, e.content, tags, e.created_us, e.expires_us, tokens)
                return kept.digest, row
        rows = txn.conn.execute(
            f"SELECT i.digest, e.seq, {_ENTRY_COLUMNS} FROM idempotency i"
            " LEFT JOIN entries e ON e.seq = i.entry_seq WHERE i.scope_pk = ? AND i.key = ?",
            (scope_pk, key),
        ).fetchall()
        if not rows:
            return None
        digest, seq = bytes(rows[0][0]), rows[0][1]
        return digest, None if seq is None else _row(rows[0][2:])

    async def set_vectors(self, vectors: Sequence[tuple[str, bytes]]) -> None:
        def op(txn: Txn) -> None:
            txn.conn.executemany(
                "UPDATE entries SET embedding = ? WHERE id = ? AND embedding = ?",
                [(vector, entry_id, PENDING_VECTOR) for entry_id, vector in vectors],
            )

        if vectors:
            await self._writer.write(op)

    async def delete(self, *, scope: Scope, entry_id: str, now_us: int) -> bool:
        def op(txn: Txn) -> bool:
            rows = txn.conn.execute(
                "UPDATE entries SET deleted_seq = :seq, deleted_us = :us"
                f" WHERE id = :id AND scope_pk = {_SCOPE_PK}"
                " AND deleted_seq IS NULL AND (expires_us IS NULL OR expires_us > :now)"
                " RETURNING seq, scope_pk",
                {
                    "seq": txn.seq + 1,
                    "us": txn.last_us,
                    "id": entry_id,
                    "tenant": scope.tenant,
                    "key": scope.key,
                    "now": now_us,
                },
            ).fetchall()
            if rows:
                deleted_seq, deleted_us = txn.stamp()
                # A keyed revision's end, from which its history is kept for the retention.
                txn.conn.execute(
                    "UPDATE entry_keys SET ended_us = ? WHERE seq = ?", (deleted_us, rows[0][0])
                )
                txn.changes.append(
                    (scope.tenant, rows[0][1], entry_id, "delete", deleted_us, deleted_seq)
                )
                return True
            return False

        result: bool = await self._writer.write(op, quick=True)
        return result

    # -- reads ---------------------------------------------------------------------------

    async def _read(self, sql: str, params: Any = ()) -> list[Any]:
        """``sql``'s rows, read on the reader connection with the fewest statements under
        way: a relevance search runs several side by side, and taking turns could queue
        one behind another's long statement on the same connection while the other
        connection idled.

        :raises UpstreamUnavailableError: once the store is closing.
        :raises sqlite3.Error: from the statement (callers translate it).
        """
        if self._closed or not self._readers:
            raise UpstreamUnavailableError("the sidecar is shutting down", {"backend": "sqlite"})
        reader = min(range(len(self._readers)), key=self._reading.__getitem__)
        self._reading[reader] += 1
        try:
            return await _fetch(self._readers[reader], sql, params)
        finally:
            self._reading[reader] -= 1

    async def find_runs(self, *, run_id: str, retention_cutoff_us: int) -> Sequence[RunRecord]:
        rows = await self._point_read(
            "SELECT tenant, snapshot_seq, snapshot_us, as_of_us FROM runs"
            " WHERE run_id = ? AND snapshot_seq IS NOT NULL AND touched_us > ? ORDER BY tenant",
            (run_id, retention_cutoff_us),
        )
        return [
            RunRecord(run_id, tenant, Snapshot(snap), snap_us, as_of)
            for tenant, snap, snap_us, as_of in rows
        ]

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
        await self._keywords.through(cast(int, snapshot))
        sql, params = _keyword_query(
            scope, snapshot, now_us, terms, limit, tag, max_tokens, where, rows
        )
        with translate_errors():
            found = await self._read(sql, params)
        if not found:
            return KeywordCandidates([])
        counts = tuple(int(n) for n in found[0][3].split(","))
        hits = [(r[0], float(r[1])) for r in found]
        read = {r[0]: _row(r[4:]) for r in found} if rows else {}
        return KeywordCandidates(hits, found[0][2], counts, read)

    async def vectors_after(self, *, scope: Scope, after: int) -> Sequence[VectorRow]:
        with translate_errors():
            rows = await self._read(
                "SELECT e.seq, e.expires_us, e.embedding, CASE WHEN e.embedding = :pending"
                " THEN e.content END FROM entries e"
                f" WHERE e.scope_pk = {_SCOPE_PK} AND e.seq > :after"
                " AND e.embedding IS NOT NULL ORDER BY e.seq",
                {
                    "tenant": scope.tenant,
                    "key": scope.key,
                    "after": after,
                    "pending": PENDING_VECTOR,
                },
            )
        return [VectorRow(*row) for row in rows]

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
        sql, params = _check_query(scope, snapshot, now_us, seqs, tag, max_tokens, where, rows)
        with translate_errors():
            found = await self._read(sql, params)
        kept = {r[0] for r in found if r[1]}
        hydrated = {r[0]: _row(r[2:]) for r in found if r[1]} if rows else {}
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
        params: dict[str, Any] = {
            "tenant": scope.tenant,
            "key": scope.key,
            "snap": cast(int, snapshot),
            "now": now_us,
            "limit": limit,
        }
        # Only a budgeted list pays for the condition; the plain one keeps its plan.
        small = ""
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
            small = f" AND {TOKENS_SQL} <= :max_tokens"
        small += _where_sql(where, params)
        if tag is None:
            sql = (
                f"SELECT {_ENTRY_COLUMNS} FROM entries e WHERE e.scope_pk = {_SCOPE_PK}"
                f" AND {_VISIBLE}{small} ORDER BY e.seq DESC LIMIT :limit"
            )
        else:
            params["tag"] = tag
            union = tagged_union(_ENTRY_COLUMNS, _SCOPE_PK, f" AND {_VISIBLE}{small}")
            sql = f"{union} ORDER BY 1 DESC LIMIT :limit"
        with translate_errors():
            rows = await self._read(sql, params)
        return [_row(r[-6:]) for r in rows]  # a list by tag's rows lead with their seq

    def _selection(
        self,
        columns: str,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
        before: int | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """``SELECT`` of the seq and ``columns`` of the entries a list considers (with
        ``before``, only those below it), and its parameters. With a tag it is a compound
        (:func:`tagged_union`): ordered by ``1``, never by ``e.seq``."""
        params: dict[str, Any] = {
            "tenant": scope.tenant,
            "key": scope.key,
            "snap": cast(int, snapshot),
            "now": now_us,
        }
        conditions = f" AND {_VISIBLE}{_where_sql(where, params)}"
        if before is not None:
            params["before"] = before
        if tag is None:
            sql = (
                f"SELECT e.seq, {columns} FROM entries e WHERE e.scope_pk = {_SCOPE_PK}{conditions}"
            )
            if before is not None:
                sql += " AND e.seq < :before"
        else:
            params["tag"] = tag
            top = ":snap" if before is None else "min(:snap, :before - 1)"
            sql = tagged_union(columns, _SCOPE_PK, conditions, top)
        return sql, params

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
        selection, params = self._selection(
            _ENTRY_COLUMNS, scope, snapshot, now_us, tag, where, 2**62 if before is None else before
        )
        params["limit"] = limit
        sql = f"{selection} ORDER BY 1 DESC LIMIT :limit"
        with translate_errors():
            rows = await self._read(sql, params)
        return [(int(r[0]), _row(r[1:])) for r in rows]

    async def count(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
    ) -> int:
        selection, params = self._selection("1", scope, snapshot, now_us, tag, where)
        with translate_errors():
            rows = await self._read(f"SELECT count(*) FROM ({selection})", params)
        return int(rows[0][0])

    async def changes(self, *, tenant: str, after: int, limit: int) -> Sequence[Change]:
        with translate_errors():
            rows = await self._read(
                "SELECT c.pos, s.key, c.entry_id, c.op, c.at_us FROM changes c"
                " JOIN scopes s ON s.scope_pk = c.scope_pk WHERE c.tenant = ? AND c.pos > ?"
                " ORDER BY c.pos LIMIT ?",
                (tenant, after, limit),
            )
        return [Change(*r) for r in rows]

    async def get_key(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_key: str
    ) -> tuple[EntryRow, int] | None:
        params = {
            "tenant": scope.tenant,
            "key": scope.key,
            "snap": cast(int, snapshot),
            "now": now_us,
            "ekey": entry_key,
        }
        rows = await self._point_read(_KEY_GET_SQL, params)
        return (_row(rows[0][:6]), int(rows[0][6])) if rows else None

    async def key_history(
        self, *, scope: Scope, now_us: int, entry_key: str, limit: int, before: int | None = None
    ) -> Sequence[Revision]:
        params = {
            "tenant": scope.tenant,
            "key": scope.key,
            "now": now_us,
            "ekey": entry_key,
            "limit": limit,
            "before": 2**62 if before is None else before,
        }
        with translate_errors():
            rows = await self._read(_HISTORY_SQL, params)
        return [_revision(r) for r in rows]

    def get_now(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | NotNow | None:
        rows = self._read_inline(_GET_SQL, _get_params(scope, snapshot, now_us, entry_id))
        if isinstance(rows, NotNow):
            return rows
        return _row(rows[0]) if rows else None

    async def get(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | None:
        rows = await self._point_read(_GET_SQL, _get_params(scope, snapshot, now_us, entry_id))
        return _row(rows[0]) if rows else None

    # -- maintenance ---------------------------------------------------------------------

    async def sweep(self, *, horizons: SweepHorizons, batch_size: int) -> SweepCounts:
        def statement(sql: str, *params: Any) -> SweepBatch:
            return lambda: self._writer.write(_statement(sql, (*params, batch_size)))

        counts = await sweep_steps(
            {
                "expired_entries": lambda: self._writer.write(_expiry(horizons.now_us, batch_size)),
                "purged_changes": statement(
                    "DELETE FROM changes WHERE pos IN (SELECT pos FROM changes WHERE at_us <= ?"
                    " LIMIT ?)",
                    horizons.key_cutoff_us,
                ),
                "purged_idempotency_keys": statement(
                    "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency"
                    " WHERE created_us <= ? LIMIT ?)",
                    horizons.key_cutoff_us,
                ),
                "expired_runs": statement(
                    "UPDATE runs SET snapshot_seq = NULL WHERE rowid IN (SELECT rowid FROM runs"
                    " WHERE snapshot_seq IS NOT NULL AND touched_us <= ? LIMIT ?)",
                    horizons.run_cutoff_us,
                ),
                "purged_runs": statement(
                    "DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs"
                    " WHERE snapshot_seq IS NULL AND touched_us <= ? LIMIT ?)",
                    horizons.marker_cutoff_us,
                ),
                # A tombstone can go once every retained snapshot is at or past its delete,
                # and the delete is past the replay retention (a run as of a time before it
                # still sees the entry).
                "purged_tombstones": statement(
                    "DELETE FROM entries WHERE seq IN (SELECT seq FROM entries WHERE deleted_seq"
                    " <= coalesce((SELECT min(snapshot_seq) FROM runs WHERE snapshot_seq IS NOT"
                    " NULL), (SELECT seq FROM clock)) AND coalesce(deleted_us, 0) <= ?"
                    f" AND {_UNPINNED} AND {_HISTORY_PAST} LIMIT ?)",
                    horizons.run_cutoff_us,
                    horizons.run_cutoff_us,
                ),
            },
            batch_size,
        )
        if counts.expired_entries:
            await self._erase_expired(counts)
        elif self._wal_holds_erased:
            self._wal_holds_erased = not await self._empty_wal()
        else:
            with contextlib.suppress(MemoryServiceError):
                await self._writer.checkpoint("PASSIVE")
        return counts

    async def _erase_expired(self, counts: SweepCounts) -> None:
        """After a sweep deleted expired rows (``secure_delete`` zeroes them in their pages):
        merge the full-text index, whose old segments still hold their terms, then empty
        the WAL, whose older frames still hold the rows. A WAL a reader holds is emptied at
        a later sweep; a failed merge is a failed step in ``counts``."""
        try:
            await self._writer.write(_statement(_FTS_OPTIMIZE, ()))
        except MemoryServiceError as exc:
            counts.errors.append(f"erase_expired: {exc.details.get('reason', exc.code)}")
        self._wal_holds_erased = not await self._empty_wal()

    async def _empty_wal(self) -> bool:
        with contextlib.suppress(MemoryServiceError):
            return await self._writer.empty_wal()
        return False

    async def forget(self, *, tenant: str, tag: str, batch_size: int) -> int:
        def op(txn: Txn) -> int:
            # Every row committed before has its tags indexed first; then the tenant's
            # scopes by their unique index, and each scope's entries with the tag by
            # entry_tags' primary key; tombstones carry their tags too.
            index_tags(txn, limit=None)
            seqs = [
                r[0]
                for r in txn.conn.execute(
                    "SELECT t.seq FROM scopes s JOIN entry_tags t ON t.scope_pk = s.scope_pk"
                    " AND t.tag = ? WHERE s.tenant = ? LIMIT ?",
                    (tag, tenant, batch_size),
                ).fetchall()
            ]
            if seqs:
                doomed = orjson.dumps(seqs)
                txn.conn.execute(
                    "INSERT INTO changes (tenant, scope_pk, entry_id, op, at_us)"
                    " SELECT ?, scope_pk, id, 'forget', ? FROM entries"
                    " WHERE seq IN (SELECT value FROM json_each(?)) ORDER BY seq",
                    (tenant, txn.last_us, doomed),
                )
                txn.conn.execute(
                    "DELETE FROM idempotency WHERE entry_seq IN (SELECT value FROM json_each(?))",
                    (doomed,),
                )
                # The row's dependants go with it: entry_tags by cascade, entries_fts by
                # its trigger, and any column a later schema adds to the row.
                txn.conn.execute(
                    "DELETE FROM entries WHERE seq IN (SELECT value FROM json_each(?))", (doomed,)
                )
            return len(seqs)

        async def batch() -> tuple[int, int]:
            removed: int = await self._writer.write(op)
            return removed, removed

        total = await until_short(batch, batch_size)
        if total:
            # FTS5 forgets a row by adding a delete marker; the row's terms stay in the old
            # segments until they are merged. Merging them all now (secure_delete zeroes
            # the pages freed) leaves no term of the forgotten entries in the database
            # file once checkpointed. It rewrites the whole index in one write, holding the
            # writer meanwhile (0.15 s for 20,000 entries of 30 words, in one measurement):
            # fine for an operator's rare action. The WAL's older frames hold the rows too,
            # and a WAL that starts over is written over, not emptied: it is emptied now, as
            # after an expiry sweep (or at a later sweep, if a reader holds it).
            await self._writer.write(_statement(_FTS_OPTIMIZE, ()))
            self._wal_holds_erased = not await self._empty_wal()
        return total

    async def list_runs(self, *, limit: int) -> Sequence[RunInfo]:
        with translate_errors():
            rows = await self._read(
                "SELECT run_id, tenant, snapshot_us, touched_us, snapshot_seq IS NOT NULL"
                " FROM runs ORDER BY touched_us DESC LIMIT ?",
                (limit,),
            )
        return [RunInfo(r[0], r[1], r[2], r[3], bool(r[4])) for r in rows]

    async def list_scopes(self, *, tenant: str, now_us: int) -> Sequence[ScopeInfo]:
        with translate_errors():
            rows = await self._read(
                "SELECT s.key, count(e.seq) FROM scopes s LEFT JOIN entries e"
                " ON e.scope_pk = s.scope_pk AND e.deleted_seq IS NULL"
                " AND (e.expires_us IS NULL OR e.expires_us > ?)"
                " WHERE s.tenant = ? GROUP BY s.scope_pk ORDER BY s.key",
                (now_us, tenant),
            )
        return [ScopeInfo(Scope(tenant, key), count) for key, count in rows]

    async def find_entry(self, *, entry_id: str) -> FoundEntry | None:
        with translate_errors():
            rows = await self._read(
                f"SELECT {_ENTRY_COLUMNS}, s.tenant, s.key, e.deleted_seq IS NOT NULL,"
                # A supersede ends a revision at the seq of the row that replaced it.
                " (SELECT n.id FROM entries n WHERE n.seq = e.deleted_seq)"
                " FROM entries e JOIN scopes s ON s.scope_pk = e.scope_pk WHERE e.id = ?",
                (entry_id,),
            )
        if not rows:
            return None
        r = rows[0]
        # The entry's columns first (six, tokens included), then the scope and tombstone.
        return FoundEntry(Scope(r[6], r[7]), _row(r[:6]), bool(r[8]), r[9])

    async def export_entries(
        self, *, now_us: int, batch_size: int
    ) -> AsyncGenerator[Sequence[StoredEntry], None]:
        # A connection of its own, so a long export holds no pooled reader; one statement
        # is one read transaction, so what it returns is one consistent point.
        with translate_errors():
            conn = await self._connect_reader()
        try:
            with translate_errors():
                cursor = await conn.execute(
                    f"SELECT s.tenant, s.key, {_ENTRY_COLUMNS} FROM entries e"
                    " JOIN scopes s ON s.scope_pk = e.scope_pk WHERE e.deleted_seq IS NULL"
                    " AND (e.expires_us IS NULL OR e.expires_us > ?) ORDER BY e.seq",
                    (now_us,),
                )
            while True:
                with translate_errors():
                    rows = await cursor.fetchmany(batch_size)
                if not rows:
                    return
                yield [StoredEntry(Scope(r[0], r[1]), _row(r[2:])) for r in rows]
        finally:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await conn.close()

    async def adopt_ref_key(self, *, key: bytes) -> bool:
        def op(txn: Txn) -> bool:
            rows = txn.conn.execute("SELECT value FROM meta WHERE key = 'ref_mac_key'").fetchall()
            if rows and bytes(rows[0][0]) == key:
                return True
            held = "SELECT 1 FROM scopes UNION ALL SELECT 1 FROM runs LIMIT 1"
            if txn.conn.execute(held).fetchall():
                return False
            txn.conn.execute(
                "INSERT INTO meta (key, value) VALUES ('ref_mac_key', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key,),
            )
            return True

        adopted: bool = await self._writer.write(op)
        return adopted

    async def import_entries(self, *, entries: Sequence[StoredEntry]) -> int:
        if not entries:
            return 0
        counted = [estimate_tokens(e.entry.content) for e in entries]  # outside the write

        def op(txn: Txn) -> int:
            wanted = orjson.dumps([e.entry.id for e in entries])
            seen = {
                r[0]
                for r in txn.conn.execute(
                    "SELECT id FROM entries WHERE id IN (SELECT value FROM json_each(?))",
                    (wanted,),
                ).fetchall()
            }
            fresh = []
            for item, tokens in zip(entries, counted, strict=True):
                if item.entry.id not in seen:
                    seen.add(item.entry.id)
                    fresh.append((item, tokens))
            if not fresh:
                return 0
            # Sequence numbers of their own, past those the group commit reserved, and the
            # clock pulled up to the newest createdAt, so later puts never date below it.
            first, at_us = txn.conn.execute(
                "UPDATE clock SET seq = seq + ?, last_us = max(last_us, ?)"
                " RETURNING seq - ?, last_us",
                (
                    len(fresh),
                    max(max(i.entry.created_us for i, _ in fresh), txn.last_us),
                    len(fresh),
                ),
            ).fetchall()[0]
            for offset, (item, tokens) in enumerate(fresh, start=1):
                row, seq = item.entry, first + offset
                scope_pk = self._scope_pk(txn, item.scope)
                txn.entries.append(
                    EntryInsert(
                        seq,
                        row.id,
                        scope_pk,
                        row.content,
                        orjson.dumps(row.tags),
                        row.created_us,
                        row.expires_us,
                        tokens,
                        item.embedding,
                    )
                )
                txn.tags.extend((scope_pk, tag, seq) for tag in row.tags)
                # A put record at the import's time (the entry keeps its createdAt): the
                # feed tells of it, and a run as of a time before the import does not see
                # it, as no run begun then did.
                change = (item.scope.tenant, scope_pk, row.id, "put", at_us, seq)
                txn.changes.append(change)
            return len(fresh)

        stored: int = await self._writer.write(op)
        # An import is an operator's offline step: it indexes what it wrote, so the first
        # search after it does not.
        await self._keywords.catch_up.everything()
        return stored

    async def backup(self, *, path: str) -> int:
        return await anyio.to_thread.run_sync(self._backup, path)

    def _backup(self, path: str) -> int:
        """On a worker thread, with a connection of its own: SQLite's online backup copies
        the database as of one read transaction (writers go on in the WAL meanwhile), in
        one step, so a steady write load cannot keep restarting it."""
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise ValidationError(
                "the backup path exists; choose a new one", {"field": "path"}
            ) from None
        except OSError as exc:
            raise ValidationError(
                f"cannot create the backup file: {exc.strerror}", {"field": "path"}
            ) from None
        os.close(fd)
        try:
            with translate_errors():
                source = sqlite3.connect(self.path, isolation_level=None)
                try:
                    target = sqlite3.connect(path, isolation_level=None)
                    try:
                        source.backup(target)
                        verdict = target.execute("PRAGMA integrity_check").fetchone()[0]
                    finally:
                        target.close()
                finally:
                    source.close()
            if verdict != "ok":
                raise UpstreamUnavailableError(
                    "the backup failed its integrity check",
                    {"backend": "sqlite", "reason": "integrity_check"},
                )
            return os.path.getsize(path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise

    async def gauges(self) -> StorageGauges:
        sizes: list[int | None] = []
        for path in (self.path, f"{self.path}-wal"):
            try:
                sizes.append(os.stat(path).st_size)
            except OSError:
                sizes.append(None)
        with translate_errors():
            rows = await self._read(_COUNTS_SQL, (self._clock(),))
        entries, scopes = rows[0]
        return StorageGauges(
            database_bytes=sizes[0],
            wal_bytes=sizes[1],
            entries=entries,
            scopes=scopes,
            commits=self._writer.commits,
            committed_writes=self._writer.committed_ops,
            batch_sizes=tuple(zip((*BATCH_BUCKETS, None), self._writer.batch_sizes, strict=True)),
        )

    async def health(self) -> StorageHealth:
        """The backend's state; ``problems`` lists what makes it degraded (empty when ok):
        ``writes_failing``, ``writer_stuck``, ``disk_full`` (under 16 MiB free).

        While writes are failing, a health check first tries an empty commit, so health
        turns ok again by itself once the database can be written.
        """
        problems = self._writer.problems(self.stuck_after)
        if problems == ["writes_failing"]:
            with anyio.move_on_after(_PROBE_SECONDS), contextlib.suppress(MemoryServiceError):
                await self._writer.write(_probe)
            problems = self._writer.problems(self.stuck_after)
        try:
            st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))  # noqa: ASYNC240
        except OSError:
            pass
        else:
            if st.f_bavail * st.f_frsize < _LOW_DISK_BYTES:
                problems.append("disk_full")
        with translate_errors():
            rows = await self._read("SELECT seq FROM clock")
        properties: dict[str, str | int | bool] = {
            "journalMode": "wal",
            "synchronous": self.synchronous,
            "commitSeq": int(rows[0][0]),
        }
        if "writes_failing" in problems:
            properties["lastWriteError"] = self._writer.failure_reason
        return StorageHealth(
            backend="sqlite",
            schema_version=self._schema_version,
            problems=tuple(problems),
            properties=properties,
        )


def _expiry(now_us: int, batch_size: int) -> OpFn:
    """A batch of the expired entries' removal, with a change record for each that was
    live (a deleted or superseded one had its record when it ended)."""

    def op(txn: Txn) -> int:
        seqs = [
            r[0]
            for r in txn.conn.execute(
                "SELECT seq FROM entries WHERE expires_us <= ? LIMIT ?", (now_us, batch_size)
            ).fetchall()
        ]
        if not seqs:
            return 0
        doomed = orjson.dumps(seqs)
        txn.conn.execute(
            "INSERT INTO changes (tenant, scope_pk, entry_id, op, at_us)"
            " SELECT s.tenant, e.scope_pk, e.id, 'expire', ? FROM entries e"
            " JOIN scopes s ON s.scope_pk = e.scope_pk WHERE e.deleted_seq IS NULL"
            " AND e.seq IN (SELECT value FROM json_each(?)) ORDER BY e.seq",
            (txn.last_us, doomed),
        )
        txn.conn.execute(
            "DELETE FROM entries WHERE seq IN (SELECT value FROM json_each(?))", (doomed,)
        )
        return len(seqs)

    return op


def _probe(txn: Txn) -> None:
    """An empty write: the group commit around it still updates the clock and commits."""


def _statement(sql: str, params: tuple[Any, ...]) -> OpFn:
    def op(txn: Txn) -> int:
        return max(txn.conn.execute(sql, params).rowcount, 0)

    return op


def _as_of_seq(txn: Txn, as_of_us: int) -> int:
    """In a transaction whose clock is past ``as_of_us``: the snapshot of a run begun then
    (see :func:`~storage.base.as_of_position`). The records of this transaction's own ops
    are not written yet: those stamped at or before ``as_of_us`` are known from the
    snapshots taken since (``txn.snapshots``), the others need not count, and
    ``txn.start_seq`` stands for the clock without them."""
    if as_of_us in txn.snapshots:
        return txn.snapshots[as_of_us]
    newest = txn.conn.execute(
        "SELECT max(seq) FROM changes WHERE at_us = (SELECT max(at_us) FROM changes"
        " WHERE at_us <= ? AND seq IS NOT NULL) AND seq IS NOT NULL",
        (as_of_us,),
    ).fetchall()[0][0]
    first = None
    if newest is None:
        first = txn.conn.execute(
            "SELECT min(seq) FROM changes WHERE at_us = (SELECT min(at_us) FROM changes"
            " WHERE seq IS NOT NULL) AND seq IS NOT NULL"
        ).fetchall()[0][0]
    return as_of_position(at_or_before=newest, first_after=first, clock=txn.start_seq)
