"""SQLite's tag index is written after the put's commit, and every read by tag at a
snapshot answers the same whatever the index holds yet (storage/sqlite/tags.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import anyio
import pytest
from openwop_memory.retrieval.search import Search
from openwop_memory.storage.base import ListFilter, Scope, Snapshot
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.storage.sqlite.keywords import BATCH as KEYWORD_BATCH
from openwop_memory.storage.sqlite.tags import BATCH
from openwop_memory.timefmt import now_us
from support.on_disk import query
from support.sqlite_store import opened
from support.store import SECOND, fresh_snapshot, put_request, stored

pytestmark = pytest.mark.anyio

SCOPE = Scope("tenant-a", "notes")
OTHER = Scope("tenant-b", "notes")  # the same tags in another tenant's scope


def tagged_position(path: Path) -> int:
    [(seq,)] = query(path, "SELECT tagged_seq FROM fts_progress")
    return int(seq)


def tag_rows(path: Path) -> list[tuple[int, str]]:
    return sorted((int(seq), tag) for seq, tag in query(path, "SELECT seq, tag FROM entry_tags"))


def expected_tag_rows(path: Path) -> list[tuple[int, str]]:
    """Every stored row's tags, from its own column."""
    found = query(path, "SELECT e.seq, j.value FROM entries e, json_each(e.tags) j")
    return sorted((int(seq), tag) for seq, tag in found)


def index_only_up_to(path: Path, position: int) -> None:
    """Make the file's tag index what it was when it had reached ``position``."""
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM entry_tags WHERE seq > ?", (position,))
        db.execute("UPDATE fts_progress SET tagged_seq = ?", (position,))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStorage]:
    async with opened(tmp_path / "store.db") as storage:  # the background is off
        yield storage


async def test_a_put_commits_no_tag_row_and_the_background_writes_them(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with opened(path, background_keywords=True) as store:
        # No await between the put and the read: the background has not run yet.
        await stored(store, put_request(SCOPE, "a walrus", tags=("animal", "sea")))
        assert tag_rows(path) == []
        for _ in range(500):
            if tag_rows(path):
                break
            await anyio.sleep(0.01)
        assert tag_rows(path) == expected_tag_rows(path) != []
        [(top,)] = query(path, "SELECT max(seq) FROM entries")
        assert tagged_position(path) >= top


async def test_reads_by_tag_answer_the_same_at_every_index_position(tmp_path: Path) -> None:
    """Lists, pages, counts, filters and searches by tag, at one snapshot, with the index
    holding none, some or all of the rows: the same answers. The rows include tombstones,
    an expired entry and another tenant's entries with the same tags."""
    path = tmp_path / "store.db"
    now = now_us()
    async with opened(path) as store:
        for number in range(60):
            tags: tuple[str, ...] = ("even" if number % 2 == 0 else "odd", f"third:{number % 3}")
            if number % 10 == 0:
                tags += ("tenth",)
            entry = await stored(store, put_request(SCOPE, f"walrus number {number}", tags=tags))
            if number % 7 == 0:
                assert await store.delete(scope=SCOPE, entry_id=entry.id, now_us=now_us())
            await stored(store, put_request(OTHER, f"walrus elsewhere {number}", tags=tags))
        await stored(
            store, put_request(SCOPE, "walrus soon gone", tags=("even",), expires_us=now + SECOND)
        )
        snapshot = await fresh_snapshot(store, SCOPE.tenant)
        await stored(store, put_request(SCOPE, "walrus after the snapshot", tags=("even",)))
        await store.keywords.catch_up.everything()  # keywords and tags, up to the last put
        assert tag_rows(path) == expected_tag_rows(path)
        full = await answers(store, snapshot, now)
        assert full["list even"] and full["search walrus tenth"] and full["count odd"]
        [(top,)] = query(path, "SELECT max(seq) FROM entries")
        # Downwards: each step takes rows out of the index, as if it had stopped earlier.
        for position in (top, int(snapshot), int(snapshot) // 2 + 1, int(snapshot) // 3, 1, 0):
            index_only_up_to(path, position)
            assert await answers(store, snapshot, now) == full, position


async def answers(store: SqliteStorage, snapshot: Snapshot, now: int) -> dict[str, object]:
    """Every read by tag there is, of SCOPE at ``snapshot``."""
    got: dict[str, object] = {}
    for tag in ("even", "odd", "third:1", "tenth", "none"):
        rows = await store.list(scope=SCOPE, snapshot=snapshot, now_us=now, limit=7, tag=tag)
        got[f"list {tag}"] = [row.content for row in rows]
        pages: list[str] = []
        before = None
        while True:
            page = await store.page(
                scope=SCOPE,
                snapshot=snapshot,
                now_us=now,
                limit=4,
                tag=tag,
                where=None,
                before=before,
            )
            if not page:
                break
            pages += [row.content for _, row in page]
            before = page[-1][0]
        got[f"pages {tag}"] = pages
        got[f"count {tag}"] = await store.count(
            scope=SCOPE, snapshot=snapshot, now_us=now, tag=tag, where=None
        )
    filters = (ListFilter(tags_any=("tenth", "third:2")), ListFilter(tags_all=("odd", "third:0")))
    for where in filters:
        rows = await store.list(
            scope=SCOPE, snapshot=snapshot, now_us=now, limit=100, tag="even", where=where
        )
        got[f"filter {where}"] = [row.content for row in rows]
    hits = await Search(store).search(
        scope=SCOPE, snapshot=snapshot, now_us=now, terms=("walrus",), limit=100, tag="tenth"
    )
    got["search walrus tenth"] = [(row.id, row.score) for row in hits]
    return got


async def test_a_forget_finds_rows_the_index_does_not_hold_yet(store: SqliteStorage) -> None:
    path = Path(store.path)
    kept = await stored(store, put_request(SCOPE, "kept", tags=("other",)))
    for number in range(BATCH + 5):  # more than one background step
        await stored(store, put_request(SCOPE, f"doomed {number}", tags=("subject:s1",)))
    assert tag_rows(path) == []
    assert await store.forget(tenant=SCOPE.tenant, tag="subject:s1", batch_size=1000) == BATCH + 5
    snapshot = await fresh_snapshot(store, SCOPE.tenant)
    rows = await store.list(scope=SCOPE, snapshot=snapshot, now_us=now_us(), limit=10, tag=None)
    assert [row.id for row in rows] == [kept.id]
    assert tag_rows(path) == expected_tag_rows(path) == [(tag_rows(path)[0][0], "other")]


async def test_the_indexer_goes_on_while_the_tags_are_behind(store: SqliteStorage) -> None:
    path = Path(store.path)
    for number in range(3 * BATCH):
        await stored(store, put_request(SCOPE, f"entry {number}", tags=(f"n:{number}",)))
    # Keywords caught up without the tags (a database of two sidecars, one of them older
    # than the tags' step, say): the keywords' batch is short, the tags' step full.
    await store._writer.write(
        lambda txn: txn.conn.execute(
            "UPDATE fts_progress SET indexed_seq = (SELECT seq FROM clock)"
        )
    )
    assert await store.keywords._batch() == KEYWORD_BATCH  # the tags' step was full
    assert len(tag_rows(path)) == BATCH
    await store.keywords.catch_up.everything()
    assert tag_rows(path) == expected_tag_rows(path)
    assert await store.keywords._batch() == 0


async def test_a_search_catches_the_tags_up_too(store: SqliteStorage) -> None:
    """So no backlog of them is left to the background, to compete with the searches."""
    path = Path(store.path)
    for number in range(2 * BATCH):
        await stored(store, put_request(SCOPE, f"entry {number}", tags=(f"n:{number}",)))
    await store.keywords.through(int(await fresh_snapshot(store, SCOPE.tenant)))
    assert tag_rows(path) == expected_tag_rows(path)
