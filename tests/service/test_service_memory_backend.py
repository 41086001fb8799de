"""The service on the in-memory backend, in process, on a clock the test moves: what
``tests/service/test_service_clock.py`` does over a SQLite file, here without a file, a writer
thread or a read connection, so a rule spanning days is judged in milliseconds.

``MemoryService`` over ``MemoryStorage(clock=...)``; then one sidecar serving a
``memory://`` database, and the commands that cannot reach one refusing it.
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
from openwop_memory.storage.memory.backend import MemoryStorage
from openwop_memory.timefmt import format_us
from openwop_memory_client import ReplaySnapshotUnavailableError
from openwop_memory_client.wire import (
    DeleteParams,
    IssueRefParams,
    ListParams,
    PutParams,
    RunBeginParams,
    RunEndParams,
)
from support.backends import BACKENDS
from support.clock import ManualClock
from support.protocol import issue, list_all, new_run, put
from support.sidecar import Sidecar, run_cli

pytestmark = pytest.mark.backend_independent

HOUR = 3600.0
DAY = 24 * HOUR
RETENTION_DAYS = 7


class Memory:
    """The service, its clock and its in-memory store."""

    def __init__(self, service: MemoryService, clock: ManualClock, store: MemoryStorage) -> None:
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


@pytest.fixture
async def memory() -> AsyncIterator[Memory]:
    clock = ManualClock()
    store = MemoryStorage(f"service-{uuid.uuid4().hex}", clock=clock)
    await store.open()
    try:
        config = ServiceConfig(replay_retention_us=RETENTION_DAYS * int(DAY) * 1_000_000)
        service = MemoryService(store, RefCodec(await store.ref_key()), config)
        yield Memory(service, clock, store)
    finally:
        await store.discard()  # made here, so forgotten here: the process keeps nothing


@pytest.mark.anyio
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
    assert (await memory.store.gauges()).entries == 1  # live ones only
    await memory.sweep()
    assert not await memory.stored(brief)  # erased, not only hidden
    assert await memory.stored(kept)


@pytest.mark.anyio
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


# -- a sidecar process on memory:// -------------------------------------------------------


def test_a_sidecar_serves_a_memory_database_that_other_commands_cannot_reach(
    workdir: Path,
) -> None:
    backend = BACKENDS["memory"]
    with Sidecar(workdir, backend=backend) as sidecar, sidecar.client() as client:
        health = client.call("sidecar.health")
        assert health["status"] == "ok" and health["storage"]["backend"] == "memory"
        ref = issue(client)
        writer = new_run(client)
        put(client, writer, ref, "held in the sidecar's memory")
        reader = new_run(client)
        assert [e["content"] for e in list_all(client, reader, ref)] == [
            "held in the sidecar's memory"
        ]
        for command in ("export", "import"):
            done = run_cli(
                command,
                str(workdir / "memory.ndjson"),
                "--database",
                backend.url_for(sidecar.database),
            )
            assert done.returncode == 1
            assert "memory:// database lives only in the process that serves it" in done.stderr
        assert not (workdir / "memory.ndjson").exists()
