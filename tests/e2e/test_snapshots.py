"""Snapshot isolation and replay (RFC 0004 §A, PROTOCOL.md `run.begin`, `memory.*`).

Every test runs against a real ``openwop-memory serve`` process on a real SQLite file.
Commit order is read back from the database file (read-only) where the wire cannot show it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.on_disk import query
from support.protocol import (
    TENANT,
    assert_run_not_found,
    begin,
    delete,
    get,
    issue,
    listing,
    put,
)
from support.schemas import check_envelope
from support.shared import SharedClient
from support.sidecar import Pair, RpcError, Sidecar, sidecars_sharing_a_database

# -- helpers ------------------------------------------------------------------------------


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


def pipelined(c: SharedClient, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Send every request in one write (the sidecar handles them concurrently); results
    in request order. Raises on any error response."""
    first = c.next_id + 1
    lines = []
    for method, unscoped in requests:
        params = c.scoped(unscoped)
        c.next_id += 1
        lines.append(
            json.dumps({"jsonrpc": "2.0", "id": c.next_id, "method": method, "params": params})
        )
    c.sock.sendall(("\n".join(lines) + "\n").encode())
    by_id: dict[int, Any] = {}
    for _ in requests:
        response = c.read()
        by_id[response["id"]] = response
    results = []
    for i in range(len(requests)):
        response = by_id[first + i]
        if "error" in response:
            raise RpcError(response["error"])
        results.append(response["result"])
    return results


def commit_seqs(database: Path, entry_ids: list[str]) -> dict[str, int]:
    """Each entry's commit sequence number, read from the database file (read-only)."""
    marks = ",".join("?" * len(entry_ids))
    rows = query(database, f"SELECT id, seq FROM entries WHERE id IN ({marks})", tuple(entry_ids))
    return {str(i): int(s) for i, s in rows}


# -- isolation ----------------------------------------------------------------------------


def test_writes_by_other_runs_after_begin_are_invisible(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "writer")
    before = put(shared_client, "writer", ref, "written before the reader began", ["k"])
    reader = begin(shared_client, "reader")
    after = put(shared_client, "writer", ref, "written after the reader began", ["k"])
    # The RFC's predicate, in wire times: inside the snapshot createdAt <= snapshotAt.
    assert before["createdAt"] <= reader["snapshotAt"] <= after["createdAt"]

    assert listing(shared_client, "reader", ref) == [before]
    assert listing(shared_client, "reader", ref, tag="k") == [before]
    assert get(shared_client, "reader", ref, before["id"]) == before
    assert get(shared_client, "reader", ref, after["id"]) is None

    begin(shared_client, "later")
    assert listing(shared_client, "later", ref) == [after, before]


def test_a_run_does_not_see_its_own_writes(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "self")
    mine = put(shared_client, "self", ref, "my own note", ["mine"])
    assert listing(shared_client, "self", ref) == []
    assert listing(shared_client, "self", ref, tag="mine") == []
    assert get(shared_client, "self", ref, mine["id"]) is None
    # Re-beginning the same run keeps its snapshot, so the write stays invisible to it.
    assert begin(shared_client, "self")["resumed"] is True
    assert listing(shared_client, "self", ref) == []
    begin(shared_client, "next")
    assert listing(shared_client, "next", ref) == [mine]


def test_delete_after_begin_does_not_change_the_snapshot(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    kept = put(shared_client, "w", ref, "kept")
    doomed = put(shared_client, "w", ref, "deleted later", ["gone"])
    begin(shared_client, "old-reader")
    begin(shared_client, "deleter")

    assert delete(shared_client, "deleter", ref, doomed["id"]) is True
    assert delete(shared_client, "deleter", ref, doomed["id"]) is False  # already deleted

    # The older snapshot still holds the entry, by list, tag list and get.
    assert listing(shared_client, "old-reader", ref) == [doomed, kept]
    assert listing(shared_client, "old-reader", ref, tag="gone") == [doomed]
    assert get(shared_client, "old-reader", ref, doomed["id"]) == doomed
    # So does the deleter's own snapshot (deleting mid-run is not retroactive, RFC §A).
    assert listing(shared_client, "deleter", ref) == [doomed, kept]
    assert get(shared_client, "deleter", ref, doomed["id"]) == doomed

    begin(shared_client, "new-reader")
    assert listing(shared_client, "new-reader", ref) == [kept]
    assert listing(shared_client, "new-reader", ref, tag="gone") == []
    assert get(shared_client, "new-reader", ref, doomed["id"]) is None


def test_delete_of_an_entry_newer_than_the_callers_snapshot(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "early")
    begin(shared_client, "w")
    newer = put(shared_client, "w", ref, "written after early began")
    assert get(shared_client, "early", ref, newer["id"]) is None
    # The live store is meant: early may delete what it cannot see.
    assert delete(shared_client, "early", ref, newer["id"]) is True
    assert delete(shared_client, "early", ref, newer["id"]) is False
    begin(shared_client, "after-delete")
    assert listing(shared_client, "after-delete", ref) == []
    assert delete(shared_client, "w", ref, "mem_no_such_entry") is False


# -- ordering, tags, limit ----------------------------------------------------------------


def test_newest_first_and_created_at_non_decreasing(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    written = [put(shared_client, "w", ref, f"note {i}") for i in range(6)]
    created = [e["createdAt"] for e in written]
    assert created == sorted(created), "createdAt went backwards in commit order"
    begin(shared_client, "r")
    assert listing(shared_client, "r", ref) == written[::-1]


@pytest.mark.sqlite_only
def test_ties_in_created_at_are_listed_in_commit_order(
    shared_sidecar: Sidecar, shared_client: SharedClient
) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    written: list[dict[str, Any]] = []
    # Puts sent at once on many connections start in the same turn of the sidecar's loop,
    # so they share group commits, which stamp one createdAt. (One connection's pipelined
    # lines start one per turn: the fairness gate's rule.)
    connections = [SharedClient(shared_client.path, shared_client.prefix) for _ in range(40)]
    try:
        for burst in range(3):
            for i, conn in enumerate(connections):
                params = conn.scoped(
                    {"runId": "w", "memoryRef": ref, "entry": {"content": f"b{burst} n{i}"}}
                )
                line = {"jsonrpc": "2.0", "id": i, "method": "memory.put", "params": params}
                conn.sock.sendall(json.dumps(line).encode() + b"\n")
            for conn in connections:
                response = conn.read()
                assert "result" in response, response
                written.append(response["result"])
    finally:
        for conn in connections:
            conn.close()
    begin(shared_client, "r")
    listed = listing(shared_client, "r", ref, limit=1000)
    assert sorted(ids(listed)) == sorted(ids(written))
    seqs = commit_seqs(shared_sidecar.database, ids(written))
    by_commit = sorted(written, key=lambda e: seqs[e["id"]])
    created = [e["createdAt"] for e in by_commit]
    assert created == sorted(created), "createdAt is not non-decreasing in commit order"
    assert ids(listed) == ids(by_commit[::-1]), "list is not newest first, ties in commit order"
    assert len(set(created)) < len(created), "no createdAt tie happened; the tie rule is untested"


def test_tag_filter_is_set_membership(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    ab = put(shared_client, "w", ref, "ab", ["a", "b"])
    b = put(shared_client, "w", ref, "b", ["b", "source:b"])
    put(shared_client, "w", ref, "c", ["c", "ab", "A"])
    none = put(shared_client, "w", ref, "untagged")
    begin(shared_client, "r")
    late = put(shared_client, "w", ref, "late b", ["b"])  # outside r's snapshot

    assert listing(shared_client, "r", ref, tag="b") == [b, ab]
    # Exact, case-sensitive, not a substring:
    assert listing(shared_client, "r", ref, tag="a") == [ab]
    assert listing(shared_client, "r", ref, tag="source:b") == [b]
    assert listing(shared_client, "r", ref, tag="source") == []
    assert listing(shared_client, "r", ref, tag="zzz") == []
    assert none in listing(shared_client, "r", ref)
    assert listing(shared_client, "r", ref, tag="b", limit=1) == [b]
    begin(shared_client, "r2")
    assert listing(shared_client, "r2", ref, tag="b") == [late, b, ab]


def test_limit_and_host_default(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    written = pipelined(
        shared_client,
        [
            ("memory.put", {"runId": "w", "memoryRef": ref, "entry": {"content": f"n{i}"}})
            for i in range(105)
        ],
    )
    begin(shared_client, "r")
    everything = listing(shared_client, "r", ref, limit=1000)
    assert sorted(ids(everything)) == sorted(ids(written))
    assert listing(shared_client, "r", ref, limit=3) == everything[:3]
    assert listing(shared_client, "r", ref, limit=1) == everything[:1]
    assert listing(shared_client, "r", ref) == everything[:100]  # host default 100
    assert listing(shared_client, "r", ref, limit=0) == everything[:100]  # 0 means the default
    # Capped at 1000, not an error:
    assert listing(shared_client, "r", ref, limit=5000) == everything


# -- replay -------------------------------------------------------------------------------


def test_ended_run_still_reads_its_snapshot_and_resumes(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    a = put(shared_client, "w", ref, "a", ["x"])
    b = put(shared_client, "w", ref, "b", ["x"])
    first = begin(shared_client, "replayed")
    assert first["resumed"] is False and first["tenant"] == TENANT
    before = listing(shared_client, "replayed", ref)
    assert before == [b, a]
    assert shared_client.call("run.end", runId="replayed") == {"ended": True}
    assert shared_client.call("run.end", runId="replayed") == {"ended": False}

    # Ended: list and get still answer from the persisted snapshot.
    assert listing(shared_client, "replayed", ref) == before
    assert get(shared_client, "replayed", ref, a["id"]) == a

    begin(shared_client, "mutator")
    c = put(shared_client, "mutator", ref, "c", ["x"])
    assert delete(shared_client, "mutator", ref, a["id"]) is True
    # Deletes through an ended run still work (any persisted run may delete).
    assert delete(shared_client, "replayed", ref, b["id"]) is True

    assert listing(shared_client, "replayed", ref) == before
    assert listing(shared_client, "replayed", ref, tag="x") == before
    assert get(shared_client, "replayed", ref, c["id"]) is None

    again = begin(shared_client, "replayed")
    assert again == {**first, "resumed": True}
    assert listing(shared_client, "replayed", ref) == before
    assert get(shared_client, "replayed", ref, a["id"]) == a
    shared_client.call("run.end", runId="replayed")

    replay = begin(shared_client, "replayed", replay=True)
    assert replay == {**first, "resumed": True}
    assert listing(shared_client, "replayed", ref) == before
    # A replay flag on an open run is the same resume.
    assert begin(shared_client, "replayed", replay=True) == replay

    begin(shared_client, "fresh")
    assert listing(shared_client, "fresh", ref) == [c]


def test_put_after_run_end_is_not_found_until_begun_again(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "p")
    put(shared_client, "p", ref, "one")
    shared_client.call("run.end", runId="p")
    err = shared_client.error("memory.put", runId="p", memoryRef=ref, entry={"content": "TWO-c0de"})
    assert_run_not_found(err)
    assert "TWO-c0de" not in json.dumps(err.error)
    assert begin(shared_client, "p")["resumed"] is True
    two = put(shared_client, "p", ref, "TWO-c0de")
    begin(shared_client, "r")
    assert [e["content"] for e in listing(shared_client, "r", ref)] == ["TWO-c0de", "one"]
    assert get(shared_client, "r", ref, two["id"]) == two


def test_never_begun_run_is_not_found_for_every_method(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory.list", {"memoryRef": ref}),
        ("memory.get", {"memoryRef": ref, "id": "mem_x"}),
        ("memory.delete", {"memoryRef": ref, "id": "mem_x"}),
        ("memory.put", {"memoryRef": ref, "entry": {"content": "x"}}),
        ("run.addSecrets", {"secrets": [{"id": "k", "value": "0123456789"}]}),
    ]
    for method, params in calls:
        assert_run_not_found(shared_client.error(method, runId="never-begun", **params))
    err = shared_client.error("run.begin", runId="never-begun", tenant=TENANT, replay=True)
    check_envelope(err.error)
    assert err.code == "replay_memory_snapshot_unavailable" and err.rpc_code == -32011
    assert err.details == {"runId": "never-begun", "reason": "unknown_run"}
    assert shared_client.call("run.end", runId="never-begun") == {"ended": False}
    # The failed replay did not take a snapshot.
    assert_run_not_found(shared_client.error("memory.list", runId="never-begun", memoryRef=ref))


def test_snapshots_survive_a_restart(workdir: Path) -> None:
    with Sidecar(workdir) as first, first.client() as c:
        ref = issue(c)
        begin(c, "w")
        a = put(c, "w", ref, "a", ["t"])
        b = put(c, "w", ref, "b", ["t"])
        opened = begin(c, "survivor")
        begin(c, "ended-before-stop")
        before = listing(c, "survivor", ref)
        assert before == [b, a]
        c.call("run.end", runId="ended-before-stop")
        begin(c, "mutator")
        put(c, "mutator", ref, "after survivor began")
        assert delete(c, "mutator", ref, a["id"]) is True
    assert first.proc is not None and first.proc.returncode == 0

    with Sidecar(workdir) as second, second.client() as c:
        assert issue(c) == ref
        # Readable before being begun in this process (the snapshot is persisted).
        assert listing(c, "survivor", ref) == before
        assert get(c, "survivor", ref, a["id"]) == a
        assert listing(c, "ended-before-stop", ref) == before
        # put needs the run open in this process.
        assert_run_not_found(
            c.error("memory.put", runId="survivor", memoryRef=ref, entry={"content": "x"})
        )
        assert begin(c, "survivor") == {**opened, "resumed": True}
        assert listing(c, "survivor", ref, tag="t") == before
        replayed = begin(c, "ended-before-stop", replay=True)
        assert replayed["resumed"] is True
        assert listing(c, "ended-before-stop", ref) == before
        put(c, "survivor", ref, "now it may write")
        begin(c, "post-restart")
        assert [e["content"] for e in listing(c, "post-restart", ref)] == [
            "now it may write",
            "after survivor began",
            "b",
        ]
        # The replayed snapshot is unchanged by that write too.
        assert listing(c, "survivor", ref) == before


def test_concurrent_begins_of_one_run_share_one_snapshot(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    begin(shared_client, "w")
    seen = put(shared_client, "w", ref, "before")
    answers = pipelined(
        shared_client, [("run.begin", {"runId": "raced", "tenant": TENANT}) for _ in range(12)]
    )
    assert len({a["snapshotAt"] for a in answers}) == 1, answers
    assert [a["resumed"] for a in answers].count(False) == 1, answers
    assert listing(shared_client, "raced", ref) == [seen]


def test_an_evicted_run_keeps_its_snapshot(workdir: Path) -> None:
    with Sidecar(workdir, "--max-open-runs", "2") as s, s.client() as c:
        ref = issue(c)
        begin(c, "w")
        a = put(c, "w", ref, "a")
        first = begin(c, "evicted", secrets=[{"id": "k", "value": "evicted-secret-1"}])
        begin(c, "other-1")
        begin(c, "other-2")  # three opened, room for two: "evicted" is least recently used
        assert c.call("sidecar.stats")["activeRuns"] == 2
        # Persisted, so readable; not open, so put is not_found until begun again.
        assert listing(c, "evicted", ref) == [a]
        err = c.error("memory.put", runId="evicted", memoryRef=ref, entry={"content": "x"})
        assert_run_not_found(err)
        put(c, "other-2", ref, "after evicted began")
        again = begin(c, "evicted", secrets=[{"id": "k", "value": "evicted-secret-1"}])
        assert again == {**first, "resumed": True}
        assert listing(c, "evicted", ref) == [a]
        redacted = put(c, "evicted", ref, "evicted-secret-1")
        assert redacted["content"] == "[REDACTED:k]"


# -- two processes, one database ----------------------------------------------------------


@pytest.fixture
def pair(workdir: Path) -> Iterator[Pair]:
    with sidecars_sharing_a_database(workdir) as sidecars:
        yield sidecars


@pytest.mark.sqlite_only
def test_two_sidecars_share_commit_order(pair: Pair) -> None:
    a, _b, ca, cb = pair
    ref = issue(ca)
    assert issue(cb) == ref
    begin(ca, "wa")
    acknowledged = put(ca, "wa", ref, "acknowledged by A before B's run began", ["s"])
    on_b = begin(cb, "rb")
    assert on_b["resumed"] is False
    too_late = put(ca, "wa", ref, "written by A after B's run began", ["s"])
    assert listing(cb, "rb", ref) == [acknowledged]
    assert listing(cb, "rb", ref, tag="s") == [acknowledged]
    assert get(cb, "rb", ref, too_late["id"]) is None

    # Writes through both processes interleave in one commit order.
    begin(cb, "wb")
    mixed = []
    for i in range(4):
        mixed.append(put(ca if i % 2 == 0 else cb, "wa" if i % 2 == 0 else "wb", ref, f"m{i}"))
    created = [e["createdAt"] for e in mixed]
    assert created == sorted(created)
    begin(ca, "ra")
    assert listing(ca, "ra", ref)[:4] == mixed[::-1]
    seqs = commit_seqs(a.database, ids(mixed))
    assert [seqs[e["id"]] for e in mixed] == sorted(seqs.values())


def test_begins_racing_on_two_sidecars_share_one_snapshot(pair: Pair) -> None:
    _a, _b, ca, cb = pair
    for c in (ca, cb):
        c.next_id += 1
        line = {"jsonrpc": "2.0", "id": c.next_id, "method": "run.begin"}
        line["params"] = {"runId": "raced", "tenant": TENANT}
        c.sock.sendall(json.dumps(line).encode() + b"\n")
    answers = [ca.read()["result"], cb.read()["result"]]
    assert answers[0]["snapshotAt"] == answers[1]["snapshotAt"], answers
    assert sorted(a["resumed"] for a in answers) == [False, True], answers


def test_run_begun_on_one_sidecar_is_readable_on_the_other(pair: Pair) -> None:
    _a, _b, ca, cb = pair
    ref = issue(ca)
    begin(ca, "w")
    x = put(ca, "w", ref, "x")
    y = put(ca, "w", ref, "y")
    on_a = begin(ca, "ra")
    seen_on_a = listing(ca, "ra", ref)
    put(ca, "w", ref, "z after ra began")
    assert listing(cb, "ra", ref) == seen_on_a == [y, x]
    assert get(cb, "ra", ref, x["id"]) == x

    # put needs the run open in the process that receives it.
    err = cb.error("memory.put", runId="ra", memoryRef=ref, entry={"content": "via b"})
    assert_run_not_found(err)
    assert begin(cb, "ra") == {**on_a, "resumed": True}
    via_b = put(cb, "ra", ref, "via b")
    # Deleting through B with A's run works; A's snapshot of ra is unchanged.
    assert delete(cb, "ra", ref, x["id"]) is True
    assert listing(ca, "ra", ref) == [y, x]
    begin(ca, "ra2")
    assert via_b in listing(ca, "ra2", ref)
    assert get(ca, "ra2", ref, x["id"]) is None
