"""The thinnest end-to-end slice: a put in one run is seen by the next run only."""

from __future__ import annotations

from support.schemas import check_capabilities, check_entry, check_envelope
from support.sidecar import RawClient


def test_put_then_later_run_reads_it(rpc: RawClient) -> None:
    check_capabilities(rpc.call("host.capabilities"))
    ref = rpc.call("memory.issueRef", tenant="t1", agent="a")["memoryRef"]
    rpc.call("run.begin", runId="w", tenant="t1", secrets=[{"id": "k", "value": "s3cr3t-value-1"}])
    entry = rpc.call(
        "memory.put",
        runId="w",
        memoryRef=ref,
        entry={"content": "x s3cr3t-value-1 y", "tags": ["source:test"]},
    )
    check_entry(entry)
    assert entry["content"] == "x [REDACTED:k] y"
    rpc.call("run.begin", runId="r", tenant="t1")
    assert rpc.call("memory.list", runId="r", memoryRef=ref) == [entry]
    assert rpc.call("memory.list", runId="w", memoryRef=ref) == []
    err = rpc.error("memory.get", runId="nope", memoryRef=ref, id=entry["id"])
    check_envelope(err.error)
    assert err.code == "not_found" and err.details["resource"] == "run"
