"""The PostgreSQL schema as numbered migrations, recorded in ``openwop_schema_migrations``.

Commit order is kept per tenant: each tenant has a row in ``tenant_clocks``, and every write
of that tenant increments it inside its own transaction. The row stays locked until the
write commits, so the tenant's sequence numbers are handed out in commit order, and a run's
snapshot (its tenant's sequence number when it began) is exact: every write committed
before is at or below it, every write still in flight is above it. Writers of different
tenants never wait for each other. A run only ever reads its own tenant's scopes, so an
order per tenant is all a snapshot needs.

Times are µs since the epoch, as in the SQLite schema; ``createdAt`` comes from the
database's clock, never a sidecar's. Content is stored as UTF-8 ``bytea``: the wire allows
any string, U+0000 included, which ``text`` cannot hold. Tags (no control characters) are
a JSON array in ``text``.

A migration step is an SQL statement, or a coroutine function run on the migrating
connection inside the migration's transaction (for work SQL cannot do, such as counting
tokens).

Version 2 adds retrieval: ``entries.tokens`` (the entry's estimated token count, see
:mod:`openwop_memory.token_count`, so entries over a token budget are skipped in the query)
and ``entries.search``, the ``tsvector`` of the content (``english`` configuration:
stemmed, stop words dropped) under a GIN index, made from the redacted content stored,
with U+0000 (which ``text`` cannot hold) read as a space; it holds lexemes only, never the
text itself.

Version 3 adds ``entries.embedding`` (``bytea``): the entry's vector (see
:mod:`retrieval.encoders.wordllama`), computed from the redacted content at its put when the
embedding model is installed, else NULL (older entries stay NULL and rank by keywords
only). It is part of the entry's row: whatever deletes the row deletes it. No extension
is needed: the similarity is computed by the sidecar.

Version 4 names a run by its tenant and its id together (the primary key of ``runs``), so
the same run id begun under two tenants is two runs: an id one tenant took first can
neither block another tenant's run nor tell it that the id is in use. ``runs_by_id`` serves
the lookups by id alone.

Version 5 drops the foreign key from ``idempotency`` to ``entries``: the sweeper deletes an
expired entry's row even while a key still names it, and the key (a digest, no content)
stays until replay retention ends, so that a put repeated with it is refused, not stored
again. (The constraint has PostgreSQL's default name, ``<table>_<columns>_fkey``.)

Version 7 (an extension) adds keyed entries: ``entry_keys`` names the entry rows that are
revisions of a key (the key's keyed digest, never its text) with their revision number and
when each ended, as in the SQLite schema (version 8 there). A keyed put holds its tenant's
clock row like every write, so writers of one key, on any sidecar, are serialised.
(Number 6 is left to a concurrent migration.)

Version 8 (an extension) serves reads as of a past time, as version 10 of the SQLite
schema: ``entries.deleted_us`` (so the sweep keeps a tombstone for the replay retention
after its delete), ``runs.as_of_us`` (a read-only run's time) and the ``meta`` row
``history_since_us`` (text: the earliest time such a run is exact from). A change
record's position already names its write's sequence number.

Version 9 (an extension) indexes keywords after the put's commit (``keywords.py``): a put
leaves ``entries.search`` NULL, and ``entries_unindexed``, a partial index of the rows
still NULL, is how the background and a search's catch-up find them without a scan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ...token_count import estimate_tokens

# A text search configuration, spelt once: the put, the backfill and the query must agree.
SEARCH_CONFIG = "english"

Step = str | Callable[[Any], Awaitable[None]]

_BACKFILL_BATCH = 1000


async def _count_tokens(conn: Any) -> None:
    """Give every existing entry its token count (a new one gets it at its insert)."""
    batch: list[tuple[int, int, int]] = []
    async for row in conn.cursor("SELECT scope_pk, seq, content FROM entries"):
        batch.append((row[0], row[1], estimate_tokens(bytes(row[2]).decode())))
        if len(batch) == _BACKFILL_BATCH:
            await _store_counts(conn, batch)
            batch = []
    await _store_counts(conn, batch)


async def _store_counts(conn: Any, batch: list[tuple[int, int, int]]) -> None:
    if batch:
        await conn.executemany(
            "UPDATE entries SET tokens = $3 WHERE scope_pk = $1 AND seq = $2", batch
        )


# The database's clock in µs (clock_timestamp: the time of the statement, not the transaction).
DB_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"

MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            """CREATE TABLE meta (
                key text PRIMARY KEY,
                value bytea NOT NULL
            )""",
            """CREATE TABLE tenant_clocks (
                tenant text PRIMARY KEY,
                seq bigint NOT NULL,
                last_us bigint NOT NULL
            )""",
            """CREATE TABLE scopes (
                scope_pk bigint PRIMARY KEY,
                tenant text NOT NULL,
                key text NOT NULL,
                UNIQUE (tenant, key)
            )""",
            """CREATE TABLE entries (
                scope_pk bigint NOT NULL REFERENCES scopes (scope_pk),
                seq bigint NOT NULL,
                id text NOT NULL UNIQUE,
                content bytea NOT NULL,
                tags text NOT NULL,
                created_us bigint NOT NULL,
                expires_us bigint,
                deleted_seq bigint,
                PRIMARY KEY (scope_pk, seq)
            )""",
            "CREATE INDEX entries_by_expiry ON entries (expires_us) WHERE expires_us IS NOT NULL",
            "CREATE INDEX entries_by_delete ON entries (scope_pk, deleted_seq)"
            " WHERE deleted_seq IS NOT NULL",
            """CREATE TABLE entry_tags (
                scope_pk bigint NOT NULL,
                tag text NOT NULL,
                seq bigint NOT NULL,
                PRIMARY KEY (scope_pk, tag, seq),
                FOREIGN KEY (scope_pk, seq) REFERENCES entries (scope_pk, seq) ON DELETE CASCADE
            )""",
            "CREATE INDEX entry_tags_by_entry ON entry_tags (scope_pk, seq)",
            # Until a table is analyzed the planner takes a scope for a few rows and sorts
            # all of it for a list, instead of reading the first rows off the index: analyze
            # after 1,000 changes or 2 %, not the default 50 + 10 %.
            "ALTER TABLE entries SET (autovacuum_analyze_threshold = 1000,"
            " autovacuum_analyze_scale_factor = 0.02)",
            "ALTER TABLE entry_tags SET (autovacuum_analyze_threshold = 1000,"
            " autovacuum_analyze_scale_factor = 0.02)",
            """CREATE TABLE runs (
                run_id text PRIMARY KEY,
                tenant text NOT NULL,
                snapshot_seq bigint,
                snapshot_us bigint NOT NULL,
                touched_us bigint NOT NULL
            )""",
            "CREATE INDEX runs_by_touch ON runs (touched_us)",
            "CREATE INDEX runs_by_tenant_snapshot ON runs (tenant, snapshot_seq)"
            " WHERE snapshot_seq IS NOT NULL",
            """CREATE TABLE idempotency (
                scope_pk bigint NOT NULL,
                key text NOT NULL,
                digest bytea NOT NULL,
                entry_seq bigint NOT NULL,
                created_us bigint NOT NULL,
                PRIMARY KEY (scope_pk, key),
                FOREIGN KEY (scope_pk, entry_seq) REFERENCES entries (scope_pk, seq)
            )""",
            "CREATE INDEX idempotency_by_entry ON idempotency (scope_pk, entry_seq)",
            "CREATE INDEX idempotency_by_age ON idempotency (created_us)",
        ],
    ),
    (
        2,
        [
            "ALTER TABLE entries ADD COLUMN tokens integer NOT NULL DEFAULT 0",
            _count_tokens,
            "ALTER TABLE entries ADD COLUMN search tsvector",
            # convert_from refuses U+0000; such content is indexed from its escaped form.
            f"UPDATE entries SET search = to_tsvector('{SEARCH_CONFIG}', CASE"
            " WHEN position('\\x00'::bytea IN content) = 0 THEN convert_from(content, 'UTF8')"
            " ELSE encode(content, 'escape') END)",
            "CREATE INDEX entries_search ON entries USING gin (search)",
        ],
    ),
    (3, ["ALTER TABLE entries ADD COLUMN embedding bytea"]),
    (
        4,
        [
            "ALTER TABLE runs DROP CONSTRAINT runs_pkey",
            "ALTER TABLE runs ADD PRIMARY KEY (tenant, run_id)",
            "CREATE INDEX runs_by_id ON runs (run_id)",
        ],
    ),
    (
        5,
        ["ALTER TABLE idempotency DROP CONSTRAINT IF EXISTS idempotency_scope_pk_entry_seq_fkey"],
    ),
    (
        7,
        [
            """CREATE TABLE entry_keys (
                scope_pk bigint NOT NULL,
                seq bigint NOT NULL,
                key text NOT NULL,
                revision bigint NOT NULL,
                ended_us bigint,
                PRIMARY KEY (scope_pk, seq),
                UNIQUE (scope_pk, key, revision),
                FOREIGN KEY (scope_pk, seq) REFERENCES entries (scope_pk, seq) ON DELETE CASCADE
            )""",
            # The change feed, per tenant: ``pos`` is the tenant's sequence number of the
            # write times 4 plus the record's index in it, so commit order across the fleet.
            """CREATE TABLE changes (
                tenant text NOT NULL,
                pos bigint NOT NULL,
                scope_pk bigint NOT NULL,
                entry_id text NOT NULL,
                op text NOT NULL,
                at_us bigint NOT NULL,
                PRIMARY KEY (tenant, pos)
            )""",
            "CREATE INDEX changes_by_age ON changes (at_us)",
        ],
    ),
    (
        8,
        [
            "ALTER TABLE entries ADD COLUMN deleted_us bigint",
            "ALTER TABLE runs ADD COLUMN as_of_us bigint",
            "INSERT INTO meta (key, value) SELECT 'history_since_us', convert_to(("
            f"SELECT greatest(max(last_us), {DB_NOW_US}) + 1 FROM tenant_clocks)::text, 'UTF8')"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        ],
    ),
    (9, ["CREATE INDEX entries_unindexed ON entries (scope_pk, seq) WHERE search IS NULL"]),
]

LATEST_VERSION = MIGRATIONS[-1][0]
