"""A :class:`~openwop_memory.storage.base.Storage` driven directly, without a sidecar: the
puts and runs the storage tests make, each checked for the outcome it expects.

Times are µs since the epoch; ``now`` defaults to the wall clock.
"""

from __future__ import annotations

import hashlib
import os

from openwop_memory.storage.base import (
    UNCOUNTED,
    BeginOutcome,
    EntryRow,
    PutOutcome,
    PutRequest,
    RunRecord,
    Scope,
    Snapshot,
    Storage,
    StoredEntry,
)
from openwop_memory.timefmt import now_us
from openwop_memory.token_count import estimate_tokens

SECOND = 1_000_000
DAY = 86_400 * SECOND
RETENTION = 7 * DAY
"""The replay retention of the runs begun here: runs begun longer ago are gone."""


def put_request(
    scope: Scope,
    content: str,
    *,
    tags: tuple[str, ...] = (),
    expires_us: int | None = None,
    key: str | None = None,
) -> PutRequest:
    """A put of ``content`` into ``scope`` with idempotency key ``key``; its digest covers
    content, tags and expiry, as the service's covers the redacted entry."""
    digest = hashlib.sha256(repr((content, tags, expires_us)).encode()).digest()
    return PutRequest(scope, content, tags, expires_us, key, digest)


async def stored(store: Storage, request: PutRequest, now: int | None = None) -> EntryRow:
    """Put ``request`` at ``now``; the new entry as a read returns it (AssertionError if
    none was stored). A put's answer may leave the token count to be taken after the
    commit (``UNCOUNTED``); a read always gives it."""
    result = await store.put(request=request, now_us=now_us() if now is None else now)
    assert result.outcome is PutOutcome.STORED and result.entry is not None, result
    return as_read(result.entry)


def as_read(entry: EntryRow) -> EntryRow:
    """``entry`` from a put's answer as a read returns it: with its token count."""
    counted = estimate_tokens(entry.content)
    assert entry.tokens in (UNCOUNTED, counted), entry
    return entry._replace(tokens=counted)


async def begun(
    store: Storage, run_id: str, tenant: str = "tenant-a", now: int | None = None
) -> RunRecord:
    """``run_id`` of ``tenant`` begun (created, or resumed within :data:`RETENTION`) at
    ``now``, without replay; its record."""
    now = now_us() if now is None else now
    result = await store.begin_run(
        run_id=run_id, tenant=tenant, replay=False, now_us=now, retention_cutoff_us=now - RETENTION
    )
    assert result.outcome in (BeginOutcome.CREATED, BeginOutcome.RESUMED), result
    assert result.run is not None
    return result.run


async def fresh_snapshot(store: Storage, tenant: str, now: int | None = None) -> Snapshot:
    """The snapshot of a run of ``tenant`` begun at ``now`` under a name not used before."""
    return (await begun(store, f"run-{os.urandom(6).hex()}", tenant, now)).snapshot


async def contents(store: Storage, scope: Scope, now: int | None = None) -> list[str]:
    """The contents a run begun at ``now`` sees in ``scope``, newest first."""
    now = now_us() if now is None else now
    snapshot = await fresh_snapshot(store, scope.tenant, now)
    rows = await store.list(scope=scope, snapshot=snapshot, now_us=now, limit=100, tag=None)
    return [row.content for row in rows]


async def exported(store: Storage, scope: Scope, count: int) -> list[StoredEntry]:
    """``count`` entries put into ``scope`` of the open ``store`` (``walrus number N``), then
    exported from it, and the store closed: an import's input."""
    try:
        for number in range(count):
            await stored(store, put_request(scope, f"walrus number {number}"))
        return [
            item
            async for batch in store.export_entries(now_us=now_us(), batch_size=100)
            for item in batch
        ]
    finally:
        await store.close()
