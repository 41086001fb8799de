"""TTL (RFC 0004 §E), the sweeper, replay retention and idempotency keys, end to end.

Real time passes only where expiry or retention needs it, in short sleeps.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, cast

import pytest
from support.on_disk import query
from support.polling import wait_for
from support.protocol import (
    TENANT,
    assert_run_not_found,
    begin,
    delete,
    get,
    issue,
    listing,
    put,
    put_error,
)
from support.schemas import check_envelope
from support.shared import SharedClient
from support.sidecar import Sidecar

# -- helpers ------------------------------------------------------------------------------


def wire_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def in_future(seconds: float) -> tuple[datetime, str]:
    t = datetime.now(UTC) + timedelta(seconds=seconds)
    return t, wire_time(t)


def sleep_until(t: datetime, margin: float = 0.1) -> None:
    delay = (t - datetime.now(UTC)).total_seconds() + margin
    if delay > 0:
        time.sleep(delay)


# -- TTL ----------------------------------------------------------------------------------


def test_entry_is_returned_before_and_not_after_expiry(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    expiry, expires_at = in_future(2.0)
    # The same instant written with an offset and nanoseconds: returned as UTC, truncated.
    offset = expiry.astimezone(timezone(timedelta(hours=2))).isoformat(timespec="microseconds")
    offset = offset[:-6] + "789" + offset[-6:]
    short = put(shared_client, "w", ref, "short-lived", ["ttl"], expires_at=expires_at)
    also_short = put(shared_client, "w", ref, "short-lived too", ["ttl"], expires_at=offset)
    keep = put(shared_client, "w", ref, "kept", ["ttl"])
    assert short["expiresAt"] == expires_at
    assert also_short["expiresAt"] == expires_at
    assert "expiresAt" not in keep
    begin(shared_client, "r")  # its snapshot includes all three
    assert listing(shared_client, "r", ref) == [keep, also_short, short]
    assert listing(shared_client, "r", ref, tag="ttl") == [keep, also_short, short]
    assert get(shared_client, "r", ref, short["id"]) == short
    assert datetime.now(UTC) < expiry, "the machine is too slow for this test's timing"

    sleep_until(expiry)
    assert listing(shared_client, "r", ref) == [keep]
    assert listing(shared_client, "r", ref, tag="ttl") == [keep]
    assert get(shared_client, "r", ref, short["id"]) is None
    assert get(shared_client, "r", ref, also_short["id"]) is None
    assert delete(shared_client, "r", ref, short["id"]) is False
    assert delete(shared_client, "w", ref, also_short["id"]) is False
    begin(shared_client, "r2")
    assert listing(shared_client, "r2", ref) == [keep]
    assert delete(shared_client, "r2", ref, keep["id"]) is True

    # Expiry in the past (or now) is refused at write time (§E).
    for past in (wire_time(datetime.now(UTC) - timedelta(seconds=1)), "2001-01-01T00:00:00Z"):
        err = put_error(shared_client, "w", ref, "stale", expires_at=past)
        assert err.code == "validation_error" and err.rpc_code == -32602
        assert err.details.get("field") == "entry.expiresAt"


@pytest.mark.sqlite_only
def test_sweeper_removes_expired_entries_from_the_file(workdir: Path) -> None:
    with (
        Sidecar(workdir, "--sweep-interval", "0.2", "--replay-retention", "5") as s,
        s.client() as c,
    ):
        ref = issue(c)
        begin(c, "w")
        expiry, expires_at = in_future(1.0)
        marker = "SWEEP-ME-7f3a9c"
        doomed = put(c, "w", ref, marker, ["sweep-tag-7f3a9c"], expires_at=expires_at)
        keep = put(c, "w", ref, "kept", ["k"])
        rows = query(s.database, "SELECT id, expires_us FROM entries ORDER BY seq")
        assert [r[0] for r in rows] == [doomed["id"], keep["id"]]
        assert rows[1][1] is None
        assert c.call("sidecar.stats")["entriesSwept"] == 0

        sleep_until(expiry, margin=0.0)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            remaining = query(s.database, "SELECT id FROM entries")
            if [r[0] for r in remaining] == [keep["id"]]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the expired entry was not swept: {remaining}")
        # The table layout this test relies on.
        columns = {r[1] for r in query(s.database, "PRAGMA table_info(entries)")}
        assert {"seq", "id", "scope_pk", "content", "tags", "expires_us"} <= columns
        assert query(s.database, "SELECT count(*) FROM entries WHERE content = ?", (marker,)) == [
            (0,)
        ]
        assert query(
            s.database,
            "SELECT count(*) FROM entry_tags WHERE tag = ?",
            ("sweep-tag-7f3a9c",),
        ) == [(0,)]
        # The pass counts what it removed once all its steps are done, a little after the
        # first step's delete is in the file.
        wait_for(lambda: c.call("sidecar.stats")["entriesSwept"] >= 1, 5.0, "the pass's count")
        stats = c.call("sidecar.stats")
        assert stats["entriesSwept"] >= 1
        assert stats["sweeps"] >= 1 and stats["sweepFailures"] == 0
        begin(c, "r")
        assert listing(c, "r", ref) == [keep]
    # After a graceful stop (WAL checkpointed) no file holds the swept entry's bytes.
    assert s.proc is not None and s.proc.returncode == 0
    for path in workdir.iterdir():
        if path.is_file():
            data = path.read_bytes()
            assert marker.encode() not in data, path.name
            assert b"sweep-tag-7f3a9c" not in data, path.name


# -- replay retention ---------------------------------------------------------------------


def test_replay_past_retention_is_unavailable(workdir: Path) -> None:
    with (
        Sidecar(workdir, "--sweep-interval", "0.2", "--replay-retention", "1") as s,
        s.client() as c,
    ):
        ref = issue(c)
        begin(c, "w")  # stays open: the sweeper keeps it alive
        a = put(c, "w", ref, "a", idempotencyKey="key-1")
        first = begin(c, "ended")
        assert listing(c, "ended", ref) == [a]
        assert c.call("run.end", runId="ended") == {"ended": True}
        d = put(c, "w", ref, "d")
        held = begin(c, "held-open")
        b = put(c, "w", ref, "b")
        assert delete(c, "w", ref, d["id"]) is True
        time.sleep(1.6)  # > retention (1 s) plus a sweep interval

        err = c.error("run.begin", runId="ended", tenant=TENANT, replay=True)
        check_envelope(err.error)
        assert err.code == "replay_memory_snapshot_unavailable" and err.rpc_code == -32011
        assert err.details.get("reason") == "retention_expired", err.error
        assert err.details.get("runId") == "ended", err.error
        for method, params in [
            ("memory.list", {"memoryRef": ref}),
            ("memory.get", {"memoryRef": ref, "id": a["id"]}),
            ("memory.delete", {"memoryRef": ref, "id": a["id"]}),
        ]:
            assert_run_not_found(c.error(method, runId="ended", **params))

        # An open run is kept within retention by its sidecar, so it still replays, and
        # the sweeps kept the tombstone its older snapshot still needs.
        assert listing(c, "held-open", ref) == [d, a]
        assert get(c, "held-open", ref, d["id"]) == d
        assert begin(c, "held-open", replay=True) == {**held, "resumed": True}

        # The idempotency key was retained for the replay retention only.
        again = put(c, "w", ref, "a", idempotencyKey="key-1")
        assert again["id"] != a["id"]

        # Without replay, the same id opens a fresh snapshot.
        fresh = begin(c, "ended")
        assert fresh["resumed"] is False
        assert fresh["snapshotAt"] > first["snapshotAt"]
        assert listing(c, "ended", ref) == [again, b, a]


def test_replay_of_a_run_never_begun_is_unknown_run(shared_client: SharedClient) -> None:
    err = shared_client.error("run.begin", runId="ghost", tenant=TENANT, replay=True)
    check_envelope(err.error)
    assert err.code == "replay_memory_snapshot_unavailable"
    assert err.details == {"runId": "ghost", "reason": "unknown_run"}
    assert begin(shared_client, "ghost")["resumed"] is False


# -- idempotency ----------------------------------------------------------------------------


def test_idempotent_put_returns_the_first_entry(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    first = put(shared_client, "w", ref, "once", ["x", "y"], idempotencyKey="k")
    assert put(shared_client, "w", ref, "once", ["x", "y"], idempotencyKey="k") == first
    # Another run of the tenant retrying into the same scope gets the same entry.
    begin(shared_client, "w2")
    assert put(shared_client, "w2", ref, "once", ["x", "y"], idempotencyKey="k") == first
    # Empty and duplicate tags are normalised before the comparison.
    assert put(shared_client, "w2", ref, "once", ["x", "", "y", "x"], idempotencyKey="k") == first
    begin(shared_client, "r")
    assert listing(shared_client, "r", ref) == [first]


def test_idempotent_put_after_delete_returns_the_deleted_entry(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    first = put(shared_client, "w", ref, "to be deleted", idempotencyKey="k-del")
    assert delete(shared_client, "w", ref, first["id"]) is True
    assert put(shared_client, "w", ref, "to be deleted", idempotencyKey="k-del") == first
    begin(shared_client, "r")
    assert listing(shared_client, "r", ref) == []  # nothing was written again
    assert get(shared_client, "r", ref, first["id"]) is None


def test_idempotency_key_with_a_different_entry_is_conflict(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    _, later = in_future(3600)
    first = put(shared_client, "w", ref, "original", ["t"], idempotencyKey="k-c")
    changed: list[tuple[str, list[str] | None, str | None]] = [
        ("CHANGED-CONTENT-91ad", ["t"], None),
        ("original", ["t", "CHANGED-TAG-91ad"], None),
        ("original", None, None),
        ("original", ["t"], later),
    ]
    for content, tags, expires_at in changed:
        err = put_error(
            shared_client, "w", ref, content, tags, expires_at=expires_at, idempotencyKey="k-c"
        )
        assert err.code == "conflict" and err.rpc_code == -32009, err.error
        assert "91ad" not in json.dumps(err.error)
    begin(shared_client, "r")
    assert listing(shared_client, "r", ref) == [first]


def test_idempotency_keys_are_per_scope(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    other_agent = issue(shared_client, agent="other")
    other_ns = issue(shared_client, namespace="ns2")
    plain = "plain-scope"
    begin(shared_client, "w")
    entries = {
        r: put(shared_client, "w", r, "same", idempotencyKey="k-s") for r in (ref, other_agent)
    }
    entries[other_ns] = put(shared_client, "w", other_ns, "same", idempotencyKey="k-s")
    entries[plain] = put(
        shared_client, "w", plain, "different content is fine here", idempotencyKey="k-s"
    )
    begin(shared_client, "w-other-tenant", tenant="t-ttl-other")
    other_tenant = issue(shared_client, tenant="t-ttl-other")
    entries[other_tenant] = put(
        shared_client, "w-other-tenant", other_tenant, "same", idempotencyKey="k-s"
    )
    entries["plain-other-tenant"] = put(
        shared_client, "w-other-tenant", plain, "same", idempotencyKey="k-s"
    )
    assert len({e["id"] for e in entries.values()}) == len(entries)
    begin(shared_client, "r")
    for r in (ref, other_agent, other_ns, plain):
        assert listing(shared_client, "r", r) == [entries[r]]


def test_concurrent_puts_with_one_key_write_once(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    request = shared_client.scoped(
        {"runId": "w", "memoryRef": ref, "entry": {"content": "raced"}, "idempotencyKey": "r"}
    )
    lines = []
    for _ in range(20):
        shared_client.next_id += 1
        lines.append(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": shared_client.next_id,
                    "method": "memory.put",
                    "params": request,
                }
            )
        )
    shared_client.sock.sendall(("\n".join(lines) + "\n").encode())
    results = [shared_client.read() for _ in lines]
    assert all("result" in r for r in results), results
    assert len({json.dumps(r["result"], sort_keys=True) for r in results}) == 1
    begin(shared_client, "r")
    assert listing(shared_client, "r", ref) == [results[0]["result"]]


@pytest.mark.sqlite_only
def test_the_sweeper_survives_its_own_failures(workdir: Path) -> None:
    args = ("--sweep-interval", "0.2", "--replay-retention", "2", "--sqlite-busy-timeout", "50ms")
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as c:

        def stats() -> dict[str, Any]:
            return cast(dict[str, Any], c.call("sidecar.stats"))

        wait_for(lambda: stats()["sweeps"] >= 1, 10, "a first sweep")
        # Another writer holds the write lock longer than the sweeper may wait for it.
        with closing(sqlite3.connect(str(sidecar.database), isolation_level=None)) as blocker:
            blocker.execute("BEGIN IMMEDIATE")
            try:
                wait_for(lambda: stats()["sweepFailures"] >= 1, 10, "a failed sweep")
                # The sweeper's writes failed, and health says so.
                assert c.call("sidecar.health")["status"] == "degraded"
            finally:
                blocker.execute("ROLLBACK")
        assert c.call("sidecar.health")["status"] == "ok"
        failures = stats()["sweepFailures"]
        sweeps = stats()["sweeps"]
        wait_for(lambda: stats()["sweeps"] >= sweeps + 2, 10, "sweeps to resume")
        assert stats()["sweepFailures"] == failures
        lines = [
            line for line in sidecar.log_lines() if line.get("event") in {"sweep", "sweep_failed"}
        ]
        assert any(line.get("failed_steps") for line in lines), lines[-3:]


@pytest.mark.anyio
async def test_the_sweeper_survives_a_failed_pass_and_the_next_removes_the_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass whose storage call fails is counted (``sweepFailures``) and logged as
    ``sweep_failed`` with the error's type only; the loop goes on and the next pass
    removes the expired entry."""
    import anyio
    from openwop_memory.app import open_app
    from openwop_memory.config import Settings
    from structlog.testing import capture_logs
    from support.backends import selected

    settings = Settings.model_validate({"database": selected().url_for(tmp_path / "sw.db")})
    async with await open_app(settings) as app:

        async def call(method: str, **params: Any) -> Any:
            line = await app.dispatcher.handle_line(
                json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
            )
            assert line is not None
            answer = json.loads(line)
            assert "result" in answer, answer
            return answer["result"]

        ref = (await call("memory.issueRef", tenant="t", agent="a"))["memoryRef"]
        await call("run.begin", runId="w", tenant="t")
        expiry, expires_at = in_future(0.3)
        await call(
            "memory.put", runId="w", memoryRef=ref, entry={"content": "d", "expiresAt": expires_at}
        )
        keep = await call("memory.put", runId="w", memoryRef=ref, entry={"content": "kept"})
        await anyio.sleep(max(0.0, (expiry - datetime.now(UTC)).total_seconds()) + 0.05)

        storage = app.service._storage
        real_sweep = storage.sweep
        calls = 0
        swept = anyio.Event()

        async def failing_once(**kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("SWEEP-FAILURE-MARK")
            counts = await real_sweep(**kwargs)
            swept.set()  # the service counts the pass before the loop next yields
            return counts

        monkeypatch.setattr(storage, "sweep", failing_once)
        app.sweeper.interval = 0.02
        with capture_logs() as captured:
            async with anyio.create_task_group() as tg:
                tg.start_soon(app.sweeper.run)
                with anyio.fail_after(10):
                    await swept.wait()
                tg.cancel_scope.cancel()
        stats = await call("sidecar.stats")
        assert stats["sweepFailures"] == 1 and stats["sweeps"] >= 1, stats
        assert stats["entriesSwept"] == 1
        failed = [c for c in captured if c["event"] == "sweep_failed"]
        assert len(failed) == 1 and failed[0]["error_type"] == "RuntimeError", captured
        assert failed[0]["log_level"] == "error"
        assert "SWEEP-FAILURE-MARK" not in repr(captured)
        passes = [c for c in captured if c["event"] == "sweep" and c["expired_entries"]]
        assert [c["expired_entries"] for c in passes] == [1]
        await call("run.begin", runId="r", tenant="t")
        assert await call("memory.list", runId="r", memoryRef=ref) == [keep]
