"""Crash safety: every acknowledged write survives a SIGKILL, and the file stays sound.

Each test runs the real sidecar, kills it with SIGKILL (no drain, no checkpoint, the WAL
left as it was), starts a new process on the same database and checks what a fresh run
sees. The SQLite file itself is checked with ``sqlite3`` only while no sidecar runs.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from support.protocol import begin, issue_refs, list_all, put
from support.sidecar import RawClient, Sidecar


def sqlite_file_state(path: Path) -> tuple[list[str], str]:
    """``PRAGMA integrity_check`` rows and ``journal_mode`` of a database no process has open."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        integrity = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    return integrity, str(mode)


def crashed_copy_state(database: Path, into: Path) -> tuple[list[str], str]:
    """Check a copy of the crashed database with its WAL, leaving the original to the sidecar.

    Opening the original here would let sqlite3 recover and checkpoint it, so the next sidecar
    would no longer be the one that recovers the WAL.
    """
    into.mkdir()
    for suffix in ("", "-wal"):
        source = Path(f"{database}{suffix}")
        if source.exists():
            shutil.copyfile(source, into / f"{database.name}{suffix}")
    return sqlite_file_state(into / database.name)


def visible_entries(client: RawClient, run_id: str, refs: list[str]) -> list[dict[str, Any]]:
    """What a brand-new run sees in each scope (asserting no scope is near the list cap)."""
    assert begin(client, run_id)["resumed"] is False
    return [entry for ref in refs for entry in list_all(client, run_id, ref)]


@dataclass
class Burst:
    """Writers, one connection and one scope each, putting until the sidecar dies."""

    socket: Path
    run_id: str
    refs: list[str]
    prefix: str
    quota: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    attempted: set[str] = field(default_factory=set)
    acked: list[tuple[str, str, str]] = field(default_factory=list)  # (ref, id, content)
    completed: list[int] = field(default_factory=list)

    def writer(self, n: int, ready: threading.Barrier) -> None:
        ref = self.refs[n]
        with RawClient(self.socket, timeout=30) as client:
            ready.wait(timeout=30)
            for i in range(self.quota):
                content = f"{self.prefix}/writer-{n}/{i}"
                with self.lock:
                    self.attempted.add(content)
                try:
                    entry = client.call(
                        "memory.put",
                        runId=self.run_id,
                        memoryRef=ref,
                        entry={"content": content, "tags": [f"writer:{n}"]},
                    )
                except (OSError, EOFError, ValueError):
                    return  # the sidecar died with this put in flight: not acknowledged
                assert entry["content"] == content
                with self.lock:
                    self.acked.append((ref, str(entry["id"]), content))
        with self.lock:
            self.completed.append(n)

    def run_until_killed(self, sidecar: Sidecar, kill_after: int) -> None:
        ready = threading.Barrier(len(self.refs) + 1)
        with ThreadPoolExecutor(len(self.refs)) as pool:
            futures = [pool.submit(self.writer, n, ready) for n in range(len(self.refs))]
            ready.wait(timeout=30)
            wait_for(lambda: len(self.acked) >= kill_after, 60, f"{kill_after} acknowledged puts")
            assert sidecar.proc is not None
            sidecar.proc.send_signal(signal.SIGKILL)
            assert sidecar.proc.wait(10) == -signal.SIGKILL
            for future in futures:
                future.result(timeout=60)
        assert len(self.completed) < len(self.refs), "the kill did not land mid-burst"


@pytest.mark.sqlite_only
def test_acknowledged_puts_survive_repeated_sigkill_mid_burst(workdir: Path) -> None:
    database = workdir / "memory.db"
    writers, quota, kill_after = 6, 300, 120
    refs: list[str] = []
    bursts: list[Burst] = []
    for crash in range(2):
        # After the first crash the socket file is stale: the next start must replace it.
        assert (workdir / "memory.sock").exists() == (crash > 0)
        sidecar = Sidecar(workdir, database=database).start()
        try:
            with sidecar.client() as client:
                round_refs = issue_refs(client, writers)
                begin(client, f"burst-{crash}")
            # Refs are deterministic across restarts (their key is in the database).
            assert not refs or round_refs == refs
            refs = round_refs
            burst = Burst(sidecar.socket, f"burst-{crash}", refs, f"crash-{crash}", quota)
            burst.run_until_killed(sidecar, kill_after)
            bursts.append(burst)
        finally:
            sidecar.kill()
        integrity, mode = crashed_copy_state(database, workdir / f"copy-after-crash-{crash}")
        assert integrity == ["ok"]
        assert mode == "wal"

    with Sidecar(workdir, database=database) as sidecar, sidecar.client() as client:
        seen = visible_entries(client, "after-crashes", refs)
        by_id = {e["id"]: e for e in seen}
        assert len(by_id) == len(seen), "duplicate ids in a listing"
        attempted = set().union(*(b.attempted for b in bursts))
        # Nothing appears that was never sent (in-flight puts may or may not have landed).
        assert {e["content"] for e in seen} <= attempted
        for burst in bursts:
            for _ref, entry_id, content in burst.acked:
                assert entry_id in by_id, f"acknowledged put {content} lost by the crash"
                assert by_id[entry_id]["content"] == content
            # The writes right before each kill are the ones most at risk: get each directly.
            for ref, entry_id, content in burst.acked[-3 * len(refs) :]:
                got = client.call("memory.get", runId="after-crashes", memoryRef=ref, id=entry_id)
                assert got == by_id[entry_id]
                assert got["content"] == content
        assert sidecar.stop() == 0

    integrity, mode = sqlite_file_state(database)
    assert integrity == ["ok"]
    assert mode == "wal"


def test_snapshots_and_deletes_survive_sigkill(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar:
        with sidecar.client() as client:
            (ref,) = issue_refs(client, 1)
            begin(client, "writer")
            before = put(client, "writer", ref, "written before the reader began")
            gone = put(client, "writer", ref, "deleted before the reader began")
            assert client.call("memory.delete", runId="writer", memoryRef=ref, id=gone["id"])
            reader = begin(client, "reader")
            assert reader["resumed"] is False
            after = put(client, "writer", ref, "written after the reader began")
        sidecar.kill()

    with Sidecar(workdir) as sidecar, sidecar.client() as client:
        # The writer's keyring died with the process: it must begin again before putting.
        err = client.error(
            "memory.put", runId="writer", memoryRef=ref, entry={"content": "too early"}
        )
        assert err.code == "not_found"
        assert err.details.get("resource") == "run"

        # The reader's snapshot is persisted: listing works before it is re-begun...
        assert client.call("memory.list", runId="reader", memoryRef=ref) == [before]
        resumed = begin(client, "reader")
        assert resumed["resumed"] is True
        assert resumed["snapshotAt"] == reader["snapshotAt"]
        # ...and it is the same point in commit order as before the crash.
        assert client.call("memory.list", runId="reader", memoryRef=ref) == [before]
        for hidden in (gone, after):
            got = client.call("memory.get", runId="reader", memoryRef=ref, id=hidden["id"])
            assert got is None

        assert begin(client, "writer")["resumed"] is True
        fresh = begin(client, "fresh")
        assert fresh["resumed"] is False
        assert client.call("memory.list", runId="fresh", memoryRef=ref) == [after, before]
        assert after["createdAt"] <= fresh["snapshotAt"]


def test_idempotency_keys_survive_sigkill(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar:
        with sidecar.client() as client:
            (ref,) = issue_refs(client, 1)
            begin(client, "writer")
            first = put(client, "writer", ref, "keyed entry", idempotencyKey="key-1")
        sidecar.kill()

    with Sidecar(workdir) as sidecar, sidecar.client() as client:
        assert begin(client, "writer")["resumed"] is True
        again = put(client, "writer", ref, "keyed entry", idempotencyKey="key-1")
        assert again == first
        err = client.error(
            "memory.put",
            runId="writer",
            memoryRef=ref,
            entry={"content": "another entry"},
            idempotencyKey="key-1",
        )
        assert err.code == "conflict"
        assert visible_entries(client, "reader", [ref]) == [first]
