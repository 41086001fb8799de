"""Fair admission of request lines across connections.

The event loop runs every ready callback of an iteration before it looks at the sockets
again, in the order they became ready. A connection that pipelines lines as fast as it can
(malformed frames cost the sidecar as much as a small request) keeps a whole window of
tasks ready at every iteration; with a few hundred such connections an iteration takes
tens of milliseconds and a quiet client's request waits through several of them.

:class:`FairGate` bounds the work started per iteration (``per_turn`` cost units, one by
default; a request line costs 1, plus 1 per 8 KiB) and, when more is asked for, hands the
turns out least-served connection first: each connection's :class:`Share` keeps the cost
it was granted (its virtual time), and a connection that comes back from being quiet
starts just below everyone still waiting, as a sleeping task does under a fair scheduler.
Fair shares alone would still leave a client doing one request after another behind: it
wants far more than 1/N of the loop. So a line alone on its connection (nothing else read,
nothing in progress) starts at once; a connection has at most one such line at a time.
Fair shares alone, or more than one line per turn, left a quiet client waiting several
times longer in a flood; ``make bench`` measures its ``get`` in a storm of malformed frames.
"""

from __future__ import annotations

import asyncio
import heapq

_LINE_BYTES_PER_COST = 8192


def line_cost(size: int) -> int:
    """The cost units of a request line of ``size`` bytes."""
    return 1 + size // _LINE_BYTES_PER_COST


class Share:
    """One connection's account at the gate."""

    __slots__ = ("vtime",)

    def __init__(self) -> None:
        self.vtime = 0


class FairGate:
    """Admits request lines: at most ``per_turn`` cost units start per loop iteration (at
    least one line), the least-served waiting connection first.

    One gate serves the whole event loop; it must be used from that loop only.
    """

    def __init__(self, per_turn: int = 1) -> None:
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self._per_turn = per_turn
        self._used = 0  # cost admitted since the current turn began
        self._turn_pending = False
        self._vclock = 0  # the highest virtual time admitted so far
        self._seq = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None], Share, int]] = []

    def admit(self, share: Share, cost: int, *, alone: bool = False) -> asyncio.Future[None] | None:
        """``None`` when the line may start now; otherwise a future to await first.

        ``alone``: the connection has nothing else read and nothing in progress (a client
        waiting for this answer before it sends more). Such a line starts at once: a
        connection can have only one, so they cannot flood, and a fair share alone would
        not do (a client doing one request after another wants more than 1/N of the loop).

        Cancelling the future gives up the place in the queue.
        """
        # A quiet connection does not bank credit for the time it was quiet, but goes just
        # ahead of the busy ones, whose keys are at least the clock.
        key = max(share.vtime, self._vclock - 1)
        if alone or (not self._waiting and self._used < self._per_turn):
            self._grant(share, key, cost)
            return None
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (key, self._seq, future, share, cost))
        self._seq += 1
        self._schedule_turn()
        return future

    def _grant(self, share: Share, key: int, cost: int) -> None:
        self._used += cost
        share.vtime = key + cost
        if key > self._vclock:
            self._vclock = key
        self._schedule_turn()

    def _schedule_turn(self) -> None:
        # A callback queued now runs in the next iteration: that is where a turn ends.
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_pending = False
        self._used = 0
        while self._waiting and self._used < self._per_turn:
            key, _, future, share, cost = heapq.heappop(self._waiting)
            if future.done():  # its connection stopped waiting
                continue
            self._grant(share, key, cost)
            future.set_result(None)
