"""Retrieval in the storage contract: ``Search.search`` over the storage primitives
(keyword relevance from each backend's full-text engine), ``max_tokens`` on list and
search, stored token counts, and the schema migration that adds them to an existing database.

Like ``test_storage_contract.py``, every test runs once per backend, through the
:class:`~openwop_memory.storage.base.Storage` API only (the migration tests alone build
a version-1 database by hand).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.storage.base import (
    KeywordCandidates,
    ListFilter,
    Scope,
    Snapshot,
    Storage,
)
from openwop_memory.storage.postgresql import schema as postgresql_schema
from openwop_memory.storage.sqlite import schema as sqlite_schema
from openwop_memory.timefmt import now_us
from openwop_memory.token_count import estimate_tokens
from support.backends import Backend
from support.old_schema import make_v1_database
from support.store import SECOND, fresh_snapshot, put_request, stored

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

A = Scope("tenant-a", "notes")
A2 = Scope("tenant-a", "other-notes")
B = Scope("tenant-b", "notes")  # the same key under another tenant


async def found(
    store: Storage,
    snap: Snapshot,
    query: str,
    *,
    scope: Scope = A,
    limit: int = 100,
    tag: str | None = None,
    max_tokens: int | None = None,
    now: int | None = None,
    where: ListFilter | None = None,
) -> list[str]:
    rows = await Search(store).search(
        scope=scope,
        snapshot=snap,
        now_us=now_us() if now is None else now,
        terms=query_terms(query),
        limit=limit,
        tag=tag,
        max_tokens=max_tokens,
        where=where,
    )
    return [r.content for r in rows]


async def test_matches_only_ranked_by_rare_terms_then_newest(store: Storage) -> None:
    await stored(store, put_request(A, "the weather in Paris was rainy"))
    await stored(store, put_request(A, "the deployment of the payment service failed"))
    await stored(store, put_request(A, "rollback of the payment service succeeded"))
    await stored(store, put_request(A, "lunch was pasta"))
    await stored(store, put_request(A, "payment reminders are sent on Mondays"))
    snap = await fresh_snapshot(store, "tenant-a")
    # "rollback" is rarest (1 of 3 matches), so the entry holding both terms comes first;
    # the other two hold "payment" alone and tie, newest first.
    assert await found(store, snap, "payment rollback") == [
        "rollback of the payment service succeeded",
        "payment reminders are sent on Mondays",
        "the deployment of the payment service failed",
    ]
    assert await found(store, snap, "payment rollback", limit=2) == [
        "rollback of the payment service succeeded",
        "payment reminders are sent on Mondays",
    ]
    assert await found(store, snap, "nothing matches zebra") == []
    assert await found(store, snap, "!!! ???") == []  # no terms at all


async def test_terms_are_stemmed_and_case_folded(store: Storage) -> None:
    await stored(store, put_request(A, "Deployments RUNNING smoothly"))
    snap = await fresh_snapshot(store, "tenant-a")
    assert await found(store, snap, "deployment run") == ["Deployments RUNNING smoothly"]


async def test_query_syntax_is_only_words(store: Storage) -> None:
    """Quotes, operators and column filters of either engine are read as plain words."""
    await stored(store, put_request(A, "alpha beta gamma"))
    snap = await fresh_snapshot(store, "tenant-a")
    for query in ('"alpha', "alpha OR", "content:alpha", "alpha & !beta", "alpha*", "(alpha"):
        assert await found(store, snap, query) == ["alpha beta gamma"], query


async def test_only_the_snapshot_the_scope_and_the_tenant(store: Storage) -> None:
    deleted = await stored(store, put_request(A, "invoice deleted before the run"))
    await stored(store, put_request(A, "invoice expiring soon", expires_us=now_us() + 60 * SECOND))
    await stored(store, put_request(A2, "invoice of another scope"))
    await stored(store, put_request(B, "invoice of another tenant"))
    await stored(store, put_request(A, "invoice kept"))
    assert await store.delete(scope=A, entry_id=deleted.id, now_us=now_us())
    snap = await fresh_snapshot(store, "tenant-a")
    await stored(store, put_request(A, "invoice written after the run began"))
    assert await found(store, snap, "invoice") == ["invoice kept", "invoice expiring soon"]
    later = now_us() + 120 * SECOND  # past the expiry
    assert await found(store, snap, "invoice", now=later) == ["invoice kept"]
    assert await found(store, snap, "invoice", scope=A2) == ["invoice of another scope"]
    # The run's snapshot belongs to tenant A: tenant B's scope under the same key is apart.
    snap_b = await fresh_snapshot(store, "tenant-b")
    assert await found(store, snap_b, "invoice", scope=B) == ["invoice of another tenant"]


async def test_an_entry_deleted_after_the_snapshot_is_still_found(store: Storage) -> None:
    entry = await stored(store, put_request(A, "quarterly report"))
    snap = await fresh_snapshot(store, "tenant-a")
    assert await store.delete(scope=A, entry_id=entry.id, now_us=now_us())
    assert await found(store, snap, "report") == ["quarterly report"]
    assert await found(store, await fresh_snapshot(store, "tenant-a"), "report") == []


async def test_the_same_snapshot_ranks_the_same_after_later_writes(store: Storage) -> None:
    """Relevance weighs only what the snapshot shows: entries written later, in the same
    scope or elsewhere, leave a replay's order unchanged."""
    for n in range(6):
        await stored(store, put_request(A, f"apple {'banana ' * (n % 3)}note {n}"))
    await stored(store, put_request(A, "banana split"))
    snap = await fresh_snapshot(store, "tenant-a")
    before = await found(store, snap, "apple banana")
    for n in range(40):  # make "apple" rare and "banana" common outside the snapshot
        await stored(store, put_request(A, f"banana bread {n}"))
        await stored(store, put_request(A2, f"banana {n}"))
    assert await found(store, snap, "apple banana") == before
    assert before[:2] == ["apple banana banana note 5", "apple banana note 4"]


async def test_tag_filter_applies_to_search(store: Storage) -> None:
    await stored(store, put_request(A, "deploy plan", tags=("ops",)))
    await stored(store, put_request(A, "deploy party", tags=("fun",)))
    snap = await fresh_snapshot(store, "tenant-a")
    assert await found(store, snap, "deploy", tag="ops") == ["deploy plan"]
    assert await found(store, snap, "deploy", tag="none") == []


async def test_token_counts_are_stored_and_skip_entries_over_the_limit(store: Storage) -> None:
    short = await stored(store, put_request(A, "short note about cats"))
    long = await stored(store, put_request(A, "cats " + "and many more words about them " * 20))
    # (``stored`` checks that each put answered UNCOUNTED or the count; reads give the count.)
    snap = await fresh_snapshot(store, "tenant-a")
    listed = await store.list(scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None)
    counts = [estimate_tokens(long.content), estimate_tokens(short.content)]
    assert [r.tokens for r in listed] == counts and counts[0] > counts[1]
    small = await store.list(
        scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None, max_tokens=counts[1]
    )
    assert [r.id for r in small] == [short.id]
    assert await found(store, snap, "cats", max_tokens=counts[1]) == [short.content]
    assert await found(store, snap, "cats", max_tokens=short.tokens - 1) == []


async def test_content_with_nul_and_non_ascii_is_indexed(store: Storage) -> None:
    await stored(store, put_request(A, "caf\u00e9 men\u00fc\x00 z\u00fcrich"))
    snap = await fresh_snapshot(store, "tenant-a")
    assert await found(store, snap, "zürich") == ["caf\u00e9 men\u00fc\x00 z\u00fcrich"]


# -- migration from schema version 1 -----------------------------------------------------


async def _make_v1_database(backend: Backend, path: Path) -> None:
    """A database as a version-1 sidecar left it, with two entries of scope ``A``."""
    rows = [
        (1, "mem_1", "an old entry about migration", '["x"]', 10),
        (2, "mem_2", "another old one", "[]", 20),
    ]
    await make_v1_database(
        backend,
        path,
        sqlite=[
            ("INSERT INTO scopes VALUES (7, ?, ?)", (A.tenant, A.key)),
            (
                "INSERT INTO entries (seq, id, scope_pk, content, tags, created_us)"
                " VALUES (?, ?, 7, ?, ?, ?)",
                rows,
            ),
            ("UPDATE clock SET seq = 2, last_us = 20", ()),
        ],
        postgresql=[
            ("INSERT INTO scopes VALUES (7, $1, $2)", (A.tenant, A.key)),
            (
                "INSERT INTO entries (scope_pk, seq, id, content, tags, created_us)"
                " VALUES (7, $1, $2, $3, $4, $5)",
                [(seq, i, c.encode(), t, us) for seq, i, c, t, us in rows],
            ),
            ("INSERT INTO tenant_clocks VALUES ($1, 2, 20)", (A.tenant,)),
        ],
    )


@pytest.mark.migrates
async def test_a_version_1_database_migrates(backend: Backend, tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    await _make_v1_database(backend, path)
    store = backend.storage(path)
    await store.open()
    try:
        schema = sqlite_schema if backend.name == "sqlite" else postgresql_schema
        assert (await store.health()).schema_version == schema.LATEST_VERSION
        snap = await fresh_snapshot(store, "tenant-a")
        rows = await store.list(scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None)
        assert [(r.content, r.tokens) for r in rows] == [
            ("another old one", estimate_tokens("another old one")),
            ("an old entry about migration", estimate_tokens("an old entry about migration")),
        ]
        assert await found(store, snap, "migrations") == ["an old entry about migration"]
        await stored(store, put_request(A, "a new entry about migration"))
        assert await found(store, await fresh_snapshot(store, "tenant-a"), "migration") == [
            "a new entry about migration",
            "an old entry about migration",
        ]
    finally:
        await store.close()


# -- the filter (tags any/all, creation time) ----------------------------------------------


async def test_filter_by_tags_any_all_and_creation_time(store: Storage) -> None:
    first = await stored(store, put_request(A, "first match", tags=("red", "round")))
    second = await stored(store, put_request(A, "second match", tags=("red",)))
    third = await stored(store, put_request(A, "third match", tags=("blue", "round")))
    snap = await fresh_snapshot(store, "tenant-a")

    async def listed(where: ListFilter, query: str | None = None) -> list[str]:
        if query is not None:
            return await found(store, snap, query, where=where)
        rows = await store.list(
            scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None, where=where
        )
        return [r.content for r in rows]

    everything = ["third match", "second match", "first match"]
    assert await listed(ListFilter()) == everything
    assert await listed(ListFilter(tags_any=("round", "none"))) == ["third match", "first match"]
    assert await listed(ListFilter(tags_all=("red", "round"))) == ["first match"]
    assert await listed(ListFilter(tags_all=("red", "none"))) == []
    assert await listed(ListFilter(tags_any=("blue", "red"), tags_all=("round",))) == [
        "third match",
        "first match",
    ]
    assert await listed(ListFilter(created_after_us=first.created_us)) == everything[:2]
    assert await listed(ListFilter(created_before_us=third.created_us)) == everything[1:]
    between = ListFilter(created_after_us=first.created_us, created_before_us=third.created_us)
    assert await listed(between) == ["second match"]
    assert second.created_us > first.created_us
    # The same filter under relevance.
    assert await listed(ListFilter(tags_all=("round",)), query="match") == [
        "third match",
        "first match",
    ]
    assert await listed(between, query="match second") == ["second match"]


async def test_keyword_candidates_give_the_same_hits_with_or_without_their_rows(
    store: Storage,
) -> None:
    entries = [
        await stored(store, put_request(A, text))
        for text in ("cats and dogs", "cats only", "dogs only", "neither")
    ]
    snap = await fresh_snapshot(store, "tenant-a")

    async def candidates(rows: bool, max_tokens: int | None = None) -> KeywordCandidates:
        return await store.keyword_candidates(
            scope=A,
            snapshot=snap,
            now_us=now_us(),
            terms=query_terms("cats dogs"),
            limit=10,
            tag=None,
            max_tokens=max_tokens,
            rows=rows,
        )

    with_rows, without = await candidates(True), await candidates(False)
    # A budget every entry fits changes nothing (SQLite takes another path for budgets).
    for rows in (True, False):
        budgeted = await candidates(rows, max_tokens=1000)
        assert budgeted == (with_rows if rows else without)
    hits = [seq for seq, _ in with_rows.hits]
    assert len(hits) == 3 and hits == [seq for seq, _ in without.hits]
    assert (without.hits, without.total, without.counts) == (
        with_rows.hits,
        with_rows.total,
        with_rows.counts,
    )
    # With them, every hit's row, as stored; without, at most those (a backend may keep
    # rows that cost it nothing).
    assert sorted(with_rows.rows) == sorted(hits)
    assert sorted(r.content for r in with_rows.rows.values()) == sorted(
        e.content for e in entries[:3]
    )
    assert set(with_rows.rows.values()) == set(entries[:3])
    assert without.rows.items() <= with_rows.rows.items()
