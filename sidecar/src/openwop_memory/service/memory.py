"""The memory service: PROTOCOL.md's methods over validated params, wire-ready results.

Each method takes a validated params model and returns a JSON-ready value, or raises a
:class:`~openwop_memory_client.MemoryServiceError`. Errors and results never carry secret
values; errors never carry entry content.

The rules live beside it: which run reads which snapshot here and in ``runs.py``, what a
put may store in ``put_policy.py``, which keyring it redacts with in ``keyring_cache.py``.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from openwop_memory_client import (
    ConflictError,
    ForbiddenError,
    ReplaySnapshotUnavailableError,
    RunNotFoundError,
    ValidationError,
)
from openwop_memory_client.wire import (
    VENDOR_FILTER,
    VENDOR_KEY,
    ChangesParams,
    CountParams,
    DeleteParams,
    GetKeyParams,
    GetParams,
    HistoryParams,
    IssueRefParams,
    ListFilterOptions,
    ListParams,
    MemoryListOptions,
    PageParams,
    PutParams,
    RunAddSecretsParams,
    RunBeginParams,
    RunEndParams,
    SearchParams,
    SecretSpec,
)

from .. import __version__
from ..domain import NOT_NOW, NotNow, SweepHorizons, retention_cutoff_us
from ..redaction import PatternPolicy
from ..retrieval.encoders import dimensions_of
from ..retrieval.fusion import weights_for
from ..retrieval.search import Search, side_by_side
from ..retrieval.text import query_terms
from ..retrieval.time_cues import asks_when
from ..storage.base import (
    PENDING_VECTOR,
    BeginOutcome,
    BeginResult,
    EntryRow,
    ListFilter,
    PutOutcome,
    PutResult,
    ReadsNow,
    RunKey,
    RunRecord,
    Scope,
    Storage,
    StorageGauges,
    SweepCounts,
)
from ..timefmt import format_us, parse_rfc3339
from ..token_count import APPROXIMATED_TOKENIZER, TOKEN_COUNTER
from .embedding import EmbeddingModel
from .indexer import VectorIndexer
from .keyring_cache import HostSecrets, KeyringCache
from .keyring_memory import KeyringBudget, KeyringCompiler
from .metrics import render as render_metrics
from .put_policy import PutPolicy, RedactionPolicy
from .refs import ISSUED_PREFIX, RefCodec
from .runs import RunHandle, RunRegistry, merged_values
from .stats import KeyringGauges, Stats


@dataclass(frozen=True)
class ServiceConfig:
    redaction: RedactionPolicy = "rewrite"
    credential_patterns: PatternPolicy = "rewrite"
    max_entry_size_bytes: int = 65536
    default_list_limit: int = 100
    max_list_limit: int = 1000
    # The JSON bytes of one list answer's entries (see ``within_bytes``).
    max_answer_bytes: int = 2 << 20
    replay_retention_us: int = 7 * 86_400 * 1_000_000
    max_open_runs: int = 10_000
    run_idle_timeout_s: float | None = 300.0
    max_run_secret_bytes: int = 16 << 10
    max_keyring_memory_bytes: int = 256 << 20
    # Whether an operator can reach forget (it is served on the admin socket only).
    forget: bool = False


# The tenants the connection being served may use under tenant binding; None: every tenant
# (binding off, or ``*``). The dispatcher sets it before each call; a call naming a run by id
# alone considers only these tenants' runs of that id (see "which run a call means").
BOUND_TENANTS: ContextVar[frozenset[str] | None] = ContextVar("bound_tenants", default=None)
# The Unix user (peer uid) of the workers' connection being served; None: no worker's (the
# admin socket, a connection the kernel gave no credentials for). The dispatcher sets it
# before each call; ``run.begin`` charges the run to it (see ``runs.py``).
CALLER_UID: ContextVar[int | None] = ContextVar("caller_uid", default=None)

_Run = TypeVar("_Run", RunHandle, RunRecord, RunHandle | RunRecord)

# How ``rank: "relevance"`` is computed here (an extension key beside ``search``, whose
# schema allows only ``supported`` and ``modes``).
VENDOR_RELEVANCE = "vendor.openwop-memory.relevance"
VENDOR_CHANGES = "vendor.openwop-memory.changes"
VENDOR_AS_OF = "vendor.openwop-memory.asOf"

# No entry can count this many tokens (entries are capped far below it); it also fits a
# signed 32-bit column.
_MAX_TOKEN_BOUND = 2**31 - 1


def _list_filter(options: ListFilterOptions) -> ListFilter:
    """The storage filter of ``options["vendor.openwop-memory.filter"]``.

    :raises ValidationError: a time is not RFC 3339 with an offset.
    """
    times: list[int | None] = []
    for name, text in (
        ("createdAfter", options.createdAfter),
        ("createdBefore", options.createdBefore),
    ):
        if text is None:
            times.append(None)
            continue
        try:
            times.append(parse_rfc3339(text))
        except ValueError:
            field = f"options.{VENDOR_FILTER}.{name}"
            raise ValidationError(
                f"{field}: not an RFC 3339 time with an offset", {"field": field}
            ) from None
    return ListFilter(
        # Duplicates removed: "all of these tags" counts the distinct ones.
        tags_any=tuple(dict.fromkeys(options.tagsAny or ())),
        tags_all=tuple(dict.fromkeys(options.tagsAll or ())),
        created_after_us=times[0],
        created_before_us=times[1],
    )


def within_budget(rows: list[EntryRow], budget: int) -> list[EntryRow]:
    """The longest prefix of ``rows`` (ranked, none over ``budget`` on its own) whose
    token counts add up to at most ``budget``."""
    spent = 0
    for index, row in enumerate(rows):
        spent += row.tokens
        if spent > budget:
            return rows[:index]
    return rows


def within_bytes(rows: list[EntryRow], budget: int) -> list[orjson.Fragment]:
    """The longest prefix of ``rows`` whose entries, as JSON (a separator each), add up to at
    most ``budget`` bytes, but at least the first entry (so every entry can be listed),
    each already encoded: the answer is encoded once, and never holds more than the budget
    and one entry of JSON beside the rows."""
    entries: list[orjson.Fragment] = []
    spent = 0
    for row in rows:
        encoded = orjson.dumps(entry_to_wire(row))
        spent += len(encoded) + 1
        if spent > budget and entries:
            break
        entries.append(orjson.Fragment(encoded))
    return entries


def entry_to_wire(row: EntryRow) -> dict[str, Any]:
    """A stored entry as ``memory-entry.schema.json`` spells it."""
    entry: dict[str, Any] = {
        "id": row.id,
        "content": row.content,
        # orjson writes a tuple as the same JSON array as a list: no copy needed.
        "tags": row.tags,
        "createdAt": format_us(row.created_us),
    }
    if row.expires_us is not None:
        entry["expiresAt"] = format_us(row.expires_us)
    return entry


def _keyed_answer(key: str, result: PutResult) -> dict[str, Any]:
    """*(extension)* The answer to a keyed put: the MemoryEntry under ``entry`` (valid
    against the schema as it stands), beside the facts it has no room for."""
    assert result.entry is not None
    assert result.revision is not None
    answer: dict[str, Any] = {
        "entry": entry_to_wire(result.entry),
        "key": key,
        "revision": result.revision,
    }
    if result.superseded is not None:
        answer["superseded"] = result.superseded
    return answer


def _created_or_resumed(run_id: str, result: BeginResult) -> RunRecord:
    """The run ``begin_run`` created or resumed.

    :raises ReplaySnapshotUnavailableError: a replay found no snapshot within retention.
    """
    outcome = result.outcome
    if outcome is BeginOutcome.RETENTION_EXPIRED:
        raise ReplaySnapshotUnavailableError(
            "the run's memory snapshot is past retention",
            {"runId": run_id, "reason": "retention_expired"},
        )
    if outcome is BeginOutcome.UNKNOWN_RUN:
        raise ReplaySnapshotUnavailableError(
            "no memory snapshot was taken for this run",
            {"runId": run_id, "reason": "unknown_run"},
        )
    if outcome is BeginOutcome.AS_OF_MISMATCH:
        raise ConflictError(
            "this run id names a run begun otherwise (as of another time, or not read-only);"
            " use a new run id",
            {"field": "asOf"},
        )
    if outcome is BeginOutcome.AS_OF_FUTURE:
        raise ValidationError("asOf is later than the database's clock", {"field": "asOf"})
    if outcome is BeginOutcome.AS_OF_UNAVAILABLE:
        raise ReplaySnapshotUnavailableError(
            "memory is not held exactly as of that time (the database was upgraded to"
            " runs as of a time later)",
            {"runId": run_id, "reason": "history_unavailable"},
        )
    assert result.run is not None
    return result.run


def _check_writes(run: RunHandle | RunRecord) -> None:
    """:raises ForbiddenError: ``run`` is read-only (begun as of a time)."""
    if isinstance(run, RunRecord) and run.as_of_us is not None:
        raise ForbiddenError("the run is read-only (begun as of a past time)", {"field": "runId"})


def _as_of_us(text: str) -> int:
    """:raises ValidationError: ``asOf`` is not an RFC 3339 time with an offset."""
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise ValidationError(
            "asOf: not an RFC 3339 time with an offset", {"field": "asOf"}
        ) from None


def _run_begin_answer(handle: RunHandle, *, resumed: bool) -> dict[str, Any]:
    return {
        "runId": handle.run_id,
        "tenant": handle.tenant,
        "snapshotAt": format_us(handle.snapshot_us),
        "resumed": resumed,
    }


class MemoryService:
    """PROTOCOL.md's methods over one storage backend.

    ``stats`` is public: the counters ``sidecar.stats`` shows, which the wire layer also
    counts requests and connections in. Everything else is the service's own.
    """

    def __init__(
        self,
        storage: Storage,
        refs: RefCodec,
        config: ServiceConfig,
        host_secrets: HostSecrets | None = None,
        stats: Stats | None = None,
        embedding: EmbeddingModel | None = None,
    ) -> None:
        self.stats = Stats() if stats is None else stats
        self._embedding = EmbeddingModel() if embedding is None else embedding
        self.indexer = VectorIndexer(storage, self._embedding)
        self._storage = storage
        # The backend's point reads without waiting, if it has them (decided once: the
        # check is not free and get is a hot path).
        self._reads_now = storage if isinstance(storage, ReadsNow) else None
        self._search = Search(storage)
        self._refs = refs
        self._config = config
        self._keyring_budget = KeyringBudget(config.max_keyring_memory_bytes)
        self._compiler = KeyringCompiler(self._keyring_budget)
        self._runs = RunRegistry(
            config.max_open_runs, self._keyring_budget, config.run_idle_timeout_s
        )
        self._keyrings = KeyringCache(host_secrets, self._compiler, self._runs)
        self._host_secrets = host_secrets
        self._put_policy = PutPolicy(
            max_entry_size_bytes=config.max_entry_size_bytes,
            redaction=config.redaction,
            credential_patterns=config.credential_patterns,
            refs=refs,
            clock=storage.clock_us,
            stats=self.stats,
        )
        self._started = time.monotonic()

    # -- host ----------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        semantic = self._embedding.installed
        modes = ["semantic", "filter"] if semantic else ["filter"]
        relevance: dict[str, Any] = {"keyword": True, "semantic": semantic}
        if semantic:
            relevance |= {
                "embeddingModel": self._embedding.name,
                "fusion": "weighted-scores",
            }
        return {
            "capabilities": {
                # Redaction cannot be switched off, so long-term is always advertised (§D).
                "agents": {"memoryBackends": ["long-term"]},
                "memory": {
                    "supported": True,
                    "maxEntrySizeBytes": self._config.max_entry_size_bytes,
                    "ttlSupported": True,
                    "writable": True,
                    # RFC 0113: tokenBudget on memory.list, counted as token_count.py says.
                    "injectionBudget": {
                        "supported": True,
                        "tokenCounter": TOKEN_COUNTER,
                        "approximates": APPROXIMATED_TOKENIZER,
                    },
                    # RFC 0080: queries beyond list: "filter" (the vendor filter of
                    # memory.list options), and "semantic" when the embedding model of the
                    # search extra is installed: rank "relevance" then fuses keywords and
                    # meaning; without it, relevance is keyword-only and "semantic" is not
                    # claimed.
                    "search": {"supported": True, "modes": modes},
                    VENDOR_RELEVANCE: relevance,
                    # RFC 0080: expiry, and forget by subject when an admin socket serves it.
                    "retention": {"ttl": True, "forget": self._config.forget},
                    # Issue 24: memory.changes, a content-free feed of every committed
                    # change. Not RFC 0057's attribution block: the sidecar emits no run
                    # events; a host emits memory.written from this feed.
                    VENDOR_CHANGES: {"supported": True},
                    # Read-only runs as of a past time, within the replay retention.
                    VENDOR_AS_OF: {
                        "supported": True,
                        "retentionSeconds": self._config.replay_retention_us // 1_000_000,
                    },
                },
            }
        }

    def issue_ref(self, params: IssueRefParams) -> dict[str, Any]:
        return {"memoryRef": self._refs.issue(params.tenant, params.agent, params.namespace)}

    # -- runs ----------------------------------------------------------------------------

    async def run_begin(self, params: RunBeginParams) -> dict[str, Any]:
        if params.asOf is not None:
            return await self._begin_as_of(params, params.asOf)
        key = RunKey(params.tenant, params.runId)
        uid = CALLER_UID.get()
        handle = self._runs.get(key)
        if handle is not None:
            self._runs.claim(handle, uid)
            await self._add_secrets(handle, params.secrets)
            return _run_begin_answer(handle, resumed=True)
        # Check the secrets, and make room for their keyring, before touching storage, so a
        # refused begin writes nothing.
        values = merged_values({}, params.secrets, self._config.max_run_secret_bytes) or {}
        generation, keyed = self._keyrings.source(params.tenant, values)
        with self._compiler.reserving(keyed, params.tenant, uid) as nbytes:
            keyring = await self._compiler.compile(keyed) if values else None
            now = self._storage.clock_us()
            result = await self._storage.begin_run(
                run_id=params.runId,
                tenant=params.tenant,
                replay=params.replay,
                now_us=now,
                retention_cutoff_us=retention_cutoff_us(now, self._config.replay_retention_us),
            )
            record = _created_or_resumed(params.runId, result)
            resumed = result.outcome is BeginOutcome.RESUMED
            handle = self._runs.get(key)  # another begin of the same run may have raced
            if handle is None or handle.snapshot != record.snapshot:
                handle = RunHandle(
                    run_id=record.run_id,
                    tenant=record.tenant,
                    snapshot=record.snapshot,
                    snapshot_us=record.snapshot_us,
                    values=values,
                    keyring=keyring,
                    generation=generation,
                    uid=uid,
                )
                self._runs.add(handle)
                if keyring is not None:
                    self._runs.charge(handle, nbytes)
                return _run_begin_answer(handle, resumed=resumed)
        self._runs.claim(handle, uid)
        await self._add_secrets(handle, params.secrets)
        return _run_begin_answer(handle, resumed=resumed)

    async def _begin_as_of(self, params: RunBeginParams, as_of: str) -> dict[str, Any]:
        """*(extension)* A read-only run as of a past time: persisted only (nothing of it is
        held in this process, so ``run.end`` of it answers ``false``), readable on every
        sidecar of the database like any stored run, refused every write.

        :raises ValidationError: ``asOf`` is malformed or in the future, or secrets given.
        :raises ReplaySnapshotUnavailableError: ``asOf`` is past the replay retention, or
            before the database's exact history.
        :raises ConflictError: the run id is a run begun otherwise.
        """
        as_of_us = _as_of_us(as_of)
        if params.secrets:
            raise ValidationError(
                "a run as of a time is read-only: it takes no secrets", {"field": "secrets"}
            )
        if self._runs.get(RunKey(params.tenant, params.runId)) is not None:
            raise ConflictError(
                "this run id names a run begun otherwise (open here, not read-only);"
                " use a new run id",
                {"field": "asOf"},
            )
        now = self._storage.clock_us()
        cutoff = retention_cutoff_us(now, self._config.replay_retention_us)
        if as_of_us <= cutoff:
            raise ReplaySnapshotUnavailableError(
                "asOf is past the replay retention",
                {"runId": params.runId, "reason": "retention_expired"},
            )
        result = await self._storage.begin_run(
            run_id=params.runId,
            tenant=params.tenant,
            replay=params.replay,
            now_us=now,
            retention_cutoff_us=cutoff,
            as_of_us=as_of_us,
        )
        record = _created_or_resumed(params.runId, result)
        return {
            "runId": record.run_id,
            "tenant": record.tenant,
            "snapshotAt": format_us(record.snapshot_us),
            "resumed": result.outcome is BeginOutcome.RESUMED,
            "readOnly": True,
        }

    async def run_add_secrets(self, params: RunAddSecretsParams) -> dict[str, Any]:
        handle = self._open_run(params.runId, None)
        await self._add_secrets(handle, params.secrets)
        return {"count": len(handle.values)}

    async def _add_secrets(self, handle: RunHandle, secrets: list[SecretSpec]) -> None:
        """Merge ``secrets`` into the handle's keyring, safe against concurrent merges.

        :raises ValidationError: see :func:`~.runs.merged_values`.
        :raises RateLimitedError: no room for the merged keyring (see ``keyring_memory.py``).
        """
        with self._runs.using(handle):
            while True:
                base = handle.values
                values = merged_values(base, secrets, self._config.max_run_secret_bytes)
                if values is None:
                    return
                generation, keyed = self._keyrings.source(handle.tenant, values)
                with self._compiler.reserving(keyed, handle.tenant, handle.uid) as nbytes:
                    keyring = await self._compiler.compile(keyed)
                    # Another merge may have finished while this one compiled; then merge
                    # again on top of it, or its secrets would be lost.
                    if handle.values is base:
                        handle.values, handle.keyring = values, keyring
                        handle.generation = generation
                        self._runs.charge(handle, nbytes)
                        return

    def run_end(self, params: RunEndParams) -> dict[str, Any]:
        handle = self._pick(params.runId, None, self._visible(self._runs.with_id(params.runId)))
        return {"ended": handle is not None and self._runs.end(handle.key)}

    def open_runs(self) -> list[RunKey]:
        """The runs open in this process (for operators)."""
        return self._runs.keys()

    async def find_run(self, run_id: str) -> RunHandle | RunRecord:
        """The run open here, else as persisted within the replay retention: its tenant
        and the snapshot it reads (for operators).

        :raises RunNotFoundError: no such run within retention.
        :raises ConflictError: several tenants have a run of this id.
        """
        return await self._any_run(run_id, None)

    def open_run_tenant(self, run_id: str) -> str | None:
        """The tenant of the run if one run of this id is open in this sidecar, else
        ``None`` (for log lines)."""
        handles = self._runs.with_id(run_id)
        return handles[0].tenant if len(handles) == 1 else None

    # -- which run a call means ------------------------------------------------------------
    #
    # A run is its tenant and its id: two tenants may each have a run of the same id. A
    # call naming a run by id alone means one of the runs of that id the connection may
    # use (BOUND_TENANTS): the only one; else the one of the tenant an issued memoryRef
    # names; else it is a conflict. A run open in this sidecar is preferred to runs that
    # are only persisted (the worker that began a run calls its own sidecar). A run of a
    # tenant the connection may not use is never considered, so it is neither refused nor
    # revealed: the call answers as for a run that does not exist.

    def _visible(self, runs: Sequence[_Run]) -> list[_Run]:
        allowed = BOUND_TENANTS.get()
        return list(runs) if allowed is None else [r for r in runs if r.tenant in allowed]

    def _matching(self, ref: str, runs: list[_Run]) -> _Run | None:
        """The run of ``runs`` that ``ref`` means without doubt: the one of the tenant an
        issued ref names, or for a plain ref the only run."""
        if ref.startswith(ISSUED_PREFIX):
            named = [r for r in runs if self._refs.names_tenant(ref, r.tenant)]
            return named[0] if len(named) == 1 else None
        return runs[0] if len(runs) == 1 else None

    def _pick(self, run_id: str, ref: str | None, runs: list[_Run]) -> _Run | None:
        """The run of ``runs`` (of id ``run_id``, one per tenant) a call naming ``ref``
        means, see above; None when there is none.

        :raises ConflictError: several, and ``ref`` does not tell which (``details.field``
            ``runId``).
        """
        if len(runs) <= 1:
            return runs[0] if runs else None
        if ref is not None:
            named = [r for r in runs if self._refs.names_tenant(ref, r.tenant)]
            if len(named) == 1:
                return named[0]
        raise ConflictError(
            "more than one tenant has a run of this id; name the tenant with a memoryRef "
            "issued for it, or bind this process to its tenant",
            {"field": "runId"},
        )

    def _open_here(self, run_id: str, ref: str) -> RunHandle | None:
        """The open run a call naming ``run_id`` and ``ref`` means without doubt (see
        :meth:`_matching`), marked as used; None when that needs a look at storage."""
        handle = self._matching(ref, self._visible(self._runs.with_id(run_id)))
        if handle is not None:
            self._runs.touch(handle)
        return handle

    def _open_run(self, run_id: str, ref: str | None) -> RunHandle:
        """The run open in this process that a call naming ``run_id`` (and ``ref``) means.

        :raises RunNotFoundError: it is not open (never begun here, ended, or evicted).
        :raises ConflictError: see :meth:`_pick`.
        """
        handles = self._visible(self._runs.with_id(run_id))
        handle = None if ref is None else self._matching(ref, handles)
        if handle is None:
            handle = self._pick(run_id, ref, handles)
        if handle is None:
            raise RunNotFoundError(
                "the run is not open in this sidecar; begin it again", {"runId": run_id}
            )
        self._runs.touch(handle)
        return handle

    async def _any_run(self, run_id: str, ref: str | None) -> RunHandle | RunRecord:
        """The run open here, else as persisted (within the replay retention), that a call
        naming ``run_id`` (and ``ref``) means: either way its tenant and the snapshot it
        reads.

        :raises RunNotFoundError: no such run within retention.
        :raises ConflictError: see :meth:`_pick`.
        """
        handles = self._visible(self._runs.with_id(run_id))
        if ref is not None:
            handle = self._matching(ref, handles)
        else:
            handle = handles[0] if len(handles) == 1 else None
        if handle is not None:
            self._runs.touch(handle)
            return handle
        records = await self._storage.find_runs(
            run_id=run_id, retention_cutoff_us=self._retention_cutoff_us()
        )
        # One per tenant, the open handle in place of the record of its run.
        runs: dict[str, RunHandle | RunRecord] = {r.tenant: r for r in self._visible(records)}
        runs |= {h.tenant: h for h in handles}
        run = self._pick(run_id, ref, list(runs.values()))
        if run is None:
            raise RunNotFoundError("unknown run", {"runId": run_id})
        if isinstance(run, RunHandle):
            self._runs.touch(run)
        return run

    def _retention_cutoff_us(self) -> int:
        return retention_cutoff_us(self._storage.clock_us(), self._config.replay_retention_us)

    # -- memory --------------------------------------------------------------------------

    async def list(self, params: ListParams) -> list[orjson.Fragment]:
        """The entries PROTOCOL.md's ``memory.list`` answers, each as its JSON: at most
        ``max_answer_bytes`` of them together (see :func:`within_bytes`)."""
        rows = await self._listed(params)
        return within_bytes(rows, self._config.max_answer_bytes)

    async def search(self, params: SearchParams) -> dict[str, Any]:
        """*(extension)* ``memory.search``: ``{hits}``, each ``{entry, score}``, what
        ``memory.list`` with ``rank: "relevance"`` and the same options finds, less the
        hits scoring below ``minScore``; as many as fit ``max_answer_bytes``."""
        given = {"limit": params.limit, "tag": params.tag, "tokenBudget": params.tokenBudget}
        options = MemoryListOptions.model_validate(
            {"rank": "relevance", "query": params.query}
            | {name: value for name, value in given.items() if value is not None}
        )
        listed = ListParams(runId=params.runId, memoryRef=params.memoryRef, options=options)
        rows = await self._listed(listed)
        if params.minScore is not None:
            least = params.minScore
            rows = [row for row in rows if (row.score or 0.0) >= least]
        entries = within_bytes(rows, self._config.max_answer_bytes)
        hits = [
            {"entry": entry, "score": row.score or 0.0}
            for entry, row in zip(entries, rows, strict=False)
        ]
        return {"hits": hits}

    async def _listed(self, params: ListParams) -> builtins.list[EntryRow]:
        """The rows ``memory.list`` answers, before the bound on the answer's bytes."""
        options = params.options
        relevance = options is not None and options.rank == "relevance"
        if relevance and (options is None or options.query is None):
            raise ValidationError(
                "options.query: rank 'relevance' requires a query", {"field": "options.query"}
            )
        run: RunHandle | RunRecord | None = self._open_here(params.runId, params.memoryRef)
        if run is None:  # the usual case above goes without a coroutine for the lookup
            run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return []
        if options is None:  # the plain list, on its shortest path
            return await self._storage.list(
                scope=scope,
                snapshot=run.snapshot,
                now_us=self._storage.clock_us(),
                limit=min(self._config.default_list_limit, self._config.max_list_limit),
                tag=None,
            )
        limit = min(options.limit or self._config.default_list_limit, self._config.max_list_limit)
        budget = options.tokenBudget
        # An entry over the whole budget is skipped in the query, so the rows fetched are
        # the first ``limit`` of the ranked list without them; any budget past this bound
        # skips nothing (and a larger integer would not fit the databases' columns).
        max_tokens = None if budget is None else min(budget, _MAX_TOKEN_BOUND)
        where = None if options.vendor_filter is None else _list_filter(options.vendor_filter)
        if relevance:
            assert options.query is not None
            terms = query_terms(options.query)
            if not terms:  # nothing content-bearing (stop words alone): nothing relevant
                return []
            vector = await self._query_vector(options.query, scope)
            rows = await self._search.search(
                scope=scope,
                snapshot=run.snapshot,
                now_us=self._storage.clock_us(),
                terms=terms,
                limit=limit,
                tag=options.tag,
                max_tokens=max_tokens,
                where=where,
                vector=vector,
                weights=weights_for(self._embedding.name),
                embed=self._embedding.vectors,
                when=asks_when(options.query),
            )
        else:
            rows = await self._storage.list(
                scope=scope,
                snapshot=run.snapshot,
                now_us=self._storage.clock_us(),
                limit=limit,
                tag=options.tag,
                max_tokens=max_tokens,
                where=where,
            )
        if budget is not None:
            rows = within_budget(rows, budget)
        return rows

    async def _query_vector(self, query: str, scope: Scope) -> bytes | None:
        """The query's vector. While the model is still to be loaded (the first relevance
        list after a start), the scope's vectors are read into memory beside its load, not
        after it: on 100,000 entries of all-MiniLM-L6-v2, 0.7 s instead of 1.4.

        :raises UpstreamUnavailableError: the database failed.
        """
        dimensions = dimensions_of(self._embedding.name)
        if self._embedding.loaded or not self._embedding.installed or dimensions is None:
            return await self._embedding.query_vector(query)
        found: list[bytes | None] = []

        async def embedded() -> None:
            found.append(await self._embedding.query_vector(query))

        async def prefetched() -> None:
            await self._search.prefetch(
                scope=scope, dimensions=dimensions, embed=self._embedding.vectors
            )

        await side_by_side(embedded, prefetched)
        return found[0]

    def get_now(self, params: GetParams) -> dict[str, Any] | NotNow | None:
        """What :meth:`get` answers, when that is ready without waiting (the run is open
        here and the backend reads at once); else ``NOT_NOW``.

        :raises ForbiddenError: the ref is another tenant's.
        :raises UpstreamUnavailableError: the database failed.
        """
        handle = self._open_here(params.runId, params.memoryRef)
        if handle is None:
            return NOT_NOW
        scope = self._refs.resolve(params.memoryRef, handle.tenant)
        if scope is None:
            return None
        storage = self._storage
        if self._reads_now is None:
            return NOT_NOW
        row = self._reads_now.get_now(
            scope=scope, snapshot=handle.snapshot, now_us=storage.clock_us(), entry_id=params.id
        )
        if row is None or isinstance(row, NotNow):
            return row
        return entry_to_wire(row)

    async def get(self, params: GetParams) -> dict[str, Any] | None:
        answer = self.get_now(params)
        if not isinstance(answer, NotNow):
            return answer
        return await self.get_stored(params)

    async def get_stored(self, params: GetParams) -> dict[str, Any] | None:
        """What :meth:`get` answers, read through the waiting path (what follows a
        ``NOT_NOW`` from :meth:`get_now`, without trying it again).

        :raises NotFoundError: no such run.
        :raises ForbiddenError: the ref is another tenant's.
        :raises UpstreamUnavailableError: the database failed.
        """
        run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return None
        storage = self._storage
        row = await storage.get(
            scope=scope, snapshot=run.snapshot, now_us=storage.clock_us(), entry_id=params.id
        )
        return None if row is None else entry_to_wire(row)

    async def delete(self, params: DeleteParams) -> bool:
        run = await self._any_run(params.runId, params.memoryRef)
        _check_writes(run)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return False
        storage = self._storage
        return await storage.delete(scope=scope, entry_id=params.id, now_us=storage.clock_us())

    async def put(self, params: PutParams) -> dict[str, Any]:
        policy = self._put_policy
        expires_us = policy.check_entry(params.entry)
        try:
            handle = self._open_run(params.runId, params.memoryRef)
        except RunNotFoundError:
            # A read-only run is never open: say so rather than "begin it again".
            _check_writes(await self._any_run(params.runId, params.memoryRef))
            raise
        scope = self._refs.resolve(params.memoryRef, handle.tenant)
        if scope is None:
            raise ValidationError("malformed memoryRef", {"field": "memoryRef"})
        # The vector is computed after the put (the indexer), from the redacted content
        # only: no secret can reach it.
        vector = PENDING_VECTOR if self._embedding.installed else None
        with self._runs.using(handle):
            keyring = await self._keyrings.for_run(handle)
            uid = CALLER_UID.get()
            request = await policy.redacted_request(keyring, scope, params, expires_us, uid, vector)
        storage = self._storage
        result = await storage.put(request=request, now_us=storage.clock_us())
        if result.outcome is PutOutcome.STORED and request.vector is not None:
            assert result.entry is not None
            self.indexer.note(result.entry.id, result.entry.content)
        if result.outcome is PutOutcome.KEY_CONFLICT:
            raise ConflictError(
                "the idempotency key was used for a different entry", {"field": "idempotencyKey"}
            )
        if result.outcome is PutOutcome.REVISION_CONFLICT:
            # The current revision (content-free) lets the writer read and try again.
            raise ConflictError(
                "the key's current revision is not the expected one",
                {"field": f"{VENDOR_KEY}.expectedRevision", "revision": result.revision or 0},
            )
        if result.outcome is PutOutcome.KEY_EXPIRED:
            # As a put repeated after expiresAt is refused before storage: the entry has
            # expired, its content is erased, and writing it again would resurrect it.
            raise ValidationError(
                "the entry this idempotency key wrote has expired", {"field": "entry.expiresAt"}
            )
        assert result.entry is not None
        if params.vendor_key is not None:
            return _keyed_answer(params.vendor_key.key, result)
        return entry_to_wire(result.entry)

    async def page(self, params: PageParams) -> dict[str, Any]:
        """*(extension)* ``memory.page``: ``{entries, nextCursor?}``, a page of the run's
        snapshot in ``memory.list``'s order; the pages of one snapshot hold each entry once.

        :raises ValidationError: the cursor is not one issued for this scope and snapshot
            (``details.field``: ``cursor``).
        """
        run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return {"entries": []}
        before = None
        if params.cursor is not None:
            before = self._refs.open_cursor(params.cursor, scope, run.snapshot)
            if before is None:
                raise ValidationError(
                    "cursor: not a cursor of this scope and run", {"field": "cursor"}
                )
        config = self._config
        limit = min(params.limit or config.default_list_limit, config.max_list_limit)
        rows = await self._storage.page(
            scope=scope,
            snapshot=run.snapshot,
            now_us=self._storage.clock_us(),
            limit=limit,
            tag=params.tag,
            where=None,
            before=before,
        )
        entries = within_bytes([row for _, row in rows], config.max_answer_bytes)
        answer: dict[str, Any] = {"entries": entries}
        # A full page (or one cut short by bytes) may have more after it.
        if entries and (len(entries) < len(rows) or len(rows) == limit):
            last = rows[len(entries) - 1][0]
            answer["nextCursor"] = self._refs.seal_cursor(scope, run.snapshot, last)
        return answer

    async def count(self, params: CountParams) -> dict[str, int]:
        """*(extension)* ``memory.count``: ``{count}`` of the entries ``memory.list`` would
        consider in the run's snapshot (with ``tag``, if given), with no limit."""
        run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return {"count": 0}
        total = await self._storage.count(
            scope=scope,
            snapshot=run.snapshot,
            now_us=self._storage.clock_us(),
            tag=params.tag,
            where=None,
        )
        return {"count": total}

    async def changes(self, params: ChangesParams) -> dict[str, Any]:
        """*(extension)* ``memory.changes``: ``{changes, nextCursor}``, the tenant's change
        records past ``cursor`` in commit order, content-free; ``nextCursor`` resumes after
        the last one (the same cursor when there is nothing new).

        :raises ValidationError: the cursor is not one this database issued for the
            tenant (``details.field``: ``cursor``).
        """
        feed = Scope(params.tenant, "\x00feed")  # no scope key has a NUL: a domain apart
        after = 0
        if params.cursor is not None:
            opened = self._refs.open_cursor(params.cursor, feed, "feed")
            if opened is None:
                raise ValidationError(
                    "cursor: not a change feed cursor of this tenant", {"field": "cursor"}
                )
            after = opened
        config = self._config
        limit = min(params.limit or config.default_list_limit, config.max_list_limit)
        records = await self._storage.changes(tenant=params.tenant, after=after, limit=limit)
        changes = [
            {
                "id": r.entry_id,
                "operation": r.op,
                "at": format_us(r.at_us),
                **self._refs.handle(Scope(params.tenant, r.scope_key)),
            }
            for r in records
        ]
        last = records[-1].position if records else after
        return {"changes": changes, "nextCursor": self._refs.seal_cursor(feed, "feed", last)}

    async def get_key(self, params: GetKeyParams) -> dict[str, Any] | None:
        """*(extension)* ``memory.getKey``: the key's revision the run's snapshot sees, as
        ``{entry, key, revision}``, or ``None``."""
        run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        if scope is None:
            return None
        storage = self._storage
        found = await storage.get_key(
            scope=scope,
            snapshot=run.snapshot,
            now_us=storage.clock_us(),
            entry_key=self._refs.keyed_id(f"entry:{params.key}"),
        )
        if found is None:
            return None
        row, revision = found
        return {"entry": entry_to_wire(row), "key": params.key, "revision": revision}

    async def history(self, params: HistoryParams) -> dict[str, Any]:
        """*(extension)* ``memory.history``: the key's stored revisions, newest first, as
        the live store holds them (not the run's snapshot: a writer needs the revisions
        committed since)."""
        run = await self._any_run(params.runId, params.memoryRef)
        scope = self._refs.resolve(params.memoryRef, run.tenant)
        revisions: list[dict[str, Any]] = []
        if scope is not None:
            config = self._config
            limit = min(params.limit or config.default_list_limit, config.max_list_limit)
            storage = self._storage
            found = await storage.key_history(
                scope=scope,
                now_us=storage.clock_us(),
                entry_key=self._refs.keyed_id(f"entry:{params.key}"),
                limit=limit,
                before=params.before,
            )
            # Bounded as a list answer is: at most max_answer_bytes of entries, at least one.
            spent = 0
            for r in found:
                encoded = orjson.dumps(entry_to_wire(r.entry))
                spent += len(encoded) + 40  # the revision's own members, generously
                item = {
                    "revision": r.revision,
                    "state": r.state.value,
                    "entry": orjson.Fragment(encoded),
                }
                if spent > self._config.max_answer_bytes and revisions:
                    break
                revisions.append(item)
        return {"key": params.key, "revisions": revisions}

    # -- sidecar -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``ok``, or ``degraded`` when storage cannot answer or reports problems (writes
        failing, a stuck writer, a full disk); never raises."""
        try:
            record = await self._storage.health()
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever the storage says
            storage: dict[str, object] = {"error": getattr(exc, "code", "internal_error")}
            degraded = True
        else:
            storage, degraded = record.to_wire(), bool(record.problems)
        return {
            "status": "degraded" if degraded else "ok",
            "version": __version__,
            "uptimeSeconds": round(time.monotonic() - self._started, 3),
            "storage": storage,
        }

    def stats_snapshot(self) -> dict[str, Any]:
        indexer = self.indexer
        return self.stats.snapshot(active_runs=len(self._runs), keyrings=self._keyring_gauges()) | {
            "vectorsPending": indexer.backlog + indexer.in_flight,
            "vectorsIndexed": indexer.indexed,
        }

    async def metrics(self) -> bytes:
        """The Prometheus metrics page (see :mod:`.metrics`); never raises for a failing
        storage (its gauges are then left out)."""
        try:
            gauges: StorageGauges | None = await self._storage.gauges()
        except Exception:  # noqa: BLE001 - a scrape must answer whatever the storage says
            gauges = None
        return render_metrics(
            self.stats,
            open_runs=len(self._runs),
            keyrings=self._keyring_gauges(),
            storage=gauges,
            refs_rejected=self._refs.rejected,
            host_reloads=None if self._host_secrets is None else self._host_secrets.reloads,
        )

    def _keyring_gauges(self) -> KeyringGauges:
        return KeyringGauges(
            self._keyring_budget.held,
            self._keyrings.host_keyrings_cached,
            self._runs.evicted,
            self._runs.idle_dropped,
        )

    async def sweep(self, batch_size: int) -> SweepCounts:
        """Keep this process's open runs retained (touch them), then remove what expired or
        is past the replay retention, ``batch_size`` rows a statement (see
        :meth:`~openwop_memory.storage.base.Storage.sweep`). Counted in ``sidecar.stats``.

        :raises Exception: whatever storage raised; counted as a failed sweep.
        """
        stats = self.stats
        try:
            storage = self._storage
            now = storage.clock_us()
            await storage.touch_runs(runs=self._runs.keys(), now_us=now)
            counts = await storage.sweep(
                horizons=SweepHorizons.at(now, self._config.replay_retention_us),
                batch_size=batch_size,
            )
        except Exception:
            stats.sweep_failures += 1
            raise
        stats.sweeps += 1
        stats.entries_swept += counts.expired_entries
        stats.tombstones_purged += counts.purged_tombstones
        stats.snapshots_expired += counts.expired_runs
        stats.run_markers_purged += counts.purged_runs
        stats.idempotency_keys_purged += counts.purged_idempotency_keys
        if counts.errors:
            stats.sweep_failures += 1
        return counts
