"""*(the ``[langgraph]`` extra)* A LangGraph ``BaseStore`` over the sidecar.

Namespaces map to scopes (``memory.issueRef(tenant, agent, <the namespace as JSON>)``),
keys to keyed entries (``put_keyed``/``get_key``), values to JSON content. docs/langgraph.md
says what is covered, what is not and why; in short:

- A LangGraph run (``configurable.run_id`` in its config) is one OpenWOP run: its first
  call takes the snapshot, every later call of the run, and a replay of it, reads that
  snapshot again, with the run's own writes laid over it (``_langgraph_runs.py``). A call
  outside such a run is an OpenWOP run of its own (``snapshots="call"``: every call).
- Within a ``batch``/``abatch`` call every read comes before the call's own writes (as
  LangGraph's ``InMemoryStore`` and ``PostgresStore`` apply a batch's puts after its
  reads); then the last write per (namespace, key) is applied, so a put then a delete ends
  deleted and a delete then a put ends present. The next call sees them.
- A put compares and sets on the key's live revision (read by ``memory.history``, which is
  not bound to the snapshot), retrying ``_ATTEMPTS`` times on a conflict and then writing
  unconditionally: last writer wins, and neither writer's revision is lost from history.
- TTLs (``supports_ttl``): a put's ``ttl`` and ``TTLConfig.default_ttl`` (minutes) set the
  entry's expiry; a read with ``refresh_ttl`` (``TTLConfig.refresh_on_read``, default
  True) rewrites the item as a new revision expiring a full TTL later: a write per item
  read that has a TTL.
- ``index=False`` keeps an item out of ``query`` search (it stays gettable and listed);
  a ``query`` returns only the items the sidecar judges relevant, at most ``_SCAN`` per
  namespace. Listings and filter searches read every page.
- ``list_namespaces`` and prefix search read a registry scope: a put registers its
  namespace, the delete of a namespace's last item unregisters it.

Not covered: vector ``index`` fields (a list of paths is accepted and ignored: the whole
body is what the sidecar indexes), a query search finding a run's own new items within
that run (its own updates and deletes are applied to the hits), atomic batches (writes
are applied one by one: the sidecar has no multi-key transaction), the TTL sweep (the
sidecar expires entries itself).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

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
    TTLConfig,
)

from ._async_client import AsyncMemoryClient
from ._async_run import AsyncMemoryRun
from ._entry import KeyedEntry, MemoryEntry, Revision
from ._errors import ConflictError, OpenWopMemoryError
from ._langgraph_runs import Key, Put, RunWrites, Written, current_run_id
from ._store_channel import Channel

REGISTRY = "langgraph.namespaces"  # a scope name no namespace's JSON spelling can be
_SCAN = 1000  # entries per page, and a query search's per-namespace cap (the sidecar's maximum)
_ATTEMPTS = 8  # compare-and-set tries of a put before it is written unconditionally
_UNINDEXED = "langgraph.unindexed"  # the tag of an item put with index=False
_I = TypeVar("_I", bound=Item)


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
    :param ttl: LangGraph's ``TTLConfig``: ``default_ttl`` (minutes) for puts that name no
        ``ttl``, ``refresh_on_read`` (default True) for gets and searches that do not say.
    :param snapshots: ``"run"`` (default): the calls of one LangGraph run (its
        ``configurable.run_id``) read one snapshot, with the run's own writes over it;
        ``"call"``: every call reads a snapshot of its own.
    """

    supports_ttl: bool = True

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        tenant: str,
        agent: str = "langgraph",
        secrets: Mapping[str, str] | None = None,
        ttl: TTLConfig | None = None,
        snapshots: Literal["run", "call"] = "run",
    ) -> None:
        if snapshots not in ("run", "call"):
            raise ValueError(f"snapshots must be 'run' or 'call', not {snapshots!r}")
        self._socket = socket_path
        self._tenant = tenant
        self._agent = agent
        self._secrets = dict(secrets or {})
        self.ttl_config = ttl
        self._per_run = snapshots == "run"
        self._run_writes = RunWrites()
        self._channel = Channel(socket_path)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`abatch`, waited for in this thread (from inside a running loop, use
        :meth:`abatch`: this would hold the loop meanwhile)."""
        ops = list(ops)
        graph_run = self._graph_run(ops)
        return self._channel.run(lambda client: self._batch(client, ops, graph_run))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in the OpenWOP run of the LangGraph run they are made in (or in one
        of their own): every read sees the run's snapshot and the run's writes before this
        call, none of this call's; then the last put per (namespace, key) is applied, then
        the TTLs of the items read with ``refresh_ttl`` are refreshed. The work is done on
        the store's own connection (``_store_channel.py``).

        :raises TypeError: a value does not serialise as JSON (nothing was sent).
        """
        ops = list(ops)
        graph_run = self._graph_run(ops)
        return await self._channel.arun(lambda client: self._batch(client, ops, graph_run))

    def close(self) -> None:
        """Close the store's connection and stop its thread (a later call opens them again).
        Not needed before the process exits: the thread is a daemon."""
        self._channel.close()

    def _graph_run(self, ops: list[Op]) -> str | None:
        """Check the values, then name the LangGraph run the caller is in (read here, in
        the caller's context: the store's own loop has none).

        :raises TypeError: a value does not serialise as JSON.
        """
        _check_values(_last_writes(ops).values())
        return current_run_id() if self._per_run else None

    async def _batch(
        self, client: AsyncMemoryClient, ops: list[Op], graph_run: str | None
    ) -> list[Result]:
        writes = _last_writes(ops)
        own = None if graph_run is None else self._run_writes.of(graph_run)
        async with contextlib.AsyncExitStack() as stack:
            scopes = _Scopes(client, self._tenant, self._agent, own or {})
            # A known run id is begun again on its original snapshot (a resume, a replay).
            run_id = graph_run or f"langgraph-{uuid.uuid4()}"
            run = client.run(run_id, self._tenant, self._secrets or None)
            await _begin(run, stack, scopes, _named(ops, writes.values()))
            read: list[_Read] = []
            results = [await self._read(run, scopes, op, read) for op in ops]
            for (namespace, key), write in writes.items():
                written = await _write(run, await scopes.ref(namespace), write)
                if own is not None:
                    own[(namespace, key)] = written
            await self._refresh(run, scopes, read, writes.keys())
            await _keep_registry(run, scopes, writes.values())
            return results

    async def _read(
        self, run: AsyncMemoryRun, scopes: _Scopes, op: Op, read: list[_Read]
    ) -> Result:
        """The result of a read op (None for a put), noting in ``read`` what to refresh."""
        if isinstance(op, GetOp):
            if (op.namespace, op.key) in scopes.own:
                written = scopes.own[(op.namespace, op.key)]
                return None if written is None else _copy(written.item, Item)
            found = await run.get_key(await scopes.ref(op.namespace), op.key)
            if found is None:
                return None
            item = _item(op.namespace, found.entry, Item)
            if item is not None and op.refresh_ttl:
                read.append(_Read(op.namespace, op.key, found.entry))
            return item
        if isinstance(op, PutOp):
            return None
        if isinstance(op, SearchOp):
            return await self._search(run, scopes, op, read)
        if isinstance(op, ListNamespacesOp):
            return await _list_namespaces(run, scopes, op)
        raise ValueError(f"unknown store operation {type(op).__name__}")

    async def _search(
        self, run: AsyncMemoryRun, scopes: _Scopes, op: SearchOp, read: list[_Read]
    ) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[tuple[SearchItem, MemoryEntry | None]] = []
        for namespace in await _namespaces(run, scopes):
            if namespace[: len(prefix)] == prefix:
                found.extend(await _search_one(run, await scopes.ref(namespace), namespace, op))
        if scopes.own:
            found = _with_own_writes(found, scopes.own, prefix, op)
        if op.query:
            found.sort(key=lambda pair: -(pair[0].score or 0.0))
        else:
            found.sort(key=lambda pair: pair[0].updated_at, reverse=True)
        page = found[op.offset : op.offset + op.limit]
        if op.refresh_ttl:
            read.extend(
                _Read(item.namespace, item.key, entry) for item, entry in page if entry is not None
            )
        return [item for item, _ in page]

    async def _refresh(
        self,
        run: AsyncMemoryRun,
        scopes: _Scopes,
        read: list[_Read],
        written: Collection[tuple[tuple[str, ...], str]],
    ) -> None:
        """Rewrite each read item that has a TTL as a new revision expiring a full TTL from
        now, unless the batch wrote it or it changed since the snapshot (either is newer)."""
        done: set[tuple[tuple[str, ...], str]] = set(written)
        for one in read:
            body = _body(one.entry)
            if body is None or body.get("ttl") is None or (one.namespace, one.key) in done:
                continue
            done.add((one.namespace, one.key))
            await _refresh_one(run, await scopes.ref(one.namespace), one, body)


class _Scopes:
    """The scope refs of one ``abatch`` call, each issued once, live reads of scopes
    (outside the call's snapshot), and the LangGraph run's writes before the call."""

    def __init__(
        self, client: AsyncMemoryClient, tenant: str, agent: str, own: Mapping[Key, Written]
    ) -> None:
        self._client = client
        self._tenant = tenant
        self._agent = agent
        self.own = own
        self._refs: dict[tuple[str, ...] | None, str] = {}
        # The registry as the call's snapshot holds it: read once, as the snapshot is fixed.
        self.registered: list[tuple[str, ...]] | None = None

    async def prefetch(self, namespace: tuple[str, ...] | None) -> None:
        """Issue the ref of ``namespace`` ahead of its use; an error is left for the use
        to meet again (:meth:`ref` caches successes only)."""
        with contextlib.suppress(OpenWopMemoryError):
            await self.ref(namespace)

    async def ref(self, namespace: tuple[str, ...] | None) -> str:
        """The scope of ``namespace``; None: the namespace registry's."""
        if namespace not in self._refs:
            name = REGISTRY if namespace is None else _encode(namespace)
            self._refs[namespace] = await self._client.issue_ref(self._tenant, self._agent, name)
        return self._refs[namespace]

    async def live_count(self, scope: str) -> int:
        """How many unexpired entries ``scope`` holds now: a run of its own, because the
        call's run sees only its snapshot, older than the call's own writes."""
        async with self._client.run(f"langgraph-check-{uuid.uuid4()}", self._tenant) as check:
            return await check.count(scope)


@dataclass(frozen=True, slots=True)
class _Read:
    """An item a get or search returned, with the revision entry it was read from."""

    namespace: tuple[str, ...]
    key: str
    entry: MemoryEntry


def _named(ops: list[Op], writes: Iterable[PutOp]) -> set[tuple[str, ...] | None]:
    """The namespaces whose refs a batch will need first: those its gets and writes name,
    and the registry's (None) if it searches, lists or writes."""
    writes = list(writes)
    named: set[tuple[str, ...] | None] = {op.namespace for op in ops if isinstance(op, GetOp)}
    named |= {op.namespace for op in writes}
    if writes or any(isinstance(op, SearchOp | ListNamespacesOp) for op in ops):
        named.add(None)
    return named


async def _begin(
    run: AsyncMemoryRun,
    stack: contextlib.AsyncExitStack,
    scopes: _Scopes,
    namespaces: Iterable[tuple[str, ...] | None],
) -> None:
    """Enter ``run`` (its exit pushed on ``stack``) while the refs of ``namespaces`` are
    issued on the same connection: a batch waits for one round trip instead of one per
    ref and the begin. Raises what entering the run raises."""
    failure: Exception | None = None

    async def enter() -> None:
        nonlocal failure
        try:
            await stack.enter_async_context(run)
        except Exception as exc:  # noqa: BLE001 - raised below, outside the task group
            failure = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter)
        for namespace in namespaces:
            tg.start_soon(scopes.prefetch, namespace)
    if failure is not None:
        raise failure


def _last_writes(ops: list[Op]) -> dict[tuple[tuple[str, ...], str], PutOp]:
    """The last put (or delete) per (namespace, key), in first-write order: within one
    batch the last write wins, as in LangGraph's own stores."""
    writes: dict[tuple[tuple[str, ...], str], PutOp] = {}
    for op in ops:
        if isinstance(op, PutOp):
            writes[(op.namespace, op.key)] = op
    return writes


def _check_values(writes: Iterable[PutOp]) -> None:
    """:raises TypeError: a value does not serialise as JSON; raised before anything is
    sent, so a batch is never half applied for it."""
    for op in writes:
        if op.value is not None:
            json.dumps(dict(op.value), ensure_ascii=False)


async def _live(run: AsyncMemoryRun, scope: str, key: str) -> Revision | None:
    """The key's current revision in the live store (history is not snapshot-bound), or
    None when it has none (never written, deleted or expired)."""
    revisions = await run.history(scope, key, limit=1)
    if revisions and revisions[0].state == "current":
        return revisions[0]
    return None


async def _write(run: AsyncMemoryRun, scope: str, op: PutOp) -> Written:
    """Apply the write; the item as stored (None for a delete)."""
    if op.value is None:
        await _delete(run, scope, op.key)
        return None
    stored = await _put(run, scope, op)
    item = _item(op.namespace, stored.entry, Item)
    assert item is not None  # the body was written by _content
    return Put(item, indexed=op.index is not False)


async def _put(run: AsyncMemoryRun, scope: str, op: PutOp) -> KeyedEntry:
    """Compare-and-set on the key's live revision, so that a concurrent writer's revision
    is never silently superseded unseen (its creation time is kept); after
    ``_ATTEMPTS`` conflicts the put is written unconditionally (last writer wins)."""
    tags = (_UNINDEXED,) if op.index is False else ()
    ttl = None if op.ttl is None else timedelta(minutes=op.ttl)
    for _ in range(_ATTEMPTS):
        live = await _live(run, scope, op.key)
        expected = 0 if live is None else live.revision
        content = _content(op, live)
        try:
            return await run.put_keyed(
                scope, op.key, content, tags=tags, ttl=ttl, expected_revision=expected
            )
        except ConflictError:
            continue
    live = await _live(run, scope, op.key)
    return await run.put_keyed(scope, op.key, _content(op, live), tags=tags, ttl=ttl)


def _content(op: PutOp, live: Revision | None) -> str:
    """The stored body: the item's creation is its first revision's; ``ttl`` (minutes)
    is kept so that a refresh can extend the item by as much again."""
    body: dict[str, Any] = {"key": op.key, "value": dict(op.value or {})}
    previous = None if live is None else _item((), live.entry, Item)
    if previous is not None:
        body["createdAt"] = previous.created_at.isoformat()
    if op.ttl is not None:
        body["ttl"] = op.ttl
    return json.dumps(body, ensure_ascii=False)


async def _delete(run: AsyncMemoryRun, scope: str, key: str) -> None:
    """Delete the key's live revision; a delete that finds it superseded meanwhile reads
    again and deletes the newer one (this delete is the later write)."""
    for _ in range(_ATTEMPTS + 1):
        live = await _live(run, scope, key)
        if live is None or await run.delete(scope, live.entry.id):
            return


async def _refresh_one(run: AsyncMemoryRun, scope: str, one: _Read, body: dict[str, Any]) -> None:
    """Rewrite the revision read as a new one with a fresh expiry, only if it is still the
    key's current revision (else a newer write stands and carries its own TTL)."""
    live = await _live(run, scope, one.key)
    if live is None or live.entry.id != one.entry.id:
        return
    written = one.entry.created_at.isoformat()
    body = {**body, "createdAt": body.get("createdAt") or written}
    body["updatedAt"] = body.get("updatedAt") or written  # a refresh is not an update
    ttl = timedelta(minutes=float(body["ttl"]))
    content = json.dumps(body, ensure_ascii=False)
    with contextlib.suppress(ConflictError):
        await run.put_keyed(
            scope, one.key, content, tags=one.entry.tags, ttl=ttl, expected_revision=live.revision
        )


async def _keep_registry(run: AsyncMemoryRun, scopes: _Scopes, writes: Iterable[PutOp]) -> None:
    """Register each namespace the batch put into; prune each it only deleted from."""
    put = {op.namespace for op in writes if op.value is not None}
    deleted = {op.namespace for op in writes if op.value is None} - put
    registry = await scopes.ref(None)
    for namespace in sorted(put):
        await _register(run, registry, _encode(namespace))
    for namespace in sorted(deleted):
        await _prune(run, scopes, namespace)


async def _register(run: AsyncMemoryRun, registry: str, encoded: str) -> None:
    if await _live(run, registry, encoded) is not None:
        return
    with contextlib.suppress(ConflictError):  # a concurrent put registered it first
        await run.put_keyed(registry, encoded, encoded, expected_revision=0)


async def _prune(run: AsyncMemoryRun, scopes: _Scopes, namespace: tuple[str, ...]) -> None:
    """Drop an emptied namespace from the registry: check, delete, check again. A put into
    the namespace registers after writing its item, so one landing between the checks is
    seen by the second and registered again here, never lost from the registry."""
    scope = await scopes.ref(namespace)
    if await scopes.live_count(scope):
        return
    registry, encoded = await scopes.ref(None), _encode(namespace)
    live = await _live(run, registry, encoded)
    if live is not None:
        await run.delete(registry, live.entry.id)
    if await scopes.live_count(scope):
        await _register(run, registry, encoded)


async def _entries(run: AsyncMemoryRun, scope: str) -> list[MemoryEntry]:
    """Every entry of ``scope`` in the run's snapshot, page by page (no cap)."""
    entries: list[MemoryEntry] = []
    cursor: str | None = None
    while True:
        page = await run.page(scope, limit=_SCAN, cursor=cursor)
        entries.extend(page.entries)
        if page.next_cursor is None:
            return entries
        cursor = page.next_cursor


async def _namespaces(run: AsyncMemoryRun, scopes: _Scopes) -> list[tuple[str, ...]]:
    """The registered namespaces in the run's snapshot and those the LangGraph run put
    into since, sorted (read once per batch)."""
    if scopes.registered is None:
        registered = set(await _read_registry(run, scopes))
        registered |= {ns for (ns, _), written in scopes.own.items() if written is not None}
        scopes.registered = sorted(registered)
    return scopes.registered


async def _read_registry(run: AsyncMemoryRun, scopes: _Scopes) -> list[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for entry in await _entries(run, await scopes.ref(None)):
        try:
            namespace = json.loads(entry.content)
        except ValueError:
            continue  # not one of the store's registrations
        if isinstance(namespace, list) and all(isinstance(part, str) for part in namespace):
            found.add(tuple(namespace))
    return sorted(found)


async def _list_namespaces(
    run: AsyncMemoryRun, scopes: _Scopes, op: ListNamespacesOp
) -> list[tuple[str, ...]]:
    namespaces = await _namespaces(run, scopes)
    if op.match_conditions:
        namespaces = [ns for ns in namespaces if all(_matches(c, ns) for c in op.match_conditions)]
    if op.max_depth is not None:
        namespaces = sorted({ns[: op.max_depth] for ns in namespaces})
    return namespaces[op.offset : op.offset + op.limit]


async def _search_one(
    run: AsyncMemoryRun, scope: str, namespace: tuple[str, ...], op: SearchOp
) -> list[tuple[SearchItem, MemoryEntry | None]]:
    """The items of one namespace a search returns, with their entries. A query search
    reads at most ``_SCAN`` relevant entries (the sidecar's maximum for one search) and
    skips items put with ``index=False``; a listing reads every page."""
    if op.query:
        entries = await run.search(scope, op.query, limit=_SCAN)
    else:
        entries = await _entries(run, scope)
    found: list[tuple[SearchItem, MemoryEntry | None]] = []
    for rank, entry in enumerate(entries):
        if op.query and _UNINDEXED in entry.tags:
            continue
        item = _item(namespace, entry, SearchItem)
        if item is None or not _passes(item, op.filter):
            continue
        if op.query:
            item.score = 1.0 / (1 + rank)  # the sidecar's order, as a score
        found.append((item, entry))
    return found


def _with_own_writes(
    found: list[tuple[SearchItem, MemoryEntry | None]],
    own: Mapping[Key, Written],
    prefix: tuple[str, ...],
    op: SearchOp,
) -> list[tuple[SearchItem, MemoryEntry | None]]:
    """A search's hits in the snapshot with the LangGraph run's own writes laid over them:
    a deleted item is gone, a rewritten one holds its new value (and is dropped if that no
    longer passes the filter, or was put with ``index=False`` under a query). A listing
    also holds the run's new items; a query ranks the snapshot's only (the sidecar's
    ranking of an item the snapshot does not hold is not known here)."""
    kept: list[tuple[SearchItem, MemoryEntry | None]] = []
    for item, entry in found:
        key = (item.namespace, item.key)
        if key not in own:
            kept.append((item, entry))
            continue
        written = own[key]
        if written is None or (op.query and not written.indexed):
            continue
        fresh = _copy(written.item, SearchItem)
        fresh.score = item.score
        if _passes(fresh, op.filter):
            kept.append((fresh, None))
    if op.query:
        return kept
    listed = {(item.namespace, item.key) for item, _ in kept}
    for (namespace, name), written in own.items():
        if written is None or (namespace, name) in listed or namespace[: len(prefix)] != prefix:
            continue
        fresh = _copy(written.item, SearchItem)
        if _passes(fresh, op.filter):
            kept.append((fresh, None))
    return kept


def _copy(item: Item, cls: type[_I]) -> _I:
    """A new ``cls`` holding what ``item`` holds (a caller may change what it is given)."""
    return cls(
        namespace=item.namespace,
        key=item.key,
        value=json.loads(json.dumps(item.value)),
        created_at=item.created_at,
        updated_at=item.updated_at,
    )


def _passes(item: SearchItem, wanted: dict[str, Any] | None) -> bool:
    return not wanted or all(_compare(item.value.get(k), v) for k, v in wanted.items())


def _body(entry: MemoryEntry) -> dict[str, Any] | None:
    """The body ``entry`` stores, or None for an entry that is not one of the store's
    (written to the scope by another client)."""
    try:
        body = json.loads(entry.content)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("key"), str):
        return None
    if not isinstance(body.get("value"), dict):
        return None
    return body


def _item(namespace: tuple[str, ...], entry: MemoryEntry, cls: type[_I]) -> _I | None:
    """The item (``Item`` or ``SearchItem``) ``entry`` stores, or None (see :func:`_body`).
    Its update time is the revision's, unless a TTL refresh rewrote it (then the body's)."""
    body = _body(entry)
    if body is None:
        return None
    return cls(
        namespace=namespace,
        key=body["key"],
        value=body["value"],
        created_at=_time(body.get("createdAt"), entry.created_at),
        updated_at=_time(body.get("updatedAt"), entry.created_at),
    )


def _time(stored: Any, otherwise: datetime) -> datetime:
    return datetime.fromisoformat(stored) if isinstance(stored, str) else otherwise


__all__ = ["KeyedEntry", "OpenWopStore"]
