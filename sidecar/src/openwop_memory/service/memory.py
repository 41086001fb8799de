"""The memory service: PROTOCOL.md's methods over validated params, wire-ready results.

Each method takes a validated params model and returns a JSON-ready value, or raises a
:class:`~openwop_memory_client.MemoryServiceError`. Errors and results never carry secret
values; errors never carry entry content.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

import anyio.to_thread
import orjson
from openwop_memory_client import (
    ConflictError,
    ForbiddenError,
    ReplaySnapshotUnavailableError,
    RunNotFoundError,
    SecretLeakageError,
    ValidationError,
)
from openwop_memory_client.wire import (
    MAX_TAG_CHARS,
    DeleteParams,
    EntryInput,
    GetParams,
    IssueRefParams,
    ListParams,
    PutParams,
    RunAddSecretsParams,
    RunBeginParams,
    RunEndParams,
    SecretSpec,
)

from .. import __version__
from ..domain import SweepHorizons, retention_cutoff_us
from ..redaction import EMPTY_KEYRING, Finding, Keyring, Redacted, redact_entry
from ..storage.base import (
    BeginOutcome,
    BeginResult,
    EntryRow,
    PutOutcome,
    PutRequest,
    RunRecord,
    Scope,
    Snapshot,
    Storage,
    SweepCounts,
)
from ..timefmt import MAX_WIRE_US, format_us, parse_rfc3339
from .keyring_memory import HostKeyringCache, KeyringBudget, KeyringCompiler
from .refs import RefCodec
from .runs import RunHandle, RunRegistry, merged_values
from .stats import KeyringGauges, Stats

# Below this size redaction costs less than the hop to a worker thread and back.
_INLINE_REDACTION_CHARS = 8192

RedactionPolicy = Literal["rewrite", "reject", "reject-disguised"]
PatternPolicy = Literal["off", "rewrite", "reject"]


class HostSecrets(Protocol):
    """The host secrets as the service reads them (see ``secrets_directory.py``)."""

    @property
    def generation(self) -> int:
        """Changes whenever the loaded secrets change."""

    def values_for(self, tenant: str) -> Mapping[str, str]:
        """Value → secret id for ``tenant``'s runs: its own secrets and the host-wide ones."""


@dataclass(frozen=True)
class ServiceConfig:
    redaction: RedactionPolicy = "rewrite"
    credential_patterns: PatternPolicy = "rewrite"
    max_entry_size_bytes: int = 65536
    default_list_limit: int = 100
    max_list_limit: int = 1000
    replay_retention_us: int = 7 * 86_400 * 1_000_000
    max_open_runs: int = 10_000
    max_run_secret_bytes: int = 16 << 10
    max_keyring_memory_bytes: int = 256 << 20


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


def _begun_run(run_id: str, result: BeginResult) -> RunRecord:
    """The run ``begin_run`` created or resumed.

    :raises ForbiddenError: the run belongs to another tenant.
    :raises ReplaySnapshotUnavailableError: a replay found no snapshot within retention.
    """
    outcome = result.outcome
    if outcome is BeginOutcome.OTHER_TENANT:
        raise ForbiddenError("the run belongs to another tenant", {"runId": run_id})
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
    assert result.run is not None
    return result.run


def _unique_nonempty(tags: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for t in tags if t))


class MemoryService:
    def __init__(
        self,
        storage: Storage,
        refs: RefCodec,
        config: ServiceConfig,
        host_secrets: HostSecrets | None = None,
        stats: Stats | None = None,
    ) -> None:
        self.storage = storage
        self.host_secrets = host_secrets
        self.refs = refs
        self.config = config
        self.keyring_budget = KeyringBudget(config.max_keyring_memory_bytes)
        self.compiler = KeyringCompiler(self.keyring_budget)
        self.host_keyrings = HostKeyringCache(self.compiler)
        self.runs = RunRegistry(config.max_open_runs, self.keyring_budget)
        self.stats = Stats() if stats is None else stats
        self.started = time.monotonic()

    # -- host ----------------------------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        return {
            "capabilities": {
                # Redaction cannot be switched off, so long-term is always advertised (§D).
                "agents": {"memoryBackends": ["long-term"]},
                "memory": {
                    "supported": True,
                    "maxEntrySizeBytes": self.config.max_entry_size_bytes,
                    "ttlSupported": True,
                    "writable": True,
                },
            }
        }

    def issue_ref(self, p: IssueRefParams) -> dict[str, Any]:
        return {"memoryRef": self.refs.issue(p.tenant, p.agent, p.namespace)}

    # -- runs ----------------------------------------------------------------------------

    async def run_begin(self, p: RunBeginParams) -> dict[str, Any]:
        handle = self.runs.get(p.runId)
        if handle is not None and handle.tenant == p.tenant:
            await self._add_secrets(handle, p.secrets)
            return self._begun(handle, resumed=True)
        # Check the secrets, and make room for their keyring, before touching storage, so a
        # refused begin writes nothing.
        values = merged_values({}, p.secrets, self.config.max_run_secret_bytes) or {}
        generation, keyed = self._with_host(p.tenant, values)
        with self.compiler.reserving(keyed) as nbytes:
            keyring = await self.compiler.compile(keyed) if values else None
            now = self.storage.clock_us()
            result = await self.storage.begin_run(
                run_id=p.runId,
                tenant=p.tenant,
                replay=p.replay,
                now_us=now,
                retention_cutoff_us=retention_cutoff_us(now, self.config.replay_retention_us),
            )
            record = _begun_run(p.runId, result)
            resumed = result.outcome is BeginOutcome.RESUMED
            handle = self.runs.get(p.runId)  # another begin of the same run may have raced us
            if handle is None or handle.snapshot != record.snapshot:
                handle = RunHandle(
                    record.run_id,
                    record.tenant,
                    record.snapshot,
                    record.snapshot_us,
                    values,
                    keyring,
                    generation,
                )
                self.runs.add(handle)
                if keyring is not None:
                    self.runs.charge(handle, nbytes)
                return self._begun(handle, resumed=resumed)
        await self._add_secrets(handle, p.secrets)
        return self._begun(handle, resumed=resumed)

    def _with_host(self, tenant: str, values: Mapping[str, str]) -> tuple[int, Mapping[str, str]]:
        """The host generation and ``values`` merged over the tenant's host secrets (the
        run's ids win): what a run's keyring is compiled from."""
        host = self.host_secrets
        if host is None or not values:
            return -1, values
        return host.generation, {**host.values_for(tenant), **values}

    @staticmethod
    def _begun(handle: RunHandle, *, resumed: bool) -> dict[str, Any]:
        return {
            "runId": handle.run_id,
            "tenant": handle.tenant,
            "snapshotAt": format_us(handle.snapshot_us),
            "resumed": resumed,
        }

    async def run_add_secrets(self, p: RunAddSecretsParams) -> dict[str, Any]:
        handle = self._open_run(p.runId)
        await self._add_secrets(handle, p.secrets)
        return {"count": len(handle.values)}

    async def _add_secrets(self, handle: RunHandle, secrets: list[SecretSpec]) -> None:
        """Merge ``secrets`` into the handle's keyring, safe against concurrent merges.

        :raises ValidationError: see :func:`~.runs.merged_values`.
        :raises RateLimitedError: no room for the grown keyring (see ``keyring_memory.py``).
        """
        with self.runs.using(handle):
            while True:
                base = handle.values
                values = merged_values(base, secrets, self.config.max_run_secret_bytes)
                if values is None:
                    return
                generation, keyed = self._with_host(handle.tenant, values)
                with self.compiler.reserving(keyed) as nbytes:
                    keyring = await self.compiler.compile(keyed)
                    # Another merge may have finished while this one compiled; then merge
                    # again on top of it, or its secrets would be lost.
                    if handle.values is base:
                        handle.values, handle.keyring = values, keyring
                        handle.generation = generation
                        self.runs.charge(handle, nbytes)
                        return

    def run_end(self, p: RunEndParams) -> dict[str, Any]:
        return {"ended": self.runs.end(p.runId)}

    def _open_run(self, run_id: str) -> RunHandle:
        handle = self.runs.get(run_id)
        if handle is None:
            raise RunNotFoundError(
                "the run is not open in this sidecar; begin it again", {"runId": run_id}
            )
        return handle

    async def tenant_of_run(self, run_id: str) -> str | None:
        """The tenant of the run, whether it is open here or only persisted (within the
        replay retention); None for a run that does not exist."""
        handle = self.runs.get(run_id)
        if handle is not None:
            return handle.tenant
        cutoff = retention_cutoff_us(self.storage.clock_us(), self.config.replay_retention_us)
        record = await self.storage.find_run(run_id=run_id, retention_cutoff_us=cutoff)
        return None if record is None else record.tenant

    async def _snapshot(self, run_id: str) -> tuple[str, Snapshot]:
        """The run's (tenant, snapshot) whether it is open here or only persisted."""
        handle = self.runs.get(run_id)
        if handle is not None:
            return handle.tenant, handle.snapshot
        record = await self.storage.find_run(
            run_id=run_id,
            retention_cutoff_us=retention_cutoff_us(
                self.storage.clock_us(), self.config.replay_retention_us
            ),
        )
        if record is None:
            raise RunNotFoundError("unknown run", {"runId": run_id})
        return record.tenant, record.snapshot

    # -- memory --------------------------------------------------------------------------

    async def list(self, p: ListParams) -> list[dict[str, Any]]:
        handle = self.runs.get(p.runId)  # the usual case, without a coroutine for it
        tenant, snapshot = (
            (handle.tenant, handle.snapshot)
            if handle is not None
            else await self._snapshot(p.runId)
        )
        scope = self.refs.resolve(p.memoryRef, tenant)
        if scope is None:
            return []
        options = p.options
        limit = (options.limit if options else None) or self.config.default_list_limit
        rows = await self.storage.list(
            scope=scope,
            snapshot=snapshot,
            now_us=self.storage.clock_us(),
            limit=min(limit, self.config.max_list_limit),
            tag=options.tag if options else None,
        )
        return [entry_to_wire(r) for r in rows]

    async def get(self, p: GetParams) -> dict[str, Any] | None:
        handle = self.runs.get(p.runId)  # the usual case, without a coroutine for it
        tenant, snapshot = (
            (handle.tenant, handle.snapshot)
            if handle is not None
            else await self._snapshot(p.runId)
        )
        scope = self.refs.resolve(p.memoryRef, tenant)
        if scope is None:
            return None
        storage = self.storage
        row = await storage.get(
            scope=scope, snapshot=snapshot, now_us=storage.clock_us(), entry_id=p.id
        )
        return None if row is None else entry_to_wire(row)

    async def delete(self, p: DeleteParams) -> bool:
        tenant, _ = await self._snapshot(p.runId)
        scope = self.refs.resolve(p.memoryRef, tenant)
        if scope is None:
            return False
        return await self.storage.delete(scope=scope, entry_id=p.id, now_us=self.storage.clock_us())

    async def put(self, p: PutParams) -> dict[str, Any]:
        expires_us = self._check_entry(p.entry)
        handle = self._open_run(p.runId)
        scope = self.refs.resolve(p.memoryRef, handle.tenant)
        if scope is None:
            raise ValidationError("malformed memoryRef", {"field": "memoryRef"})
        with self.runs.using(handle):
            keyring = await self._keyring(handle)
            request = await self._redacted_request(keyring, scope, p, expires_us)
        result = await self.storage.put(request=request, now_us=self.storage.clock_us())
        if result.outcome is PutOutcome.KEY_CONFLICT:
            raise ConflictError(
                "the idempotency key was used for a different entry", {"field": "idempotencyKey"}
            )
        assert result.entry is not None
        return entry_to_wire(result.entry)

    def _check_entry(self, entry: EntryInput) -> int | None:
        """Check the entry as received; return its expiry in µs (``None`` if it has none).

        :raises ValidationError: too large, or ``expiresAt`` unreadable, unspellable or past.
        """
        size = len(entry.content.encode()) + sum(len(t.encode()) for t in entry.tags)
        if size > self.config.max_entry_size_bytes:
            raise ValidationError(
                f"content plus tags exceed {self.config.max_entry_size_bytes} bytes",
                {"field": "entry", "maxEntrySizeBytes": self.config.max_entry_size_bytes},
            )
        expires_us = None
        if entry.expiresAt is not None:
            try:
                expires_us = parse_rfc3339(entry.expiresAt)
            except ValueError:
                raise ValidationError(
                    "expiresAt is not an RFC 3339 time with an offset", {"field": "entry.expiresAt"}
                ) from None
            if expires_us > MAX_WIRE_US:
                raise ValidationError(
                    "expiresAt is after 9999-12-31T23:59:59.999999Z",
                    {"field": "entry.expiresAt"},
                )
            if expires_us <= self.storage.clock_us():
                raise ValidationError(
                    "expiresAt is not in the future", {"field": "entry.expiresAt"}
                )
        return expires_us

    async def _redacted_request(
        self,
        keyring: Keyring,
        scope: Scope,
        p: PutParams,
        expires_us: int | None,
    ) -> PutRequest:
        # Tags are redacted as sent, so every field name below indexes the request's tags;
        # empty and repeated tags are dropped afterwards.
        redacted = await self._redact(keyring, p.entry)
        refused = self._refused(redacted)
        if refused:
            raise SecretLeakageError(
                "the entry contains a registered secret"
                if refused[0].kind == "secret"
                else "the entry contains a credential",
                {
                    "field": "entry." + refused[0].field,
                    "secretIds": sorted(set().union(*(f.secret_ids for f in refused))),
                },
            )
        self.stats.redactions_applied += sum(len(f.secret_ids) for f in redacted.findings)
        for i, tag in enumerate(redacted.tags):
            if len(tag) > MAX_TAG_CHARS:
                raise ValidationError(
                    f"a tag is longer than {MAX_TAG_CHARS} characters after redaction",
                    {"field": f"entry.tags[{i}]"},
                )
        tags = _unique_nonempty(redacted.tags)
        # The digest is over the redacted entry, so no secret value enters it.
        digest = hashlib.sha256(orjson.dumps([redacted.content, tags, expires_us])).digest()
        # Keys are stored as keyed digests: a worker may well derive them from content.
        key = None if p.idempotencyKey is None else self.refs.keyed_id(p.idempotencyKey)
        return PutRequest(scope, redacted.content, tags, expires_us, key, digest)

    async def _redact(self, keyring: Keyring, entry: EntryInput) -> Redacted:
        """Redact ``entry``; a large one in a worker thread, so small requests are not held
        up behind it (a 64 KiB entry takes milliseconds)."""
        args = (keyring, entry.content, tuple(entry.tags))
        patterns = self.config.credential_patterns
        if len(entry.content) + sum(map(len, entry.tags)) <= _INLINE_REDACTION_CHARS:
            return redact_entry(*args, patterns=patterns)
        return await anyio.to_thread.run_sync(partial(redact_entry, *args, patterns=patterns))

    def _refused(self, redacted: Redacted) -> tuple[Finding, ...]:
        """The findings the policies refuse to store rather than rewrite (first field first)."""
        if redacted.leaked:
            return redacted.findings or (Finding("content", "secret", frozenset(), True),)
        return tuple(
            f
            for f in redacted.findings
            if (f.kind == "pattern" and self.config.credential_patterns == "reject")
            or (
                f.kind == "secret"
                and (
                    self.config.redaction == "reject"
                    or (self.config.redaction == "reject-disguised" and f.disguised)
                )
            )
        )

    async def _keyring(self, handle: RunHandle) -> Keyring:
        """The run's keyring merged with the host keyring for its tenant (the run's ids win).

        Compiled once per change of either, not per put.

        :raises RateLimitedError: no room to compile it (see ``keyring_memory.py``).
        """
        host = self.host_secrets
        if not handle.values:
            if host is None:
                return EMPTY_KEYRING
            generation = host.generation
            return await self.host_keyrings.get(
                handle.tenant, generation, host.values_for(handle.tenant)
            )
        if handle.keyring is not None and (host is None or handle.generation == host.generation):
            return handle.keyring
        values = handle.values
        generation, keyed = self._with_host(handle.tenant, values)
        with self.compiler.reserving(keyed) as nbytes:
            keyring = await self.compiler.compile(keyed)
            if handle.values is values:  # else a merge compiled a newer one meanwhile
                handle.keyring, handle.generation = keyring, generation
                self.runs.charge(handle, nbytes)
        return keyring

    # -- sidecar -------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """``ok``, or ``degraded`` when storage cannot answer or reports problems (writes
        failing, a stuck writer, a full disk); never raises."""
        try:
            record = await self.storage.health()
        except Exception as exc:  # noqa: BLE001 - health must answer, whatever the storage says
            storage: dict[str, object] = {"error": getattr(exc, "code", "internal_error")}
            degraded = True
        else:
            storage, degraded = record.to_wire(), bool(record.problems)
        return {
            "status": "degraded" if degraded else "ok",
            "version": __version__,
            "uptimeSeconds": round(time.monotonic() - self.started, 3),
            "storage": storage,
        }

    async def sweep(self, batch_size: int) -> SweepCounts:
        """Keep this process's open runs retained (touch them), then remove what expired or
        is past the replay retention, ``batch_size`` rows a statement (see
        :meth:`~openwop_memory.storage.base.Storage.sweep`). Counted in ``sidecar.stats``.

        :raises Exception: whatever storage raised; counted as a failed sweep.
        """
        stats = self.stats
        try:
            storage = self.storage
            now = storage.clock_us()
            await storage.touch_runs(run_ids=self.runs.run_ids(), now_us=now)
            counts = await storage.sweep(
                horizons=SweepHorizons.at(now, self.config.replay_retention_us),
                batch_size=batch_size,
            )
        except Exception:
            stats.sweep_failures += 1
            raise
        stats.sweeps += 1
        stats.entries_swept += counts.expired_entries
        stats.tombstones_purged += counts.purged_tombstones
        if counts.errors:
            stats.sweep_failures += 1
        return counts

    def stats_snapshot(self) -> dict[str, Any]:
        gauges = KeyringGauges(self.keyring_budget.held, len(self.host_keyrings), self.runs.evicted)
        return self.stats.snapshot(active_runs=len(self.runs), keyrings=gauges)
