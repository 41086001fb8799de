"""Databases as a version-1 sidecar left them, for tests of the migrations since."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import asyncpg
from openwop_memory.storage.postgresql import schema as postgresql_schema
from openwop_memory.storage.sqlite import schema as sqlite_schema

from support.backends import POSTGRES, Backend

# A statement and its parameters, in the backend's own placeholder style.
Statement = tuple[str, Sequence[object]]


def _v1_statements(backend: Backend) -> list[str]:
    migrations = (
        sqlite_schema.MIGRATIONS if backend.name == "sqlite" else postgresql_schema.MIGRATIONS
    )
    version, steps = migrations[0]
    assert version == 1
    return [s for s in steps if isinstance(s, str)]


async def make_v1_database(
    backend: Backend,
    path: Path,
    *,
    sqlite: Sequence[Statement] = (),
    postgresql: Sequence[Statement] = (),
) -> None:
    """A version-1 database of ``backend`` at ``path``, holding what the backend's
    ``sqlite`` or ``postgresql`` statements wrote after its schema was made (each run
    with executemany when its parameters are a list of rows)."""
    statements = _v1_statements(backend)
    if backend.name == "sqlite":
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
            " applied_us INTEGER NOT NULL)"
        )
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
        for sql, params in sqlite:
            if isinstance(params, list):
                conn.executemany(sql, params)
            else:
                conn.execute(sql, params)
        conn.commit()
        conn.close()
        return
    pg = await asyncpg.connect(POSTGRES.url_for(path))
    try:
        await pg.execute(
            "CREATE TABLE openwop_schema_migrations (version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for statement in statements:
            await pg.execute(statement)
        await pg.execute("INSERT INTO openwop_schema_migrations (version) VALUES (1)")
        for sql, params in postgresql:
            if isinstance(params, list):
                await pg.executemany(sql, params)
            else:
                await pg.execute(sql, *params)
    finally:
        await pg.close()
