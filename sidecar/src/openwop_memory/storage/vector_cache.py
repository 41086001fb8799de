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

Memory: the matrix is float32 (:data:`~openwop_memory.semantic.RANK_DIMENSIONS` x 4 bytes
an entry, plus 24 for its number, expiry and length); scopes least recently searched are
dropped when all cached scopes would exceed ``max_bytes``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import numpy as np
import numpy.typing as npt

from ..semantic import RANK_DIMENSIONS, norms_of, query_threshold, query_vector, similarities
from .base import Scope

NO_EXPIRY = np.iinfo(np.int64).max
_ROW_BYTES = RANK_DIMENSIONS * 4 + 24
_FIRST_CAPACITY = 1024
_A = TypeVar("_A", bound="np.ndarray[Any, Any]")

NewRows = Sequence[tuple[int, int | None, bytes]]  # seq, expires_us, vector
LoadAfter = Callable[[int], Awaitable[NewRows]]
"""The scope's rows with a vector and a sequence number above the argument, in order."""
Check = Callable[[list[int]], Awaitable[tuple[set[int], set[int]]]]
"""Of these sequence numbers: those the search keeps (visible to its snapshot and kept by
its conditions), and those the database still has at all."""


@dataclass
class _Scope:
    seqs: npt.NDArray[np.int64]
    expires: npt.NDArray[np.int64]
    alive: npt.NDArray[np.bool_]
    matrix: npt.NDArray[np.float32]
    norms: npt.NDArray[np.float64]
    size: int
    loaded_seq: int
    lock: anyio.Lock

    @classmethod
    def empty(cls) -> _Scope:
        return cls(
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty(0, np.bool_),
            np.empty((0, RANK_DIMENSIONS), np.float32),
            np.empty(0, np.float64),
            0,
            -1,
            anyio.Lock(),
        )

    @property
    def nbytes(self) -> int:
        return len(self.seqs) * _ROW_BYTES

    def append(self, rows: NewRows) -> None:
        """Add rows (in sequence order), growing the arrays by doubling."""
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
        block = block.reshape(len(rows), -1)[:, :RANK_DIMENSIONS]
        self.matrix[start:end] = block.astype(np.float32)
        self.norms[start:end] = norms_of(self.matrix[start:end])
        self.size = end
        self.loaded_seq = int(rows[-1][0])


async def side_by_side(*calls: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` concurrently; a failure is raised as itself (the first one), not as an
    exception group, so the backend's error contract holds."""
    try:
        async with anyio.create_task_group() as tasks:
            for call in calls:
                tasks.start_soon(call)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


def _grown(array: _A, capacity: int) -> _A:
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    result: _A = grown  # type: ignore[assignment]  # same dtype and rank as array
    return result


class VectorCache:
    """The cached vectors of the scopes searched by meaning, least recently used dropped
    past ``max_bytes``."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._scopes: OrderedDict[Scope, _Scope] = OrderedDict()

    async def nearest(
        self,
        scope: Scope,
        *,
        snapshot_seq: int,
        now_us: int,
        vector: bytes,
        count: int,
        load_after: LoadAfter,
        check: Check,
    ) -> list[int]:
        """The sequence numbers of up to ``count`` entries of ``scope`` nearest to ``vector``
        among those ``check`` keeps and at least :data:`~openwop_memory.semantic.MIN_COSINE`
        similar, nearest first (ties: the larger number first).

        :raises UpstreamUnavailableError: from ``load_after`` or ``check``.
        """
        cached = self._scopes.get(scope)
        if cached is None:
            cached = self._scopes[scope] = _Scope.empty()
        self._scopes.move_to_end(scope)
        async with cached.lock:
            rows = await load_after(cached.loaded_seq)
            if rows:
                cached.append(rows)
                self._evict()
            n = cached.size
            shown = (
                cached.alive[:n] & (cached.seqs[:n] <= snapshot_seq) & (cached.expires[:n] > now_us)
            )
            if count <= 0 or not shown.any():
                return []
            query = query_vector(vector)
            scores = similarities(cached.matrix[:n], cached.norms[:n], query)
            shown &= scores >= query_threshold(query)
            candidates = int(np.count_nonzero(shown))
            if candidates == 0:
                return []
            scores[~shown] = -np.inf
            return await self._best(cached, scores, candidates, count, check)

    async def _best(
        self,
        cached: _Scope,
        scores: npt.NDArray[np.float64],
        candidates: int,
        count: int,
        check: Check,
    ) -> list[int]:
        """The first ``count`` kept entries by score, examined in chunks of growing size,
        each chunk every entry scoring in a band (so equal scores are never split)."""
        kept: list[int] = []
        examined = 0
        above = np.inf
        chunk = 2 * count
        while len(kept) < count and examined < candidates:
            k = min(examined + chunk, candidates)
            threshold = np.partition(scores, len(scores) - k)[len(scores) - k]
            band = np.flatnonzero((scores >= threshold) & (scores < above))
            band = band[np.lexsort((-cached.seqs[band], -scores[band]))]
            examined += len(band)
            above = threshold
            chunk *= 2
            seqs = [int(s) for s in cached.seqs[band]]
            passing, present = await check(seqs)
            gone = [i for i, s in zip(band, seqs, strict=True) if s not in present]
            if gone:
                cached.alive[gone] = False
            kept.extend(s for s in seqs if s in passing)
        return kept[:count]

    def _evict(self) -> None:
        total = sum(s.nbytes for s in self._scopes.values())
        while total > self.max_bytes and len(self._scopes) > 1:
            _, dropped = self._scopes.popitem(last=False)
            total -= dropped.nbytes

    def forget(self, scope: Scope) -> None:
        """Drop the scope's cached vectors (after a purge, say); the next search reloads."""
        self._scopes.pop(scope, None)
