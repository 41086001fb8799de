"""Which OpenWOP run a LangGraph store call belongs to, and what each LangGraph run wrote.

LangGraph gives a store no run boundary, only calls; what names a run is the config the
graph runs with: ``configurable.run_id``, which LangGraph's server sets for every run and a
local caller may pass (``graph.invoke(x, {"configurable": {"run_id": ...}})``). A call made
inside such a run is part of the OpenWOP run ``langgraph-run-<run_id>``: the first call
begins it, every later call (and a replay, in any process) begins it again and gets the
same snapshot back. A call outside a run, or in one without a ``run_id``, is a run of its
own, as before.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from typing import NamedTuple

from langgraph.config import get_config
from langgraph.store.base import Item

RUNS_KEPT = 1024
"""LangGraph runs whose writes a store remembers (least recently used first out). A run
forgotten so reads only its snapshot again: LangGraph never says that a run ended."""

_PREFIX = "langgraph-run-"
_PLAIN = re.compile(r"[\x20-\x7e]{1,200}")  # kept as it is; anything else goes by its digest

Key = tuple[tuple[str, ...], str]
"""An item's (namespace, key)."""


class Put(NamedTuple):
    """An item a run put, as stored, and whether it was put to be found by a query."""

    item: Item
    indexed: bool


Written = Put | None
"""A run's last write of an item: what it put, or None for a delete."""


def current_run_id() -> str | None:
    """The OpenWOP run id of the LangGraph run this call is made in, or None when it is
    made outside one (or the run's config names no ``run_id``)."""
    try:
        config = get_config()
    except RuntimeError:  # not inside a runnable: a direct call to the store
        return None
    value = (config.get("configurable") or {}).get("run_id")
    if value is None:
        return None
    text = str(value)
    if _PLAIN.fullmatch(text):
        return _PREFIX + text
    return _PREFIX + hashlib.sha256(text.encode()).hexdigest()


class RunWrites:
    """What the LangGraph runs of one store wrote through it, by OpenWOP run id: the last
    write per item (:data:`Written`). A run's reads see its snapshot
    with these laid over it, so a graph reads what its earlier nodes wrote."""

    def __init__(self, kept: int = RUNS_KEPT) -> None:
        self._kept = kept
        self._runs: OrderedDict[str, dict[Key, Written]] = OrderedDict()

    def of(self, run_id: str) -> dict[Key, Written]:
        """The writes of ``run_id`` (a live dict: the caller adds to it), made if new."""
        writes = self._runs.get(run_id)
        if writes is None:
            writes = self._runs[run_id] = {}
            while len(self._runs) > self._kept:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(run_id)
        return writes
