"""Tenant isolation and memoryRefs (RFC 0004 §C, §F; PROTOCOL.md `memory.issueRef`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.protocol import (
    assert_resolves_to_nothing,
    begin,
    issue,
    listing,
    put,
    tampered,
)
from support.schemas import check_envelope
from support.shared import SharedClient
from support.sidecar import RawClient, RpcError, Sidecar, sidecars_sharing_a_database

A, B = "tenant-a", "tenant-b"
SECRET_CONTENT = "CROSS-TENANT-PAYLOAD-5e1b"


# -- helpers ------------------------------------------------------------------------------


def assert_forbidden(err: RpcError) -> None:
    check_envelope(err.error)
    assert err.code == "forbidden" and err.rpc_code == -32003, err.error
    text = json.dumps(err.error)
    assert SECRET_CONTENT not in text and "tenant-a" not in text, err.error


# -- cross-tenant -------------------------------------------------------------------------


def test_issued_ref_of_another_tenant_is_forbidden(rpc: RawClient) -> None:
    ref_a = issue(rpc, A)
    begin(rpc, "ra", A)
    entry = put(rpc, "ra", ref_a, SECRET_CONTENT, ["t"])
    begin(rpc, "rb", B)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory.list", {"memoryRef": ref_a}),
        ("memory.list", {"memoryRef": ref_a, "options": {"tag": "t", "limit": 5}}),
        ("memory.get", {"memoryRef": ref_a, "id": entry["id"]}),
        ("memory.delete", {"memoryRef": ref_a, "id": entry["id"]}),
        ("memory.put", {"memoryRef": ref_a, "entry": {"content": "from b", "tags": ["b"]}}),
    ]
    for method, params in calls:
        assert_forbidden(rpc.error(method, runId="rb", **params))
    # Also for an ended run of B (served from its persisted snapshot).
    rpc.call("run.end", runId="rb")
    assert_forbidden(rpc.error("memory.list", runId="rb", memoryRef=ref_a))
    assert_forbidden(rpc.error("memory.delete", runId="rb", memoryRef=ref_a, id=entry["id"]))

    # Nothing was written or deleted.
    begin(rpc, "ra2", A)
    assert listing(rpc, "ra2", ref_a) == [entry]
    assert rpc.call("sidecar.stats")["requests"]["memory.put"] == {"ok": 1, "forbidden": 1}


def test_entry_id_of_another_scope_resolves_to_nothing(shared_client: SharedClient) -> None:
    ref = issue(shared_client, A, "one")
    other = issue(shared_client, A, "two")
    begin(shared_client, "w", A)
    entry = put(shared_client, "w", ref, "scoped")
    begin(shared_client, "r", A)
    assert shared_client.call("memory.get", runId="r", memoryRef=other, id=entry["id"]) is None
    assert shared_client.call("memory.get", runId="r", memoryRef="plain", id=entry["id"]) is None
    assert shared_client.call("memory.delete", runId="r", memoryRef=other, id=entry["id"]) is False
    assert shared_client.call("memory.get", runId="r", memoryRef=ref, id=entry["id"]) == entry


def test_the_same_run_id_under_another_tenant_is_another_run(workdir: Path) -> None:
    """Run ids are per tenant: B's run of A's run id is B's own (a fresh snapshot), A's
    keeps its snapshot, and neither answer says the other exists."""
    with Sidecar(workdir) as s, s.client() as c:
        ref = issue(c, A)
        begin(c, "w", A)
        put(c, "w", ref, "before")
        original = begin(c, "shared-id", A)
        replay = c.error("run.begin", runId="shared-id", tenant=B, replay=True)
        assert replay.code == "replay_memory_snapshot_unavailable"
        assert replay.details["reason"] == "unknown_run"  # as for an id nobody used
        theirs = begin(c, "shared-id", B)
        assert theirs["resumed"] is False and theirs["tenant"] == B
        # The run of A still has its snapshot; its issued ref says which run a call means.
        assert begin(c, "shared-id", A) == {**original, "resumed": True}
        assert [e["content"] for e in listing(c, "shared-id", ref)] == ["before"]
    with Sidecar(workdir) as s, s.client() as c:
        assert begin(c, "shared-id", B) == {**theirs, "resumed": True}
        assert begin(c, "shared-id", A) == {**original, "resumed": True}


# -- issued refs --------------------------------------------------------------------------


def test_issued_refs_are_deterministic_and_distinct(shared_client: SharedClient) -> None:
    base = issue(shared_client, A, "agent")
    assert issue(shared_client, A, "agent") == base
    assert issue(shared_client, A, "agent", "default") == base
    distinct = {
        base,
        issue(shared_client, A, "agent", "other-ns"),
        issue(shared_client, A, "agent2"),
        issue(shared_client, B, "agent"),
        issue(shared_client, B, "agent", "other-ns"),
        # Names that would collide under naive concatenation.
        issue(shared_client, A, "x/y", "z"),
        issue(shared_client, A, "x", "y/z"),
        issue(shared_client, A, "x:y", "z"),
        issue(shared_client, A, "x", "y:z"),
        issue(shared_client, "a:b", "c"),
        issue(shared_client, "a", "b:c"),
    }
    assert len(distinct) == 11
    with RawClient(shared_client.path) as unprefixed:  # names at their 128-character limit
        longest = issue(unprefixed, "T" * 128, "A" * 128, "N" * 128)
    unicode = issue(shared_client, "Mandant-ä", "агент", "名前空間")
    for ref in [*distinct, longest, unicode]:
        assert 0 < len(ref) <= 512, ref
        assert not any(ord(ch) < 0x20 for ch in ref), ref
    assert "tenant-a" not in base and "agent" not in base  # opaque: no names inside


def test_tampered_issued_refs_resolve_to_nothing(shared_client: SharedClient) -> None:
    ref = issue(shared_client, A)
    begin(shared_client, "w", A)
    entry = put(shared_client, "w", ref, "the real one", ["t"])
    begin(shared_client, "r", A)
    variants = tampered(ref)
    assert len(variants) > 50
    for bad in variants:
        assert_resolves_to_nothing(shared_client, "r", bad, [entry["id"]])
    # An issued ref of B tampered is nothing too (not forbidden, which would confirm it).
    ref_b = issue(shared_client, B)
    for bad in tampered(ref_b)[::7]:
        assert_resolves_to_nothing(shared_client, "r", bad, [entry["id"]])
    # The real entry is untouched by all of that.
    assert listing(shared_client, "r", ref) == [entry]
    begin(shared_client, "r2", A)
    assert listing(shared_client, "r2", ref) == [entry]


def test_malformed_refs_resolve_to_nothing(shared_client: SharedClient) -> None:
    begin(shared_client, "w", A)
    for bad in ["", "x" * 513, "a\x00b", "a\nb", "a\x7fb", "..", "a/../b", "..\\b", "a/.."]:
        assert_resolves_to_nothing(shared_client, "w", bad, ["mem_any"])
    # At the limit and with dots that are not a `..` segment it is a working plain ref.
    for good in ["x" * 512, "a/..b", "...", "a..b"]:
        put(shared_client, "w", good, "fine")
    begin(shared_client, "r", A)
    assert [e["content"] for e in listing(shared_client, "r", "x" * 512)] == ["fine"]


def test_refs_survive_a_restart(workdir: Path) -> None:
    with Sidecar(workdir) as s, s.client() as c:
        ref = issue(c, A)
        ref_b = issue(c, B)
        begin(c, "w", A)
        entry = put(c, "w", ref, "persisted", ["t"])
    with Sidecar(workdir) as s, s.client() as c:
        assert issue(c, A) == ref
        assert issue(c, B) == ref_b
        begin(c, "r", A)
        assert listing(c, "r", ref) == [entry]
        assert c.call("memory.get", runId="r", memoryRef=ref, id=entry["id"]) == entry
        begin(c, "rb", B)
        assert_forbidden(c.error("memory.list", runId="rb", memoryRef=ref))


def test_refs_are_identical_on_sidecars_sharing_a_database(workdir: Path) -> None:
    with sidecars_sharing_a_database(workdir) as (_a, _b, ca, cb):
        for tenant, agent, ns in [(A, "x", "default"), (B, "x", "n"), (A, "y", "n")]:
            assert issue(ca, tenant, agent, ns) == issue(cb, tenant, agent, ns)
        ref = issue(ca, A)
        begin(ca, "w", A)
        entry = put(ca, "w", ref, "via a")
        begin(cb, "r", A)
        assert listing(cb, "r", ref) == [entry]
        begin(cb, "rb", B)
        assert_forbidden(cb.error("memory.get", runId="rb", memoryRef=ref, id=entry["id"]))
        # A run id begun on A under tenant A is another run under tenant B, on B.
        assert begin(cb, "w", B)["resumed"] is False
        assert listing(cb, "w", ref) == []  # A's ref picks A's run: its snapshot is older


def test_separate_databases_issue_different_refs(workdir: Path) -> None:
    one = Sidecar(workdir, database=workdir / "one.db", socket_path=workdir / "1.sock")
    with one, one.client() as c:
        ref_one = issue(c, A)
    two = Sidecar(workdir, database=workdir / "two.db", socket_path=workdir / "2.sock")
    with two, two.client() as c:
        assert issue(c, A) != ref_one
        begin(c, "r", A)
        # A ref from another host is not valid here (§C): it resolves to nothing.
        assert_resolves_to_nothing(c, "r", ref_one, ["mem_x"])


# -- plain refs ---------------------------------------------------------------------------


@pytest.mark.parametrize("plain", ["notes", "urn:openwop:memory:agent", "mem_a_b_c"])
def test_plain_refs_are_scoped_to_the_runs_tenant(shared_client: SharedClient, plain: str) -> None:
    begin(shared_client, "wa", A)
    begin(shared_client, "wb", B)
    ea = put(shared_client, "wa", plain, "tenant a's note", ["t"])
    eb = put(shared_client, "wb", plain, "tenant b's note", ["t"])
    begin(shared_client, "ra", A)
    begin(shared_client, "rb", B)
    assert listing(shared_client, "ra", plain) == [ea]
    assert listing(shared_client, "rb", plain) == [eb]
    assert shared_client.call("memory.get", runId="rb", memoryRef=plain, id=ea["id"]) is None
    assert shared_client.call("memory.delete", runId="rb", memoryRef=plain, id=ea["id"]) is False
    # A plain ref is not the scope of any issued ref.
    assert listing(shared_client, "ra", issue(shared_client, A, plain)) == []
    begin(shared_client, "ra2", A)
    assert listing(shared_client, "ra2", plain) == [ea]
