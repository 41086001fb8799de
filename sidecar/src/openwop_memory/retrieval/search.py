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
from .context import with_context
from .fusion import LIGHT_WEIGHTS, Weights, coverage, fuse, keyword_ceiling
from .time_cues import SAYS_WHEN, says_when

if TYPE_CHECKING:  # numpy comes with the search extra, which a query vector implies
    from .nearest import VectorCache


KeywordHits = tuple[list[tuple[int, float]], dict[int, EntryRow]]
"""Keyword hits as ``(seq, coverage)``, best first, and their rows by ``seq`` (when read)."""

KeywordList = Callable[[int, bool], Awaitable[KeywordHits]]
"""Up to the first argument's number of keyword hits, with their rows if the second is
true."""


CONTEXT_LINKED = 40
"""At most this many of the best candidates are linked to their neighbours: a long answer's
tail gains little from context, and every one linked costs a check of its neighbours (for
list(100) on a 100,000-entry scope, linking all 100 took 3 to 4 ms more than none)."""


def candidate_pool(limit: int) -> int:
    """How many candidates each side brings to fusion for an answer of ``limit``: half as
    many again as ``limit``, so that an entry second on both sides can pass one first on
    only one (and, for a short answer, 40: enough for context to lift a neighbour from
    below the first 20, which measured better on conversations). Twice ``limit`` cost a
    list(100) of a 100,000-entry scope about 1 ms more, for entries that could only fuse
    into the answer's tail."""
    return max(limit + limit // 2, 40)


def context_linked(limit: int) -> int:
    """How many of the best candidates an answer of ``limit`` links to their neighbours:
    ``limit``, at least 20 and at most :data:`CONTEXT_LINKED`."""
    return min(max(limit, 20), CONTEXT_LINKED)


def _scored(row: EntryRow, score: float) -> EntryRow:
    """``row`` with ``score``: built from its fields, ``score`` last (NamedTuple's
    ``_replace`` cost 1.5 µs an entry, a hundred of them an answer)."""
    return EntryRow(*row[:-1], score)


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
        when: bool = False,
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
        whose vector is still pending is embedded by ``embed`` first. When the query asks
        when (``when``, :func:`~openwop_memory.retrieval.time_cues.asks_when`), an entry
        that says when (:func:`~openwop_memory.retrieval.time_cues.says_when`) weighs
        :data:`~openwop_memory.retrieval.time_cues.SAYS_WHEN` more. Then each of the best
        :func:`context_linked` candidates is linked to the entries
        before and after it in the snapshot, which are scored too, and every score counts
        the best linked one's (:func:`~openwop_memory.retrieval.context.with_context`).

        Each row found carries its ``score`` in [0, 1]: the fused score with its context,
        or without ``vector`` its keyword coverage
        (:func:`~openwop_memory.retrieval.fusion.coverage`).
        Nothing outside the snapshot weighs in, so the same snapshot and query give the
        same order for as long as no entry expires.

        :raises UpstreamUnavailableError: from any of the storage's calls.
        """

        async def keyword(count: int, rows: bool) -> KeywordHits:
            if not terms:
                return [], {}
            found = await self._storage.keyword_candidates(
                scope=scope,
                snapshot=snapshot,
                now_us=now_us,
                terms=terms,
                limit=count,
                tag=tag,
                max_tokens=max_tokens,
                where=where,
                rows=rows,
            )
            ceiling = keyword_ceiling(found.total, found.counts, len(terms))
            return [(seq, coverage(score, ceiling)) for seq, score in found.hits], found.rows

        if vector is None:
            hits, rows = await keyword(limit, True)
            return [_scored(rows[seq], score) for seq, score in hits]
        return await self._hybrid(
            keyword,
            scope,
            snapshot,
            now_us,
            tag,
            max_tokens,
            where,
            vector,
            weights,
            limit,
            embed,
            when,
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
        when: bool,
    ) -> list[EntryRow]:
        """The keyword list and the nearest entries, side by side, fused, then with their
        neighbours scored and context counted."""
        vectors = self._vector_cache()
        pool = candidate_pool(limit)
        keyword_list: list[tuple[int, float]] = []
        nearest: list[tuple[int, float]] = []
        found: dict[int, EntryRow] = {}  # the rows read so far, of entries the checks kept

        async def check(seqs: list[int], rows: bool = when) -> tuple[set[int], set[int]]:
            # Candidates are checked without their rows (only the answer's are read, at the
            # end), unless the time cues must read every candidate's text.
            checked = await self._storage.check_candidates(
                scope=scope,
                snapshot=snapshot,
                now_us=now_us,
                seqs=seqs,
                tag=tag,
                max_tokens=max_tokens,
                where=where,
                rows=rows,
            )
            found.update(checked.rows)
            return checked.kept, checked.stored

        # When the product takes a thread on every CPU, the keyword statement waits for it:
        # beside it, one part waited for a CPU (2 ms at the p90 on 2 CPUs) and the product
        # ended last; after it, the statement runs beside the check of the nearest.
        product_done = anyio.Event()
        after_product = vectors.fills_every_cpu(scope, len(vector))

        async def by_keywords() -> None:
            if after_product:
                await product_done.wait()
            # Without their rows, unless the time cues read them: the answer's are read
            # at the end, as the nearest's are.
            hits, rows = await keyword(pool, when)
            keyword_list.extend(hits)
            found.update(rows)

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
                    scored=product_done,
                )
            )

        await side_by_side(by_keywords, by_meaning)  # on two of the backend's connections
        # A keyword hit outside the nearest still has a cosine, which fusion weighs too.
        near = dict(nearest)
        missing = [seq for seq, _ in keyword_list if seq not in near]
        near.update(vectors.cosines(scope, missing, vector))
        fused = fuse(keyword_list, list(near.items()), weights=weights)
        links: dict[int, tuple[int | None, int | None]] = {}
        if weights.context > 0:
            # The neighbours in the snapshot (kept by ``check``) of the best few, scored as
            # any candidate is: their keyword score if listed, and their cosine.
            links = await vectors.adjacent(
                scope,
                [seq for seq, _ in fused[: context_linked(limit)]],
                snapshot_seq=snapshot,
                now_us=now_us,
                dimensions=len(vector),
                check=check,
            )
            added = {s for pair in links.values() for s in pair if s is not None}
            if added - near.keys():
                near.update(vectors.cosines(scope, sorted(added - near.keys()), vector))
                fused = fuse(keyword_list, list(near.items()), weights=weights)
        scores = dict(fused)
        if when:
            scores = {
                seq: score
                * (1 + SAYS_WHEN if says_when(found[seq].content) else 1)
                / (1 + SAYS_WHEN)
                for seq, score in scores.items()
            }
        scored = with_context(scores, links, weight=weights.context)
        # Best first, ties by the larger seq: (score, seq) pairs, largest first.
        ranked = sorted([(score, seq) for seq, score in scored.items()], reverse=True)
        answer: list[EntryRow] = []
        start = 0
        while len(answer) < limit and start < len(ranked):
            window = ranked[start : start + limit - len(answer)]
            start += len(window)
            unread = [seq for _, seq in window if seq not in found]
            if unread:
                await check(unread, rows=True)
            # An entry a sweep or forget removed since its check is gone: the next fill in.
            answer.extend(_scored(found[seq], score) for score, seq in window if seq in found)
        return answer

    async def prefetch(self, *, scope: Scope, dimensions: int, embed: Embed | None) -> None:
        """Load ``scope``'s vectors of ``dimensions`` into memory now, as the next search by
        meaning would first (run beside a first query's embedding, it takes the scope's load
        off that search's time).

        :raises UpstreamUnavailableError: from the storage.
        """
        await self._vector_cache().refresh(
            scope,
            dimensions,
            load_after=lambda after: self._storage.vectors_after(scope=scope, after=after),
            embed=embed,
        )

    def _vector_cache(self) -> VectorCache:
        if self._vectors is None:
            from .nearest import VectorCache  # numpy: only once a search has a vector

            self._vectors = VectorCache()
        return self._vectors
