"""The in-memory backend's client writes over a :class:`~.database.Database`: a run's
begin and a put, each one synchronous step (see :mod:`.database`)."""

from __future__ import annotations

import dataclasses

from ...domain import new_entry_id
from ..base import (
    KEY_CONFLICT,
    REFUSED,
    BeginOutcome,
    BeginResult,
    EntryRow,
    FoundRun,
    PutOutcome,
    PutRequest,
    PutResult,
    RunRecord,
    Scope,
    Snapshot,
    classify_run,
    refuse_as_of,
    replayed,
)
from .database import HISTORY_SINCE_US, Database, KeptKey, Row, RunRow
from .queries import as_of_seq


def begin_run(
    database: Database,
    *,
    run_id: str,
    tenant: str,
    replay: bool,
    now_us: int,
    retention_cutoff_us: int,
    as_of_us: int | None,
) -> BeginResult:
    """:meth:`Storage.begin_run` on ``database``, whose clock the write has moved to now."""
    row = database.runs.get(run_id, {}).get(tenant)
    found = None
    if row is not None:
        found = FoundRun(row.snapshot_seq is not None, row.touched_us, row.as_of_us)
    outcome = classify_run(
        found,
        tenant=tenant,
        replay=replay,
        retention_cutoff_us=retention_cutoff_us,
        as_of_us=as_of_us,
    )
    if outcome is BeginOutcome.RESUMED:
        assert row is not None
        assert row.snapshot_seq is not None
        row.touched_us = now_us
        snapshot = Snapshot(row.snapshot_seq)
        return BeginResult(
            outcome, RunRecord(run_id, tenant, snapshot, row.snapshot_us, row.as_of_us)
        )
    if outcome is not BeginOutcome.CREATED:
        return REFUSED[outcome]
    # Every entry inside the snapshot has createdAt <= its time, every later one more.
    snap_us, snap_seq = database.last_us, database.seq
    if as_of_us is not None:
        refused = refuse_as_of(as_of_us, clock_us=snap_us, history_since_us=HISTORY_SINCE_US)
        if refused is not None:
            return REFUSED[refused]
        if as_of_us < snap_us:
            snap_seq = as_of_seq(database, as_of_us)
        snap_us = as_of_us
    database.snapshot_taken()
    database.runs.setdefault(run_id, {})[tenant] = RunRow(snap_seq, snap_us, now_us, as_of_us)
    run = RunRecord(run_id, tenant, Snapshot(snap_seq), snap_us, as_of_us)
    return BeginResult(BeginOutcome.CREATED, run)


def put(database: Database, request: PutRequest, *, tokens: int, now_us: int) -> PutResult:
    """:meth:`Storage.put` on ``database``, whose clock the write has moved to now;
    ``tokens`` is the content's token estimate."""
    scope = request.scope
    # A rule copied from SQL: the scope is made first, even by a put that ends in a
    # conflict (SQLite's transaction commits the scope row with the refusal).
    database.scope_rows(scope)
    key = request.idempotency_key
    if key is not None:
        kept = database.keys.get((scope, key))
        if kept is not None:
            if kept.digest != request.digest:
                return KEY_CONFLICT
            earlier = database.by_seq.get(kept.entry_seq)
            answer = replayed(None if earlier is None else earlier.entry, now_us)
            if request.entry_key is None or answer.entry is None or earlier is None:
                return answer
            return dataclasses.replace(answer, revision=earlier.revision)
    latest, current = 0, None
    if request.entry_key is not None:
        latest, current = _key_head(database, scope, request.entry_key, now_us)
        expected = request.expected_revision
        head = 0 if current is None else latest
        if expected is not None and expected != head:
            return PutResult(PutOutcome.REVISION_CONFLICT, revision=head)
    seq, created_us = database.stamp()
    entry = EntryRow(
        new_entry_id(created_us),
        request.content,
        request.tags,
        created_us,
        request.expires_us,
        tokens,
    )
    row = database.new_row(seq, scope, entry, request.vector)
    if key is not None:
        database.keys[(scope, key)] = KeptKey(request.digest, seq, now_us)
    if request.entry_key is None:
        database.add(row)
        database.record(scope.tenant, scope.key, entry.id, "put", created_us, seq)
        return PutResult(PutOutcome.STORED, entry)
    row.entry_key, row.revision = request.entry_key, latest + 1
    if current is not None:
        # The supersede: the old revision ends at the new one's commit position.
        database.tombstone(current, seq, created_us)
        database.record(scope.tenant, scope.key, current.entry.id, "supersede", created_us, seq)
    database.add(row)
    database.record(scope.tenant, scope.key, entry.id, "put", created_us, seq)
    superseded = None if current is None else current.entry.id
    return PutResult(PutOutcome.STORED, entry, row.revision, superseded)


def _key_head(
    database: Database, scope: Scope, entry_key: str, now_us: int
) -> tuple[int, Row | None]:
    """The key's latest revision number (0: none stored), and its current revision's row
    (``None`` when the latest is deleted or expired at ``now_us``)."""
    revisions = database.revisions.get((scope, entry_key))
    if not revisions:
        return 0, None
    latest = revisions[-1]
    assert latest.revision is not None
    return latest.revision, latest if latest.live(now_us) else None
