"""One large redaction at a time, the tenants waiting taking turns.

Redaction is Python holding the GIL. Run on many threads at once, it leaves the event loop
(which answers every other client) a small share of the GIL: 96 large puts pipelined by
one client made another client's ``sidecar.health`` wait 2.8 s with anyio's 40 threads.
On one thread the loop gets the GIL back at every switch interval. A first-come queue in
front of that thread would still let one tenant's burst (up to ``max_pipelined`` puts a
connection) hold another tenant's large put for seconds, so the queue is served round
robin by tenant: a put waits for at most one redaction of each other tenant waiting.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class RedactionTurns:
    """Runs callables on a worker thread one at a time, tenants in turn. Use from one
    event loop only."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: OrderedDict[str, deque[anyio.Event]] = OrderedDict()
        self._limiter: anyio.CapacityLimiter | None = None  # made inside the event loop

    async def run(self, tenant: str, work: Callable[[], T]) -> T:
        """``work()`` on the worker thread once it is ``tenant``'s turn; its result.

        Cancelled while waiting, the place is given up; once started, ``work`` runs to its
        end (a thread cannot be stopped) and the next turn starts after it.
        """
        if self._busy:
            turn = anyio.Event()
            queue = self._waiting.setdefault(tenant, deque())
            queue.append(turn)
            try:
                await turn.wait()
            except BaseException:
                if turn.is_set():  # the turn was handed over already: pass it on
                    self._next(tenant)
                else:
                    queue.remove(turn)
                    if not queue and self._waiting.get(tenant) is queue:
                        del self._waiting[tenant]
                raise
        else:
            self._busy = True
        try:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(1)
            return await anyio.to_thread.run_sync(work, limiter=self._limiter)
        finally:
            self._next(tenant)

    def _next(self, finished: str) -> None:
        """Hand the thread to the first tenant waiting other than ``finished`` (whose turn
        it was) if there is one; the tenant served goes to the back."""
        if not self._waiting:
            self._busy = False
            return
        if len(self._waiting) > 1 and next(iter(self._waiting)) == finished:
            self._waiting.move_to_end(finished)
        tenant, queue = next(iter(self._waiting.items()))
        turn = queue.popleft()
        if queue:
            self._waiting.move_to_end(tenant)
        else:
            del self._waiting[tenant]
        turn.set()
