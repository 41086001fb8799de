"""The storage contract (``storage/base.py``), checked against every backend directly.

Every test runs once per backend in :data:`support.backends.BACKENDS`, on a real database
(SQLite: a file in ``tmp_path``), through the :class:`~openwop_memory.storage.base.Storage`
API only, so a second backend passes exactly when it keeps the same promises. Times are
passed explicitly (µs); only createdAt comes from the store's clock.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from openwop_memory.domain import NotNow, SweepHorizons, new_entry_id
from openwop_memory.retrieval.search import Search
from openwop_memory.storage.base import (
    BeginOutcome,
    EntryRow,
    FileBackup,
    PutOutcome,
    ReadsNow,
    RunKey,
    RunRecord,
    Scope,
    Snapshot,
    Storage,
    StorageHealth,
    StoredEntry,
)
from openwop_memory.timefmt import now_us
from openwop_memory_client import UpstreamUnavailableError, ValidationError
from support.backends import BACKENDS, Backend
from support.on_disk import files_of, query
from support.store import DAY, RETENTION, SECOND, begun, fresh_snapshot, put_request, stored

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

A = Scope("tenant-a", "scope-1")
A2 = Scope("tenant-a", "scope-2")
B = Scope("tenant-b", "scope-1")  # the same key under another tenant


async def ids(
    store: Storage,
    scope: Scope,
    snapshot: Snapshot,
    *,
    now: int | None = None,
    limit: int = 100,
    tag: str | None = None,
) -> list[str]:
    rows = await store.list(
        scope=scope,
        snapshot=snapshot,
        now_us=now_us() if now is None else now,
        limit=limit,
        tag=tag,
    )
    return [r.id for r in rows]


# -- lifecycle --------------------------------------------------------------------------------


async def test_ref_key_is_made_once_per_database(backend: Backend, tmp_path: Path) -> None:
    first = backend.storage(tmp_path / "keys.db")
    await first.open()
    key = await first.ref_key()
    await first.close()
    await first.close()  # idempotent
    again = backend.storage(tmp_path / "keys.db")
    await again.open()
    try:
        assert await again.ref_key() == key
        assert len(key) == 32
    finally:
        await again.close()
    other = backend.storage(tmp_path / "other.db")
    await other.open()
    try:
        assert await other.ref_key() != key
    finally:
        await other.close()


async def test_a_closed_store_fails_only_with_upstream_unavailable(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.storage(tmp_path / "closed.db")
    await store.open()
    await store.close()
    snapshot = Snapshot(0)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.ref_key(),
        lambda: store.begin_run(
            run_id="r", tenant="t", replay=False, now_us=1, retention_cutoff_us=0
        ),
        lambda: store.find_runs(run_id="r", retention_cutoff_us=0),
        lambda: store.touch_runs(runs=[RunKey("t", "r")], now_us=1),
        lambda: store.put(request=put_request(A, "x"), now_us=1),
        lambda: store.delete(scope=A, entry_id="mem_x", now_us=1),
        lambda: store.list(scope=A, snapshot=snapshot, now_us=1, limit=1, tag=None),
        lambda: store.get(scope=A, snapshot=snapshot, now_us=1, entry_id="mem_x"),
        lambda: store.health(),
        lambda: store.page(
            scope=A, snapshot=snapshot, now_us=1, limit=1, tag=None, where=None, before=None
        ),
        lambda: store.count(scope=A, snapshot=snapshot, now_us=1, tag=None, where=None),
        lambda: store.get_key(scope=A, snapshot=snapshot, now_us=1, entry_key="k"),
        lambda: store.key_history(scope=A, now_us=1, entry_key="k", limit=1),
        lambda: store.changes(tenant="t", after=0, limit=1),
    ]
    for call in calls:
        with pytest.raises(UpstreamUnavailableError):
            await call()
    # A sweep of a closed store reports its failed steps instead of raising.
    counts = await store.sweep(horizons=SweepHorizons(1, 0, 0, 0), batch_size=1)
    # Six steps: expired entries, changes, idempotency keys, runs, markers, tombstones.
    assert len(counts.errors) == 6


async def test_health_is_a_content_free_record(store: Storage, backend: Backend) -> None:
    await stored(store, put_request(A, "private content", tags=("private-tag",)))
    health = await store.health()
    assert isinstance(health, StorageHealth)
    assert health.backend == backend.name
    assert health.schema_version >= 1
    assert health.problems == ()  # nothing wrong: status ok
    wire = health.to_wire()
    assert wire["backend"] == backend.name and wire["schemaVersion"] == health.schema_version
    assert wire["problems"] == []
    assert "private" not in repr(wire)


# -- runs -------------------------------------------------------------------------------------


async def test_begin_creates_then_resumes_the_same_snapshot(store: Storage) -> None:
    now = now_us()
    first = await store.begin_run(
        run_id="run-1", tenant="tenant-a", replay=False, now_us=now, retention_cutoff_us=0
    )
    assert first.outcome is BeginOutcome.CREATED and first.run is not None
    assert (first.run.run_id, first.run.tenant) == ("run-1", "tenant-a")
    await stored(store, put_request(A, "after the snapshot"))
    for replay in (False, True):
        again = await store.begin_run(
            run_id="run-1", tenant="tenant-a", replay=replay, now_us=now + 1, retention_cutoff_us=0
        )
        assert again.outcome is BeginOutcome.RESUMED
        assert again.run == first.run  # the snapshot value is handed back unchanged


async def test_the_same_run_id_under_another_tenant_is_another_run(store: Storage) -> None:
    """Run ids are per tenant: B beginning A's run id first neither blocks A nor changes
    A's run, and each tenant resumes its own."""
    t0 = now_us()
    squatted = await begun(store, "run-owned", tenant="tenant-b", now=t0)
    entry = await stored(store, put_request(A, "written after B began"))
    replay = await store.begin_run(
        run_id="run-owned", tenant="tenant-a", replay=True, now_us=t0, retention_cutoff_us=0
    )
    assert replay.outcome is BeginOutcome.UNKNOWN_RUN  # B's run is not A's
    mine = await store.begin_run(
        run_id="run-owned", tenant="tenant-a", replay=False, now_us=t0, retention_cutoff_us=0
    )
    assert mine.outcome is BeginOutcome.CREATED and mine.run is not None
    assert mine.run.tenant == "tenant-a" and await ids(store, A, mine.run.snapshot) == [entry.id]
    assert await begun(store, "run-owned", tenant="tenant-b") == squatted
    assert await begun(store, "run-owned", tenant="tenant-a") == mine.run
    assert await store.find_runs(run_id="run-owned", retention_cutoff_us=0) == [
        mine.run,
        squatted,
    ]


async def test_replay_of_a_run_never_begun_is_unknown_and_writes_nothing(store: Storage) -> None:
    for _ in range(2):
        result = await store.begin_run(
            run_id="ghost", tenant="tenant-a", replay=True, now_us=now_us(), retention_cutoff_us=0
        )
        assert result.outcome is BeginOutcome.UNKNOWN_RUN and result.run is None
    assert await store.find_runs(run_id="ghost", retention_cutoff_us=0) == []


async def test_past_retention_replay_is_refused_and_a_plain_begin_takes_a_new_snapshot(
    store: Storage,
) -> None:
    t0 = now_us()
    old = await begun(store, "run-old", now=t0)
    entry = await stored(store, put_request(A, "between the snapshots"))
    later = t0 + RETENTION + DAY
    # The cutoff is the service's: a run touched at or before it is past retention.
    for cutoff in (t0, t0 + 1):
        result = await store.begin_run(
            run_id="run-old",
            tenant="tenant-a",
            replay=True,
            now_us=later,
            retention_cutoff_us=cutoff,
        )
        assert result.outcome is BeginOutcome.RETENTION_EXPIRED and result.run is None
    assert await store.find_runs(run_id="run-old", retention_cutoff_us=t0) == []
    fresh = await store.begin_run(
        run_id="run-old", tenant="tenant-a", replay=False, now_us=later, retention_cutoff_us=t0
    )
    assert fresh.outcome is BeginOutcome.CREATED and fresh.run is not None
    assert fresh.run.snapshot != old.snapshot
    assert await ids(store, A, old.snapshot) == []
    assert await ids(store, A, fresh.run.snapshot) == [entry.id]
    # The new snapshot was touched at `later`: retained against a cutoff just before it.
    assert await store.find_runs(run_id="run-old", retention_cutoff_us=later - 1) == [fresh.run]


async def test_find_run_honours_the_cutoff(store: Storage) -> None:
    t0 = now_us()
    run = await begun(store, "run-find", now=t0)
    assert await store.find_runs(run_id="run-find", retention_cutoff_us=t0 - 1) == [run]
    assert await store.find_runs(run_id="run-find", retention_cutoff_us=t0) == []
    assert await store.find_runs(run_id="nobody", retention_cutoff_us=0) == []


async def test_touch_runs_keeps_snapshots_retained(store: Storage) -> None:
    t0 = now_us()
    run = await begun(store, "run-touched", now=t0)
    await begun(store, "run-left", now=t0)
    await store.touch_runs(runs=[], now_us=t0 + DAY)  # nothing to do is fine
    await store.touch_runs(
        runs=[RunKey("tenant-a", "run-touched"), RunKey("tenant-a", "never-begun")],
        now_us=t0 + DAY,
    )
    assert await store.find_runs(run_id="run-touched", retention_cutoff_us=t0) == [run]
    assert await store.find_runs(run_id="run-left", retention_cutoff_us=t0) == []
    assert await store.find_runs(run_id="never-begun", retention_cutoff_us=0) == []


async def test_snapshot_time_separates_the_entries_it_holds_from_later_ones(
    store: Storage,
) -> None:
    before = await stored(store, put_request(A, "before"))
    run = await begun(store, "run-time")
    after = await stored(store, put_request(A, "after"))
    assert before.created_us <= run.snapshot_us <= after.created_us


# -- writes and reads -------------------------------------------------------------------------


async def test_put_stores_and_get_reads_back(store: Storage) -> None:
    expires = now_us() + DAY
    entry = await stored(store, put_request(A, "hello", tags=("x", "y"), expires_us=expires))
    assert re.fullmatch(r"mem_[0-9a-f]{33}", entry.id)
    assert int(entry.id[4:17], 16) == entry.created_us
    assert (entry.content, entry.tags, entry.expires_us) == ("hello", ("x", "y"), expires)
    run = await begun(store, "run-read")
    got = await store.get(scope=A, snapshot=run.snapshot, now_us=now_us(), entry_id=entry.id)
    assert got == entry
    for scope in (A2, B):  # another scope of the tenant, the same key under another tenant
        assert (
            await store.get(scope=scope, snapshot=run.snapshot, now_us=now_us(), entry_id=entry.id)
            is None
        )
    assert (
        await store.get(scope=A, snapshot=run.snapshot, now_us=now_us(), entry_id="mem_unknown")
        is None
    )


async def test_created_at_never_goes_backwards_in_commit_order(store: Storage) -> None:
    entries = [await stored(store, put_request(A, f"n{i}")) for i in range(20)]
    async with anyio.create_task_group() as tg:  # and in one group commit
        for i in range(20):
            tg.start_soon(stored, store, put_request(A, f"c{i}"))
    run = await begun(store, "run-order")
    rows = await store.list(scope=A, snapshot=run.snapshot, now_us=now_us(), limit=100, tag=None)
    assert len(rows) == 40 and len({r.id for r in rows}) == 40
    created = [r.created_us for r in reversed(rows)]  # list is newest first
    assert created == sorted(created)
    assert [r.id for r in rows[-20:]] == [e.id for e in reversed(entries)]


async def test_list_is_newest_first_limited_filtered_and_scoped(store: Storage) -> None:
    tagged = [await stored(store, put_request(A, f"t{i}", tags=("keep",))) for i in range(3)]
    plain = await stored(store, put_request(A, "plain", tags=("other",)))
    await stored(store, put_request(A2, "elsewhere", tags=("keep",)))
    await stored(store, put_request(B, "other tenant", tags=("keep",)))
    run = await begun(store, "run-list")
    everything = [plain.id, *(e.id for e in reversed(tagged))]
    assert await ids(store, A, run.snapshot) == everything
    assert await ids(store, A, run.snapshot, limit=2) == everything[:2]
    assert await ids(store, A, run.snapshot, tag="keep") == [e.id for e in reversed(tagged)]
    assert await ids(store, A, run.snapshot, tag="keep", limit=1) == [tagged[-1].id]
    assert await ids(store, A, run.snapshot, tag="absent") == []
    assert len(await ids(store, B, run.snapshot)) == 1


async def test_a_snapshot_sees_neither_later_writes_nor_later_deletes(store: Storage) -> None:
    kept = await stored(store, put_request(A, "kept", tags=("t",)))
    doomed = await stored(store, put_request(A, "doomed", tags=("t",)))
    old = await begun(store, "run-old-view")
    newer = await stored(store, put_request(A, "newer", tags=("t",)))
    assert await store.delete(scope=A, entry_id=doomed.id, now_us=now_us()) is True
    new = await begun(store, "run-new-view")
    for tag in (None, "t"):
        assert await ids(store, A, old.snapshot, tag=tag) == [doomed.id, kept.id]
        assert await ids(store, A, new.snapshot, tag=tag) == [newer.id, kept.id]
    assert (
        await store.get(scope=A, snapshot=old.snapshot, now_us=now_us(), entry_id=newer.id) is None
    )
    assert (
        await store.get(scope=A, snapshot=old.snapshot, now_us=now_us(), entry_id=doomed.id)
        == doomed
    )
    assert (
        await store.get(scope=A, snapshot=new.snapshot, now_us=now_us(), entry_id=doomed.id) is None
    )


async def test_expired_entries_are_invisible_at_the_time_of_the_read(store: Storage) -> None:
    t0 = now_us()
    entry = await stored(store, put_request(A, "short-lived", expires_us=t0 + DAY))
    run = await begun(store, "run-expiry")
    assert await ids(store, A, run.snapshot, now=t0 + DAY - 1) == [entry.id]
    assert await ids(store, A, run.snapshot, now=t0 + DAY) == []
    assert (
        await store.get(scope=A, snapshot=run.snapshot, now_us=t0 + DAY, entry_id=entry.id) is None
    )


async def test_delete_tombstones_a_live_entry_of_its_scope_once(store: Storage) -> None:
    t0 = now_us()
    entry = await stored(store, put_request(A, "to delete"))
    short = await stored(store, put_request(A, "expired", expires_us=t0 + SECOND))
    for scope in (A2, B):
        assert await store.delete(scope=scope, entry_id=entry.id, now_us=t0) is False
    assert await store.delete(scope=A, entry_id="mem_unknown", now_us=t0) is False
    assert await store.delete(scope=A, entry_id=short.id, now_us=t0 + SECOND) is False
    assert await store.delete(scope=A, entry_id=entry.id, now_us=t0) is True
    assert await store.delete(scope=A, entry_id=entry.id, now_us=t0) is False


async def test_idempotency_keys_replay_or_conflict_per_scope(store: Storage) -> None:
    first = await stored(store, put_request(A, "once", key="k1"))
    again = await store.put(request=put_request(A, "once", key="k1"), now_us=now_us())
    assert again.outcome is PutOutcome.REPLAYED and again.entry == first
    clash = await store.put(request=put_request(A, "different", key="k1"), now_us=now_us())
    assert clash.outcome is PutOutcome.KEY_CONFLICT and clash.entry is None
    # The key is the scope's own: another scope's same key stores anew.
    for scope in (A2, B):
        assert (await stored(store, put_request(scope, "different", key="k1"))).id != first.id
    run = await begun(store, "run-keys")
    assert await ids(store, A, run.snapshot) == [first.id]  # the conflict wrote nothing


async def test_one_key_in_one_group_commit_stores_once(store: Storage) -> None:
    outcomes: list[PutOutcome] = []
    entries: set[str] = set()

    async def put_once() -> None:
        result = await store.put(request=put_request(A, "raced", key="same"), now_us=now_us())
        outcomes.append(result.outcome)
        assert result.entry is not None
        entries.add(result.entry.id)

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(put_once)
    assert sorted(o.value for o in outcomes) == ["replayed"] * 7 + ["stored"]
    assert len(entries) == 1


async def test_a_kept_key_pins_its_deleted_entry_through_the_sweep(store: Storage) -> None:
    t0 = now_us()
    req = put_request(A, "pinned", key="pin")
    entry = await stored(store, req, now=t0)
    assert await store.delete(scope=A, entry_id=entry.id, now_us=t0) is True
    # Past the delete's replay retention: only the key holds the tombstone.
    past = now_us() + DAY
    horizons = SweepHorizons(
        now_us=t0 + DAY, run_cutoff_us=past, marker_cutoff_us=0, key_cutoff_us=t0 - 1
    )
    counts = await store.sweep(horizons=horizons, batch_size=10)
    assert counts.errors == [] and counts.purged_idempotency_keys == 0
    assert counts.purged_tombstones == 0
    replay = await store.put(request=req, now_us=t0 + DAY)
    assert replay.outcome is PutOutcome.REPLAYED and replay.entry == entry
    # Once the key goes, so may the tombstone, and the same put stores anew.
    counts = await store.sweep(
        horizons=SweepHorizons(t0 + DAY, past, 0, key_cutoff_us=t0), batch_size=10
    )
    assert counts.purged_idempotency_keys == 1
    assert counts.purged_tombstones == 1
    assert (await stored(store, req, now=t0 + DAY)).id != entry.id


# -- sweep ------------------------------------------------------------------------------------


async def test_sweep_removes_expired_entries_in_batches(store: Storage) -> None:
    t0 = now_us()
    for i in range(5):
        await stored(store, put_request(A, f"e{i}", expires_us=t0 + SECOND))
    live = await stored(store, put_request(A, "live"))
    counts = await store.sweep(horizons=SweepHorizons(t0 + SECOND, 0, 0, 0), batch_size=2)
    assert counts.expired_entries == 5 and counts.errors == []
    run = await begun(store, "run-after-sweep")
    assert await ids(store, A, run.snapshot, now=t0) == [live.id]  # gone, not only hidden
    counts = await store.sweep(horizons=SweepHorizons(t0 + SECOND, 0, 0, 0), batch_size=2)
    assert counts.expired_entries == 0


async def test_sweep_expires_runs_then_purges_their_markers(store: Storage) -> None:
    t0 = now_us()
    await begun(store, "run-swept", now=t0)
    kept = await begun(store, "run-kept", now=t0 + DAY)
    counts = await store.sweep(horizons=SweepHorizons(t0 + DAY, t0, t0 - 1, 0), batch_size=1)
    assert (counts.expired_runs, counts.purged_runs) == (1, 0)
    assert await store.find_runs(run_id="run-swept", retention_cutoff_us=0) == []
    assert await store.find_runs(run_id="run-kept", retention_cutoff_us=0) == [kept]
    # The marker remembers the run: a replay is told its snapshot expired.
    replay = await store.begin_run(
        run_id="run-swept", tenant="tenant-a", replay=True, now_us=t0 + DAY, retention_cutoff_us=0
    )
    assert replay.outcome is BeginOutcome.RETENTION_EXPIRED
    # A marker is the tenant's own: another tenant's run of the id is another run.
    other = await store.begin_run(
        run_id="run-swept", tenant="tenant-b", replay=True, now_us=t0 + DAY, retention_cutoff_us=0
    )
    assert other.outcome is BeginOutcome.UNKNOWN_RUN
    counts = await store.sweep(horizons=SweepHorizons(t0 + DAY, t0, t0, 0), batch_size=1)
    assert (counts.expired_runs, counts.purged_runs) == (0, 1)
    replay = await store.begin_run(
        run_id="run-swept", tenant="tenant-a", replay=True, now_us=t0 + DAY, retention_cutoff_us=0
    )
    assert replay.outcome is BeginOutcome.UNKNOWN_RUN
    assert await store.find_runs(run_id="run-kept", retention_cutoff_us=0) == [kept]


async def test_sweep_purges_a_tombstone_only_once_no_retained_snapshot_sees_it(
    store: Storage,
) -> None:
    t0 = now_us()
    entry = await stored(store, put_request(A, "deleted later"))
    old = await begun(store, "run-holding", now=t0)
    assert await store.delete(scope=A, entry_id=entry.id, now_us=t0) is True
    none_expire = SweepHorizons(t0, run_cutoff_us=0, marker_cutoff_us=0, key_cutoff_us=0)
    counts = await store.sweep(horizons=none_expire, batch_size=10)
    assert counts.purged_tombstones == 0
    assert await ids(store, A, old.snapshot) == [entry.id]  # still visible to that run
    # Once the run holding the older snapshot is past retention, and so is the delete,
    # the tombstone can go.
    cutoff = now_us() + SECOND
    counts = await store.sweep(
        horizons=SweepHorizons(t0 + DAY, cutoff, marker_cutoff_us=0, key_cutoff_us=0),
        batch_size=10,
    )
    assert counts.expired_runs == 1 and counts.purged_tombstones == 1
    assert await ids(store, A, old.snapshot) == []


async def test_sweep_keeps_a_tombstone_for_the_retention_after_its_delete(
    store: Storage,
) -> None:
    """No run holds the deleted entry, yet a run as of a time before the delete must still
    see it, so the tombstone stays until the delete is past the replay retention."""
    entry = await stored(store, put_request(A, "deleted, no run holding it"))
    before = now_us()
    await anyio.sleep(0.002)
    assert await store.delete(scope=A, entry_id=entry.id, now_us=now_us()) is True
    counts = await store.sweep(horizons=SweepHorizons(now_us(), before, 0, 0), batch_size=10)
    assert counts.purged_tombstones == 0
    as_of = await store.begin_run(
        run_id="as-of-before-delete",
        tenant="tenant-a",
        replay=False,
        now_us=now_us(),
        retention_cutoff_us=0,
        as_of_us=before,
    )
    assert as_of.outcome is BeginOutcome.CREATED and as_of.run is not None
    assert await ids(store, A, as_of.run.snapshot) == [entry.id]
    later = now_us() + SECOND
    counts = await store.sweep(horizons=SweepHorizons(later, later, 0, 0), batch_size=10)
    assert counts.purged_tombstones == 1


async def test_clock_is_now(store: Storage) -> None:
    """``clock_us`` is the store's now: here, where the database runs on this host, within a
    second of this host's clock; and it does not go backwards."""
    first = store.clock_us()
    assert abs(first - now_us()) < SECOND
    assert store.clock_us() >= first


# The backends whose get_now reads without waiting (the service's fast memory.get path):
# for them the contract is that it answers every read below, not merely that it may.
# The in-memory backend never waits for anything.
ANSWERS_AT_ONCE = frozenset({"sqlite", "memory"})
# The backends that count their commits and their live entries and scopes exactly (no
# planner estimate): SQLite, and the in-memory backend, which keeps the counts as it writes.
COUNTS_EXACTLY = frozenset({"sqlite", "memory"})


async def test_get_now_answers_as_get_does_or_not_now(store: Storage, backend: Backend) -> None:
    """A backend may decline to read without waiting; when it answers, the answer is get's,
    snapshot, scope, deletion and expiry included. SQLite's always answers."""
    kept = await stored(store, put_request(A, "kept"))
    doomed = await stored(store, put_request(A, "doomed"))
    short = await stored(store, put_request(A, "short", expires_us=now_us() + DAY))
    old = await begun(store, "run-now-old")
    newer = await stored(store, put_request(A, "newer"))
    assert await store.delete(scope=A, entry_id=doomed.id, now_us=now_us()) is True
    new = await begun(store, "run-now-new")
    answered = 0
    for run in (old, new):
        for scope in (A, A2, B):
            for entry_id in (kept.id, doomed.id, short.id, newer.id, "mem_unknown"):
                for at in (now_us(), now_us() + 2 * DAY):
                    if not isinstance(store, ReadsNow):
                        continue
                    now = store.get_now(
                        scope=scope, snapshot=run.snapshot, now_us=at, entry_id=entry_id
                    )
                    if isinstance(now, NotNow):
                        continue
                    answered += 1
                    assert now == await store.get(
                        scope=scope, snapshot=run.snapshot, now_us=at, entry_id=entry_id
                    )
    expected = 2 * 3 * 5 * 2 if backend.name in ANSWERS_AT_ONCE else 0
    assert answered == expected, "a backend answers every such read or none"


async def test_gauges_report_sizes_and_commits(store: Storage, backend: Backend) -> None:
    for i in range(3):
        await stored(store, put_request(A, f"gauged {i}"))
    gauges = await store.gauges()
    assert gauges.database_bytes is not None and gauges.database_bytes > 0
    if backend.name == "sqlite":
        assert gauges.wal_bytes is not None
    if backend.name in COUNTS_EXACTLY:
        assert gauges.commits is not None and gauges.commits >= 1
        assert gauges.committed_writes is not None and gauges.committed_writes >= 3


async def test_gauges_count_live_entries_and_scopes_exactly(
    store: Storage, backend: Backend
) -> None:
    """Exact counts where the backend has them (SQLite, memory): a deleted entry and an
    expired one are not live, though their rows are still stored; PostgreSQL says it
    estimates."""
    t0 = now_us()
    for i in range(5):
        await stored(store, put_request(A, f"a{i}"))
    for i in range(2):
        await stored(store, put_request(A2, f"a2 {i}"))
    gone = await stored(store, put_request(B, "b deleted"))
    await stored(store, put_request(B, "b expires", expires_us=t0 + SECOND // 2))
    assert await store.delete(scope=B, entry_id=gone.id, now_us=now_us()) is True
    await anyio.sleep(max(t0 + SECOND // 2 - now_us(), 0) / 1e6 + 0.05)
    gauges = await store.gauges()
    if backend.name in COUNTS_EXACTLY:
        assert (gauges.entries, gauges.scopes) == (7, 3)
        assert (gauges.entries_estimate, gauges.scopes_estimate) == (None, None)
    else:
        assert (gauges.entries, gauges.scopes) == (None, None)


async def test_the_operators_reads_cross_tenants_and_see_tombstones(store: Storage) -> None:
    kept = await stored(store, put_request(A, "kept"))
    gone = await stored(store, put_request(A, "gone"))
    other = await stored(store, put_request(B, "other tenant"))
    await stored(store, put_request(A2, "expired", expires_us=now_us() + SECOND))
    assert await store.delete(scope=A, entry_id=gone.id, now_us=now_us()) is True
    await begun(store, "run-ops-a")
    await begun(store, "run-ops-b", tenant="tenant-b")
    runs = await store.list_runs(limit=10)
    assert [r.run_id for r in runs] == ["run-ops-b", "run-ops-a"], "latest touched first"
    assert runs[0].tenant == "tenant-b" and all(r.retained for r in runs)
    assert len(await store.list_runs(limit=1)) == 1
    later = now_us() + 2 * SECOND
    scopes = {
        i.scope: i.live_entries for i in await store.list_scopes(tenant="tenant-a", now_us=later)
    }
    assert scopes == {A: 1, A2: 0}
    found = await store.find_entry(entry_id=other.id)
    assert found is not None and (found.scope, found.entry, found.deleted) == (B, other, False)
    tomb = await store.find_entry(entry_id=gone.id)
    assert tomb is not None and tomb.deleted and tomb.entry == gone
    assert (await store.find_entry(entry_id=kept.id)) is not None
    assert await store.find_entry(entry_id="mem_none") is None


async def test_backup_copies_or_says_what_to_use(
    store: Storage, backend: Backend, tmp_path: Path
) -> None:
    entry = await stored(store, put_request(A, "backed up"))
    target = tmp_path / "copy.db"
    if not isinstance(store, FileBackup):
        # PostgreSQL: the admin's backup says what to use instead; memory: no file at all.
        assert backend.name in ("postgresql", "memory")
        return
    size = await store.backup(path=str(target))
    assert size == target.stat().st_size > 0
    with pytest.raises(ValidationError):
        await store.backup(path=str(target))  # never over an existing file
    import sqlite3

    with sqlite3.connect(target) as copy:
        assert copy.execute("SELECT content FROM entries WHERE id = ?", (entry.id,)).fetchone() == (
            "backed up",
        )


async def test_forget_purges_a_tenants_subject_everywhere_snapshots_included(
    store: Storage, backend: Backend, tmp_path: Path
) -> None:
    subject = ("subject:s1",)
    plain = await stored(store, put_request(A, "forgettable walrus zyzzyva", tags=subject))
    other_scope = await stored(store, put_request(A2, "forgettable walrus", tags=("x", *subject)))
    pinned = await stored(store, put_request(A, "pinned walrus", tags=subject, key="k1"))
    other_subject = await stored(store, put_request(A, "kept walrus", tags=("subject:s2",)))
    other_tenant = await stored(store, put_request(B, "kept walrus", tags=subject))
    tomb = await stored(store, put_request(A, "tombstoned walrus", tags=subject))
    old = await begun(store, "run-before-forget")  # it sees the tombstone
    assert await store.delete(scope=A, entry_id=tomb.id, now_us=now_us())
    assert tomb.id in await ids(store, A, old.snapshot), "an older snapshot sees the tombstone"
    forgotten = [plain, other_scope, pinned, tomb]

    assert await store.forget(tenant="tenant-a", tag="subject:s1", batch_size=2) == 4
    now = now_us()
    assert await ids(store, A, old.snapshot) == [other_subject.id], "older snapshots too"
    assert await ids(store, A2, old.snapshot) == []
    assert await ids(store, B, old.snapshot) == [other_tenant.id], "another tenant's: kept"
    for entry in forgotten:
        assert await store.find_entry(entry_id=entry.id) is None
    found = await Search(store).search(
        scope=A, snapshot=old.snapshot, now_us=now, terms=["walrus"], limit=10, tag=None
    )
    assert [r.id for r in found] == [other_subject.id], "the full-text index forgot them"
    # The key that pinned a forgotten entry went with it: the same put stores anew.
    again = await store.put(
        request=put_request(A, "pinned walrus", tags=subject, key="k1"), now_us=now
    )
    assert again.outcome is PutOutcome.STORED and again.entry is not None
    assert again.entry.id != pinned.id
    assert await store.forget(tenant="tenant-a", tag="subject:nobody", batch_size=2) == 0
    assert await store.forget(tenant="tenant-b", tag="subject:s1", batch_size=500) == 1
    # What is left of them on disk: SQLite's file only (the in-memory backend has none, and
    # a forgotten row's index terms are an attribute of the row object that went).
    if backend.name == "sqlite":
        # A search indexes what its snapshot holds first (the put did not): then the index
        # holds every entry, the one put after the forget included.
        latest = await fresh_snapshot(store, "tenant-a")
        await Search(store).search(
            scope=A, snapshot=latest, now_us=now, terms=["walrus"], limit=1, tag=None
        )
        path = tmp_path / "store.db"  # the store fixture's file
        indexed = query(path, "SELECT rowid FROM entries_fts WHERE entries_fts MATCH 'walrus'")
        kept = query(
            path, "SELECT seq FROM entries WHERE id IN (?, ?)", (other_subject.id, again.entry.id)
        )
        assert sorted(indexed) == sorted(kept), "no index row outlives its entry"
        await store.close()  # checkpointed: the file alone holds the data
        on_disk = b"".join(files_of(tmp_path).values())
        assert b"zyzzyva" not in on_disk, "neither its text nor its index terms stay on disk"
        assert b"kept walrus" in on_disk


async def exported(store: Storage, now: int, batch_size: int = 2) -> list[StoredEntry]:
    batches = store.export_entries(now_us=now, batch_size=batch_size)
    return [item async for batch in batches for item in batch]


async def test_export_then_import_into_fresh_databases_round_trips_every_live_entry(
    store: Storage, backend: Backend, tmp_path: Path
) -> None:
    now = now_us()
    live = [
        StoredEntry(A, await stored(store, put_request(A, "one", tags=("a", "b")))),
        StoredEntry(A2, await stored(store, put_request(A2, "two\x00 with NUL"))),
        StoredEntry(B, await stored(store, put_request(B, "three", expires_us=now + DAY))),
        StoredEntry(A, await stored(store, put_request(A, "four", key="k"))),
    ]
    gone = await stored(store, put_request(A, "deleted"))
    assert await store.delete(scope=A, entry_id=gone.id, now_us=now)
    await stored(store, put_request(A, "expired", expires_us=now + SECOND))
    later = now + 2 * SECOND
    source = await exported(store, later)
    assert sorted(source, key=lambda e: e.entry.id) == sorted(live, key=lambda e: e.entry.id)
    key = await store.ref_key()
    for target in BACKENDS.values():  # SQLite and PostgreSQL, either way round
        fresh = target.storage(tmp_path / f"fresh-{target.name}.db")
        await fresh.open()
        try:
            assert await fresh.adopt_ref_key(key=key) is True
            assert await fresh.ref_key() == key
            assert await fresh.import_entries(entries=source[:3]) == 3
            assert await fresh.import_entries(entries=source) == 1, "ids already there: skipped"
            again = await exported(fresh, later, batch_size=100)
            assert sorted(again, key=lambda e: e.entry.id) == sorted(
                source, key=lambda e: e.entry.id
            ), target.name
            snapshot = await fresh_snapshot(fresh, "tenant-a", later)
            for scope in (A, A2):
                assert await ids(fresh, scope, snapshot, now=later) == await ids(
                    store, scope, await fresh_snapshot(store, "tenant-a", later), now=later
                )
            found = await Search(fresh).search(
                scope=A, snapshot=snapshot, now_us=later, terms=["four"], limit=5, tag=None
            )
            assert [r.content for r in found] == ["four"], "imported entries are indexed"
            newer = await stored(fresh, put_request(A, "after the import"))
            assert newer.created_us >= max(e.entry.created_us for e in source)
        finally:
            await fresh.close()
    # A database holding memory under its own key keeps it.
    other = backend.storage(tmp_path / "other.db")
    await other.open()
    try:
        await stored(other, put_request(A, "its own"))
        own = await other.ref_key()
        assert await other.adopt_ref_key(key=key) is False
        assert await other.ref_key() == own
    finally:
        await other.close()


async def test_a_kept_key_of_an_expired_entry_is_refused(store: Storage) -> None:
    """The key outlives its expired entry, which the sweep erases all the same: the same
    entry is refused (KEY_EXPIRED) before the sweep and after it, another is a conflict,
    and nothing is stored again until the key itself is past retention."""
    t0 = now_us()
    req = put_request(A, "gone soon", expires_us=t0 + SECOND, key="k")
    entry = await stored(store, req, now=t0)
    assert (await store.put(request=req, now_us=t0 + 1)).outcome is PutOutcome.REPLAYED
    later = t0 + SECOND
    assert (await store.put(request=req, now_us=later)).outcome is PutOutcome.KEY_EXPIRED
    horizons = SweepHorizons(later, 0, 0, key_cutoff_us=t0 - 1)
    counts = await store.sweep(horizons=horizons, batch_size=10)
    assert counts.errors == [], counts
    assert counts.expired_entries == 1 and counts.purged_idempotency_keys == 0, counts
    assert await store.find_entry(entry_id=entry.id) is None
    assert (await store.put(request=req, now_us=later)).outcome is PutOutcome.KEY_EXPIRED
    other = put_request(A, "another", key="k")
    assert (await store.put(request=other, now_us=later)).outcome is PutOutcome.KEY_CONFLICT
    counts = await store.sweep(horizons=SweepHorizons(later, 0, 0, key_cutoff_us=t0), batch_size=10)
    assert counts.purged_idempotency_keys == 1
    assert (await store.put(request=other, now_us=later)).outcome is PutOutcome.STORED


# -- runs as of a time ------------------------------------------------------------------------


async def as_of_run(
    store: Storage, run_id: str, as_of: int, tenant: str = "tenant-a"
) -> RunRecord | BeginOutcome:
    """``begin_run`` of a read-only run as of ``as_of``: its outcome, or its record."""
    result = await store.begin_run(
        run_id=run_id,
        tenant=tenant,
        replay=False,
        now_us=now_us(),
        retention_cutoff_us=now_us() - RETENTION,
        as_of_us=as_of,
    )
    if result.outcome is BeginOutcome.CREATED:
        assert result.run is not None
        return result.run
    return result.outcome


async def test_a_run_as_of_a_time_sees_what_a_run_begun_then_saw(store: Storage) -> None:
    """Puts, keyed supersedes and deletes, with runs begun between them (some in the same
    group commit as writes): a read-only run as of each run's snapshotAt sees exactly its
    entries; so does one as of any time between two runs, which sees what the earlier saw."""
    live: list[str] = []
    runs: list[RunRecord] = []
    n = 0

    async def write(i: int) -> None:
        if i % 5 == 3 and live:
            assert await store.delete(scope=A, entry_id=live.pop(0), now_us=now_us())
        else:
            key = "k" if i % 4 == 1 else None
            request = dataclasses.replace(put_request(A, f"entry {i}"), entry_key=key)
            result = await store.put(request=request, now_us=now_us())
            assert result.entry is not None
            if result.superseded in live:
                live.remove(result.superseded)
            live.append(result.entry.id)

    for step in range(12):
        async with anyio.create_task_group() as tg:  # writes and a begin in one group
            for i in range(3):
                tg.start_soon(write, n + i)
            n += 3
            tg.start_soon(_begin_into, runs, store, f"at-{step}")
    times = sorted(r.snapshot_us for r in runs)
    assert len(set(times)) == len(times)  # each snapshot has a time of its own
    for number, run in enumerate(runs):
        seen = await ids(store, A, run.snapshot)
        again = await as_of_run(store, f"as-of-{number}", run.snapshot_us)
        assert not isinstance(again, BeginOutcome), again
        assert again.snapshot_us == run.snapshot_us and again.as_of_us == run.snapshot_us
        assert await ids(store, A, again.snapshot) == seen, number
        between = await as_of_run(store, f"between-{number}", run.snapshot_us + 1)
        later = [t for t in times if t > run.snapshot_us]
        if not isinstance(between, BeginOutcome) and (not later or later[0] > run.snapshot_us + 1):
            assert await ids(store, A, between.snapshot) == seen, number


async def _begin_into(runs: list[RunRecord], store: Storage, run_id: str) -> None:
    runs.append(await begun(store, run_id))


async def test_a_run_as_of_a_time_resumes_and_refuses_what_it_cannot_be(store: Storage) -> None:
    await stored(store, put_request(A, "before"))
    t = now_us()
    await anyio.sleep(0.002)
    await stored(store, put_request(A, "after"))
    first = await as_of_run(store, "as-of", t)
    assert not isinstance(first, BeginOutcome)
    again = await store.begin_run(
        run_id="as-of",
        tenant="tenant-a",
        replay=True,
        now_us=now_us(),
        retention_cutoff_us=0,
        as_of_us=t,
    )
    assert again.outcome is BeginOutcome.RESUMED and again.run == first
    # The same id as of another time, or begun to write: another run, refused.
    assert await as_of_run(store, "as-of", t - 1) is BeginOutcome.AS_OF_MISMATCH
    writing = await store.begin_run(
        run_id="as-of", tenant="tenant-a", replay=False, now_us=now_us(), retention_cutoff_us=0
    )
    assert writing.outcome is BeginOutcome.AS_OF_MISMATCH
    await begun(store, "writer")
    assert await as_of_run(store, "writer", t) is BeginOutcome.AS_OF_MISMATCH
    # Before the store's history began (here: its creation), nothing is exact.
    assert await as_of_run(store, "ancient", 0) is BeginOutcome.AS_OF_UNAVAILABLE
    # Later than the store's clock: the future is not a snapshot.
    assert await as_of_run(store, "future", now_us() + DAY) is BeginOutcome.AS_OF_FUTURE
    # Another tenant's run as of the same time sees its own (empty) memory.
    other = await as_of_run(store, "as-of", t, tenant="tenant-b")
    assert not isinstance(other, BeginOutcome)
    assert await ids(store, B, other.snapshot) == []


async def test_an_import_is_in_the_history_of_runs_as_of_a_time(store: Storage) -> None:
    """An imported row keeps its createdAt, and its change record is at the import's time:
    a run as of a time before the import does not see it, one after it does, and the
    feed tells of it."""
    await stored(store, put_request(A, "before the import"))
    before = now_us()
    await anyio.sleep(0.002)
    imported = EntryRow(new_entry_id(before - SECOND), "imported", (), before - SECOND, None, 0)
    assert await store.import_entries(entries=[StoredEntry(A, imported)]) == 1
    earlier = await as_of_run(store, "before-import", before)
    assert not isinstance(earlier, BeginOutcome)
    assert imported.id not in await ids(store, A, earlier.snapshot)
    assert [c.entry_id for c in await store.changes(tenant="tenant-a", after=0, limit=10)][
        -1
    ] == imported.id
    await anyio.sleep(0.002)
    after = await as_of_run(store, "after-import", now_us())
    assert not isinstance(after, BeginOutcome)
    assert imported.id in await ids(store, A, after.snapshot)
