"""One large redaction at a time, the tenants waiting taking turns.

Redaction is Python holding the GIL. Run on many threads at once, it leaves the event loop
(which answers every other client) a small share of the GIL: 96 large puts pipelined by
one client made another client's ``sidecar.health`` wait 2.8 s with anyio's 40 threads.
On one thread the loop gets the GIL back at every switch interval. A first-come queue in
front of that thread would still let one tenant's burst (up to ``max_pipelined`` puts a
connection) hold another tenant's large put for seconds, so the queue is served round
robin by party, in two levels as open runs are shared (``runs.py``): between the Unix users
(peer uids) waiting, then between the tenants each user's redactions are for. A put waits
for at most one redaction of each other user waiting, however many tenant names another
user's process spreads its puts over (without tenant binding any process may name any
tenant; its uid is the kernel's), and within its own user's turns, for at most one of each
other tenant of that user.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class RedactionTurns:
    """Runs callables on a worker thread one at a time, users then tenants in turn. Use
    from one event loop only."""

    def __init__(self) -> None:
        self._busy = False
        # uid -> tenant -> the turns waiting; each level in the order it is served.
        self._waiting: OrderedDict[int | None, OrderedDict[str, deque[anyio.Event]]] = OrderedDict()
        self._limiter: anyio.CapacityLimiter | None = None  # made inside the event loop

    async def run(self, tenant: str, work: Callable[[], T], uid: int | None = None) -> T:
        """``work()`` on the worker thread once it is ``tenant``'s turn within ``uid``'s
        (the caller's Unix user; ``None``: no worker's connection); its result.

        Cancelled while waiting, the place is given up; once started, ``work`` runs to its
        end (a thread cannot be stopped) and the next turn starts after it.
        """
        if self._busy:
            turn = anyio.Event()
            tenants = self._waiting.setdefault(uid, OrderedDict())
            queue = tenants.setdefault(tenant, deque())
            queue.append(turn)
            try:
                await turn.wait()
            except BaseException:
                if turn.is_set():  # the turn was handed over already: pass it on
                    self._next(uid, tenant)
                else:
                    self._give_up(uid, tenant, turn)
                raise
        else:
            self._busy = True
        try:
            if self._limiter is None:
                self._limiter = anyio.CapacityLimiter(1)
            return await anyio.to_thread.run_sync(work, limiter=self._limiter)
        finally:
            self._next(uid, tenant)

    def _give_up(self, uid: int | None, tenant: str, turn: anyio.Event) -> None:
        tenants = self._waiting[uid]
        queue = tenants[tenant]
        queue.remove(turn)
        if not queue:
            del tenants[tenant]
            if not tenants:
                del self._waiting[uid]

    def _next(self, uid: int | None, finished: str) -> None:
        """Hand the thread to the first user waiting other than ``uid`` (whose turn it was)
        if there is one, and within that user to its first tenant waiting other than
        ``finished``, if there is one; the user and the tenant served go to the back."""
        waiting = self._waiting
        if not waiting:
            self._busy = False
            return
        if len(waiting) > 1 and next(iter(waiting)) == uid:
            waiting.move_to_end(uid)
        served_uid, tenants = next(iter(waiting.items()))
        if served_uid == uid and len(tenants) > 1 and next(iter(tenants)) == finished:
            tenants.move_to_end(finished)
        tenant, queue = next(iter(tenants.items()))
        turn = queue.popleft()
        if queue:
            tenants.move_to_end(tenant)
        else:
            del tenants[tenant]
        if tenants:
            waiting.move_to_end(served_uid)
        else:
            del waiting[served_uid]
        turn.set()
