"""Vectors computed after the put (issue 22): a put stores a pending vector, the indexer
stores the real one later, and a search ranks the same whichever it finds."""

from __future__ import annotations

import hashlib
import time
from functools import cache
from pathlib import Path

import pytest
from openwop_memory.retrieval.encoders import wordllama as semantic
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.storage.base import PENDING_VECTOR, PutRequest, Scope, Snapshot, Storage
from openwop_memory.timefmt import now_us
from support.backends import Backend
from support.names import uid
from support.on_disk import query
from support.protocol import new_run, put
from support.sidecar import Sidecar
from support.store import fresh_snapshot, stored

A = Scope("tenant-a", "notes")
NOTES = [
    "The user plays the cello in an amateur orchestra on Thursday evenings.",
    "The user is allergic to peanuts.",
    "The staging deploy failed because the database volume ran out of disk space.",
    "Our beagle puppy chewed the sofa again.",
    "Lunch with Dana moved to the Italian place near the office.",
]
QUESTIONS = ["musical instrument hobby", "which pet do they have", "food that makes them ill"]


@cache
def model() -> semantic.Embedder:
    return semantic.load()


async def embed(texts: list[str]) -> list[bytes | None]:
    return [model().vector(text) for text in texts]


def request(content: str, vector: bytes | None) -> PutRequest:
    digest = hashlib.sha256(content.encode()).digest()
    return PutRequest(A, content, (), None, None, digest, vector)


async def ranked(store: Storage, snap: Snapshot, text: str, *, with_embed: bool) -> list[str]:
    rows = await Search(store).search(
        scope=A,
        snapshot=snap,
        now_us=now_us(),
        terms=query_terms(text),
        limit=10,
        tag=None,
        vector=model().vector(text),
        embed=embed if with_embed else None,
    )
    return [r.content for r in rows]


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_a_search_ranks_pending_vectors_as_it_ranks_stored_ones(
    store: Storage, backend: Backend, tmp_path: Path
) -> None:
    ids = [(await stored(store, request(note, PENDING_VECTOR))).id for note in NOTES]
    snap = await fresh_snapshot(store, "tenant-a")
    before = {q: await ranked(store, snap, q, with_embed=True) for q in QUESTIONS}
    assert before["musical instrument hobby"][0] == NOTES[0]  # found by meaning alone
    # Another instance (a cache of its own) without the computation: pending vectors are
    # not there yet, so meaning finds nothing of them.
    other = backend.storage(tmp_path / "store.db")
    await other.open()
    try:
        assert await ranked(other, snap, "musical instrument hobby", with_embed=False) == []
        vectors = [(i, model().vector(n) or b"") for i, n in zip(ids, NOTES, strict=True)]
        await store.set_vectors(vectors)
        again = backend.storage(tmp_path / "store.db")
        await again.open()
        try:
            after = {q: await ranked(again, snap, q, with_embed=False) for q in QUESTIONS}
        finally:
            await again.close()
    finally:
        await other.close()
    assert after == before


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_set_vectors_replaces_only_a_pending_vector(
    store: Storage, backend: Backend, tmp_path: Path
) -> None:
    cello = await stored(store, request(NOTES[0], model().vector(NOTES[0])))
    snap = await fresh_snapshot(store, "tenant-a")
    before = await ranked(store, snap, "musical instrument hobby", with_embed=False)
    assert before == [NOTES[0]]
    other_vector = model().vector("quarterly tax filing deadlines") or b""
    await store.set_vectors([(cello.id, other_vector), ("mem_no_such_entry", other_vector)])
    fresh = backend.storage(tmp_path / "store.db")
    await fresh.open()
    try:
        assert await ranked(fresh, snap, "musical instrument hobby", with_embed=False) == before
    finally:
        await fresh.close()


@pytest.mark.sqlite_only
def test_the_sidecar_acknowledges_the_put_and_stores_the_vector_after(sidecar: Sidecar) -> None:
    tenant, ref = uid("t"), uid("ref")
    with sidecar.client() as c:
        writer = new_run(c, tenant)
        entries = [put(c, writer, ref, note) for note in NOTES]
        reader = new_run(c, tenant)
        found = c.call(
            "memory.list",
            runId=reader,
            memoryRef=ref,
            options={"rank": "relevance", "query": "musical instrument hobby"},
        )
        assert found[0]["id"] == entries[0]["id"]
    ids = tuple(e["id"] for e in entries)
    sql = f"SELECT id, embedding FROM entries WHERE id IN ({','.join('?' * len(ids))})"
    deadline = time.monotonic() + 10
    while True:
        rows = query(sidecar.database, sql, ids)
        if all(vector != PENDING_VECTOR for _, vector in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    stored_vectors = dict(rows)
    assert {i: stored_vectors[e["id"]] for i, e in enumerate(entries)} == {
        i: model().vector(note) for i, note in enumerate(NOTES)
    }
