"""Log lines an operator relies on, from a real sidecar: which database it opened, an issued
ref that failed verification (counted, rate-limited, never quoted), and a sweeper that is
quiet when it has nothing to do."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from support.backends import POSTGRES, selected
from support.protocol import begin, issue, put
from support.sidecar import RawClient, Sidecar, run_cli


def put_some(client: RawClient, n: int, expires_at: str | None = None) -> str:
    ref = issue(client, "t-logs", "a")
    begin(client, "r-logs", "t-logs")
    for i in range(n):
        put(client, "r-logs", ref, f"n{i}", expires_at=expires_at)
    return ref


def test_start_up_says_which_database_it_opened_and_whether_it_was_new(workdir: Path) -> None:
    with Sidecar(workdir) as first:
        with first.client() as client:
            put_some(client, 4)
        (opened,) = first.events("database_opened")
    backend = first.backend.name
    assert opened["backend"] == backend
    assert opened["created"] is True
    assert opened["schema_version"] >= 1
    if backend == "sqlite":
        assert opened["path"] == str(first.database.resolve())
        assert (opened["entries"], opened["scopes"]) == (0, 0)
    else:
        assert {"host", "port", "database"} <= opened.keys()
        assert "postgresql://" not in str(opened)
    with Sidecar(workdir, database=first.database) as second:
        (reopened,) = second.events("database_opened")
    assert reopened["created"] is False
    if backend == "sqlite":
        assert (reopened["entries"], reopened["scopes"]) == (4, 1)
    else:
        assert opened["holds_entries"] is False and reopened["holds_entries"] is True


def test_without_create_database_a_missing_database_stops_the_start_naming_it(
    workdir: Path,
) -> None:
    backend = selected()
    missing = workdir / "mistyped.db"
    url = backend.url_for(missing)  # PostgreSQL: an empty database, none of our tables
    refused = run_cli(
        "serve",
        "--socket",
        str(workdir / "m.sock"),
        "--database",
        url,
        "--create-database",
        "false",
    )
    assert refused.returncode == 1, refused.stderr
    assert "create_database is false" in refused.stderr
    if backend.name == "sqlite":
        assert f"the database {missing} does not exist" in refused.stderr
        assert not missing.exists()
    else:
        assert f"database {POSTGRES.database_name(missing)} holds no" in refused.stderr
        assert "postgresql://" not in refused.stderr
        tables = POSTGRES.psql(
            missing, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        )
        assert tables.strip() == "0", "nothing was created"
    with Sidecar(workdir, database=missing) as first:  # the default makes it
        (made,) = first.events("database_opened")
    with Sidecar(workdir, "--create-database", "false", database=missing) as second:
        (opened,) = second.events("database_opened")
    assert made["created"] is True and opened["created"] is False


def test_a_rejected_ref_is_counted_and_logged_once_without_the_ref(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar, sidecar.client() as client:
        ref = put_some(client, 1)
        client.call("run.begin", runId="r-read", tenant="t-logs")
        # The same ref with one character of its MAC changed: well-formed, but it no
        # longer verifies.
        body = ref.rstrip("=")
        forged = body[:-1] + ("A" if body[-1] != "A" else "B") + ref[len(body) :]
        for _ in range(3):
            assert client.call("memory.list", runId="r-read", memoryRef=forged) == []
        assert len(client.call("memory.list", runId="r-read", memoryRef=ref)) == 1
        text = client.call("sidecar.metrics")["text"]
        lines = sidecar.events("ref_rejected")
    assert "openwop_memory_refs_rejected_total 3.0" in text
    assert len(lines) == 1, "at most one line per interval"
    assert lines[0]["tenant"] == "t-logs" and lines[0]["level"] == "warning"
    assert forged not in sidecar.log() and ref not in sidecar.log()


def test_the_sweeper_is_quiet_until_it_removes_something(workdir: Path) -> None:
    args = ("--sweep-interval", "0.2", "--replay-retention", "1h")
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as client:
        time.sleep(1.0)
        assert sidecar.events("sweep") == [], "an idle pass logs nothing at info"
        soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
        put_some(client, 2, expires_at=soon)
        deadline = time.monotonic() + 20
        while not sidecar.events("sweep") and time.monotonic() < deadline:
            time.sleep(0.1)
        sweeps = sidecar.events("sweep")
    assert sweeps, "the pass that removed the expired entries was logged"
    assert sum(s["expired_entries"] for s in sweeps) == 2
    assert all(s["level"] == "info" for s in sweeps)
