"""The nearest entries by meaning, for every backend: a per-scope matrix of the stored
vectors, kept in memory and brought up to date from the database before each search.

What is cached never goes stale in a way that matters: an entry's vector, sequence number
and expiry never change after its put. What does change is checked in the database for
the candidates only: whether an entry is still there at all (a sweep or purge removes
rows), deleted as of the snapshot, and kept by the search's tag, token and ``where``
conditions. So a search reads new rows (those with a sequence number above what the cache
holds, cheap on the scope's index), scores every cached entry of the snapshot in one
matrix product, and asks the database about the best ones, a chunk at a time, until it
has as many as it needs. A row the database no longer has is dropped from the cache.

This relies on a scope's sequence numbers being committed in order (both backends hand
them out under a lock held until commit): once the cache holds every row up to ``n``, no
row with a number at or below ``n`` can appear later.

Memory: the matrix holds the stored int8 vectors as they are (the model's dimensions in
bytes an entry, plus 25 for its number, expiry, length and liveness), multiplied as int8
by :func:`~.encoders.wordllama.similarities`; scopes least recently
searched are dropped when all cached scopes would exceed ``max_bytes``, or there would be
more than ``max_scopes`` of them.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np
import numpy.typing as npt

from ..storage.base import NO_VECTOR, PENDING_VECTOR, Embed, Scope
from .blas import one_thread_per_product
from .encoders.wordllama import norms_of, similarities

NO_EXPIRY = np.iinfo(np.int64).max
_ROW_OVERHEAD = 25  # an entry's number, expiry, length and liveness, in bytes


def row_bytes(dimensions: int) -> int:
    """Memory an entry with a vector of ``dimensions`` takes in the cache (its arrays grow
    by doubling: up to twice that)."""
    return dimensions + _ROW_OVERHEAD


_FIRST_CAPACITY = 1024
# Up to this many bytes of cached vectors (8,192 rows of 384) a search scores on the event
# loop, where the hand-off to a thread would cost more than the product.
_INLINE_BYTES = 8192 * 384
# Up to this many new rows are added to a scope's cache on the event loop.
_INLINE_APPEND = 8192
# A scope's product is cut into parts of at least this many bytes of vectors (131,072 rows
# of 384), scored on a worker thread each, as many as there are CPUs. Below twice that
# one thread scores it, and the search's keyword statement runs beside it on another CPU
# rather than after it: 100,000 rows of 384 took 2.1 to 2.4 ms on one thread and 1.5 to
# 1.7 on two, and the statement about 1.5 ms. A search on one CPU also leaves the others
# to other clients' requests.
_PART_BYTES = 48 << 20
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_A = TypeVar("_A", bound="np.ndarray[Any, Any]")
_Found = tuple["npt.NDArray[np.intp]", "npt.NDArray[np.float64]"]

NewRows = Sequence[Any]  # rows of (seq, expires_us, vector, ...), tuples or driver records
LoadAfter = Callable[[int], Awaitable[NewRows]]
"""The scope's rows with a vector (or a pending one, then with the content as a fourth
member) and a sequence number above the argument, in order."""
Check = Callable[[list[int]], Awaitable[tuple[set[int], set[int]]]]
"""Of these sequence numbers: those the search keeps (visible to its snapshot and kept by
its conditions), and those the database still has at all."""


@dataclass
class _Scope:
    seqs: npt.NDArray[np.int64]
    expires: npt.NDArray[np.int64]
    alive: npt.NDArray[np.bool_]
    matrix: npt.NDArray[np.int8]
    norms: npt.NDArray[np.float64]
    size: int
    loaded_seq: int
    lock: anyio.Lock
    dimensions: int

    @classmethod
    def empty(cls, dimensions: int) -> _Scope:
        return cls(
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty(0, np.bool_),
            np.empty((0, dimensions), np.int8),
            np.empty(0, np.float64),
            0,
            -1,
            anyio.Lock(),
            dimensions,
        )

    @property
    def nbytes(self) -> int:
        return len(self.seqs) * row_bytes(self.dimensions)

    def append(self, new: NewRows) -> None:
        """Add rows (in sequence order), growing the arrays by doubling; a vector of another
        length (another model's) is left out."""
        last_seq = int(new[-1][0])
        rows = [r for r in new if len(r[2]) == self.dimensions]
        if not rows:
            self.loaded_seq = last_seq
            return
        needed = self.size + len(rows)
        if needed > len(self.seqs):
            capacity = max(_FIRST_CAPACITY, needed, 2 * len(self.seqs))
            self.seqs = _grown(self.seqs, capacity)
            self.expires = _grown(self.expires, capacity)
            self.alive = _grown(self.alive, capacity)
            self.matrix = _grown(self.matrix, capacity)
            self.norms = _grown(self.norms, capacity)
        start, end = self.size, needed
        self.seqs[start:end] = [r[0] for r in rows]
        self.expires[start:end] = [NO_EXPIRY if r[1] is None else r[1] for r in rows]
        self.alive[start:end] = True
        block = np.frombuffer(b"".join(r[2] for r in rows), dtype=np.int8)
        block = block.reshape(len(rows), self.dimensions)
        self.matrix[start:end] = block
        self.norms[start:end] = norms_of(block)
        self.size = end
        self.loaded_seq = last_seq


def _candidates(
    cached: _Scope,
    rows: range,
    snapshot_seq: int,
    now_us: int,
    query: npt.NDArray[np.float32],
    floor: float,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The positions among ``rows`` of those the snapshot shows at ``now_us`` whose cosine
    with ``query`` is above ``floor``, and their cosines."""
    at = slice(rows.start, rows.stop)
    shown = cached.alive[at] & (cached.seqs[at] <= snapshot_seq) & (cached.expires[at] > now_us)
    cosines = similarities(cached.matrix[at], cached.norms[at], query)
    cosines /= float(np.sqrt(float(np.dot(query, query))))
    where = np.flatnonzero(shown & (cosines > floor))
    return where + rows.start, cosines[where]


def _first_chunk(count: int) -> int:
    """How many of the best candidates the first check asks about, for ``count`` kept:
    most pass (the cache holds only rows of the scope's own sequence), and a quarter more
    than needed usually settles it in one check."""
    return count + count // 4


def _parts(n: int, dimensions: int) -> list[range]:
    """The first ``n`` rows (of ``dimensions`` bytes each) cut into as many consecutive
    parts as there are CPUs to score them on at once (at most 4, and none of fewer than
    :data:`_PART_BYTES`)."""
    count = max(1, min(_CPUS, 4, n * dimensions // _PART_BYTES))
    bounds = [n * i // count for i in range(count + 1)]
    return [range(lo, hi) for lo, hi in itertools.pairwise(bounds)]


async def _filled(rows: NewRows, embed: Embed | None) -> NewRows:
    """``rows`` with each pending vector computed by ``embed``. Without ``embed`` pending
    rows stay pending, which the cache leaves out (only storage-level callers omit it)."""
    pending = [i for i, r in enumerate(rows) if r[2] == PENDING_VECTOR]
    if not pending or embed is None:
        return rows
    vectors = await embed([rows[i][3] for i in pending])
    filled = list(rows)
    for i, vector in zip(pending, vectors, strict=True):
        filled[i] = (rows[i][0], rows[i][1], NO_VECTOR if vector is None else vector)
    return filled


def _shown(
    cached: _Scope, n: int, start: int, direction: int, count: int, snapshot_seq: int, now_us: int
) -> tuple[list[int], int]:
    """Up to ``count`` positions of rows the snapshot shows at ``now_us``, from ``start`` in
    ``direction`` (-1 or 1) within the first ``n``, and the position to go on from. Going
    forward it stops at the first row past the snapshot: every later one is too."""
    positions: list[int] = []
    i = start
    while 0 <= i < n and len(positions) < count:
        if cached.seqs[i] > snapshot_seq:
            if direction > 0:
                return positions, n
        elif cached.alive[i] and cached.expires[i] > now_us:
            positions.append(i)
        i += direction
    return positions, i


# A partition of a whole part's scores cost 0.65 ms a 100,000 here: with more than this
# many scores a k-th largest is sought among a few read off every _SAMPLE_EVERY-th first.
_SAMPLE_EVERY = 16
_SAMPLE_FROM = 16384


def _contenders(scores: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """Scores among ``scores`` that hold its ``k`` largest (``0 < k < len(scores)``): those
    at or above a bound read from every :data:`_SAMPLE_EVERY`-th score, about ``2k`` of
    them, where that bound leaves at least ``k``; otherwise all of them."""
    if len(scores) < _SAMPLE_FROM:
        return scores
    sample = scores[::_SAMPLE_EVERY]
    j = min(len(sample), 2 * (k // _SAMPLE_EVERY) + 8)
    bound = np.partition(sample, len(sample) - j)[len(sample) - j]
    above: npt.NDArray[np.float64] = scores[scores >= bound]
    return above if len(above) >= k else scores


def _top(scores: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """The ``k`` largest of ``scores`` (all of them if fewer), in no order."""
    if k >= len(scores):
        return scores
    held = _contenders(scores, k)
    top: npt.NDArray[np.float64] = np.partition(held, len(held) - k)[len(held) - k :]
    return top


def _kth_largest(scores: npt.NDArray[np.float64], k: int) -> float:
    """The ``k``-th largest of ``scores`` (the smallest if there are fewer; 0 if none)."""
    k = min(k, len(scores))
    if not k:
        return 0.0
    held = _contenders(scores, k) if k < len(scores) else scores
    return float(np.partition(held, len(held) - k)[len(held) - k])


async def _scored_apart(parts: list[Callable[[], _Found]], k: int) -> tuple[_Found, float]:
    """Each of ``parts`` run on a worker thread, all at once; their results joined in
    order, and the ``k``-th largest score of them all. Each thread also picks its own
    ``k`` best, among which the ``k`` best of all are: a partition of the whole on the
    event loop cost 1 ms a 100,000 scores."""
    found: list[tuple[_Found, npt.NDArray[np.float64]] | None] = [None] * len(parts)

    def scored(part: Callable[[], _Found]) -> tuple[_Found, npt.NDArray[np.float64]]:
        where, scores = part()
        return (where, scores), _top(scores, k)

    async def one(i: int) -> None:
        found[i] = await anyio.to_thread.run_sync(scored, parts[i])

    async with anyio.create_task_group() as tasks:
        for i in range(len(parts)):
            tasks.start_soon(one, i)
    done = [f for f in found if f is not None]
    where = np.concatenate([w for (w, _), _ in done])
    scores = np.concatenate([c for (_, c), _ in done])
    tops = np.concatenate([top for _, top in done])
    return (where, scores), _kth_largest(tops, k)


def _grown(array: _A, capacity: int) -> _A:
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    result: _A = grown  # type: ignore[assignment]  # same dtype and rank as array
    return result


class VectorCache:
    """The cached vectors of the scopes searched by meaning, least recently used dropped
    past ``max_bytes`` or ``max_scopes``."""

    def __init__(self, max_bytes: int = 256 << 20, max_scopes: int = 4096) -> None:
        one_thread_per_product()
        self.max_bytes = max_bytes
        self.max_scopes = max_scopes
        self._scopes: OrderedDict[Scope, _Scope] = OrderedDict()

    async def nearest(
        self,
        scope: Scope,
        *,
        snapshot_seq: int,
        now_us: int,
        vector: bytes,
        floor: float,
        count: int,
        load_after: LoadAfter,
        check: Check,
        embed: Embed | None = None,
        scored: anyio.Event | None = None,
    ) -> list[tuple[int, float]]:
        """The sequence numbers of up to ``count`` entries of ``scope`` nearest to ``vector``
        among those ``check`` keeps and whose cosine with it is above ``floor``, with their
        cosines, nearest first (ties: the larger number first). Only entries with a vector
        of ``vector``'s length (its model's) take part. ``scored`` is set once every entry
        is scored (before the candidates are checked), or on the way out.

        :raises UpstreamUnavailableError: from ``load_after`` or ``check``.
        """
        try:
            cached = self._scope(scope, len(vector))
            async with cached.lock:
                await self._refreshed(cached, load_after, embed)
                n = cached.size
                if count <= 0 or n == 0:
                    return []
                query = np.frombuffer(vector, dtype=np.int8).astype(np.float32)
                score = partial(_candidates, cached, snapshot_seq=snapshot_seq, now_us=now_us)
                # A big scope's product is milliseconds: off the event loop (SimSIMD and
                # numpy let go of the GIL), on one thread or, past _PART_BYTES, in parts on
                # as many as there are CPUs; a small one costs less than the hand-off.
                first = _first_chunk(count)
                if n * cached.dimensions > _INLINE_BYTES:
                    parts = _parts(n, cached.dimensions)
                    (where, scores), threshold = await _scored_apart(
                        [partial(score, rows=part, query=query, floor=floor) for part in parts],
                        first,
                    )
                else:
                    where, scores = score(rows=range(n), query=query, floor=floor)
                    threshold = _kth_largest(scores, first)
                if scored is not None:
                    scored.set()
                if len(where) == 0:
                    return []
                return await self._best(cached, where, scores, count, check, threshold)
        finally:
            if scored is not None:
                scored.set()

    def fills_every_cpu(self, scope: Scope, dimensions: int) -> bool:
        """Whether scoring ``scope`` (as cached now) takes a thread on every CPU, so that
        anything else run meanwhile slows it down."""
        cached = self._scopes.get(scope)
        if cached is None or cached.dimensions != dimensions:
            return False
        size = cached.size * dimensions
        return size > _INLINE_BYTES and len(_parts(cached.size, dimensions)) >= _CPUS

    async def refresh(
        self, scope: Scope, dimensions: int, *, load_after: LoadAfter, embed: Embed | None = None
    ) -> None:
        """Bring ``scope``'s vectors of ``dimensions`` up to date, as a search by meaning
        does first: a scope's first search after a start reads all of them (100,000 rows of
        384: about 0.3 s here, most of it the database's read), which can so run beside the
        query's embedding.

        :raises UpstreamUnavailableError: from ``load_after``.
        """
        cached = self._scope(scope, dimensions)
        async with cached.lock:
            await self._refreshed(cached, load_after, embed)

    def _scope(self, scope: Scope, dimensions: int) -> _Scope:
        """The cache of ``scope`` for vectors of ``dimensions``, made (empty) if there is
        none, or none of that length; the most recently used now."""
        cached = self._scopes.get(scope)
        if cached is None or cached.dimensions != dimensions:
            cached = self._scopes[scope] = _Scope.empty(dimensions)
            self._evict()
        self._scopes.move_to_end(scope)
        return cached

    async def _refreshed(self, cached: _Scope, load_after: LoadAfter, embed: Embed | None) -> None:
        """The rows put since ``cached`` was last brought up to date added to it, their
        vectors computed where the indexer has not stored them yet (the ranking is the same
        whether it has or not). Its lock is held."""
        rows = await _filled(await load_after(cached.loaded_seq), embed)
        if len(rows) > _INLINE_APPEND:  # a first search of a big scope: 100k rows ~0.1 s
            await anyio.to_thread.run_sync(cached.append, rows)
            self._evict()
        elif rows:
            cached.append(rows)
            self._evict()

    def cosines(self, scope: Scope, seqs: Sequence[int], vector: bytes) -> dict[int, float]:
        """The cosine with ``vector`` of each of ``seqs`` whose vector of the same model the
        cache holds (as :meth:`nearest` computes it); the others are left out."""
        cached = self._scopes.get(scope)
        if cached is None or cached.dimensions != len(vector) or not seqs:
            return {}
        n = cached.size
        wanted = np.asarray(seqs, dtype=np.int64)
        at = np.minimum(np.searchsorted(cached.seqs[:n], wanted), max(n - 1, 0))
        held = (cached.seqs[:n][at] == wanted) if n else np.zeros(len(wanted), np.bool_)
        if not held.any():
            return {}
        rows = at[held]
        query = np.frombuffer(vector, dtype=np.int8).astype(np.float32)
        values = similarities(cached.matrix[rows], cached.norms[rows], query)
        values /= float(np.sqrt(float(np.dot(query, query))))
        return dict(zip(wanted[held].tolist(), values.tolist(), strict=True))

    async def adjacent(
        self,
        scope: Scope,
        seqs: Sequence[int],
        *,
        snapshot_seq: int,
        now_us: int,
        dimensions: int,
        check: Check,
    ) -> dict[int, tuple[int | None, int | None]]:
        """For each of ``seqs`` the cache holds (with a vector of ``dimensions``), the
        sequence numbers of the nearest entry before it and after it in the scope among the
        entries the snapshot shows at ``now_us`` that ``check`` keeps and that have such a
        vector (None on a side with none): the turns around a turn, as the snapshot has
        them, whatever was deleted, erased or written since. Call it after
        :meth:`nearest` in the same search, which brought the cache up to date.

        :raises UpstreamUnavailableError: from ``check``.
        """
        cached = self._scopes.get(scope)
        if cached is None or cached.dimensions != dimensions or not seqs:
            return {}
        n = cached.size
        held = cached.seqs[:n]
        at = dict(zip(seqs, np.searchsorted(held, seqs).tolist(), strict=True))
        # (seq, direction) -> the next position of the cache to examine on that side. The
        # rows are walked from the entry outwards, not masked as a whole: a few a side.
        sides = {(s, d): p + d for s, p in at.items() if p < n and held[p] == s for d in (-1, 1)}
        found: dict[tuple[int, int], int | None] = {}
        step = 1  # most entries' neighbours are kept: one a side settles them in one check
        while sides:
            runs = {}
            for side, start in sides.items():
                positions, sides[side] = _shown(
                    cached, n, start, side[1], step, snapshot_seq, now_us
                )
                runs[side] = [int(held[i]) for i in positions]
            asked = sorted({s for run in runs.values() for s in run})
            kept = (await check(asked))[0] if asked else set()
            for side, run in runs.items():
                hit = next((s for s in run if s in kept), None)
                if hit is not None or len(run) < step:
                    found[side] = hit
                    del sides[side]
            step *= 2
        return {s: (found[s, -1], found[s, 1]) for s, _ in found if (s, -1) in found}

    async def _best(
        self,
        cached: _Scope,
        where: npt.NDArray[np.intp],
        scores: npt.NDArray[np.float64],
        count: int,
        check: Check,
        first_threshold: float,
    ) -> list[tuple[int, float]]:
        """The first ``count`` kept entries by score among the candidates at ``where``
        (``scores`` theirs), examined in chunks of growing size, each chunk every candidate
        scoring in a band (so equal scores are never split between chunks); the first band
        reaches down to ``first_threshold``, the :func:`_first_chunk`-th largest score."""
        kept: list[tuple[int, float]] = []
        examined = 0
        above = np.inf
        chunk = _first_chunk(count)
        while len(kept) < count and examined < len(where):
            k = min(examined + chunk, len(where))
            threshold = first_threshold if examined == 0 else _kth_largest(scores, k)
            band = np.flatnonzero((scores >= threshold) & (scores < above))
            seqs_of_band = cached.seqs[where[band]]
            band = band[np.lexsort((-seqs_of_band, -scores[band]))]
            examined += len(band)
            above = threshold
            chunk *= 2
            seqs: list[int] = cached.seqs[where[band]].tolist()
            passing, present = await check(seqs)
            gone = [where[i] for i, s in zip(band, seqs, strict=True) if s not in present]
            if gone:
                cached.alive[gone] = False
            banded: list[float] = scores[band].tolist()
            kept.extend((s, c) for s, c in zip(seqs, banded, strict=True) if s in passing)
        return kept[:count]

    def _evict(self) -> None:
        total = sum(s.nbytes for s in self._scopes.values())
        while len(self._scopes) > 1 and (
            total > self.max_bytes or len(self._scopes) > self.max_scopes
        ):
            _, dropped = self._scopes.popitem(last=False)
            total -= dropped.nbytes
