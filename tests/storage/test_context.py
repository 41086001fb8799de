"""Conversational context through the storage API, on every backend: a hybrid search links
its best candidates to the entries before and after them *as the snapshot shows them*
(:meth:`VectorCache.adjacent`), so a reply is found through the turn that names its topic,
an older snapshot keeps its neighbours after a delete, and entries a search's conditions
drop, or deleted ones, are walked past."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache

import pytest
from openwop_memory.retrieval.encoders import wordllama as semantic
from openwop_memory.retrieval.fusion import LIGHT_WEIGHTS, Weights
from openwop_memory.retrieval.nearest import Check, VectorCache
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.retrieval.time_cues import SAYS_WHEN
from openwop_memory.storage.base import (
    EntryRow,
    PutRequest,
    Scope,
    Snapshot,
    Storage,
    VectorRow,
)
from openwop_memory.timefmt import now_us
from support.store import fresh_snapshot, stored

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

A = Scope("tenant-a", "chat")
FILLER = [
    "Ana: Morning! Got a sec?",
    "Sam: Hey! Pretty good, busy as always. You?",
    "Ana: The traffic this morning was a nightmare.",
    "Sam: Ugh, that's the worst.",
    "Ana: Trying to drink less coffee. It's going badly.",
    "Sam: lol same",
]
ASKED = "Ana: Did you end up going to the pottery class on Saturday?"
REPLY = "Sam: Yes! I made a wonky little bowl, so proud of it."
AFTER = [
    "Ana: Aww I love that for you.",
    "Sam: Anyway, how's everyone at home?",
    "Ana: Same old, same old.",
    "Sam: Gotta run, talk soon!",
]
QUESTION = "What did Sam make at the pottery class?"
WITHOUT_CONTEXT = Weights(LIGHT_WEIGHTS.meaning, LIGHT_WEIGHTS.floor, LIGHT_WEIGHTS.related, 0.0)


@cache
def model() -> semantic.Embedder:
    return semantic.load()


def request(content: str, tags: tuple[str, ...] = ()) -> PutRequest:
    digest = hashlib.sha256(content.encode()).digest()
    return PutRequest(A, content, tags, None, None, digest, model().vector(content))


async def chat(store: Storage) -> dict[str, EntryRow]:
    """FILLER, ASKED, REPLY and AFTER put in that order; the rows by content."""
    return {c: await stored(store, request(c)) for c in [*FILLER, ASKED, REPLY, *AFTER]}


async def scored(
    store: Storage,
    snap: Snapshot,
    *,
    weights: Weights = LIGHT_WEIGHTS,
    limit: int = 3,
    query: str = QUESTION,
    when: bool = False,
) -> dict[str, float]:
    """The contents found for ``query``, best first, with their scores."""
    rows = await Search(store).search(
        scope=A,
        snapshot=snap,
        now_us=now_us(),
        terms=query_terms(query),
        limit=limit,
        tag=None,
        vector=model().vector(query),
        weights=weights,
        when=when,
    )
    return {row.content: row.score or 0.0 for row in rows}


async def ranked(store: Storage, snap: Snapshot, *, limit: int = 3) -> list[str]:
    return list(await scored(store, snap, limit=limit))


async def test_a_reply_counts_the_turn_that_names_its_topic(store: Storage) -> None:
    await chat(store)
    snap = await fresh_snapshot(store, A.tenant)
    weight = LIGHT_WEIGHTS.context
    own = await scored(store, snap, weights=WITHOUT_CONTEXT, limit=20)
    assert next(iter(own)) == ASKED and own[REPLY] < own[ASKED]
    with_context = await scored(store, snap, limit=2)
    assert list(with_context) == [ASKED, REPLY]
    # Its own score and a quarter of its best neighbour's, the turn before it.
    best = max(own[ASKED], own.get(AFTER[0], 0.0))
    assert best == own[ASKED]
    assert with_context[REPLY] == round((own[REPLY] + weight * best) / (1 + weight), 9)


async def test_an_older_snapshot_keeps_its_neighbours_after_a_delete(store: Storage) -> None:
    rows = await chat(store)
    before = await fresh_snapshot(store, A.tenant)
    first = await scored(store, before, limit=20)
    assert await store.delete(scope=A, entry_id=rows[ASKED].id, now_us=now_us())
    await stored(store, request("Sam: pottery pottery pottery class"))  # after the snapshot
    after = await fresh_snapshot(store, A.tenant)
    # The first snapshot ranks as it did, its deleted turn and the lift it gave included.
    assert await scored(store, before, limit=20) == first
    # A new one has neither: the reply's neighbour before it is now a filler.
    now = await scored(store, after, limit=20)
    assert ASKED not in now and next(iter(now)) == "Sam: pottery pottery pottery class"
    assert now[REPLY] < first[REPLY]


async def test_neighbours_are_the_nearest_kept_entries_of_the_snapshot(store: Storage) -> None:
    """Past entries deleted before the snapshot, written after it, or dropped by the
    search's tag, in as many rounds of checks as it takes."""
    contents = [f"turn number {n} of the chat" for n in range(12)]
    for n, content in enumerate(contents):
        tags = ("kept",) if n in (0, 1, 9, 10) else ()
        await stored(store, request(content, tags))
    seqs = [row.seq for row in await store.vectors_after(scope=A, after=-1)]
    for n in range(2, 8):  # six deleted in a row: more than one round of two a side
        listed = await store.list(
            scope=A,
            snapshot=await fresh_snapshot(store, A.tenant),
            now_us=now_us(),
            limit=100,
            tag=None,
        )
        gone = next(r for r in listed if r.content == contents[n])
        assert await store.delete(scope=A, entry_id=gone.id, now_us=now_us())
    snap = await fresh_snapshot(store, A.tenant)
    await stored(store, request("written after the snapshot"))
    cache_ = VectorCache()
    vector = model().vector("turn") or b""
    asked: list[list[int]] = []

    def checker(tag: str | None) -> Check:
        async def check(candidates: list[int]) -> tuple[set[int], set[int]]:
            asked.append(candidates)
            found = await store.check_candidates(
                scope=A, snapshot=snap, now_us=now_us(), seqs=candidates, tag=tag
            )
            return set(found.kept), found.stored

        return check

    async def load(after: int) -> Sequence[VectorRow]:
        return await store.vectors_after(scope=A, after=after)

    await cache_.nearest(
        A,
        snapshot_seq=snap,
        now_us=now_us(),
        vector=vector,
        floor=-1.0,
        count=1,
        load_after=load,
        check=checker(None),
    )
    adjacent = await cache_.adjacent(
        A,
        [seqs[1], seqs[8], seqs[11]],
        snapshot_seq=snap,
        now_us=now_us(),
        dimensions=len(vector),
        check=checker(None),
    )
    assert adjacent == {
        seqs[1]: (seqs[0], seqs[8]),  # 2 to 7 deleted
        seqs[8]: (seqs[1], seqs[9]),
        seqs[11]: (seqs[10], None),  # the entry written later is not the snapshot's
    }
    asked.clear()
    tagged = await cache_.adjacent(
        A,
        [seqs[1], seqs[9]],
        snapshot_seq=snap,
        now_us=now_us(),
        dimensions=len(vector),
        check=checker("kept"),
    )
    assert tagged == {seqs[1]: (seqs[0], seqs[9]), seqs[9]: (seqs[1], seqs[10])}
    assert len(asked) >= 2  # walking past 8, and 2 to 7, took more than one check
    assert (
        await cache_.adjacent(
            A,
            [10**9],
            snapshot_seq=snap,
            now_us=now_us(),
            dimensions=len(vector),
            check=checker(None),
        )
        == {}
    )


async def test_a_when_question_weighs_the_entries_that_say_when(store: Storage) -> None:
    dated = "Sam: I went to the pottery class yesterday"
    undated = "Sam: I went to the pottery class with my sister"
    for content in (dated, undated, "Ana: a note about nothing else"):
        await stored(store, request(content))
    snap = await fresh_snapshot(store, A.tenant)
    query = "When did Sam go to the pottery class?"
    plain = await scored(store, snap, weights=WITHOUT_CONTEXT, limit=5, query=query)
    asked = await scored(store, snap, weights=WITHOUT_CONTEXT, limit=5, query=query, when=True)
    assert set(plain) == set(asked)
    assert asked[dated] == plain[dated]  # times 1.25, over 1.25
    assert asked[undated] == round(plain[undated] / (1 + SAYS_WHEN), 9)
    assert next(iter(asked)) == dated
