"""The service over a real SQLite file, in process, on a clock the test moves: expiry,
replay retention, tombstones and runs as of a time, judged over days without sleeping.

The layer below the wire: ``MemoryService`` as ``open_app`` builds it, on
``SqliteStorage(clock=...)``; the sidecar process, socket and dispatch are other tests'.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from openwop_memory.service.memory import MemoryService, ServiceConfig
from openwop_memory.service.refs import RefCodec
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
from support.on_disk import query

pytestmark = [pytest.mark.backend_independent, pytest.mark.anyio]

HOUR = 3600.0
DAY = 24 * HOUR
RETENTION_DAYS = 7


class Memory:
    """The service, its clock and its database file."""

    def __init__(self, service: MemoryService, clock: ManualClock, path: Path) -> None:
        self.service, self.clock, self.path = service, clock, path

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

    def rows(self) -> int:
        [(count,)] = query(self.path, "SELECT count(*) FROM entries")
        return int(count)


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[Memory]:
    clock = ManualClock()
    path = tmp_path / "memory.db"
    storage = SqliteStorage(str(path), clock=clock)
    await storage.open()
    try:
        config = ServiceConfig(replay_retention_us=RETENTION_DAYS * int(DAY) * 1_000_000)
        service = MemoryService(storage, RefCodec(await storage.ref_key()), config)
        yield Memory(service, clock, path)
    finally:
        await storage.close()


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
    assert memory.rows() == 2
    await memory.sweep()
    assert memory.rows() == 1  # erased, not only hidden


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
    assert memory.rows() == 1
    memory.clock.advance(RETENTION_DAYS * DAY)
    await memory.sweep()
    assert memory.rows() == 0  # no run holds it and the delete is past retention
    with pytest.raises(ReplaySnapshotUnavailableError) as old:
        await memory.begin("too-old", asOf=before)
    assert old.value.details["reason"] == "retention_expired"
