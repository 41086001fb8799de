"""The service in process, on a clock the test moves: expiry, replay retention, snapshot
isolation, tombstones and runs as of a time, judged over days without sleeping.

The layer below the wire: ``MemoryService`` as ``open_app`` builds it, once over a real
SQLite file (``SqliteStorage(clock=...)``) and once over the in-memory backend
(``MemoryStorage(clock=...)``: no file, no writer thread, so a rule spanning days is judged in
milliseconds); the sidecar process, socket and dispatch are other tests'.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from openwop_memory.service.memory import MemoryService, ServiceConfig
from openwop_memory.service.refs import RefCodec
from openwop_memory.storage.base import Storage
from openwop_memory.storage.memory.backend import MemoryStorage
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.timefmt import format_us
from openwop_memory_client import ForbiddenError, ReplaySnapshotUnavailableError
from openwop_memory_client.wire import (
    DeleteParams,
    IssueRefParams,
    ListParams,
    PutParams,
    RunBeginParams,
    RunEndParams,
)
from support.clock import ManualClock

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

HOUR = 3600.0
DAY = 24 * HOUR
RETENTION_DAYS = 7


class Memory:
    """The service, its clock and its store."""

    def __init__(self, service: MemoryService, clock: ManualClock, store: Storage) -> None:
        self.service, self.clock, self.store = service, clock, store

    def ref(self) -> str:
        params = IssueRefParams(tenant="tenant", agent="agent")
        return str(self.service.issue_ref(params)["memoryRef"])

    async def begin(self, run: str, **params: Any) -> dict[str, Any]:
        return await self.service.run_begin(RunBeginParams(runId=run, tenant="tenant", **params))

    async def put(self, run: str, ref: str, content: str, **entry: Any) -> str:
        params = PutParams.model_validate(
            {"runId": run, "memoryRef": ref, "entry": {"content": content, **entry}}
        )
        return str((await self.service.put(params))["id"])

    async def ids(self, run: str, ref: str) -> list[str]:
        listed = await self.service.list(ListParams(runId=run, memoryRef=ref))
        return [e["id"] for e in orjson.loads(orjson.dumps(listed))]

    async def sweep(self) -> None:
        counts = await self.service.sweep(batch_size=100)
        assert counts.errors == []

    async def stored(self, entry_id: str) -> bool:
        """Whether the store still holds the entry at all (deleted, expired or not)."""
        return await self.store.find_entry(entry_id=entry_id) is not None


@pytest.fixture(params=["sqlite", "memory"])
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Memory]:
    clock = ManualClock()
    storage: Storage
    if request.param == "sqlite":
        storage = SqliteStorage(str(tmp_path / "memory.db"), clock=clock)
    else:
        storage = MemoryStorage(f"service-{uuid.uuid4().hex}", clock=clock)
    await storage.open()
    try:
        config = ServiceConfig(replay_retention_us=RETENTION_DAYS * int(DAY) * 1_000_000)
        service = MemoryService(storage, RefCodec(await storage.ref_key()), config)
        yield Memory(service, clock, storage)
    finally:
        await storage.discard()  # made here: the file, or the process's database, goes


async def test_an_entry_expires_at_its_time_and_the_sweep_erases_it(memory: Memory) -> None:
    ref = memory.ref()
    await memory.begin("w")
    expires = format_us(memory.clock.now + int(HOUR * 1_000_000))
    brief = await memory.put("w", ref, "for an hour", expiresAt=expires)
    kept = await memory.put("w", ref, "for good")
    memory.clock.advance(HOUR - 1)
    await memory.begin("before")
    assert await memory.ids("before", ref) == [kept, brief]
    memory.clock.advance(2)
    assert await memory.ids("before", ref) == [kept]  # judged at the call, by the clock
    assert await memory.stored(brief), "hidden, not erased yet"
    await memory.sweep()
    assert not await memory.stored(brief)  # erased, not only hidden
    assert await memory.stored(kept)


async def test_a_run_is_replayable_until_its_retention_passes(memory: Memory) -> None:
    ref = memory.ref()
    await memory.begin("w")
    first = await memory.put("w", ref, "first")
    await memory.begin("old")
    memory.clock.advance((RETENTION_DAYS - 1) * DAY)
    await memory.sweep()  # "old" was touched at its begin, six days ago: still retained
    assert (await memory.begin("old", replay=True))["resumed"] is True
    assert await memory.ids("old", ref) == [first]
    # Ended, the run is no longer kept retained by this process: its last touch counts.
    assert memory.service.run_end(RunEndParams(runId="old")) == {"ended": True}
    memory.clock.advance(RETENTION_DAYS * DAY + 1)
    await memory.sweep()
    with pytest.raises(ReplaySnapshotUnavailableError) as gone:
        await memory.begin("old", replay=True)
    assert gone.value.details["reason"] == "retention_expired"


async def test_a_deleted_entry_stays_for_runs_as_of_before_it_until_retention(
    memory: Memory,
) -> None:
    ref = memory.ref()
    await memory.begin("w")
    doomed = await memory.put("w", ref, "deleted on day one")
    memory.clock.advance(1)  # the put is stamped past the writer's begin: after its time
    before = format_us(memory.clock.now)
    memory.clock.advance(DAY)
    assert await memory.service.delete(DeleteParams(runId="w", memoryRef=ref, id=doomed))
    memory.clock.advance((RETENTION_DAYS - 2) * DAY)
    await memory.sweep()  # no run holds it, yet a run as of before the delete may come
    answer = await memory.begin("as-of", asOf=before)
    assert answer["readOnly"] is True and answer["snapshotAt"] == before
    assert await memory.ids("as-of", ref) == [doomed]
    with pytest.raises(ForbiddenError):
        await memory.put("as-of", ref, "a read-only run writes nothing")
    # The run as of then holds the tombstone while it is retained, as any run does.
    memory.service.run_end(RunEndParams(runId="w"))
    memory.clock.advance(3 * DAY)
    await memory.sweep()
    assert await memory.stored(doomed)
    memory.clock.advance(RETENTION_DAYS * DAY)
    await memory.sweep()
    assert not await memory.stored(doomed)  # no run holds it and the delete is past retention
    with pytest.raises(ReplaySnapshotUnavailableError) as old:
        await memory.begin("too-old", asOf=before)
    assert old.value.details["reason"] == "retention_expired"


async def test_a_snapshot_holds_while_time_passes_then_goes_with_retention(
    memory: Memory,
) -> None:
    """Snapshot isolation over days: a run begun before a write and a delete sees neither,
    on every replay, until its retention has passed without a touch."""
    ref = memory.ref()
    await memory.begin("w")
    first = await memory.put("w", ref, "first")
    memory.clock.advance(1)
    await memory.begin("old")
    memory.clock.advance(DAY)
    later = await memory.put("w", ref, "a day later")
    assert await memory.service.delete(DeleteParams(runId="w", memoryRef=ref, id=first))
    await memory.begin("new")
    assert await memory.ids("new", ref) == [later]
    memory.clock.advance((RETENTION_DAYS - 2) * DAY)
    await memory.sweep()  # "old" is still within its retention: its view stays
    assert (await memory.begin("old", replay=True))["resumed"] is True
    assert await memory.ids("old", ref) == [first]
    assert await memory.stored(first), "the tombstone stays while a snapshot sees it"
    for run in ("old", "new", "w"):
        memory.service.run_end(RunEndParams(runId=run))
    memory.clock.advance(RETENTION_DAYS * DAY + 1)
    await memory.sweep()
    with pytest.raises(ReplaySnapshotUnavailableError) as gone:
        await memory.begin("old", replay=True)
    assert gone.value.details["reason"] == "retention_expired"
    assert not await memory.stored(first), "no snapshot sees it any more: purged"
