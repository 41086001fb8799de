"""Issue 20, row 12: a SQLite keyword search costs what the caller's scope holds, not what
every tenant holds.

Before, the full-text lookup ran over every tenant's index and the scope was joined after:
a word common in tenant B's memory made tenant A's search, from an empty scope, read all
of B's matches (a CPU amplifier, and a word-frequency oracle across tenants). The proxy read
here is the number of SQLite VM steps the search statement takes (each row the full-text
index hands back costs several): deterministic, unlike a timing. The timings themselves are
in ``make bench`` (``bench/search_cost.py``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.storage.base import EntryRow, Scope, StoredEntry
from openwop_memory.storage.sqlite.backend import SqliteStorage, _keyword_query
from openwop_memory.storage.sqlite.keywords import TOKEN_FUNCTION
from openwop_memory.timefmt import now_us
from openwop_memory.token_count import estimate_tokens
from support.store import fresh_snapshot, put_request, stored

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

A = Scope("tenant-a", "notes")
B = Scope("tenant-b", "notes")
B_ENTRIES = 3000


def _connect(path: Path) -> sqlite3.Connection:
    """A connection of its own, able to run the backend's statements as its readers do."""
    conn = sqlite3.connect(path)
    conn.create_function(TOKEN_FUNCTION, 1, estimate_tokens, deterministic=True)
    return conn


def _vm_steps(path: Path, sql: str, params: dict[str, object]) -> tuple[int, int]:
    """The rows ``sql`` returns and the VM steps it took, on a connection of its own."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    with _connect(path) as conn:
        conn.set_progress_handler(count, 1)
        rows = conn.execute(sql, params).fetchall()
    return len(rows), steps


async def test_a_word_common_in_another_tenant_costs_an_empty_scope_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "memory.db"
    store = SqliteStorage(str(path))
    await store.open()
    try:
        start = now_us() - 10_000_000
        await store.import_entries(
            entries=[
                StoredEntry(B, EntryRow(f"b-{i}", f"walrus note {i}", (), start + i, None, 0))
                for i in range(B_ENTRIES)
            ]
        )
        await stored(store, put_request(A, "a note of tenant a about penguins"))
        snap_a = await fresh_snapshot(store, A.tenant)
        snap_b = await fresh_snapshot(store, B.tenant)
        now = now_us()

        def query(scope: Scope, snap: object, words: str) -> tuple[str, dict[str, object]]:
            return _keyword_query(scope, snap, now, query_terms(words), 100, None, None, None)  # type: ignore[arg-type]

        common = _vm_steps(path, *query(A, snap_a, "walrus"))
        absent = _vm_steps(path, *query(A, snap_a, "narwhal"))
        # Tenant A sees none of B's 3,000 matches, and its search for B's common word
        # takes about the steps of a search for a word nobody wrote (before: 10,000s more).
        assert common[0] == absent[0] == 0
        assert common[1] <= absent[1] + 200, (common, absent)
        # A scope that was never written matches nothing and reads nothing either.
        never = _vm_steps(path, *query(Scope("tenant-c", "notes"), snap_a, "walrus"))
        assert never[0] == 0 and never[1] <= absent[1] + 200, (never, absent)
        # The bystanders are served: B finds its own, A its own.
        own_b = await Search(store).search(
            scope=B, snapshot=snap_b, now_us=now, terms=["walrus"], limit=5, tag=None
        )
        assert len(own_b) == 5
        own_a = await Search(store).search(
            scope=A, snapshot=snap_a, now_us=now, terms=["penguin"], limit=5, tag=None
        )
        assert [r.content for r in own_a] == ["a note of tenant a about penguins"]
    finally:
        await store.close()


async def test_in_a_big_scope_a_rare_word_is_looked_up_alone_and_a_common_one_within_it(
    tmp_path: Path,
) -> None:
    """Past ``_BIG_SCOPE`` entries a scope's own doclist costs more than a rare word's
    hits elsewhere: such a word is looked up alone and its hits of other scopes dropped,
    while a word common elsewhere is still looked up within the scope only."""
    from openwop_memory.storage.sqlite.backend import _BIG_SCOPE, _RARE_TERM

    path = tmp_path / "memory.db"
    store = SqliteStorage(str(path))
    await store.open()
    c = Scope("tenant-c", "notes")
    big = _BIG_SCOPE + 500
    try:
        start = now_us() - 10_000_000

        def entries(scope: Scope, texts: list[str]) -> list[StoredEntry]:
            return [
                StoredEntry(scope, EntryRow(f"{scope.tenant}-{i}", t, (), start + i, None, 0))
                for i, t in enumerate(texts)
            ]

        texts = [f"penguin note {i}" for i in range(big)] + ["walrus in a", "narwhal in a"]
        await store.import_entries(entries=entries(A, texts))
        await store.import_entries(entries=entries(B, [f"walrus {i}" for i in range(B_ENTRIES)]))
        await store.import_entries(entries=entries(c, [f"narwhal {i}" for i in range(5)]))
        snap = await fresh_snapshot(store, A.tenant)
        now = now_us()
        search = Search(store)
        for word, found in (("walrus", "walrus in a"), ("narwhal", "narwhal in a")):
            hits = await search.search(
                scope=A, snapshot=snap, now_us=now, terms=[word], limit=10, tag=None
            )
            assert [r.content for r in hits] == [found]

        def steps(words: str) -> int:
            sql, params = _keyword_query(A, snap, now, query_terms(words), 10, None, None, None)
            return _vm_steps(path, sql, params)[1]

        absent = steps("dugong")
        # B's 3,000 walruses cost A at most the probe that finds the word common (about 9
        # steps a posting read, _RARE_TERM + 1 of them), never a join of B's hits; C's 5
        # narwhals are read and dropped.
        walrus, narwhal = steps("walrus"), steps("narwhal")
        assert absent < walrus <= absent + 10 * (_RARE_TERM + 1), (walrus, absent)
        assert narwhal > absent + 5 * 5, (narwhal, absent)
    finally:
        await store.close()


async def test_a_candidate_check_looks_each_candidate_up_by_its_rowid(tmp_path: Path) -> None:
    """A search's check reads each candidate's row once (by its rowid, the scope checked
    on the row), not through the scope's index and then the row, and still keeps only the
    scope's own."""
    from openwop_memory.storage.sqlite.backend import _check_query

    path = tmp_path / "memory.db"
    store = SqliteStorage(str(path))
    await store.open()
    try:
        a = await stored(store, put_request(A, "a note of tenant a"))
        await stored(store, put_request(B, "a note of tenant b"))
        now = now_us()

        async def seq_of(scope: Scope) -> int:
            snap = await fresh_snapshot(store, scope.tenant)
            page = await store.page(
                scope=scope, snapshot=snap, now_us=now, limit=5, tag=None, where=None, before=None
            )
            return page[0][0]

        seq_a, seq_b = await seq_of(A), await seq_of(B)
        snap = await fresh_snapshot(store, A.tenant)
        sql, params = _check_query(A, snap, now, [seq_a, seq_b], None, None, None, False)
        with _connect(path) as conn:
            plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
            found = conn.execute(sql, params).fetchall()
        assert "SEARCH e USING INTEGER PRIMARY KEY (rowid=?)" in plan, plan
        assert "entries_by_scope" not in plan, plan
        assert found == [(seq_a, 1)]  # B's entry is not A's
        checked = await store.check_candidates(
            scope=A, snapshot=snap, now_us=now, seqs=[seq_a, seq_b], tag=None
        )
        assert checked.kept == {seq_a} and checked.stored == {seq_a}
        assert checked.rows[seq_a].id == a.id
    finally:
        await store.close()
