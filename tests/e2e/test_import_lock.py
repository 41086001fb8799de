"""An import cannot split a live memory: it is refused while a sidecar serves the database
(the serve lock every serving sidecar holds, on both backends) or when the database holds
runs or entries under another ref key, and one that fails leaves no database file behind.

A sidecar keeps the ref key it read at its start; had an import changed the key under it,
the sidecar would go on serving scopes no ref of the imported file reaches, and its
workers' writes would land where no ref reaches after its restart."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from pathlib import Path

import anyio.from_thread
import pytest
from openwop_memory.storage.base import DatabaseInUseError
from openwop_memory.storage.postgresql.serve_lock import AdvisoryServeLock
from openwop_memory.storage.sqlite.serve_lock import SUFFIX
from support.backends import BACKENDS, Backend
from support.protocol import begin, issue, list_all, put
from support.sidecar import RawClient, Sidecar, run_cli

pytestmark = pytest.mark.backend_independent


def cli(*args: str) -> tuple[int, str, str]:
    done = run_cli(*args, timeout=120)
    return done.returncode, done.stdout, done.stderr


def exported(workdir: Path, backend: Backend, database: Path, name: str) -> int:
    """How many live entries ``database`` holds, read by an export (it also shows that an
    export reads beside a serving sidecar)."""
    code, out, err = cli(
        "export", str(workdir / f"{name}.ndjson"), "--database", backend.url_for(database)
    )
    assert code == 0, err
    found = re.match(r"exported (\d+) entries", out)
    assert found, out
    return int(found.group(1))


def an_export(workdir: Path, backend: Backend) -> tuple[Path, str]:
    """An export file of two entries, and a ref that reaches them."""
    path = workdir / "source.ndjson"
    with (
        Sidecar(workdir, database=workdir / "source.db", backend=backend) as source,
        source.client() as client,
    ):
        ref = issue(client, "t-lock", "a")
        begin(client, "w", "t-lock")
        put(client, "w", ref, "one")
        put(client, "w", ref, "two")
    code, _, err = cli("export", str(path), "--database", backend.url_for(source.database))
    assert code == 0, err
    return path, ref


@pytest.mark.across_processes
def test_an_import_is_refused_while_a_sidecar_serves_the_database(
    workdir: Path, backend: Backend
) -> None:
    export, ref = an_export(workdir, backend)
    target = workdir / "target.db"
    url = backend.url_for(target)
    with Sidecar(workdir, database=target, backend=backend) as serving:
        assert serving.proc is not None
        code, out, err = cli("import", str(export), "--database", url)
        assert code == 1, out
        lines = err.splitlines()
        assert len(lines) == 1 and "serves this database" in lines[0], err
        assert "stop every sidecar on it first" in lines[0]
        if backend.name == "postgresql":
            assert f"pid {serving.proc.pid}" in lines[0], "the refusal names the holder"
        assert exported(workdir, backend, target, "while") == 0, "nothing was imported"
        with serving.client() as client:
            assert client.call("sidecar.health")["status"] == "ok", "it goes on serving"
    code, out, err = cli("import", str(export), "--database", url)
    assert code == 0 and out.startswith("imported 2 entries"), err
    assert exported(workdir, backend, target, "after") == 2
    with Sidecar(workdir, database=target, backend=backend) as again, again.client() as client:
        begin(client, "r", "t-lock")
        assert [e["content"] for e in list_all(client, "r", ref)] == ["two", "one"]


def test_two_sidecars_share_a_database_and_neither_lets_an_import_in(workdir: Path) -> None:
    sqlite = BACKENDS["sqlite"]
    export, _ = an_export(workdir, sqlite)
    target = workdir / "shared.db"
    first = Sidecar(workdir, database=target, socket_path=workdir / "a.sock", backend=sqlite)
    second = Sidecar(workdir, database=target, socket_path=workdir / "b.sock", backend=sqlite)
    with first, second:
        first.stop()
        code, _, err = cli("import", str(export), "--database", sqlite.url_for(target))
        assert code == 1 and "a sidecar serves this database" in err, err
        with RawClient(second.socket) as client:
            assert client.call("sidecar.health")["status"] == "ok"
    assert exported(workdir, sqlite, target, "shared") == 0


def test_a_sidecar_does_not_start_while_an_import_holds_the_sqlite_database(
    workdir: Path,
) -> None:
    sqlite = BACKENDS["sqlite"]
    target = workdir / "importing.db"
    with Sidecar(workdir, database=target, backend=sqlite):
        pass  # the database, and its lock file, exist
    fd = os.open(str(target) + SUFFIX, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as an import holds it
        starting = Sidecar(workdir, database=target, backend=sqlite)
        try:
            with pytest.raises(RuntimeError, match="exited with 1") as refused:
                starting.start()
        finally:
            starting.kill()
        assert "an import into this database is running" in str(refused.value)
    finally:
        os.close(fd)
    with Sidecar(workdir, database=target, backend=sqlite) as after, after.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"


def test_a_sidecar_does_not_start_while_an_import_holds_the_postgresql_database(
    workdir: Path,
) -> None:
    postgresql = BACKENDS["postgresql"]
    target = workdir / "importing.db"
    url = postgresql.url_for(target)

    with anyio.from_thread.start_blocking_portal() as portal:
        held = AdvisoryServeLock(url, connect_timeout=5)
        portal.call(lambda: held.acquire(exclusive=True))  # as an import holds it
        try:
            # Another import is refused too, by the same lock.
            again = AdvisoryServeLock(url, connect_timeout=5)
            with pytest.raises(DatabaseInUseError):
                portal.call(lambda: again.acquire(exclusive=True))
            # A sidecar that started would serve on: the timeout fails the test then.
            done = subprocess.run(
                Sidecar(workdir, database=target, backend=postgresql).argv,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        finally:
            portal.call(held.release)
    assert done.returncode == 1
    assert "an import into this database is running" in done.stderr, done.stderr
    with Sidecar(workdir, database=target, backend=postgresql) as after, after.client() as c:
        assert c.call("sidecar.health")["status"] == "ok"


@pytest.mark.across_processes
def test_an_import_into_a_database_with_runs_under_another_key_is_refused(
    workdir: Path, backend: Backend
) -> None:
    export, _ = an_export(workdir, backend)
    target = workdir / "runs.db"
    with (
        Sidecar(workdir, database=target, backend=backend) as own,
        own.client() as client,
    ):
        begin(client, "w", "t-lock")  # a run, and so a worker holding refs of this key
    code, _, err = cli("import", str(export), "--database", backend.url_for(target))
    assert code == 1 and "already holds memory under another ref key" in err, err
    assert exported(workdir, backend, target, "runs") == 0


def test_a_failed_import_into_a_new_path_leaves_no_file(workdir: Path) -> None:
    sqlite = BACKENDS["sqlite"]
    export, _ = an_export(workdir, sqlite)
    cut = workdir / "cut.ndjson"
    cut.write_text("".join(export.read_text().splitlines(keepends=True)[:-1]))
    fresh = workdir / "fresh.db"
    code, _, err = cli("import", str(cut), "--database", sqlite.url_for(fresh))
    assert code == 1 and "ends without its trailer" in err, err
    assert sorted(p.name for p in workdir.glob("fresh.db*")) == []
    refused = run_cli(
        "serve",
        "--socket",
        str(workdir / "m.sock"),
        "--database",
        sqlite.url_for(fresh),
        "--create-database",
        "false",
        timeout=60,
    )
    assert refused.returncode == 1 and "does not exist" in refused.stderr, refused.stderr
    # A file that was there before a failed import stays, with what it held.
    with Sidecar(workdir, database=fresh, backend=sqlite):
        pass
    code, _, err = cli("import", str(cut), "--database", sqlite.url_for(fresh))
    assert code == 1 and fresh.exists()
    assert exported(workdir, sqlite, fresh, "kept") == 0
