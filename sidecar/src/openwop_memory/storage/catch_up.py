"""Work a backend does after the put's commit, in batches, paced: written once for every
backend (their keyword indexers give the batch; this decides when it runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from openwop_memory_client import MemoryServiceError

log = structlog.get_logger("openwop_memory.storage")

LINGER = 0.02
"""Seconds the background waits after a put for more to come, so a burst is one batch."""


class CatchUp:
    """Runs ``batch`` (one transaction; returns how many items it did) after puts until a
    batch does fewer than ``size``.

    Paced: after each batch it rests three times as long as the batch took, so a backlog
    (after a bulk load, say) takes at most a quarter of the writer, and the puts meanwhile
    wait for one short batch, not for a queue of them. (Back to back, a 100,000-entry
    backlog took a sequential client's put p99 from 6 to 22 ms and its p50 from 0.65 to
    1.4 ms in ``make bench`` on SQLite; paced so, 6.6 and 0.75.)
    """

    def __init__(self, batch: Callable[[], Awaitable[int]], size: int, what: str) -> None:
        self._batch = batch
        self._size = size
        self._what = what  # the log event's name on a failure
        # False leaves all the work to the readers (a benchmark measures a put alone so).
        self.enabled = True
        self._task: asyncio.Task[None] | None = None
        self._again = False

    async def everything(self) -> None:
        """Batches back to back until one is short: everything committed before this call
        is done.

        :raises MemoryServiceError: a commit failed.
        """
        while await self._batch() == self._size:
            pass

    async def _paced(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if await self._batch() < self._size:
                return
            await asyncio.sleep(3 * (loop.time() - started))

    def note_put(self) -> None:
        """A put has committed: do its work soon, in the background. Never blocks or raises."""
        if not self.enabled:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        else:
            self._again = True  # the running catch-up goes round once more

    async def _run(self) -> None:
        """Work until nothing is left that was committed before the last :meth:`note_put`.
        A failure is logged and left to the readers and the next put."""
        try:
            while True:
                self._again = False
                await asyncio.sleep(LINGER)
                await self._paced()
                if not self._again:
                    return
        except MemoryServiceError as exc:
            log.warning(self._what, reason=exc.details.get("reason", exc.code))

    async def close(self) -> None:
        """Stop the background (a batch in flight still commits or rolls back)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)
        self._task = None
