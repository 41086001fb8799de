"""Connection slots of one listener: how many it holds at once, and how many of those one
peer (a Unix user, by ``SO_PEERCRED``) may hold.

Each listener has its own :class:`Slots`, so that no party using one socket can take the
slots of another: the workers' socket cannot starve the operator's admin socket, and one
Unix user holding its share of the workers' socket leaves the rest to the others.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum


class Refusal(Enum):
    """Why a connection got no slot: the name of the setting that bounds it."""

    FULL = "full"  # the listener holds its total
    PEER = "peer"  # the connecting user holds its share


class Slots:
    """At most ``total`` connections at once, of which at most ``per_peer`` from one uid.

    A peer the kernel gave no credentials for (``uid`` None) counts only against the total.
    """

    def __init__(self, total: int, per_peer: int | None = None) -> None:
        self.total = total
        self.per_peer = total if per_peer is None else min(per_peer, total)
        self.held = 0
        self._by_uid: Counter[int] = Counter()

    def take(self, uid: int | None) -> Refusal | None:
        """Take a slot for a connection of ``uid``; None when taken, else why not (and
        nothing is taken). Every slot taken is given back with :meth:`give_back`."""
        if self.held >= self.total:
            return Refusal.FULL
        if uid is not None:
            if self._by_uid[uid] >= self.per_peer:
                return Refusal.PEER
            self._by_uid[uid] += 1
        self.held += 1
        return None

    def give_back(self, uid: int | None) -> None:
        self.held -= 1
        if uid is not None:
            self._by_uid[uid] -= 1
            if not self._by_uid[uid]:
                del self._by_uid[uid]  # a passing user leaves nothing behind

    def held_by(self, uid: int) -> int:
        return self._by_uid[uid]
