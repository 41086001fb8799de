"""The in-memory backend's maintenance writes over a :class:`~.database.Database`: the
sweep's steps, one batch of a forget, an import.

Each function is one synchronous write (one step of the event loop); the backend runs a
sweep or forget as a series of them, yielding to the loop between batches as SQLite's
does between transactions, so that client writes interleave.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from ...domain import SweepHorizons
from ...token_count import estimate_tokens
from ..base import StoredEntry
from .database import Database, Row

Step = Callable[[Database, SweepHorizons, int], int]
"""One batch of a sweep step: how many rows it removed or changed (below the batch size:
the step is done)."""


def expire_entries(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Remove entries that expired at or before ``now_us``, whatever pins them, with an
    ``expire`` record for each that was live (a deleted or superseded one had its record
    when it ended). Their idempotency keys stay (a digest only), so a repeated put is
    refused rather than stored again."""
    doomed = sorted(
        seq
        for seq in database.expiring
        if (expires := database.by_seq[seq].entry.expires_us) is not None
        and expires <= horizons.now_us
    )[:batch]
    for seq in doomed:
        row = database.by_seq[seq]
        if row.deleted_seq is None:
            database.record(
                row.scope.tenant, row.scope.key, row.entry.id, "expire", database.last_us, None
            )
        database.remove(row)
    return len(doomed)


def purge_changes(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Drop change records written at or before ``key_cutoff_us`` (the replay retention):
    a prefix of the feed, whose times never go back."""
    end = bisect.bisect_right(database.changes, horizons.key_cutoff_us, key=lambda c: c.at_us)
    count = min(end, batch)
    del database.changes[:count]
    return count


def purge_keys(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Drop idempotency keys created at or before ``key_cutoff_us``."""
    old = [k for k, kept in database.keys.items() if kept.created_us <= horizons.key_cutoff_us]
    for key in old[:batch]:
        del database.keys[key]
    return len(old[:batch])


def expire_runs(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Take the snapshot of runs touched at or before ``run_cutoff_us``, leaving a marker."""
    done = 0
    for by_tenant in database.runs.values():
        for run in by_tenant.values():
            if done == batch:
                return done
            if run.snapshot_seq is not None and run.touched_us <= horizons.run_cutoff_us:
                run.snapshot_seq = None
                done += 1
    return done


def purge_markers(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Drop the markers of runs touched at or before ``marker_cutoff_us``."""
    old = [
        (run_id, tenant)
        for run_id, by_tenant in database.runs.items()
        for tenant, run in by_tenant.items()
        if run.snapshot_seq is None and run.touched_us <= horizons.marker_cutoff_us
    ][:batch]
    for run_id, tenant in old:
        by_tenant = database.runs[run_id]
        del by_tenant[tenant]
        if not by_tenant:
            del database.runs[run_id]
    return len(old)


def purge_tombstones(database: Database, horizons: SweepHorizons, batch: int) -> int:
    """Remove tombstones no snapshot can see any more.

    A rule copied from SQL (the ``purged_tombstones`` step of SQLite's ``sweep``, written
    again in PostgreSQL's): a tombstone goes once every retained snapshot is at or past
    its delete, the delete is past the replay retention (a run as of a time before it
    still sees the entry), no idempotency key pins it, and, for a keyed revision, its end
    is past the retention too (its history is kept that long). Its horizon could be one
    function of ``domain.py`` over a backend's few facts.
    """
    cutoff = horizons.run_cutoff_us
    retained = [
        run.snapshot_seq
        for by_tenant in database.runs.values()
        for run in by_tenant.values()
        if run.snapshot_seq is not None
    ]
    horizon = min(retained, default=database.seq)
    pinned = {kept.entry_seq for kept in database.keys.values()}
    doomed: list[Row] = []
    for row in database.by_seq.values():
        if len(doomed) == batch:
            break
        if (
            row.deleted_seq is not None
            and row.deleted_seq <= horizon
            and (row.deleted_us or 0) <= cutoff
            and row.seq not in pinned
            and (row.ended_us is None or row.ended_us <= cutoff)
        ):
            doomed.append(row)
    for row in doomed:
        database.remove(row)
    return len(doomed)


STEPS: dict[str, Step] = {
    "expired_entries": expire_entries,
    "purged_changes": purge_changes,
    "purged_idempotency_keys": purge_keys,
    "expired_runs": expire_runs,
    "purged_runs": purge_markers,
    "purged_tombstones": purge_tombstones,
}
"""The sweep's steps by their :class:`SweepCounts` field; ``storage/batches.py`` runs them
in their order."""


def forget_batch(database: Database, tenant: str, tag: str, batch: int) -> int:
    """Remove up to ``batch`` entries of ``tenant`` tagged ``tag`` (deleted or not), each
    with a ``forget`` record, and the idempotency keys that pinned them."""
    doomed = [
        row
        for scope, rows in database.scopes.items()
        if scope.tenant == tenant
        for row in rows.values()
        if tag in row.tag_set
    ][:batch]
    if not doomed:
        return 0
    doomed.sort(key=lambda row: row.seq)
    seqs = {row.seq for row in doomed}
    for row in doomed:
        database.record(tenant, row.scope.key, row.entry.id, "forget", database.last_us, None)
    for key in [k for k, kept in database.keys.items() if kept.entry_seq in seqs]:
        del database.keys[key]
    for row in doomed:
        database.remove(row)
    return len(doomed)


def import_entries(database: Database, entries: Sequence[StoredEntry]) -> int:
    """Store ``entries`` as :meth:`Storage.import_entries` says: each keeps its id, scope,
    content, tags, createdAt and expiresAt, gets a position of its own and a ``put``
    record at the import's time; an id already stored is skipped.

    A rule copied from SQL: the clock is pulled up to the newest createdAt imported, so a
    later put never dates below it.
    """
    seen = set(database.by_id)
    fresh: list[StoredEntry] = []
    for item in entries:
        if item.entry.id not in seen:
            seen.add(item.entry.id)
            fresh.append(item)
    if not fresh:
        return 0
    database.advance(max(item.entry.created_us for item in fresh))
    at_us = database.last_us
    for item in fresh:
        seq = database.seq = database.seq + 1
        entry = item.entry._replace(tokens=estimate_tokens(item.entry.content), score=None)
        database.add(database.new_row(seq, item.scope, entry, item.embedding))
        database.record(item.scope.tenant, item.scope.key, entry.id, "put", at_us, seq)
    return len(fresh)
