"""The committed scope ids a backend keeps in memory, bounded.

A backend puts an id here only once the transaction that made the scope has committed (see
``base.py``): an id a rolled-back transaction made may be handed to another scope.
"""

from __future__ import annotations

from collections import OrderedDict

from .base import Scope


class ScopeCache:
    """Committed scope ids, the least recently used dropped past ``size`` (a miss costs
    one indexed lookup when writing)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ids: OrderedDict[Scope, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, scope: Scope) -> int | None:
        pk = self._ids.get(scope)
        if pk is not None:
            self._ids.move_to_end(scope)
        return pk

    def put(self, scope: Scope, pk: int) -> None:
        self._ids[scope] = pk
        self._ids.move_to_end(scope)
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
