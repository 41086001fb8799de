"""Tenant isolation and memoryRefs (RFC 0004 §C, §F; PROTOCOL.md `memory.issueRef`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from support.schemas import check_entry, check_envelope
from support.shared import SharedClient
from support.sidecar import RawClient, RpcError, Sidecar, sidecars_sharing_a_database

A, B = "tenant-a", "tenant-b"
SECRET_CONTENT = "CROSS-TENANT-PAYLOAD-5e1b"
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


# -- helpers ------------------------------------------------------------------------------


def begin(c: RawClient, run: str, tenant: str, **params: Any) -> dict[str, Any]:
    return cast(dict[str, Any], c.call("run.begin", runId=run, tenant=tenant, **params))


def issue(c: RawClient, tenant: str, agent: str = "agent", namespace: str | None = None) -> str:
    params = {"tenant": tenant, "agent": agent}
    if namespace is not None:
        params["namespace"] = namespace
    result = c.call("memory.issueRef", **params)
    assert set(result) == {"memoryRef"}
    return str(result["memoryRef"])


def put(c: RawClient, run: str, ref: str, content: str, tags: list[str] | None = None) -> Any:
    entry: dict[str, Any] = {"content": content}
    if tags is not None:
        entry["tags"] = tags
    result = c.call("memory.put", runId=run, memoryRef=ref, entry=entry)
    check_entry(result)
    return result


def listing(c: RawClient, run: str, ref: str) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], c.call("memory.list", runId=run, memoryRef=ref))


def assert_forbidden(err: RpcError) -> None:
    check_envelope(err.error)
    assert err.code == "forbidden" and err.rpc_code == -32003, err.error
    text = json.dumps(err.error)
    assert SECRET_CONTENT not in text and "tenant-a" not in text, err.error


def assert_resolves_to_nothing(c: RawClient, run: str, ref: str, entry_id: str) -> None:
    assert c.call("memory.list", runId=run, memoryRef=ref) == [], ref
    assert c.call("memory.list", runId=run, memoryRef=ref, options={"tag": "t"}) == [], ref
    assert c.call("memory.get", runId=run, memoryRef=ref, id=entry_id) is None, ref
    assert c.call("memory.delete", runId=run, memoryRef=ref, id=entry_id) is False, ref
    err = c.error("memory.put", runId=run, memoryRef=ref, entry={"content": "nope"})
    check_envelope(err.error)
    assert err.code == "validation_error" and err.rpc_code == -32602, (ref, err.error)
    assert err.details.get("field") == "memoryRef", err.error


def tampered(ref: str) -> list[str]:
    """Every one-character flip after the prefix, plus truncations and appendages."""
    prefix = ref.index(".") + 1
    variants = []
    for i in range(prefix, len(ref)):
        ch = ref[i]
        replacement = B64URL[(B64URL.index(ch) + 1) % 64] if ch in B64URL else "A"
        variants.append(ref[:i] + replacement + ref[i + 1 :])
    variants += [ref[:-1], ref[:-2], ref[:-4], ref[: prefix + 10], ref[:prefix]]
    variants += [ref + "A", ref + "AAAA", ref + "==", ref + "x", ref + " ", ref + "/"]
    return [v for v in dict.fromkeys(variants) if v != ref]


# -- a sidecar shared by this module's tests ----------------------------------------------


@pytest.fixture
def client(shared_sidecar: Sidecar) -> Iterator[SharedClient]:
    """Overrides conftest's ``client``: these tests keep apart by per-test name prefixes."""
    with SharedClient.connect(shared_sidecar) as c:
        yield c


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


def test_entry_id_of_another_scope_resolves_to_nothing(client: SharedClient) -> None:
    ref = issue(client, A, "one")
    other = issue(client, A, "two")
    begin(client, "w", A)
    entry = put(client, "w", ref, "scoped")
    begin(client, "r", A)
    assert client.call("memory.get", runId="r", memoryRef=other, id=entry["id"]) is None
    assert client.call("memory.get", runId="r", memoryRef="plain", id=entry["id"]) is None
    assert client.call("memory.delete", runId="r", memoryRef=other, id=entry["id"]) is False
    assert client.call("memory.get", runId="r", memoryRef=ref, id=entry["id"]) == entry


def test_rebegin_under_another_tenant_is_forbidden(workdir: Path) -> None:
    with Sidecar(workdir) as s, s.client() as c:
        ref = issue(c, A)
        begin(c, "w", A)
        put(c, "w", ref, "before")
        original = begin(c, "shared-id", A)
        assert_forbidden(c.error("run.begin", runId="shared-id", tenant=B))
        assert_forbidden(c.error("run.begin", runId="shared-id", tenant=B, replay=True))
        c.call("run.end", runId="shared-id")
        assert_forbidden(c.error("run.begin", runId="shared-id", tenant=B))
        # The run still belongs to A with its snapshot.
        assert begin(c, "shared-id", A) == {**original, "resumed": True}
        assert [e["content"] for e in listing(c, "shared-id", ref)] == ["before"]
    with Sidecar(workdir) as s, s.client() as c:
        assert_forbidden(c.error("run.begin", runId="shared-id", tenant=B))
        assert begin(c, "shared-id", A) == {**original, "resumed": True}


# -- issued refs --------------------------------------------------------------------------


def test_issued_refs_are_deterministic_and_distinct(client: SharedClient) -> None:
    base = issue(client, A, "agent")
    assert issue(client, A, "agent") == base
    assert issue(client, A, "agent", "default") == base
    distinct = {
        base,
        issue(client, A, "agent", "other-ns"),
        issue(client, A, "agent2"),
        issue(client, B, "agent"),
        issue(client, B, "agent", "other-ns"),
        # Names that would collide under naive concatenation.
        issue(client, A, "x/y", "z"),
        issue(client, A, "x", "y/z"),
        issue(client, A, "x:y", "z"),
        issue(client, A, "x", "y:z"),
        issue(client, "a:b", "c"),
        issue(client, "a", "b:c"),
    }
    assert len(distinct) == 11
    with RawClient(client.path) as unprefixed:  # names at their 128-character limit
        longest = issue(unprefixed, "T" * 128, "A" * 128, "N" * 128)
    unicode = issue(client, "Mandant-ä", "агент", "名前空間")
    for ref in [*distinct, longest, unicode]:
        assert 0 < len(ref) <= 512, ref
        assert not any(ord(ch) < 0x20 for ch in ref), ref
    assert "tenant-a" not in base and "agent" not in base  # opaque: no names inside


def test_tampered_issued_refs_resolve_to_nothing(client: SharedClient) -> None:
    ref = issue(client, A)
    begin(client, "w", A)
    entry = put(client, "w", ref, "the real one", ["t"])
    begin(client, "r", A)
    variants = tampered(ref)
    assert len(variants) > 50
    for bad in variants:
        assert_resolves_to_nothing(client, "r", bad, entry["id"])
    # An issued ref of B tampered is nothing too (not forbidden, which would confirm it).
    ref_b = issue(client, B)
    for bad in tampered(ref_b)[::7]:
        assert_resolves_to_nothing(client, "r", bad, entry["id"])
    # The real entry is untouched by all of that.
    assert listing(client, "r", ref) == [entry]
    begin(client, "r2", A)
    assert listing(client, "r2", ref) == [entry]


def test_malformed_refs_resolve_to_nothing(client: SharedClient) -> None:
    begin(client, "w", A)
    for bad in ["", "x" * 513, "a\x00b", "a\nb", "a\x7fb", "..", "a/../b", "..\\b", "a/.."]:
        assert_resolves_to_nothing(client, "w", bad, "mem_any")
    # At the limit and with dots that are not a `..` segment it is a working plain ref.
    for good in ["x" * 512, "a/..b", "...", "a..b"]:
        put(client, "w", good, "fine")
    begin(client, "r", A)
    assert [e["content"] for e in listing(client, "r", "x" * 512)] == ["fine"]


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
        # A run begun on A under tenant A cannot be re-begun on B under tenant B.
        assert_forbidden(cb.error("run.begin", runId="w", tenant=B))


def test_separate_databases_issue_different_refs(workdir: Path) -> None:
    one = Sidecar(workdir, database=workdir / "one.db", socket_path=workdir / "1.sock")
    with one, one.client() as c:
        ref_one = issue(c, A)
    two = Sidecar(workdir, database=workdir / "two.db", socket_path=workdir / "2.sock")
    with two, two.client() as c:
        assert issue(c, A) != ref_one
        begin(c, "r", A)
        # A ref from another host is not valid here (§C): it resolves to nothing.
        assert_resolves_to_nothing(c, "r", ref_one, "mem_x")


# -- plain refs ---------------------------------------------------------------------------


@pytest.mark.parametrize("plain", ["notes", "urn:openwop:memory:agent", "mem_a_b_c"])
def test_plain_refs_are_scoped_to_the_runs_tenant(client: SharedClient, plain: str) -> None:
    begin(client, "wa", A)
    begin(client, "wb", B)
    ea = put(client, "wa", plain, "tenant a's note", ["t"])
    eb = put(client, "wb", plain, "tenant b's note", ["t"])
    begin(client, "ra", A)
    begin(client, "rb", B)
    assert listing(client, "ra", plain) == [ea]
    assert listing(client, "rb", plain) == [eb]
    assert client.call("memory.get", runId="rb", memoryRef=plain, id=ea["id"]) is None
    assert client.call("memory.delete", runId="rb", memoryRef=plain, id=ea["id"]) is False
    # A plain ref is not the scope of any issued ref.
    assert listing(client, "ra", issue(client, A, plain)) == []
    begin(client, "ra2", A)
    assert listing(client, "ra2", plain) == [ea]
