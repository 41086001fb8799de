"""The errors the service makes of storage outcomes, pinned as the wire spelt them before
storage stopped raising them (message, code and ``details``, nothing more)."""

from __future__ import annotations

import pytest
from openwop_memory.storage.sqlite import schema as sqlite_schema
from support.backends import selected
from support.schemas import check_envelope
from support.sidecar import RawClient, RpcError


def pinned(err: RpcError, code: str, rpc_code: int, message: str, details: object) -> None:
    check_envelope(err.error)
    assert (err.code, err.rpc_code, err.error["message"]) == (code, rpc_code, message), err.error
    assert err.details == details, err.error


def test_another_tenants_run_unknown_run_and_key_conflict_on_the_wire(rpc: RawClient) -> None:
    rpc.call("run.begin", runId="run-owned", tenant="t1")
    # Another tenant's run of the id is not this tenant's: answered as an id never used.
    err = rpc.error("run.begin", runId="run-owned", tenant="t2", replay=True)
    pinned(
        err,
        "replay_memory_snapshot_unavailable",
        -32011,
        "no memory snapshot was taken for this run",
        {"runId": "run-owned", "reason": "unknown_run"},
    )
    err = rpc.error("run.begin", runId="never-begun", tenant="t1", replay=True)
    pinned(
        err,
        "replay_memory_snapshot_unavailable",
        -32011,
        "no memory snapshot was taken for this run",
        {"runId": "never-begun", "reason": "unknown_run"},
    )
    params = {"runId": "run-owned", "memoryRef": "ref", "idempotencyKey": "k"}
    first = rpc.call("memory.put", entry={"content": "one"}, **params)
    assert rpc.call("memory.put", entry={"content": "one"}, **params) == first
    err = rpc.error("memory.put", entry={"content": "two"}, **params)
    pinned(
        err,
        "conflict",
        -32009,
        "the idempotency key was used for a different entry",
        {"field": "idempotencyKey"},
    )
    # A refused begin wrote nothing: the run still resumes for its tenant only.
    assert rpc.call("run.begin", runId="run-owned", tenant="t1")["resumed"] is True
    assert rpc.error("run.begin", runId="never-begun", tenant="t1", replay=True).details == {
        "runId": "never-begun",
        "reason": "unknown_run",
    }


@pytest.mark.skipif(selected().name != "sqlite", reason="the SQLite backend's health record")
def test_health_shows_the_storage_record_as_before(rpc: RawClient) -> None:
    storage = rpc.call("sidecar.health")["storage"]
    assert set(storage) == {
        "backend",
        "journalMode",
        "synchronous",
        "schemaVersion",
        "commitSeq",
        "problems",
    }
    assert storage["problems"] == []
    assert storage["backend"] == "sqlite" and storage["journalMode"] == "wal"
    assert storage["synchronous"] == "NORMAL"
    assert storage["schemaVersion"] == sqlite_schema.LATEST_VERSION
    before = storage["commitSeq"]
    rpc.call("run.begin", runId="r", tenant="t")
    assert rpc.call("sidecar.health")["storage"]["commitSeq"] > before
