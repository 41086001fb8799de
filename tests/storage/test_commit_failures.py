"""A failed commit leaves no trace: no entry moves across tenants, no batch-mate fails with it,
and health says what is wrong until writes work again.

The storage layer is driven directly, on real SQLite files: ``PRAGMA max_page_count`` gives a
real ``SQLITE_FULL``, and the writer's ``before_statement`` seam fails a group commit at any
chosen statement. One test fills a real (tmpfs) file system under a running sidecar.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from openwop_memory.storage.base import EntryRow, PutOutcome, Scope
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.storage.sqlite.writer import Txn
from openwop_memory_client import UpstreamUnavailableError
from support.protocol import new_run, put
from support.sidecar import Sidecar
from support.sqlite_store import opened, wal_bytes, wal_frames
from support.store import contents, put_request, stored

pytestmark = [pytest.mark.sqlite_only, pytest.mark.anyio]

A = Scope("tenant-a", "scope-a")
B = Scope("tenant-b", "scope-b")
NOW = 1_800_000_000_000_000
# Every statement a put runs ("tags" is an import's: a put's tags are indexed after it).
STATEMENTS = ("begin", "clock", "op", "entries", "keys", "commit")
TAGS = ("t1", "t2")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStorage]:
    async with opened(tmp_path / "memory.db") as s:
        yield s


def fail_once_at(statement: str) -> Callable[[str], None]:
    """A ``before_statement`` seam that fails the first ``statement`` it sees, as a
    database would."""
    fired = False

    def fault(name: str) -> None:
        nonlocal fired
        if name == statement and not fired:
            fired = True
            raise sqlite3.OperationalError("disk I/O error")

    return fault


async def set_max_page_count(store: SqliteStorage, pages: int | None) -> None:
    """Cap the writer's database size at ``pages`` (its current size if ``None``)."""

    def apply(txn: Txn) -> None:
        count = txn.conn.execute("PRAGMA page_count").fetchone()[0]
        txn.conn.execute(f"PRAGMA max_page_count = {pages or count}")

    await store._writer.write(apply)


async def test_rolled_back_scope_id_never_moves_an_entry_to_another_tenant(
    tmp_path: Path,
) -> None:
    """Issue 7, finding 1. Disk full: tenant A's first put to a new scope fails; space
    returns; tenant B writes its first entry to a new scope; A retries. Before the fix, the
    rolled-back scope id stayed cached and SQLite gave it to B's scope, so A's retry was
    answered normally and landed in B's scope, listed by B's runs, and stayed there after
    a restart."""
    path = tmp_path / "memory.db"
    async with opened(path) as store:
        await set_max_page_count(store, None)  # the next page the database needs: SQLITE_FULL
        with pytest.raises(UpstreamUnavailableError) as failed:
            await stored(store, put_request(A, "a" * 20_000, tags=TAGS), NOW)
        assert failed.value.details["reason"] == "SQLITE_FULL"
        await set_max_page_count(store, 1 << 30)
        await stored(store, put_request(B, "b's entry", tags=TAGS), NOW)
        await stored(store, put_request(A, "a's retry", tags=TAGS), NOW)
        assert await contents(store, A, NOW) == ["a's retry"]
        assert await contents(store, B, NOW) == ["b's entry"]
    async with opened(path) as store:
        assert await contents(store, A, NOW) == ["a's retry"]
        assert await contents(store, B, NOW) == ["b's entry"]


@pytest.mark.parametrize("statement", STATEMENTS)
async def test_a_commit_failing_at_any_statement_leaves_no_trace(
    tmp_path: Path, statement: str
) -> None:
    """A group commit that fails at ``statement`` fails its callers, writes nothing, and
    leaves later puts of the same and other tenants where they belong, also after a
    restart."""
    path = tmp_path / "memory.db"
    async with opened(path) as store:
        store._writer.before_statement = fail_once_at(statement)
        with pytest.raises(UpstreamUnavailableError):
            await stored(store, put_request(A, "first", key="k1", tags=TAGS), NOW)
        store._writer.before_statement = None
        assert await contents(store, A, NOW) == []
        await stored(store, put_request(B, "b", tags=TAGS), NOW)
        again = await stored(store, put_request(A, "first", key="k1", tags=TAGS), NOW)
        replayed = await store.put(request=put_request(A, "first", key="k1", tags=TAGS), now_us=NOW)
        # The key was not half-written by the failed commit:
        assert (replayed.outcome, replayed.entry) == (PutOutcome.REPLAYED, again)
        assert await contents(store, A, NOW) == ["first"]
        assert await contents(store, B, NOW) == ["b"]
    async with opened(path) as store:
        assert await contents(store, A, NOW) == ["first"]
        assert await contents(store, B, NOW) == ["b"]
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_one_failing_op_does_not_fail_its_group(store: SqliteStorage) -> None:
    """Issue 7, finding 1's variant: one op that cannot commit used to fail every put
    sharing its group commit (198 of 200 other tenants' puts, until restart). Now each op
    of a failed group is retried alone, and only the failing one gets the error."""

    def poisoned(txn: Txn) -> None:
        txn.conn.execute("INSERT INTO entries (seq) VALUES (NULL)")  # NOT NULL violated

    scopes = [Scope(f"tenant-{n}", "s") for n in range(20)]
    results: dict[str, EntryRow | BaseException] = {}

    async def one(scope: Scope) -> None:
        try:
            results[scope.tenant] = await stored(
                store, put_request(scope, scope.tenant, tags=TAGS), NOW
            )
        except UpstreamUnavailableError as exc:
            results[scope.tenant] = exc

    async def poison() -> None:
        try:
            await store._writer.write(poisoned)
        except UpstreamUnavailableError as exc:
            results["poison"] = exc

    # A commit in flight holds the writer, so the poison and the puts queue behind it and
    # go into the next group commit together.
    release = threading.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store._writer.write, lambda txn: release.wait(10))
        await anyio.sleep(0.05)
        tg.start_soon(poison)
        for scope in scopes:
            tg.start_soon(one, scope)
        await anyio.sleep(0.05)
        assert len(store._writer._pending) == 21
        release.set()
    assert isinstance(results.pop("poison"), UpstreamUnavailableError)
    assert all(isinstance(r, EntryRow) for r in results.values()), results
    for scope in scopes:
        assert await contents(store, scope, NOW) == [scope.tenant]


async def test_scope_cache_is_bounded(tmp_path: Path) -> None:
    """The scope-id cache never grows past its size, and scopes it dropped still resolve to
    their own entries."""
    async with opened(tmp_path / "memory.db", scope_cache_size=3) as store:
        scopes = [Scope(f"tenant-{n}", "s") for n in range(10)]
        for scope in scopes:
            await stored(store, put_request(scope, f"one {scope.tenant}", tags=TAGS), NOW)
        assert len(store._scope_pks) == 3
        for scope in scopes:
            await stored(store, put_request(scope, f"two {scope.tenant}", tags=TAGS), NOW)
            assert len(store._scope_pks) <= 3
        for scope in scopes:
            assert await contents(store, scope, NOW) == [
                f"two {scope.tenant}",
                f"one {scope.tenant}",
            ]


async def test_health_reports_failing_writes_and_recovers(store: SqliteStorage) -> None:
    """Issue 7, finding 5: health said ok while every write failed. Now it lists
    ``writes_failing`` (with the reason) and turns ok by itself once a write can commit."""
    assert (await store.health()).problems == ()

    def always(name: str) -> None:
        if name == "commit":
            raise sqlite3.OperationalError("database or disk is full")

    store._writer.before_statement = always
    with pytest.raises(UpstreamUnavailableError):
        await stored(store, put_request(A, "x", tags=TAGS), NOW)
    health = await store.health()  # its probe write fails too
    assert health.problems == ("writes_failing",)
    assert health.properties["lastWriteError"] == "OperationalError"
    store._writer.before_statement = None
    health = await store.health()
    assert health.problems == (), health
    assert "lastWriteError" not in health.properties


async def test_health_reports_a_stuck_writer(tmp_path: Path) -> None:
    """A commit in flight for longer than ``stuck_after`` makes health list
    ``writer_stuck`` (answering at once, without queueing behind it); it clears when the
    commit ends."""
    release = threading.Event()

    def blocked(txn: Txn) -> None:
        release.wait(10)

    async with opened(tmp_path / "memory.db", stuck_after=0.2) as store:
        async with anyio.create_task_group() as tg:
            tg.start_soon(store._writer.write, blocked)
            await anyio.sleep(0.4)
            with anyio.fail_after(2):
                problems = (await store.health()).problems
            assert "writer_stuck" in problems
            release.set()
        assert (await store.health()).problems == ()


# -- a real sidecar -------------------------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The umask most hosts run with; a sidecar started by the test inherits it."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_database_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Issue 7, finding 6: the database, WAL and SHM were created 0644 under a 022 umask, so
    anyone on the host could read every tenant's memory. Now they are 0600 and a directory
    created for them 0700, with no warning."""
    database = tmp_path / "new-dir" / "memory.db"
    with Sidecar(tmp_path, database=database) as sidecar, sidecar.client() as c:
        put(c, new_run(c, "t1"), "ref", "private")
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in database.parent.iterdir()}
    # The serve lock (which a serving sidecar holds so that no import splits its memory) too.
    files = ("memory.db", "memory.db-wal", "memory.db-shm", "memory.db-serve.lock")
    assert modes == dict.fromkeys(files, 0o600), {name: oct(mode) for name, mode in modes.items()}
    assert stat.S_IMODE(database.parent.stat().st_mode) == 0o700
    assert not sidecar.events("database_readable_by_others")


def test_a_database_readable_by_others_is_named_at_start(tmp_path: Path) -> None:
    """An existing database file that group or others may read is served, with a warning
    naming the file and its mode (never content)."""
    database = tmp_path / "memory.db"
    database.touch()
    database.chmod(0o644)
    with Sidecar(tmp_path, database=database) as sidecar:
        pass
    warnings = sidecar.events("database_readable_by_others")
    assert len(warnings) == 1, sidecar.log()
    assert warnings[0]["mode"] == "0644"
    assert warnings[0]["path"] == str(database)


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (root only); skips where mounting is refused."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until its file system has no byte left; returns it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):  # ENOSPC: on to smaller writes
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_full_under_a_running_sidecar(tmp_path: Path) -> None:
    """Issue 7, findings 1 and 5, end to end on a really full file system: A's first put to
    a new scope fails with ``upstream_unavailable`` and health turns degraded; once space
    returns, B's first put and A's retry each land in their own tenant's scope, health is ok
    again, and a restart shows the same."""
    disk = tiny_filesystem(tmp_path / "disk", "64m")
    with disk as mounted:
        database = mounted / "memory.db"
        sidecar = Sidecar(tmp_path, database=database)
        with sidecar, sidecar.client() as c:
            run_a, run_b = new_run(c, "tenant-a"), new_run(c, "tenant-b")
            filler = fill(mounted)
            err = c.error(
                "memory.put", runId=run_a, memoryRef="scope-a", entry={"content": "a" * 30_000}
            )
            assert err.code == "upstream_unavailable", err.error
            with sidecar.client() as probe:
                health = probe.call("sidecar.health")
            assert health["status"] == "degraded", health
            problems = health["storage"]["problems"]
            assert "writes_failing" in problems and "disk_full" in problems, health
            filler.unlink()
            put(c, run_b, "scope-b", "b's entry")
            put(c, run_a, "scope-a", "a's retry")
            assert c.call("sidecar.health")["status"] == "ok"
            reader_a, reader_b = new_run(c, "tenant-a"), new_run(c, "tenant-b")
            seen_a = c.call("memory.list", runId=reader_a, memoryRef="scope-a")
            seen_b = c.call("memory.list", runId=reader_b, memoryRef="scope-b")
            assert [e["content"] for e in seen_a] == ["a's retry"]
            assert [e["content"] for e in seen_b] == ["b's entry"]
        with Sidecar(tmp_path, database=database) as again, again.client() as c:
            reader_a, reader_b = new_run(c, "tenant-a"), new_run(c, "tenant-b")
            seen_a = c.call("memory.list", runId=reader_a, memoryRef="scope-a")
            seen_b = c.call("memory.list", runId=reader_b, memoryRef="scope-b")
            assert [e["content"] for e in seen_a] == ["a's retry"]
            assert [e["content"] for e in seen_b] == ["b's entry"]


# -- checkpoints --------------------------------------------------------------------------


async def until_checkpoints_done(store: SqliteStorage) -> None:
    """Wait for the checkpoint thread (no event to wait on there)."""
    with anyio.fail_after(5):
        while store._writer._checkpointing:  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def test_a_failing_background_checkpoint_is_logged_and_retried_a_step_later(
    tmp_path: Path,
) -> None:
    """The checkpoint past ``checkpoint_bytes`` of WAL fails: a ``checkpoint_failed``
    warning names the reason (never content), puts go on, the next try waits until the WAL
    has grown by another step, and that one starts it over."""
    from structlog.testing import capture_logs

    path = tmp_path / "memory.db"
    step = 64 << 10
    fired: list[str] = []
    fail = fail_once_at("checkpoint")

    def fault(name: str) -> None:
        if name == "checkpoint":
            fired.append(name)
        fail(name)

    async with opened(path, checkpoint_bytes=step) as store:
        writer = store._writer
        writer.before_statement = fault
        marker = "CKPT-CONTENT-" + "x" * 2000
        with capture_logs() as captured, anyio.fail_after(10):
            while not fired:
                await stored(store, put_request(A, marker))
            await until_checkpoints_done(store)
        assert [(c["event"], c["log_level"], c["reason"]) for c in captured] == [
            ("checkpoint_failed", "warning", "OperationalError")
        ]
        assert "CKPT-CONTENT" not in repr(captured)
        # Not retried on the next look: only once the WAL has grown by another step.
        assert wal_bytes(path) >= step
        # The threshold moved a step past the WAL's size at the failure (puts and readers may
        # grow the WAL after it, so its size now only bounds the threshold from above), and
        # no second checkpoint was tried meanwhile.
        assert fired == ["checkpoint"]
        assert step < writer._checkpoint_at <= wal_bytes(path) + step
        with anyio.fail_after(10):
            while len(fired) < 2:
                await stored(store, put_request(A, marker))
            await until_checkpoints_done(store)
        assert writer._checkpoint_at == step
        await stored(store, put_request(A, "after"))
        assert wal_frames(path) <= 10  # one commit's pages: started over
        assert len(await contents(store, A)) > 0


async def test_a_failing_explicit_checkpoint_raises_upstream_unavailable_and_writes_go_on(
    store: SqliteStorage, tmp_path: Path
) -> None:
    """``checkpoint(mode)`` (the sweep's and forget's, and close's) failing raises the
    service's ``upstream_unavailable``, leaves no checkpoint counted as running, and the
    next put and checkpoint work."""
    writer = store._writer
    await stored(store, put_request(A, "before"))
    writer.before_statement = fail_once_at("checkpoint")
    with pytest.raises(UpstreamUnavailableError) as raised:
        await writer.checkpoint("PASSIVE")
    assert raised.value.details == {"backend": "sqlite", "reason": "OperationalError"}
    assert writer._checkpointing == 0
    await stored(store, put_request(A, "after"))
    await writer.checkpoint("TRUNCATE")
    assert wal_bytes(tmp_path / "memory.db") == 0
    assert await contents(store, A) == ["after", "before"]
