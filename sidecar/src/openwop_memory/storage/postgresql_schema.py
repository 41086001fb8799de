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
"""

from __future__ import annotations

# The database's clock in µs (clock_timestamp: the time of the statement, not the transaction).
DB_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"

MIGRATIONS: list[tuple[int, list[str]]] = [
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
]

LATEST_VERSION = MIGRATIONS[-1][0]
