"""Relevance search over any backend, written once: keyword candidates from the backend's
full-text index, with a query vector also the nearest entries by meaning
(:class:`~openwop_memory.retrieval.nearest.VectorCache`), fused by
:func:`~openwop_memory.retrieval.fusion.fuse`.

A backend offers three primitives (:meth:`Storage.keyword_candidates`,
:meth:`Storage.vectors_after`, :meth:`Storage.check_candidates`); everything that makes them
a ranking is here, so a third backend writes primitives, not search.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..storage.base import Embed, EntryRow, ListFilter, Scope, Snapshot, WorkerPath
from .fusion import LIGHT_WEIGHTS, Weights, coverage, fuse, keyword_ceiling

if TYPE_CHECKING:  # numpy comes with the search extra, which a query vector implies
    from .nearest import VectorCache


KeywordList = Callable[[int], Awaitable[list[tuple[int, float, EntryRow]]]]
"""Up to the argument's number of keyword hits as ``(seq, coverage, row)``, best first."""


def candidate_pool(limit: int) -> int:
    """How many candidates each side brings to fusion for an answer of ``limit``: more than
    ``limit``, so that an entry second on both sides can pass one first on only one."""
    return max(2 * limit, 20)


async def side_by_side(*calls: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` concurrently; a failure is raised as itself (the first one), not as an
    exception group, so the backend's error contract holds."""
    try:
        async with anyio.create_task_group() as tasks:
            for call in calls:
                tasks.start_soon(call)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


class Search:
    """The relevance search of one storage, holding the vectors of the scopes it searched
    by meaning (loaded on the first such search: none before)."""

    def __init__(self, storage: WorkerPath) -> None:
        self._storage = storage
        self._vectors: VectorCache | None = None

    async def search(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        terms: Sequence[str],
        limit: int,
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
        vector: bytes | None = None,
        weights: Weights = LIGHT_WEIGHTS,
        embed: Embed | None = None,
    ) -> list[EntryRow]:
        """Up to ``limit`` of the entries :meth:`Storage.list` would consider (same
        visibility, tag, token and ``where`` rules), most relevant first: without
        ``vector``, those matching at least one of ``terms``
        (:meth:`Storage.keyword_candidates`); with it, the fusion of that keyword list and
        the nearest entries by meaning.

        **With ``vector``** (the query's embedding, by the model ``weights`` were measured
        for): the keyword list's first :func:`candidate_pool` entries and as many entries
        with a stored vector of the same model whose cosine with ``vector`` (of the stored
        integers, exact) is above ``weights.floor`` (ties newest first), among the same
        entries, fused by :func:`~openwop_memory.retrieval.fusion.fuse`: the first ``limit``
        of the entries scoring above 0. An entry that matches no term and is less similar
        than ``weights.related`` is left out, so a query with nothing relevant finds
        nothing. An entry stored without a vector takes part through its keywords only; one
        whose vector is still pending is embedded by ``embed`` first.

        Each row found carries its ``score`` in [0, 1]: the fused score, or without
        ``vector`` its keyword coverage (:func:`~openwop_memory.retrieval.fusion.coverage`).
        Nothing outside the snapshot weighs in, so the same snapshot and query give the
        same order for as long as no entry expires.

        :raises UpstreamUnavailableError: from any of the storage's calls.
        """

        async def keyword(count: int) -> list[tuple[int, float, EntryRow]]:
            if not terms:
                return []
            found = await self._storage.keyword_candidates(
                scope=scope,
                snapshot=snapshot,
                now_us=now_us,
                terms=terms,
                limit=count,
                tag=tag,
                max_tokens=max_tokens,
                where=where,
            )
            ceiling = keyword_ceiling(found.total, found.counts, len(terms))
            return [(seq, coverage(score, ceiling), row) for seq, score, row in found.hits]

        if vector is None:
            return [row._replace(score=score) for _, score, row in await keyword(limit)]
        return await self._hybrid(
            keyword, scope, snapshot, now_us, tag, max_tokens, where, vector, weights, limit, embed
        )

    async def _hybrid(
        self,
        keyword: KeywordList,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        max_tokens: int | None,
        where: ListFilter | None,
        vector: bytes,
        weights: Weights,
        limit: int,
        embed: Embed | None,
    ) -> list[EntryRow]:
        """The keyword list and the nearest entries, side by side, fused."""
        vectors = self._vector_cache()
        pool = candidate_pool(limit)
        keyword_rows: list[tuple[int, float, EntryRow]] = []
        nearest: list[tuple[int, float]] = []
        found: dict[int, EntryRow] = {}  # the rows the checks kept

        async def check(seqs: list[int]) -> tuple[set[int], set[int]]:
            checked = await self._storage.check_candidates(
                scope=scope,
                snapshot=snapshot,
                now_us=now_us,
                seqs=seqs,
                tag=tag,
                max_tokens=max_tokens,
                where=where,
            )
            found.update(checked.kept)
            return set(checked.kept), checked.stored

        async def by_keywords() -> None:
            keyword_rows.extend(await keyword(pool))

        async def by_meaning() -> None:
            nearest.extend(
                await vectors.nearest(
                    scope,
                    snapshot_seq=snapshot,
                    now_us=now_us,
                    vector=vector,
                    floor=weights.floor,
                    count=pool,
                    load_after=lambda after: self._storage.vectors_after(scope=scope, after=after),
                    check=check,
                    embed=embed,
                )
            )

        await side_by_side(by_keywords, by_meaning)  # on two of the backend's connections
        # A keyword hit outside the nearest still has a cosine, which fusion weighs too.
        near = dict(nearest)
        missing = [seq for seq, _, _ in keyword_rows if seq not in near]
        near.update(vectors.cosines(scope, missing, vector))
        fused = fuse(
            [(seq, score) for seq, score, _ in keyword_rows], list(near.items()), weights=weights
        )
        found.update((seq, row) for seq, _, row in keyword_rows)
        return [found[seq]._replace(score=score) for seq, score in fused[:limit]]

    def _vector_cache(self) -> VectorCache:
        if self._vectors is None:
            from .nearest import VectorCache  # numpy: only once a search has a vector

            self._vectors = VectorCache()
        return self._vectors
