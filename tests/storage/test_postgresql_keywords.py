"""PostgreSQL's keyword vectors are written after the put's commit, and a search at a
snapshot ranks the same whether or not the background has caught up, whichever sidecar
wrote the rows (storage/postgresql/keywords.py). These run in every test session, on the
throwaway server (``support.postgres``)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import anyio
import pytest
from openwop_memory.retrieval.search import Search
from openwop_memory.storage.base import EntryRow, Scope, Snapshot
from openwop_memory.storage.postgresql.backend import PostgresqlStorage
from openwop_memory.storage.postgresql.keywords import BATCH
from openwop_memory.timefmt import now_us
from support.backends import BACKENDS, POSTGRES
from support.store import exported, fresh_snapshot, put_request, stored

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

SCOPE = Scope("tenant-a", "notes")


async def opened(path: Path, *, background: bool) -> PostgresqlStorage:
    store = cast(PostgresqlStorage, BACKENDS["postgresql"].storage(path))
    store.keywords.catch_up.enabled = background
    await store.open()
    return store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[PostgresqlStorage]:
    storage = await opened(tmp_path / "store", background=False)
    try:
        yield storage
    finally:
        await storage.close()


def unindexed(path: Path) -> int:
    return int(POSTGRES.psql(path, "SELECT count(*) FROM entries WHERE search IS NULL"))


def rows(path: Path) -> int:
    return int(POSTGRES.psql(path, "SELECT count(*) FROM entries"))


async def search(store: PostgresqlStorage, snapshot: Snapshot, *terms: str) -> list[EntryRow]:
    return list(
        await Search(store).search(
            scope=SCOPE, snapshot=snapshot, now_us=now_us(), terms=terms, limit=50, tag=None
        )
    )


async def test_a_put_commits_its_row_without_its_vector_and_the_background_adds_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "background"
    quiet = await opened(path, background=False)
    try:
        await stored(quiet, put_request(SCOPE, "a walrus on the beach"))
        assert rows(path) == 1 and unindexed(path) == 1  # the put wrote no vector
    finally:
        await quiet.close()
    busy = await opened(path, background=True)
    try:
        await stored(busy, put_request(SCOPE, "another walrus"))
        for _ in range(500):  # the background indexes every row, the other store's too
            if unindexed(path) == 0:
                break
            await anyio.sleep(0.01)
        assert unindexed(path) == 0 and rows(path) == 2
    finally:
        await busy.close()


async def test_a_search_indexes_what_its_snapshot_holds_first(
    store: PostgresqlStorage, tmp_path: Path
) -> None:
    entry = await stored(store, put_request(SCOPE, "a walrus on the beach"))
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    later = await stored(store, put_request(SCOPE, "a later walrus"))
    assert unindexed(tmp_path / "store") == 2
    assert [row.id for row in await search(store, snapshot, "walrus")] == [entry.id]
    # The rows of the snapshot have their vectors; the later one is left to the background.
    assert unindexed(tmp_path / "store") == 1
    assert later.id not in [row.id for row in await search(store, snapshot, "walrus")]


async def test_a_ranking_at_a_snapshot_does_not_depend_on_the_indexing_state(
    store: PostgresqlStorage,
) -> None:
    """More rows than a background batch, searched before anything was indexed, then again
    once everything is indexed and later puts use the same words: the same entries in the
    same order with the same scores."""
    for number in range(BATCH + 40):
        words = "walrus " * (1 + number % 3) + f"tusk{number % 7} ice"
        await stored(store, put_request(SCOPE, words))
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    first = await search(store, snapshot, "walrus", "tusk3")
    assert len(first) == 50
    for _ in range(30):
        await stored(store, put_request(SCOPE, "walrus tusk3"))
    await store.keywords.catch_up.everything()
    again = await search(store, snapshot, "walrus", "tusk3")
    assert [(row.id, row.score) for row in again] == [(row.id, row.score) for row in first]
    assert len({row.score for row in first}) > 1, "the scores tell the entries apart"


async def test_a_search_waits_for_rows_another_transaction_is_indexing(
    store: PostgresqlStorage, tmp_path: Path
) -> None:
    """A transaction elsewhere (another sidecar's background, say) holds the first rows
    while it indexes them: the search's catch-up waits for it, then indexes the rest, and
    finds every row of its snapshot."""
    written = [await stored(store, put_request(SCOPE, f"walrus {n}")) for n in range(6)]
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    path = tmp_path / "store"
    holding = threading.Thread(
        target=POSTGRES.psql,
        args=(
            path,
            "BEGIN; SELECT seq FROM entries WHERE search IS NULL ORDER BY seq LIMIT 3"
            " FOR UPDATE; SELECT pg_sleep(1); UPDATE entries"
            " SET search = to_tsvector('english', convert_from(content, 'UTF8'))"
            " WHERE seq IN (SELECT seq FROM entries ORDER BY seq LIMIT 3); COMMIT",
        ),
    )
    holding.start()
    for _ in range(500):  # until the rows are locked: the holder is in its sleep
        if (
            POSTGRES.psql(
                path,
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(1)%'"
                " AND pid <> pg_backend_pid() AND wait_event = 'PgSleep'",
            ).strip()
            != "0"
        ):
            break
        await anyio.sleep(0.01)
    else:
        raise AssertionError("the holder never locked the rows")
    try:
        found = await search(store, snapshot, "walrus")
    finally:
        holding.join()
    assert sorted(row.id for row in found) == sorted(entry.id for entry in written)
    assert unindexed(path) == 0


async def test_content_with_a_nul_character_is_indexed(store: PostgresqlStorage) -> None:
    entry = await stored(store, put_request(SCOPE, "walrus\x00tusk"))
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    assert [row.id for row in await search(store, snapshot, "tusk")] == [entry.id]


async def test_an_import_indexes_what_it_wrote(store: PostgresqlStorage, tmp_path: Path) -> None:
    items = await exported(await opened(tmp_path / "source", background=False), SCOPE, BATCH + 5)
    assert await store.import_entries(entries=items) == BATCH + 5
    path = tmp_path / "store"
    assert rows(path) == BATCH + 5 and unindexed(path) == 0


async def test_the_background_leaves_deleted_rows_to_the_searches_that_see_them(
    tmp_path: Path,
) -> None:
    """A deleted row, or one with an expiry, is a sweep's to remove: the background never
    takes (and locks) it, and a search at a snapshot that sees it indexes it and finds it."""
    path = tmp_path / "deleted"
    store = await opened(path, background=True)
    try:
        quiet = store.keywords.catch_up
        quiet.enabled = False
        gone = await stored(store, put_request(SCOPE, "a walrus, deleted"))
        before = await fresh_snapshot(store, SCOPE.tenant)
        assert await store.delete(scope=SCOPE, entry_id=gone.id, now_us=now_us())
        quiet.enabled = True
        await stored(store, put_request(SCOPE, "a live walrus"))
        later = now_us() + 3_600_000_000
        expiring = await stored(store, put_request(SCOPE, "an hour's walrus", expires_us=later))
        await quiet.everything()
        assert unindexed(path) == 2  # the deleted row and the expiring one
        assert [row.id for row in await search(store, before, "deleted")] == [gone.id]
        assert unindexed(path) == 1
        now = await fresh_snapshot(store, SCOPE.tenant)
        assert [row.id for row in await search(store, now, "hour")] == [expiring.id]
        assert unindexed(path) == 0
    finally:
        await store.close()
