"""SQLite's keyword index is written after the put's commit, and a search at a snapshot
ranks the same whether or not the background has caught up (storage/sqlite/keywords.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import anyio
import pytest
from openwop_memory.retrieval.search import Search
from openwop_memory.storage.base import UNCOUNTED, EntryRow, Scope, Snapshot
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.storage.sqlite.keywords import BATCH, COUNT_LATER_MAX_CHARS
from openwop_memory.timefmt import now_us
from openwop_memory.token_count import estimate_tokens
from support.on_disk import query
from support.sqlite_store import opened
from support.store import exported, fresh_snapshot, put_request, stored

pytestmark = pytest.mark.anyio

SCOPE = Scope("tenant-a", "notes")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStorage]:
    storage = SqliteStorage(str(tmp_path / "store.db"))
    await storage.open()
    try:
        yield storage
    finally:
        await storage.close()


def progress(store: SqliteStorage) -> int:
    [(seq,)] = query(Path(store.path), "SELECT indexed_seq FROM fts_progress")
    return int(seq)


def index_rows(store: SqliteStorage) -> list[int]:
    found = query(
        Path(store.path), "SELECT rowid FROM entries_fts WHERE entries_fts MATCH 'walrus'"
    )
    return sorted(int(seq) for (seq,) in found)


def seqs(store: SqliteStorage) -> list[int]:
    return sorted(int(seq) for (seq,) in query(Path(store.path), "SELECT seq FROM entries"))


async def search(store: SqliteStorage, snapshot: Snapshot, *terms: str) -> list[EntryRow]:
    return list(
        await Search(store).search(
            scope=SCOPE, snapshot=snapshot, now_us=now_us(), terms=terms, limit=50, tag=None
        )
    )


async def wait_indexed(store: SqliteStorage) -> None:
    """Poll (the background's progress is in the file, not an event) for up to 5 s."""
    for _ in range(500):
        if progress(store) >= max(seqs(store)):
            return
        await anyio.sleep(0.01)
    raise AssertionError("the background did not index the rows")


async def test_a_put_commits_its_row_and_no_index_terms(store: SqliteStorage) -> None:
    # No await between the put and the reads: the background has not run yet.
    await stored(store, put_request(SCOPE, "a walrus on the beach"))
    assert index_rows(store) == [] and progress(store) < max(seqs(store))
    await wait_indexed(store)  # nobody searched: the background indexed it
    assert index_rows(store) == seqs(store)


async def test_a_search_indexes_what_its_snapshot_holds_first(store: SqliteStorage) -> None:
    entry = await stored(store, put_request(SCOPE, "a walrus on the beach"))
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    assert index_rows(store) == []
    assert [row.id for row in await search(store, snapshot, "walrus")] == [entry.id]
    assert progress(store) >= cast(int, snapshot)


async def test_a_ranking_at_a_snapshot_does_not_depend_on_the_indexing_state(
    store: SqliteStorage,
) -> None:
    """More rows than one batch, searched before anything was indexed, then again once the
    background has indexed them and later puts that use the same word: the same entries in
    the same order with the same scores."""
    for number in range(BATCH + 40):
        words = "walrus " * (1 + number % 3) + f"tusk{number % 7} ice"
        await stored(store, put_request(SCOPE, words))
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    first = await search(store, snapshot, "walrus", "tusk3")
    assert len(first) == 50 and index_rows(store)  # the search indexed in batches
    for _ in range(30):
        await stored(store, put_request(SCOPE, "walrus tusk3"))
    await wait_indexed(store)
    again = await search(store, snapshot, "walrus", "tusk3")
    assert [(row.id, row.score) for row in again] == [(row.id, row.score) for row in first]
    assert len({row.score for row in first}) > 1, "the scores tell the entries apart"


async def test_rows_deleted_before_they_were_indexed_leave_the_index_whole(
    store: SqliteStorage,
) -> None:
    kept = await stored(store, put_request(SCOPE, "kept walrus"))
    await wait_indexed(store)
    for _ in range(3):
        await stored(store, put_request(SCOPE, "doomed walrus", tags=("subject:s1",)))
    # The forget deletes rows the index never held: their delete must not touch it.
    assert await store.forget(tenant=SCOPE.tenant, tag="subject:s1", batch_size=10) == 3
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    assert [row.id for row in await search(store, snapshot, "walrus")] == [kept.id]
    conn = sqlite3.connect(store.path)
    try:
        # Raises SQLITE_CORRUPT_VTAB if the index and the rows disagree.
        conn.execute("INSERT INTO entries_fts (entries_fts, rank) VALUES ('integrity-check', 1)")
    finally:
        conn.close()
    assert index_rows(store) == seqs(store)


async def test_an_import_indexes_what_it_wrote(store: SqliteStorage, tmp_path: Path) -> None:
    source = SqliteStorage(str(tmp_path / "source.db"))
    await source.open()
    items = await exported(source, SCOPE, BATCH + 5)
    assert await store.import_entries(entries=items) == BATCH + 5
    assert index_rows(store) == seqs(store) and len(seqs(store)) == BATCH + 5


async def test_short_content_is_counted_after_its_put_and_read_counted_before(
    tmp_path: Path,
) -> None:
    short = "a walrus on the beach " * 20  # within COUNT_LATER_MAX_CHARS
    long = "walrus " * (COUNT_LATER_MAX_CHARS // 7 + 1)
    assert len(short) <= COUNT_LATER_MAX_CHARS < len(long)
    async with opened(tmp_path / "store.db") as quiet:  # no background indexing
        put = await quiet.put(request=put_request(SCOPE, short), now_us=now_us())
        assert put.entry is not None and put.entry.tokens == UNCOUNTED
        await stored(quiet, put_request(SCOPE, long))

        def stored_counts() -> list[int]:
            rows = query(Path(quiet.path), "SELECT tokens FROM entries ORDER BY seq")
            return [int(n) for (n,) in rows]

        # The long one was counted at its put; the short one waits for the indexing batch.
        assert stored_counts() == [UNCOUNTED, estimate_tokens(long)]
        snapshot = await fresh_snapshot(quiet, SCOPE.tenant)
        now = now_us()
        listed = await quiet.list(scope=SCOPE, snapshot=snapshot, now_us=now, limit=5, tag=None)
        assert [r.tokens for r in listed] == [estimate_tokens(long), estimate_tokens(short)]
        # A budget counts the row in SQL meanwhile: exactly the count the batch stores.
        for budget, kept in ((estimate_tokens(short), [short]), (estimate_tokens(short) - 1, [])):
            small = await quiet.list(
                scope=SCOPE, snapshot=snapshot, now_us=now, limit=5, tag=None, max_tokens=budget
            )
            assert [r.content for r in small] == kept
        assert stored_counts()[0] == UNCOUNTED  # the list counted, and wrote nothing
        found = await Search(quiet).search(
            scope=SCOPE,
            snapshot=snapshot,
            now_us=now,
            terms=("walrus",),
            limit=5,
            tag=None,
            max_tokens=estimate_tokens(short),
        )
        assert [r.content for r in found] == [short]
        # The search indexed its snapshot first, and counted the short one's tokens with it.
        assert stored_counts() == [estimate_tokens(short), estimate_tokens(long)]
