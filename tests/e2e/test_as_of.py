"""Runs as of a past time *(extension)*: ``run.begin`` with ``asOf`` (docs/PROTOCOL.md), on
a real sidecar and through the typed client.

A run as of T is read-only and sees exactly what a run begun at T saw: the snapshot is
computed from the change feed's write positions, and every write committed after a
snapshot is stamped past its time, so "the writes stamped at or before T" is a snapshot.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from openwop_memory.timefmt import parse_rfc3339
from openwop_memory_client import ForbiddenError, MemoryClient, MemoryValidationError
from openwop_memory_client.wire import VENDOR_KEY
from support.protocol import WIRE_TIME, begin, delete, expect, invalid, issue, listing, put
from support.shared import SharedClient
from support.sidecar import Sidecar


def begin_as_of(c: SharedClient, run: str, as_of: str, **params: Any) -> dict[str, Any]:
    """``run.begin`` with ``asOf``: its answer, checked."""
    answer = c.call("run.begin", runId=run, tenant="tenant", asOf=as_of, **params)
    assert set(answer) == {"runId", "tenant", "snapshotAt", "resumed", "readOnly"}, answer
    assert answer["readOnly"] is True and WIRE_TIME.match(answer["snapshotAt"]), answer
    assert parse_rfc3339(answer["snapshotAt"]) == parse_rfc3339(as_of)
    return dict(answer)


def ids(c: SharedClient, run: str, ref: str) -> list[str]:
    return [e["id"] for e in listing(c, run, ref, limit=1000)]


def test_runs_as_of_each_snapshot_time_see_what_those_runs_saw(
    shared_client: SharedClient,
) -> None:
    c = shared_client
    ref = issue(c, "tenant")
    begin(c, "writer", "tenant")
    seen: list[tuple[str, list[str]]] = []
    live: list[str] = []
    for step in range(8):
        live.append(put(c, "writer", ref, f"fact {step}")["id"])
        if step % 3 == 2:
            assert delete(c, "writer", ref, live.pop(0))
        if step % 2:
            keyed = c.call(
                "memory.put",
                runId="writer",
                memoryRef=ref,
                entry={"content": f"the colour is {step}"},
                **{VENDOR_KEY: {"key": "colour"}},
            )
            live = [i for i in live if i != keyed.get("superseded")] + [keyed["entry"]["id"]]
        run = f"at-{step}"
        snapshot_at = begin(c, run, "tenant")["snapshotAt"]
        seen.append((snapshot_at, ids(c, run, ref)))
        assert sorted(seen[-1][1]) == sorted(live)
    for number, (snapshot_at, expected) in enumerate(seen):
        answer = begin_as_of(c, f"as-of-{number}", snapshot_at)
        assert answer["resumed"] is False
        assert ids(c, f"as-of-{number}", ref) == expected, number
        # Begun again: the same run, resumed.
        assert begin_as_of(c, f"as-of-{number}", snapshot_at)["resumed"] is True


def test_a_run_as_of_a_time_refuses_writes_and_bad_times(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c, "tenant")
    begin(c, "writer", "tenant")
    entry = put(c, "writer", ref, "kept")["id"]
    t = begin(c, "marker", "tenant")["snapshotAt"]
    begin_as_of(c, "reader", t)
    err = expect(
        c, "forbidden", -32003, "memory.put", runId="reader", memoryRef=ref, entry={"content": "no"}
    )
    assert err.error["data"]["details"] == {"field": "runId"}
    err = expect(c, "forbidden", -32003, "memory.delete", runId="reader", memoryRef=ref, id=entry)
    assert ids(c, "marker", ref) == [entry]  # nothing was deleted
    # The same id begun to write, or as of another time: another run, refused.
    err = expect(c, "conflict", -32009, "run.begin", runId="reader", tenant="tenant")
    assert err.error["data"]["details"]["field"] == "asOf"
    later = (datetime.fromisoformat(t) + timedelta(microseconds=1)).isoformat()
    expect(c, "conflict", -32009, "run.begin", runId="reader", tenant="tenant", asOf=later)
    expect(c, "conflict", -32009, "run.begin", runId="writer", tenant="tenant", asOf=t)
    # Malformed, in the future, past retention; and secrets, which a reader cannot use.
    for bad in ("yesterday", "2026-13-01T00:00:00Z", "2026-12-01T00:00:00"):
        err = invalid(c, "run.begin", runId="bad", tenant="tenant", asOf=bad)
        assert err.error["data"]["details"] == {"field": "asOf"}
    future = datetime.now(UTC) + timedelta(days=1)
    err = invalid(c, "run.begin", runId="bad", tenant="tenant", asOf=future.isoformat())
    assert err.error["data"]["details"] == {"field": "asOf"}
    old = (datetime.now(UTC) - timedelta(days=30)).isoformat()
    err = expect(
        c,
        "replay_memory_snapshot_unavailable",
        -32011,
        "run.begin",
        runId="bad",
        tenant="tenant",
        asOf=old,
    )
    assert err.error["data"]["details"]["reason"] == "retention_expired"
    err = invalid(
        c,
        "run.begin",
        runId="bad",
        tenant="tenant",
        asOf=t,
        secrets=[{"id": "k", "value": "a-secret-value"}],
    )
    assert err.error["data"]["details"] == {"field": "secrets"}
    assert "a-secret-value" not in str(err.error)


@pytest.mark.backend_independent
def test_the_typed_client_reads_as_of_a_time(shared_sidecar: Sidecar) -> None:
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref("as-of-tenant", "agent")
        with client.run("writer", "as-of-tenant") as writer:
            first = writer.put(ref, "before")
        with client.run("marker", "as-of-tenant") as marker:
            t = datetime.fromisoformat(marker.snapshot_at)
        time.sleep(0.002)
        with client.run("writer", "as-of-tenant") as writer:
            writer.put(ref, "after")
        with client.run("reader", "as-of-tenant", as_of=t) as reader:
            assert reader.read_only is True
            assert datetime.fromisoformat(reader.snapshot_at) == t
            assert [e.id for e in reader.list(ref)] == [first.id]
            with pytest.raises(ForbiddenError):
                reader.put(ref, "refused")
        with pytest.raises(MemoryValidationError):
            client.run("naive", "as-of-tenant", as_of="2026-01-01").__enter__()  # type: ignore[arg-type]
