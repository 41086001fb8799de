"""The SQLite schema as numbered migrations, recorded in ``schema_migrations``.

Sequence numbers (``seq``) come from the one-row ``clock`` table and are the store's commit
order: an entry's ``seq`` is its creation position and doubles as its primary key, a delete
stamps ``deleted_seq``, and a run's snapshot is the ``seq`` it was taken at.

A migration step is an SQL statement, or a function run on the writer connection inside
the migration's transaction (for work SQL cannot do, such as counting tokens).

Version 2 adds retrieval: ``entries.tokens`` (the entry's estimated token count, see
:mod:`openwop_memory.token_count`, so entries over a token budget are skipped in the query)
and ``entries_fts``, an FTS5 index of the content. The index is *external content*: it
keeps terms and positions, never a copy of the text, and triggers keep it in the same
transaction as every insert and delete of an entry (content never changes). It indexes
exactly what ``entries`` stores, which is redacted content only.

Version 3 adds ``entries.embedding``: the entry's vector (see :mod:`retrieval.encoders.wordllama`),
computed from the redacted content at its put when the embedding model is installed, else
NULL (entries written before stay NULL and rank by keywords only). It lives in the entry's
row, so a delete, sweep or purge of the row removes it, overwritten as ``secure_delete``
overwrites the rest of the row.

Version 4 makes the full-text index scope-aware: ``entries_fts`` indexes the entry's
``scope_pk`` as a column beside its content, and a search matches ``scope_pk : N AND
content : "term"``. FTS5 walks the scope's own doclist and seeks into the term's at those
rows only, so a search costs what its scope holds, not what every tenant's memory holds
(before, a word common in another tenant's memory made an empty scope's search read that
tenant's whole doclist: a CPU amplifier and a word-frequency oracle across tenants). The
relevance statistics were already the scope's (see ``_SCORES`` in ``sqlite.py``).

Version 5 names a run by its tenant and its id together (the primary key of ``runs``), so
the same run id begun under two tenants is two runs: an id one tenant took first can
neither block another tenant's run nor tell it that the id is in use. Existing rows keep
their tenant; ``runs_by_id`` serves the lookups by id alone.

Version 6 takes the foreign key off ``idempotency.entry_seq``: the sweeper erases an expired
entry's row even while a key still names it, and the key (a digest, no content) stays
until replay retention ends, so that a put repeated with it is refused, not stored again.
SQLite cannot drop a constraint, so the table is rebuilt.

Version 8 (an extension) adds keyed entries: ``entry_keys`` names the entry rows that are
revisions of a key (the key's keyed digest, never its text) with their revision number, and
when each ended (superseded or deleted), so the sweep keeps a key's history for the replay
retention. A revision is an ordinary entry row: a supersede stamps the old row's
``deleted_seq`` with the new row's ``seq``, so every read's visibility rule applies as is.
The row goes with its entry (cascade). It also adds ``changes``, the change feed (see
``storage/base.py``). (Number 7 is left to a concurrent migration.)

Version 9 takes keyword indexing off the put's transaction: the insert trigger goes, and
``fts_progress`` records the commit position up to which every row is in ``entries_fts``
(rows written later are indexed in batches after their commit, and a search first indexes
what its snapshot holds beyond it; see ``keywords.py``). The delete trigger stays,
for the rows at or below that position only: an external-content index must not be told
to forget a row it never held.

Version 10 (an extension) serves reads as of a past time: ``changes.seq`` is the sequence
number of the write a put, supersede or delete record stands for (NULL for expiry and
forget, which change no snapshot's entries), so the feed maps a time to a snapshot;
``entries.deleted_us`` is when a row was deleted or superseded, so the sweep keeps a
tombstone for the replay retention after it (a run as of then still sees the entry);
``runs.as_of_us`` marks a read-only run begun as of that time; and the ``meta`` row
``history_since_us`` is the earliest time a run as of a time is exact from (records
written before this version carry no ``seq``).

Version 11 changes no table: from it on, ``entries.tokens`` may hold -1 (``UNCOUNTED``), a
count the keyword indexing batch has not taken yet (see ``keywords.py``). The version keeps
an older sidecar, which would take -1 for a count, from opening the file.

Version 12 writes a put's tags into ``entry_tags`` after its commit, as the keywords:
``fts_progress.tagged_seq`` is the position up to which every row's tags are there (see
``tags.py``). An older sidecar would miss the rows above it in a list by tag.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from ...token_count import estimate_tokens

Step = str | Callable[[sqlite3.Connection], None]


def _count_tokens(conn: sqlite3.Connection) -> None:
    """Give every existing entry its token count (a new one gets it at its insert)."""
    conn.create_function("openwop_estimate_tokens", 1, estimate_tokens, deterministic=True)
    try:
        conn.execute("UPDATE entries SET tokens = openwop_estimate_tokens(content)")
    finally:
        conn.create_function("openwop_estimate_tokens", 1, None)


MIGRATIONS: list[tuple[int, list[Step]]] = [
    (
        1,
        [
            """CREATE TABLE meta (
                key TEXT PRIMARY KEY,
                value BLOB NOT NULL
            )""",
            """CREATE TABLE clock (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                seq INTEGER NOT NULL,
                last_us INTEGER NOT NULL
            )""",
            "INSERT INTO clock (id, seq, last_us) VALUES (1, 0, 0)",
            """CREATE TABLE scopes (
                scope_pk INTEGER PRIMARY KEY,
                tenant TEXT NOT NULL,
                key TEXT NOT NULL,
                UNIQUE (tenant, key)
            )""",
            """CREATE TABLE entries (
                seq INTEGER PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                scope_pk INTEGER NOT NULL REFERENCES scopes (scope_pk),
                content TEXT NOT NULL,
                tags TEXT NOT NULL,
                created_us INTEGER NOT NULL,
                expires_us INTEGER,
                deleted_seq INTEGER
            )""",
            "CREATE INDEX entries_by_scope ON entries (scope_pk, seq)",
            "CREATE INDEX entries_by_expiry ON entries (expires_us) WHERE expires_us IS NOT NULL",
            "CREATE INDEX entries_by_delete ON entries (deleted_seq) WHERE deleted_seq IS NOT NULL",
            """CREATE TABLE entry_tags (
                scope_pk INTEGER NOT NULL,
                tag TEXT NOT NULL,
                seq INTEGER NOT NULL REFERENCES entries (seq) ON DELETE CASCADE,
                PRIMARY KEY (scope_pk, tag, seq)
            ) WITHOUT ROWID""",
            "CREATE INDEX entry_tags_by_entry ON entry_tags (seq)",
            """CREATE TABLE runs (
                run_id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                snapshot_seq INTEGER,
                snapshot_us INTEGER NOT NULL,
                touched_us INTEGER NOT NULL
            )""",
            "CREATE INDEX runs_by_touch ON runs (touched_us)",
            "CREATE INDEX runs_by_snapshot ON runs (snapshot_seq) WHERE snapshot_seq IS NOT NULL",
            """CREATE TABLE idempotency (
                scope_pk INTEGER NOT NULL,
                key TEXT NOT NULL,
                digest BLOB NOT NULL,
                entry_seq INTEGER NOT NULL REFERENCES entries (seq),
                created_us INTEGER NOT NULL,
                PRIMARY KEY (scope_pk, key)
            )""",
            "CREATE INDEX idempotency_by_entry ON idempotency (entry_seq)",
            "CREATE INDEX idempotency_by_age ON idempotency (created_us)",
        ],
    ),
    (
        2,
        [
            "ALTER TABLE entries ADD COLUMN tokens INTEGER NOT NULL DEFAULT 0",
            _count_tokens,
            # Porter stemming over unicode61 (diacritics folded): "running" finds "run".
            """CREATE VIRTUAL TABLE entries_fts USING fts5 (
                content, content = 'entries', content_rowid = 'seq',
                tokenize = 'porter unicode61 remove_diacritics 2'
            )""",
            """CREATE TRIGGER entries_fts_insert AFTER INSERT ON entries BEGIN
                INSERT INTO entries_fts (rowid, content) VALUES (new.seq, new.content);
            END""",
            # An external-content index forgets a row only when told the text it indexed.
            """CREATE TRIGGER entries_fts_delete AFTER DELETE ON entries BEGIN
                INSERT INTO entries_fts (entries_fts, rowid, content)
                VALUES ('delete', old.seq, old.content);
            END""",
            "INSERT INTO entries_fts (entries_fts) VALUES ('rebuild')",
        ],
    ),
    (3, ["ALTER TABLE entries ADD COLUMN embedding BLOB"]),
    (
        4,
        [
            "DROP TRIGGER entries_fts_insert",
            "DROP TRIGGER entries_fts_delete",
            "DROP TABLE entries_fts",
            # scope_pk is read from the content table like content: the integer as one token.
            """CREATE VIRTUAL TABLE entries_fts USING fts5 (
                scope_pk, content, content = 'entries', content_rowid = 'seq',
                tokenize = 'porter unicode61 remove_diacritics 2'
            )""",
            """CREATE TRIGGER entries_fts_insert AFTER INSERT ON entries BEGIN
                INSERT INTO entries_fts (rowid, scope_pk, content)
                VALUES (new.seq, new.scope_pk, new.content);
            END""",
            """CREATE TRIGGER entries_fts_delete AFTER DELETE ON entries BEGIN
                INSERT INTO entries_fts (entries_fts, rowid, scope_pk, content)
                VALUES ('delete', old.seq, old.scope_pk, old.content);
            END""",
            "INSERT INTO entries_fts (entries_fts) VALUES ('rebuild')",
        ],
    ),
    (
        5,
        [
            """CREATE TABLE runs_by_tenant (
                tenant TEXT NOT NULL,
                run_id TEXT NOT NULL,
                snapshot_seq INTEGER,
                snapshot_us INTEGER NOT NULL,
                touched_us INTEGER NOT NULL,
                PRIMARY KEY (tenant, run_id)
            )""",
            "INSERT INTO runs_by_tenant (tenant, run_id, snapshot_seq, snapshot_us, touched_us)"
            " SELECT tenant, run_id, snapshot_seq, snapshot_us, touched_us FROM runs",
            "DROP TABLE runs",
            "ALTER TABLE runs_by_tenant RENAME TO runs",
            "CREATE INDEX runs_by_id ON runs (run_id)",
            "CREATE INDEX runs_by_touch ON runs (touched_us)",
            "CREATE INDEX runs_by_snapshot ON runs (snapshot_seq) WHERE snapshot_seq IS NOT NULL",
        ],
    ),
    (
        6,
        [
            """CREATE TABLE idempotency_v4 (
                scope_pk INTEGER NOT NULL,
                key TEXT NOT NULL,
                digest BLOB NOT NULL,
                entry_seq INTEGER NOT NULL,
                created_us INTEGER NOT NULL,
                PRIMARY KEY (scope_pk, key)
            )""",
            "INSERT INTO idempotency_v4 SELECT scope_pk, key, digest, entry_seq, created_us"
            " FROM idempotency",
            "DROP TABLE idempotency",
            "ALTER TABLE idempotency_v4 RENAME TO idempotency",
            "CREATE INDEX idempotency_by_entry ON idempotency (entry_seq)",
            "CREATE INDEX idempotency_by_age ON idempotency (created_us)",
        ],
    ),
    (
        8,
        [
            """CREATE TABLE entry_keys (
                seq INTEGER PRIMARY KEY REFERENCES entries (seq) ON DELETE CASCADE,
                scope_pk INTEGER NOT NULL,
                key TEXT NOT NULL,
                revision INTEGER NOT NULL,
                ended_us INTEGER,
                UNIQUE (scope_pk, key, revision)
            )""",
            # The change feed: a content-free record of every put, supersede, delete,
            # expiry and forget, written in the transaction of the change. ``pos`` (never
            # reused: AUTOINCREMENT) is commit order, the writer being one at a time.
            """CREATE TABLE changes (
                pos INTEGER PRIMARY KEY AUTOINCREMENT,
                tenant TEXT NOT NULL,
                scope_pk INTEGER NOT NULL,
                entry_id TEXT NOT NULL,
                op TEXT NOT NULL,
                at_us INTEGER NOT NULL
            )""",
            "CREATE INDEX changes_by_tenant ON changes (tenant, pos)",
            "CREATE INDEX changes_by_age ON changes (at_us)",
        ],
    ),
    (
        9,
        [
            "DROP TRIGGER entries_fts_insert",
            "DROP TRIGGER entries_fts_delete",
            # Every row so far was indexed by the trigger, in its own transaction.
            """CREATE TABLE fts_progress (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                indexed_seq INTEGER NOT NULL
            )""",
            "INSERT INTO fts_progress (id, indexed_seq) SELECT 1, seq FROM clock",
            """CREATE TRIGGER entries_fts_delete AFTER DELETE ON entries
                WHEN old.seq <= (SELECT indexed_seq FROM fts_progress) BEGIN
                INSERT INTO entries_fts (entries_fts, rowid, scope_pk, content)
                VALUES ('delete', old.seq, old.scope_pk, old.content);
            END""",
        ],
    ),
    (
        10,
        [
            "ALTER TABLE changes ADD COLUMN seq INTEGER",
            "ALTER TABLE entries ADD COLUMN deleted_us INTEGER",
            "ALTER TABLE runs ADD COLUMN as_of_us INTEGER",
            "INSERT OR REPLACE INTO meta (key, value)"
            " SELECT 'history_since_us', last_us + 1 FROM clock",
        ],
    ),
    (11, []),
    (
        12,
        [
            # Every row so far had its tags written by its put.
            "ALTER TABLE fts_progress ADD COLUMN tagged_seq INTEGER NOT NULL DEFAULT 0",
            "UPDATE fts_progress SET tagged_seq = (SELECT seq FROM clock)",
        ],
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]
