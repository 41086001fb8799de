"""Vectors computed after the put, not in it.

A put with the embedding model stores :data:`~storage.base.PENDING_VECTOR` and is
acknowledged once its row is durable; the put's entry is noted here, and :meth:`run`
computes the vectors of what was noted, a batch at a time on a worker thread, and stores
them (:meth:`~storage.base.WorkerPath.set_vectors`). Nothing depends on it keeping up: a
search computes every pending vector of its scope itself, the same bytes the indexer
would store, so rankings are the same at any moment, on any sidecar (a vector is a pure
function of the redacted content). A note dropped (the backlog full, the process ended,
a write failed) costs a search that computation again, nothing else.
"""

from __future__ import annotations

import time
from collections import deque

import anyio
import structlog

from ..storage.base import NO_VECTOR, WorkerPath
from .embedding import EmbeddingModel

log = structlog.get_logger("openwop_memory.indexer")

BATCH = 64
"""Entries embedded and stored together: one worker-thread hand-off and one write each."""
BACKLOG = 16_384
"""Notes kept at most; past it the oldest are dropped (searches compute them)."""
QUIET = 0.02
"""Seconds without a put that the indexer waits for before a batch: a burst of puts is then
embedded and stored in a few batches, not one write transaction each, and a stream of puts
is not slowed by a batch beside it (a sentence encoder's batch is most of a second)."""
MAX_DEFER = 1.0
"""Seconds a batch waits at most for puts to pause: a steady stream is indexed too."""


class VectorIndexer:
    """Computes and stores the vectors of the entries :meth:`note` is given."""

    def __init__(self, storage: WorkerPath, embedding: EmbeddingModel) -> None:
        self._storage = storage
        self._embedding = embedding
        self._backlog: deque[tuple[str, str]] = deque(maxlen=BACKLOG)
        self._wake = anyio.Event()
        # When the last put was noted (time.monotonic: anyio's clock costs a put 1 µs more
        # to read, through the async library's detection).
        self._last_note = 0.0
        self.indexed = 0
        self.in_flight = 0
        self.failed_batches = 0

    @property
    def backlog(self) -> int:
        """Entries noted and not indexed yet."""
        return len(self._backlog)

    def note(self, entry_id: str, content: str) -> None:
        """Index the entry ``entry_id`` (its redacted ``content``) soon; never blocks."""
        self._backlog.append((entry_id, content))
        self._last_note = time.monotonic()
        self._wake.set()

    async def run(self) -> None:
        """Index what is noted until cancelled. Never raises otherwise.

        It yields to puts: a batch waits for a pause in them (:meth:`_pause`), and after
        a batch during which one was put it rests three times as long as the batch took,
        as the keyword indexers do (``storage/catch_up.py``), so it takes at most a quarter
        of the sidecar and of the writer while puts keep coming, and they wait behind one
        batch at most, not a queue of them. With no put meanwhile it goes on at once (a
        sentence encoder's backlog is then indexed at full speed). A search computes
        whatever is still pending."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._backlog:
                await self._pause()
                started = time.monotonic()
                await self.index_once()
                if self._backlog and self._last_note >= started:  # puts came meanwhile
                    await anyio.sleep(3 * (time.monotonic() - started))

    async def _pause(self) -> None:
        """Until no put has been noted for :data:`QUIET` seconds, :data:`MAX_DEFER` at
        most."""
        deadline = time.monotonic() + MAX_DEFER
        while (now := time.monotonic()) < deadline:
            quiet_for = now - self._last_note
            if quiet_for >= QUIET:
                return
            await anyio.sleep(min(QUIET - quiet_for, deadline - now))

    async def index_once(self) -> int:
        """Index up to :data:`BATCH` noted entries; how many were taken. Never raises but
        for cancellation: a failed batch is logged and left to the searches."""
        batch = [self._backlog.popleft() for _ in range(min(BATCH, len(self._backlog)))]
        if not batch:
            return 0
        self.in_flight = len(batch)
        try:
            vectors = await self._embedding.vectors([content for _, content in batch])
            await self._storage.set_vectors(
                [
                    (entry_id, NO_VECTOR if vector is None else vector)
                    for (entry_id, _), vector in zip(batch, vectors, strict=True)
                ]
            )
        except Exception as exc:  # noqa: BLE001 - searches compute what is not stored
            self.failed_batches += 1
            log.warning(
                "indexing_failed",
                entries=len(batch),
                error_type=type(exc).__name__,
                reason=getattr(exc, "code", None),
            )
        else:
            self.indexed += len(batch)
        finally:
            self.in_flight = 0
        return len(batch)
