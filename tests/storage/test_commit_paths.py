"""Where SQLite commits run, and that the event loop keeps answering whatever the writes do.

With ``synchronous = NORMAL`` a put commits on the event loop; it goes to the writer thread
when another connection holds the write lock, when commits on the loop turned slow, while a
checkpoint runs, or when commits fsync (FULL). Checkpoints run on a thread of their own.
The storage layer is driven directly on real SQLite files; the writer's
``before_statement`` seam records which thread runs each statement, and makes a commit slow
or holds it (no timing is asserted).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from openwop_memory.storage.base import EntryRow, RunKey, Scope, Snapshot
from openwop_memory.storage.sqlite import writer as sqlite_writer
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.timefmt import now_us
from support.sqlite_store import opened, stored_bytes, wal_bytes, wal_frames
from support.store import fresh_snapshot, put_request, stored

pytestmark = [pytest.mark.sqlite_only, pytest.mark.anyio]

A = Scope("tenant-a", "scope-a")


async def read(store: SqliteStorage, snap: Snapshot, entry: EntryRow) -> EntryRow | None:
    """A get of ``entry`` in ``snap``: answered on the loop (a point read), no write."""
    return await store.get(scope=A, snapshot=snap, now_us=now_us(), entry_id=entry.id)


class Threads:
    """A ``before_statement`` seam noting the thread of each statement, by name."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.also: Callable[[str], None] | None = None

    def __call__(self, name: str) -> None:
        self.seen.append((name, threading.get_ident()))
        if self.also is not None:
            self.also(name)

    def of(self, name: str) -> list[int]:
        return [ident for seen, ident in self.seen if seen == name]


@pytest.fixture
def threads() -> Threads:
    return Threads()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` set by another thread (no event to wait on there)."""
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def test_puts_commit_on_the_loop_and_other_writes_on_the_writer_thread(
    tmp_path: Path, threads: Threads
) -> None:
    loop = threading.get_ident()
    async with opened(tmp_path / "memory.db") as store:
        store._writer.before_statement = threads
        entry = await stored(store, put_request(A, "on the loop"))
        assert threads.of("begin") == [loop]
        threads.seen.clear()
        await store.touch_runs(runs=[RunKey("t", "r1")], now_us=now_us())  # may touch many rows
        assert threads.of("begin") == [store._writer._thread.ident]
        assert await read(store, await fresh_snapshot(store, A.tenant), entry) == entry


async def test_with_synchronous_full_every_commit_is_on_the_writer_thread(
    tmp_path: Path, threads: Threads
) -> None:
    async with opened(tmp_path / "memory.db", synchronous="FULL") as store:
        store._writer.before_statement = threads
        entry = await stored(store, put_request(A, "fsynced"))
        assert threads.of("begin") == [store._writer._thread.ident]
        assert await read(store, await fresh_snapshot(store, A.tenant), entry) == entry


async def test_a_write_lock_held_elsewhere_never_blocks_the_loop(
    tmp_path: Path, threads: Threads
) -> None:
    """Another process's writer holds the lock: the put's batch meets SQLITE_BUSY on the loop
    at once and waits on the writer thread; meanwhile the loop answers reads. Once the lock
    is free, the put commits, exactly once."""
    path = tmp_path / "memory.db"
    loop = threading.get_ident()
    async with opened(path) as store:
        first = await stored(store, put_request(A, "before"))
        snap = await fresh_snapshot(store, A.tenant)
        store._writer.before_statement = threads
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(stored, store, put_request(A, "waited"))
                await until(lambda: store._writer._thread.ident in threads.of("begin"))
                assert threads.of("begin")[0] == loop
                assert await read(store, snap, first) == first
                assert store._writer._pending == [] and store._writer._in_flight
                blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert threads.of("commit") == [store._writer._thread.ident]
        snap = await fresh_snapshot(store, A.tenant)
        rows = await store.list(scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None)
        assert [row.content for row in rows] == ["waited", "before"]


async def test_a_slow_commit_sends_commits_off_the_loop_for_a_while(
    tmp_path: Path, threads: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit on the loop that waits in the kernel (a slow disk; here the seam sleeps)
    sends the next commits to the writer thread: a commit that is slow there too no longer
    holds up reads. After the pause, commits come back to the loop."""
    monkeypatch.setattr(sqlite_writer, "_OFF_LOOP_FIRST_S", 0.2)
    loop = threading.get_ident()
    held = threading.Event()
    release = threading.Event()

    def slow_disk(name: str) -> None:
        if name != "commit":
            return
        if threading.get_ident() == loop:
            release.wait(0.02)  # the loop's commit waits for the "disk"
        else:
            held.set()
            release.wait(10)

    async with opened(tmp_path / "memory.db") as store:
        first = await stored(store, put_request(A, "first"))
        snap = await fresh_snapshot(store, A.tenant)
        threads.also = slow_disk
        store._writer.before_statement = threads
        await stored(store, put_request(A, "slow on the loop"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(stored, store, put_request(A, "slow on the thread"))
            await until(held.is_set)
            assert await read(store, snap, first) == first  # answered while the commit hangs
            release.set()
        assert threads.of("commit") == [loop, store._writer._thread.ident]
        threads.also = None
        threads.seen.clear()
        await anyio.sleep(0.25)
        await stored(store, put_request(A, "back on the loop"))
        assert threads.of("commit") == [loop]


async def test_checkpoints_run_on_their_own_thread_and_restart_the_wal_in_place(
    tmp_path: Path, threads: Threads
) -> None:
    """Past ``checkpoint_bytes`` of WAL a checkpoint runs on neither the loop nor the
    writer thread, and the WAL starts over: the next commit writes from the file's start
    and cuts the file back to ``checkpoint_bytes``, which stays allocated (appending past
    a file's end costs the kernel twice what writing over it does). SQLite's own
    checkpoint (which would run inside a commit on the loop) is off on the writer
    connection."""
    path = tmp_path / "memory.db"
    async with opened(path, checkpoint_bytes=64 << 10) as store:
        writer = store._writer
        assert writer._conn is not None
        assert writer._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        writer.before_statement = threads
        with anyio.fail_after(10):
            while not threads.of("checkpoint"):
                await stored(store, put_request(A, "x" * 2000))
        await until(lambda: not writer._checkpointing)
        [checkpointer] = threads.of("checkpoint")
        assert checkpointer not in (threading.get_ident(), writer._thread.ident)
        assert wal_bytes(path) > 64 << 10
        await stored(store, put_request(A, "after"))
        assert wal_frames(path) <= 10  # one commit's pages
        assert wal_bytes(path) == 64 << 10


async def test_reads_and_writes_go_on_while_a_checkpoint_runs(
    tmp_path: Path, threads: Threads
) -> None:
    """A checkpoint held up (on the disk, say) stalls neither reads nor writes: while it
    runs, puts commit on the writer thread, whose WAL appends cannot stall the loop."""
    path = tmp_path / "memory.db"
    loop = threading.get_ident()
    held = threading.Event()
    release = threading.Event()

    def slow_checkpoint(name: str) -> None:
        if name == "checkpoint":
            held.set()
            release.wait(10)

    async with opened(path, checkpoint_bytes=64 << 10) as store:
        writer = store._writer
        first = await stored(store, put_request(A, "first"))
        snap = await fresh_snapshot(store, A.tenant)
        threads.also = slow_checkpoint
        writer.before_statement = threads
        with anyio.fail_after(10):
            while not held.is_set():
                await stored(store, put_request(A, "x" * 2000))
        threads.seen.clear()
        during = [await stored(store, put_request(A, f"during {n}")) for n in range(3)]
        assert await read(store, snap, first) == first
        assert loop not in threads.of("commit")
        release.set()
        await until(lambda: not writer._checkpointing)
        threads.seen.clear()
        await stored(store, put_request(A, "after"))
        assert threads.of("commit") == [loop]
        assert wal_frames(path) <= 10  # one commit's pages: started over
        snap = await fresh_snapshot(store, A.tenant)
        assert [await read(store, snap, entry) for entry in during] == during


async def test_a_reader_pinning_the_wal_holds_writes_up_only_briefly(tmp_path: Path) -> None:
    """A long read keeps the WAL from being emptied: the checkpoint gives up after a short
    wait instead of holding writers for the busy timeout, tries again only once the WAL has
    grown by another step, and empties it once the reader is gone."""
    path = tmp_path / "memory.db"
    step = 64 << 10
    async with opened(path, checkpoint_bytes=step) as store:
        writer = store._writer
        first = await stored(store, put_request(A, "first"))
        reader = sqlite3.connect(path, isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM entries").fetchall()
            with anyio.fail_after(3):  # each put is answered: none waits the busy timeout
                while writer._checkpoint_at == step:
                    await stored(store, put_request(A, "x" * 2000))
                    await until(lambda: not writer._checkpointing)
            assert wal_bytes(path) >= step  # not emptied
        finally:
            reader.close()
        with anyio.fail_after(10):
            while writer._checkpoint_at != step:
                await stored(store, put_request(A, "x" * 2000))
                await until(lambda: not writer._checkpointing)
        await stored(store, put_request(A, "after"))
        assert wal_frames(path) <= 10  # one commit's pages: started over
        assert await read(store, await fresh_snapshot(store, A.tenant), first) == first


def _nothing(txn: sqlite_writer.Txn) -> None:
    return None


async def _commits_of_two_writes_a_turn_apart(writer: sqlite_writer.GroupCommit) -> int:
    """Commits taken by one write and another started a turn of the loop after it (once
    the first has asked for its commit)."""
    loop = asyncio.get_running_loop()
    before = writer.commits
    first = loop.create_task(writer.write(_nothing, quick=True))
    await asyncio.sleep(0)  # the first write runs: it is waiting, its commit is due
    second = loop.create_task(writer.write(_nothing, quick=True))
    await asyncio.gather(first, second)
    return writer.commits - before


async def test_under_concurrent_writers_a_commit_waits_a_turn_for_more(tmp_path: Path) -> None:
    """After a commit of several writes, the next commit waits one more turn of the loop:
    a write started in that turn joins it. After a commit of one (a lone writer), the next
    commits at once: the write a turn later gets a commit of its own."""
    async with opened(tmp_path / "memory.db") as store:
        writer = store._writer
        await asyncio.gather(*(writer.write(_nothing, quick=True) for _ in range(3)))
        assert await _commits_of_two_writes_a_turn_apart(writer) == 1
        await writer.write(_nothing, quick=True)  # alone
        assert await _commits_of_two_writes_a_turn_apart(writer) == 2


async def test_a_forget_empties_the_wal_a_growth_checkpoint_only_started_over(
    tmp_path: Path, threads: Threads
) -> None:
    """A WAL that starts over is written over from its start, so its file still holds older
    frames: a forget empties it (as an expiry sweep does), and then neither the database
    file nor its WAL holds a byte of the forgotten entry."""
    path = tmp_path / "memory.db"
    marker = "ForgetMeQ7z4k9w2"
    # The marker's frames land past those the commit after the restart writes over, and
    # within the checkpoint_bytes the file is cut back to.
    async with opened(path, checkpoint_bytes=1 << 20) as store:
        for _ in range(3):
            await stored(store, put_request(A, "x" * 2000))
        await stored(store, put_request(A, f"remember {marker}", tags=("subject:s1",)))
        # The marker goes into the full-text and tag indexes now, and only the put below
        # commits after the WAL starts over: no indexing in the background, and no put once
        # the checkpoint is queued (on a busy machine one landed after it, past the count).
        await store.keywords.catch_up.everything()
        store.keywords.catch_up.enabled = False
        await store.keywords.catch_up.close()
        store._writer.before_statement = threads
        with anyio.fail_after(10):
            while not (store._writer._checkpointing or threads.of("checkpoint")):
                await stored(store, put_request(A, "x" * 2000))
        await until(lambda: not store._writer._checkpointing)
        await stored(store, put_request(A, "after"))
        assert wal_frames(path) <= 10  # started over...
        assert marker.encode() in stored_bytes(path)  # ...over the old frames
        assert await store.forget(tenant=A.tenant, tag="subject:s1", batch_size=10) == 1
        assert wal_bytes(path) == 0
        assert marker.encode() not in stored_bytes(path)


async def test_a_cancelled_caller_does_not_undo_its_write(tmp_path: Path) -> None:
    """Cancelling a put's caller cancels its wait, not the write: the batch commits whole."""
    async with opened(tmp_path / "memory.db") as store:
        with anyio.move_on_after(0):
            await stored(store, put_request(A, "cancelled caller"))
        await until(lambda: not store._writer._pending)
        snap = await fresh_snapshot(store, A.tenant)
        rows = await store.list(scope=A, snapshot=snap, now_us=now_us(), limit=10, tag=None)
        assert [row.content for row in rows] == ["cancelled caller"]
