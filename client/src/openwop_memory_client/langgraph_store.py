"""*(the ``[langgraph]`` extra)* A LangGraph ``BaseStore`` over the sidecar.

Namespaces map to scopes (``memory.issueRef(tenant, agent, <the namespace as JSON>)``),
keys to keyed entries (``put_keyed``/``get_key``), values to JSON content. Each
``batch``/``abatch`` call is one OpenWOP run: its reads see the store as of the call's start
and not the call's own puts (as LangGraph's ``InMemoryStore`` applies a batch's puts after
its reads), and the next call sees them, which is what a LangGraph user expects of a store.
``list_namespaces`` and prefix search read a registry scope the store's puts keep.

Not covered (yet): vector ``index`` (accepted, ignored: search ranks by the sidecar's
relevance), ``refresh_ttl`` (TTLs are fixed at write), one snapshot per LangGraph run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import anyio
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from ._async_client import AsyncMemoryClient
from ._async_run import AsyncMemoryRun
from ._entry import KeyedEntry, MemoryEntry

REGISTRY = "langgraph.namespaces"  # a scope name no namespace's JSON spelling can be
_SCAN = 1000  # entries read from one scope by a search (the sidecar's maximum)


def _encode(namespace: tuple[str, ...]) -> str:
    return json.dumps(list(namespace), ensure_ascii=False, separators=(",", ":"))


def _matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = condition.path
    if len(namespace) < len(path):
        return False
    pairs = zip(namespace, path, strict=False)
    if condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    return all(p == "*" or n == p for n, p in pairs)


def _compare(value: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: nested equality, and ``$eq $ne $gt $gte $lt $lte``."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(_compare(value.get(k), v) for k, v in wanted.items())
    return bool(value == wanted)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if value is None:
        return False
    numbers = float(value), float(operand)
    return {
        "$gt": numbers[0] > numbers[1],
        "$gte": numbers[0] >= numbers[1],
        "$lt": numbers[0] < numbers[1],
        "$lte": numbers[0] <= numbers[1],
    }[op]


class OpenWopStore(BaseStore):
    """LangGraph's long-term memory store on an openwop-memory sidecar.

    :param socket_path: the sidecar's socket (as :class:`AsyncMemoryClient`'s).
    :param tenant: the tenant of every run the store begins.
    :param agent: the agent part of every scope (default ``"langgraph"``).
    :param secrets: secrets (id -> value) registered for every run: a value holding one is
        stored with ``[REDACTED:<id>]`` in its place.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        tenant: str,
        agent: str = "langgraph",
        secrets: Mapping[str, str] | None = None,
    ) -> None:
        self._socket = socket_path
        self._tenant = tenant
        self._agent = agent
        self._secrets = dict(secrets or {})

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`abatch` on an event loop of its own (not from inside a running loop)."""
        ops = list(ops)
        return anyio.run(self.abatch, ops)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        async with AsyncMemoryClient(self._socket) as client:
            refs: dict[tuple[str, ...] | None, str] = {}

            async def ref(namespace: tuple[str, ...] | None) -> str:
                if namespace not in refs:
                    name = REGISTRY if namespace is None else _encode(namespace)
                    refs[namespace] = await client.issue_ref(self._tenant, self._agent, name)
                return refs[namespace]

            run_id = f"langgraph-{uuid.uuid4()}"
            async with client.run(run_id, self._tenant, self._secrets or None) as run:
                results: list[Result] = []
                for op in ops:
                    results.append(await self._one(run, ref, op))
                return results

    async def _one(self, run: AsyncMemoryRun, ref: Any, op: Op) -> Result:
        if isinstance(op, GetOp):
            found = await run.get_key(await ref(op.namespace), op.key)
            return None if found is None else self._item(op.namespace, found.entry, Item)
        if isinstance(op, PutOp):
            await self._put(run, ref, op)
            return None
        if isinstance(op, SearchOp):
            return await self._search(run, ref, op)
        if isinstance(op, ListNamespacesOp):
            namespaces = await self._namespaces(run, ref)
            if op.match_conditions:
                namespaces = [
                    ns for ns in namespaces if all(_matches(c, ns) for c in op.match_conditions)
                ]
            if op.max_depth is not None:
                namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
            return namespaces[op.offset : op.offset + op.limit]
        raise ValueError(f"unknown store operation {type(op).__name__}")

    async def _put(self, run: AsyncMemoryRun, ref: Any, op: PutOp) -> None:
        scope = await ref(op.namespace)
        current = await run.get_key(scope, op.key)
        if op.value is None:
            if current is not None:
                await run.delete(scope, current.entry.id)
            return
        body: dict[str, Any] = {"key": op.key, "value": dict(op.value)}
        previous = None if current is None else self._item(op.namespace, current.entry, Item)
        if previous is not None:  # the item's creation is its first revision's
            body["createdAt"] = previous.created_at.isoformat()
        ttl = None if op.ttl is None else timedelta(minutes=op.ttl)
        await run.put_keyed(scope, op.key, json.dumps(body, ensure_ascii=False), ttl=ttl)
        encoded = _encode(op.namespace)
        registry = await ref(None)
        if await run.get_key(registry, encoded) is None:
            await run.put_keyed(registry, encoded, encoded)

    async def _namespaces(self, run: AsyncMemoryRun, ref: Any) -> list[tuple[str, ...]]:
        entries = await run.list(await ref(None), limit=_SCAN)
        return sorted({tuple(json.loads(entry.content)) for entry in entries})

    async def _search(self, run: AsyncMemoryRun, ref: Any, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[SearchItem] = []
        for namespace in await self._namespaces(run, ref):
            if namespace[: len(prefix)] != prefix:
                continue
            scope = await ref(namespace)
            if op.query:
                entries = await run.search(scope, op.query, limit=_SCAN)
            else:
                entries = await run.list(scope, limit=_SCAN)
            for rank, entry in enumerate(entries):
                item = self._item(namespace, entry, SearchItem)
                if item is None:
                    continue
                if op.filter and not all(
                    _compare(item.value.get(k), v) for k, v in op.filter.items()
                ):
                    continue
                if op.query:
                    item.score = 1.0 / (1 + rank)  # the sidecar's order, as a score
                found.append(item)
        if op.query:
            found.sort(key=lambda item: -(item.score or 0.0))
        else:
            found.sort(key=lambda item: item.updated_at, reverse=True)
        return found[op.offset : op.offset + op.limit]

    @staticmethod
    def _item(namespace: tuple[str, ...], entry: MemoryEntry, cls: Any) -> Any:
        """The item ``entry`` stores, or None for an entry that is not one of the store's
        (written to the scope by another client)."""
        try:
            body = json.loads(entry.content)
        except ValueError:
            return None
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            return None
        if not isinstance(body.get("value"), dict):
            return None
        created = body.get("createdAt") or entry.created_at.isoformat()
        return cls(
            namespace=namespace,
            key=body["key"],
            value=body["value"],
            created_at=created,
            updated_at=entry.created_at,
        )


__all__ = ["KeyedEntry", "OpenWopStore"]
