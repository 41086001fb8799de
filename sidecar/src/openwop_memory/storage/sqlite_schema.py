"""The SQLite schema as numbered migrations, recorded in ``schema_migrations``.

Sequence numbers (``seq``) come from the one-row ``clock`` table and are the store's commit
order: an entry's ``seq`` is its creation position and doubles as its primary key, a delete
stamps ``deleted_seq``, and a run's snapshot is the ``seq`` it was taken at.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, list[str]]] = [
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
]

LATEST_VERSION = MIGRATIONS[-1][0]
