"""Expiry that erases: an entry past its ``expiresAt`` leaves the database at the next sweep,
even though the client's idempotency key names it, and a put repeated with that key is
refused (``validation_error`` on ``entry.expiresAt``), never stored again.

End to end, with the real client and a real sidecar sweeping every 0.2 s; the storage
contract of the kept key is in tests/storage/test_storage_contract.py
(``test_a_kept_key_of_an_expired_entry_is_refused``).
"""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from openwop_memory.storage.base import PutOutcome, PutRequest, Scope
from openwop_memory.storage.postgresql import schema as postgresql_schema
from openwop_memory.storage.sqlite import schema as sqlite_schema
from openwop_memory_client import ConflictError, MemoryClient, MemoryValidationError
from support import backends
from support.names import uid
from support.on_disk import query
from support.polling import wait_for
from support.sidecar import Sidecar

# One word to the full-text index, which keeps terms lower-cased and shares leading bytes
# with the previous term: its tail is what any copy of it holds.
MARKER = "EraseMeQ7z4k9w2"
TRACE = b"q7z4k9w2"
TAG = "erasetag-q7z4k9w2"


def _stored_traces(sidecar: Sidecar) -> dict[str, int]:
    """How many traces of the marker (content, index term or tag) are still stored, by
    place: the SQLite file and its WAL read as raw bytes, or PostgreSQL's tables by query."""
    if backends.selected().name == "sqlite":
        places = {}
        for path in (sidecar.database, Path(f"{sidecar.database}-wal")):
            data = path.read_bytes() if path.exists() else b""
            places[path.name] = data.lower().count(TRACE)
        return places
    out = backends.POSTGRES.psql(
        sidecar.database,
        "SELECT (SELECT count(*) FROM entries WHERE lower(convert_from(content, 'UTF8'))"
        " LIKE '%q7z4k9w2%' OR tags LIKE '%q7z4k9w2%' OR search::text LIKE '%q7z4k9w2%'),"
        " (SELECT count(*) FROM entry_tags WHERE tag LIKE '%q7z4k9w2%')",
    )
    entries, tags = (int(v) for v in out.strip().split("|"))
    return {"entries": entries, "entry_tags": tags}


def _kept_keys(sidecar: Sidecar) -> int:
    if backends.selected().name == "sqlite":
        [(count,)] = query(sidecar.database, "SELECT count(*) FROM idempotency")
        return int(count)
    return int(backends.POSTGRES.psql(sidecar.database, "SELECT count(*) FROM idempotency"))


def test_an_expired_entry_leaves_the_database_at_the_next_sweep(workdir: Path) -> None:
    with (
        Sidecar(workdir, "--sweep-interval", "0.2") as sidecar,
        MemoryClient(sidecar.socket) as client,
    ):
        tenant = uid("t")
        ref = client.issue_ref(tenant, "agent")
        with client.run(uid("w"), tenant) as run:
            expires = datetime.now(UTC) + timedelta(seconds=1)
            # With the client's own idempotency key, as every put of the client has.
            doomed = run.put(ref, f"remember {MARKER} for a second", tags=[TAG], expires_at=expires)
            kept = run.put(ref, "kept for good")
            key = "retry-key-q7z4"
            keyed = run.put(ref, "short too", ttl=1, idempotency_key=key)
            assert keyed.expires_at is not None
            assert sum(_stored_traces(sidecar).values()) > 0  # the probe sees it
            assert _kept_keys(sidecar) == 3

            time.sleep(max((expires - datetime.now(UTC)).total_seconds(), 0) + 0.2)
            wait_for(lambda: client.stats()["entriesSwept"] >= 2, 10, "both expired swept")
            sweeps = client.stats()["sweeps"]
            wait_for(lambda: client.stats()["sweeps"] >= sweeps + 1, 10, "one more sweep")
            # Gone from every byte SQLite keeps (rows zeroed, index merged, WAL emptied),
            # or from every PostgreSQL table, while the sidecar runs.
            traces = _stored_traces(sidecar)
            assert traces == dict.fromkeys(traces, 0)
            # The keys stay (a digest each, no content), so a retry is refused.
            assert _kept_keys(sidecar) == 3
            with pytest.raises(MemoryValidationError) as refused:
                run.put(
                    ref,
                    "short too",
                    expires_at=keyed.expires_at,
                    idempotency_key=key,
                )
            assert refused.value.details.get("field") == "entry.expiresAt"
            with pytest.raises(ConflictError):
                run.put(ref, "another entry", idempotency_key=key)
        with client.run(uid("r"), tenant) as reader:
            assert reader.list(ref) == [kept]
            assert reader.get(ref, doomed.id) is None


async def _make_v3_database(backend: backends.Backend, path: Path, scope: Scope) -> None:
    """A database as a version-3 sidecar left it: one entry, and the key of its put."""
    entry = (1, "mem_kept", "written before version 4", "[]", 10)
    key = (scope_pk := 7, "k", b"d" * 32, 1, 10)
    if backend.name == "sqlite":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_us)")
        for version, steps in sqlite_schema.MIGRATIONS[:3]:
            for step in steps:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
            conn.execute("INSERT INTO schema_migrations VALUES (?, 0)", (version,))
        conn.execute("INSERT INTO scopes VALUES (?, ?, ?)", (scope_pk, scope.tenant, scope.key))
        conn.execute(
            "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us)"
            f" VALUES (?, ?, {scope_pk}, ?, ?, ?)",
            entry,
        )
        conn.execute("INSERT INTO idempotency VALUES (?, ?, ?, ?, ?)", key)
        conn.execute("UPDATE clock SET seq = 1, last_us = 10")
        conn.commit()
        conn.close()
        return
    pg = await asyncpg.connect(backends.POSTGRES.url_for(path))
    try:
        async with pg.transaction():  # as a migration runs: a cursor needs one
            await pg.execute(
                "CREATE TABLE openwop_schema_migrations (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for pg_version, pg_steps in postgresql_schema.MIGRATIONS[:3]:
                for pg_step in pg_steps:
                    if isinstance(pg_step, str):
                        await pg.execute(pg_step)
                    else:
                        await pg_step(pg)
                await pg.execute(
                    "INSERT INTO openwop_schema_migrations (version) VALUES ($1)", pg_version
                )
            await pg.execute(
                "INSERT INTO scopes VALUES ($1, $2, $3)", scope_pk, scope.tenant, scope.key
            )
            seq, entry_id, content, tags, created = entry
            await pg.execute(
                "INSERT INTO entries (scope_pk, seq, id, content, tags, created_us)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                scope_pk, seq, entry_id, content.encode(), tags, created,
            )  # fmt: skip
            await pg.execute("INSERT INTO tenant_clocks VALUES ($1, 1, 10)", scope.tenant)
            await pg.execute("INSERT INTO idempotency VALUES ($1, $2, $3, $4, $5)", *key)
    finally:
        await pg.close()


@pytest.mark.backend_independent
@pytest.mark.anyio
@pytest.mark.migrates
async def test_the_migration_keeps_the_keys_and_drops_their_foreign_key(
    backend: backends.Backend, tmp_path: Path
) -> None:
    """Migrating a version-3 database keeps every kept key (the same put still replays its entry),
    and no key constrains its entry any more (the sweep may erase an expired one)."""
    path = tmp_path / "v3.db"
    scope = Scope("t-v3", "scope")
    await _make_v3_database(backend, path, scope)
    store = backend.storage(path)
    await store.open()
    try:
        schema = sqlite_schema if backend.name == "sqlite" else postgresql_schema
        assert (await store.health()).schema_version == schema.LATEST_VERSION
        request = PutRequest(scope, "written before version 4", (), None, "k", b"d" * 32)
        replay = await store.put(request=request, now_us=store.clock_us())
        assert replay.outcome is PutOutcome.REPLAYED
        assert replay.entry is not None and replay.entry.id == "mem_kept"
    finally:
        await store.close()
    if backend.name == "sqlite":
        assert query(path, "PRAGMA foreign_key_list(idempotency)") == []
    else:
        foreign = backends.POSTGRES.psql(
            path,
            "SELECT count(*) FROM pg_constraint WHERE conrelid = 'idempotency'::regclass"
            " AND contype = 'f'",
        )
        assert int(foreign) == 0
