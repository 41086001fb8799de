"""The thinnest end-to-end slice: a put in one run is seen by the next run only.

Run twice: with point reads served inline on the event loop (the default) and with every
read on a reader thread, so both read paths answer the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.schemas import check_capabilities, check_entry, check_envelope
from support.sidecar import Sidecar


@pytest.mark.parametrize("inline", ["true", "false"])
def test_put_then_later_run_reads_it(workdir: Path, inline: str) -> None:
    with (
        Sidecar(workdir, "--sqlite-inline-point-reads", inline) as sidecar,
        sidecar.client() as rpc,
    ):
        check_capabilities(rpc.call("host.capabilities"))
        ref = rpc.call("memory.issueRef", tenant="t1", agent="a")["memoryRef"]
        secrets = [{"id": "k", "value": "s3cr3t-value-1"}]
        rpc.call("run.begin", runId="w", tenant="t1", secrets=secrets)
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
        assert rpc.call("memory.get", runId="r", memoryRef=ref, id=entry["id"]) == entry
        assert rpc.call("memory.list", runId="w", memoryRef=ref) == []
        assert rpc.call("memory.get", runId="w", memoryRef=ref, id=entry["id"]) is None
        rpc.call("run.end", runId="r")  # a persisted run: looked up by id, not held open
        assert rpc.call("memory.get", runId="r", memoryRef=ref, id=entry["id"]) == entry
        err = rpc.error("memory.get", runId="nope", memoryRef=ref, id=entry["id"])
        check_envelope(err.error)
        assert err.code == "not_found"
        assert err.details["resource"] == "run"
