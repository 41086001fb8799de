"""The wire protocol of PROTOCOL.md against a real sidecar: every method's documented shape,
JSON-RPC 2.0 framing (batches, notifications, pipelining, ids) and protocol abuse (partial
lines, stalls, bad bytes, deep nesting, the request size cap)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.names import uid
from support.polling import eventually
from support.protocol import (
    WIRE_TIME,
    assert_healthy,
    checked_entry,
    error_of,
    later_list,
    new_run,
    notification,
    pipeline,
    put,
    req,
)
from support.schemas import check_capabilities, check_envelope
from support.sidecar import RawClient, Sidecar, module_sidecar

SMALL_MAX = 4096  # --max-request-bytes for the size-cap tests (the flag's minimum is 1024)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with module_sidecar(tmp_path_factory, "psmall", "--max-request-bytes", str(SMALL_MAX)) as s:
        yield s


def health_answer_is_next(client: RawClient, rid: Any = "after") -> dict[str, Any]:
    """Send a health request; the very next line must be its answer (so nothing else came)."""
    client.send_line(req("sidecar.health", {}, rid))
    answer = client.read()
    assert isinstance(answer, dict) and answer.get("id") == rid, answer
    assert answer["result"]["status"] == "ok", answer
    return answer


# -- the documented shape of every method --------------------------------------------------


def test_capabilities_shape(client: RawClient) -> None:
    caps = client.call("host.capabilities")
    check_capabilities(caps)
    assert caps == {
        "capabilities": {
            "agents": {"memoryBackends": ["long-term"]},
            "memory": {
                "supported": True,
                "maxEntrySizeBytes": 65536,
                "ttlSupported": True,
                "writable": True,
                "injectionBudget": {
                    "supported": True,
                    "tokenCounter": "openwop-memory-estimate-1",
                    "approximates": "cl100k_base",
                },
                # The test environment has the search extra (tests/storage/test_semantic.py
                # checks the answer without it).
                "search": {"supported": True, "modes": ["semantic", "filter"]},
                "vendor.openwop-memory.relevance": {
                    "keyword": True,
                    "semantic": True,
                    "embeddingModel": "wordllama-l2_supercat-64",
                    "fusion": "weighted-scores",
                },
                # No admin socket here, so nothing can forget (see test_admin).
                "retention": {"ttl": True, "forget": False},
                # Issue 24: the change feed, memory.changes.
                "vendor.openwop-memory.changes": {"supported": True},
                # Runs as of a past time (run.begin's asOf), within the replay retention.
                "vendor.openwop-memory.asOf": {"supported": True, "retentionSeconds": 604800},
            },
        }
    }


def test_issue_ref_shape_and_determinism(client: RawClient) -> None:
    tenant = uid("t")
    first = client.call("memory.issueRef", tenant=tenant, agent="a")
    assert set(first) == {"memoryRef"}
    ref = first["memoryRef"]
    assert isinstance(ref, str) and 0 < len(ref) <= 512
    assert ref.isprintable()
    # Deterministic; namespace defaults to "default"; every part of the scope matters.
    assert client.call("memory.issueRef", tenant=tenant, agent="a")["memoryRef"] == ref
    same = client.call("memory.issueRef", tenant=tenant, agent="a", namespace="default")
    assert same["memoryRef"] == ref
    others = {
        client.call("memory.issueRef", tenant=tenant, agent="a", namespace="n2")["memoryRef"],
        client.call("memory.issueRef", tenant=tenant, agent="b")["memoryRef"],
        client.call("memory.issueRef", tenant=tenant + "x", agent="a")["memoryRef"],
    }
    assert len(others) == 3 and ref not in others
    # Long names still give a ref within 512 characters.
    long_ref = client.call(
        "memory.issueRef", tenant="t" * 128, agent="a" * 128, namespace="n" * 128
    )
    assert 0 < len(long_ref["memoryRef"]) <= 512


def test_run_begin_shape_resume_and_replay(client: RawClient) -> None:
    run_id = uid()
    first = client.call("run.begin", runId=run_id, tenant="t1")
    assert set(first) == {"runId", "tenant", "snapshotAt", "resumed"}
    assert first["runId"] == run_id and first["tenant"] == "t1"
    assert first["resumed"] is False
    assert WIRE_TIME.match(first["snapshotAt"]), first
    again = client.call("run.begin", runId=run_id, tenant="t1")
    assert again == {**first, "resumed": True}
    assert client.call("run.end", runId=run_id) == {"ended": True}
    # Ended: the persisted snapshot comes back, for a resume and for a replay.
    assert client.call("run.begin", runId=run_id, tenant="t1") == {**first, "resumed": True}
    client.call("run.end", runId=run_id)
    replay = client.call("run.begin", runId=run_id, tenant="t1", replay=True)
    assert replay == {**first, "resumed": True}


def test_run_add_secrets_shape(client: RawClient) -> None:
    run_id = new_run(client, secrets=[{"id": "k0", "value": "value-number-0"}])
    more = [{"id": "k1", "value": "value-number-1"}, {"id": "k2", "value": "value-number-2"}]
    assert client.call("run.addSecrets", runId=run_id, secrets=more) == {"count": 3}
    # Merging what is already there changes nothing; an empty list is a no-op.
    assert client.call("run.addSecrets", runId=run_id, secrets=more) == {"count": 3}
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 3}
    # Secrets given again to run.begin (a resume) merge into the same keyring.
    client.call("run.begin", runId=run_id, tenant="t1", secrets=[{"id": "k3", "value": "v" * 9}])
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 4}


def test_run_end_shape(client: RawClient) -> None:
    run_id = new_run(client)
    assert client.call("run.end", runId=run_id) == {"ended": True}
    assert client.call("run.end", runId=run_id) == {"ended": False}
    assert client.call("run.end", runId=uid("never")) == {"ended": False}


def test_memory_methods_shape(client: RawClient) -> None:
    ref = client.call("memory.issueRef", tenant="t1", agent=uid("agent"))["memoryRef"]
    writer = new_run(client)
    first = put(client, writer, ref, "first", tags=["source:test", "a"])
    assert first["content"] == "first" and first["tags"] == ["source:test", "a"]
    assert "expiresAt" not in first
    second = put(client, writer, ref, "second", expires_at="2099-01-01T00:00:00Z")
    assert second["tags"] == [] and second["expiresAt"] == "2099-01-01T00:00:00.000000Z"
    assert isinstance(first["id"], str) and first["id"] and first["id"] != second["id"]
    # Text order of the wire times is their time order.
    assert first["createdAt"] <= second["createdAt"]

    reader = new_run(client)
    assert client.call("memory.list", runId=reader, memoryRef=ref) == [second, first]
    assert client.call("memory.get", runId=reader, memoryRef=ref, id=first["id"]) == first
    assert client.call("memory.get", runId=reader, memoryRef=ref, id="mem_nope") is None
    assert client.call("memory.delete", runId=reader, memoryRef=ref, id=first["id"]) is True
    assert client.call("memory.delete", runId=reader, memoryRef=ref, id=first["id"]) is False
    assert client.call("memory.delete", runId=reader, memoryRef=ref, id="mem_nope") is False
    # The writer never sees its own writes (they are after its snapshot).
    assert client.call("memory.list", runId=writer, memoryRef=ref) == []
    assert client.call("memory.get", runId=writer, memoryRef=ref, id=first["id"]) is None
    assert later_list(client, ref) == [second]


def test_health_shape(client: RawClient) -> None:
    health = client.call("sidecar.health")
    assert health["status"] == "ok"
    assert {"status", "version", "uptimeSeconds", "storage"} <= set(health)
    assert isinstance(health["version"], str) and health["version"]
    assert isinstance(health["uptimeSeconds"], int | float) and health["uptimeSeconds"] >= 0
    assert isinstance(health["storage"], dict)


def test_stats_count_methods_and_error_codes(client: RawClient) -> None:
    def count(stats: dict[str, Any], method: str, outcome: str) -> int:
        return int(stats["requests"].get(method, {}).get(outcome, 0))

    before = client.call("sidecar.stats")
    client.error("memory.get", runId=uid("never"), memoryRef="x", id="y")
    run_id = new_run(client, secrets=[{"id": "k", "value": "stats-secret-value"}])
    put(client, run_id, uid("ref"), "a stats-secret-value b")
    after = client.call("sidecar.stats")
    assert count(after, "memory.get", "not_found") == count(before, "memory.get", "not_found") + 1
    assert count(after, "memory.put", "ok") == count(before, "memory.put", "ok") + 1
    assert after["redactionsApplied"] == before["redactionsApplied"] + 1
    assert isinstance(after["activeRuns"], int) and after["activeRuns"] >= 1
    assert isinstance(after["entriesSwept"], int)
    assert "stats-secret-value" not in json.dumps(after)


def test_health_and_stats_carry_no_content(client: RawClient) -> None:
    marker = uid("CONTENTMARK")
    run_id = new_run(client, secrets=[{"id": "k", "value": marker + "-secret"}])
    put(client, run_id, marker, f"{marker} {marker}-secret", tags=[marker])
    text = json.dumps([client.call("sidecar.health"), client.call("sidecar.stats")])
    assert marker not in text


# -- ids, batches, notifications -----------------------------------------------------------


@pytest.mark.parametrize("rid", [0, -7, 2**53, "", "abc", "ünï"], ids=repr)
def test_request_id_echoed_exactly(client: RawClient, rid: Any) -> None:
    answer = client.raw(req("sidecar.health", {}, rid))
    assert answer["id"] == rid and type(answer["id"]) is type(rid)
    assert answer["result"]["status"] == "ok"


def test_null_id_is_a_request_not_a_notification(client: RawClient) -> None:
    # JSON-RPC 2.0: a notification is a request *without* an id member; id null is answered.
    answer = client.raw(req("sidecar.health", {}, None))
    assert answer["id"] is None and answer["result"]["status"] == "ok"


def test_batch_of_three_matched_by_id(client: RawClient) -> None:
    run_id = uid()
    batch = [
        {"jsonrpc": "2.0", "id": "b1", "method": "sidecar.health"},
        {
            "jsonrpc": "2.0",
            "id": "b2",
            "method": "run.begin",
            "params": {"runId": run_id, "tenant": "t1"},
        },
        {
            "jsonrpc": "2.0",
            "id": "b3",
            "method": "memory.issueRef",
            "params": {"tenant": "t1", "agent": "a"},
        },
    ]
    answers = client.raw(json.dumps(batch).encode())
    assert isinstance(answers, list) and len(answers) == 3
    by_id = {a["id"]: a for a in answers}
    assert set(by_id) == {"b1", "b2", "b3"}
    assert by_id["b1"]["result"]["status"] == "ok"
    assert by_id["b2"]["result"]["runId"] == run_id
    ref = client.call("memory.issueRef", tenant="t1", agent="a")["memoryRef"]
    assert by_id["b3"]["result"] == {"memoryRef": ref}


def test_batch_with_invalid_members(client: RawClient) -> None:
    batch: list[Any] = [
        {"jsonrpc": "2.0", "id": 1, "method": "sidecar.health"},
        7,
        {"jsonrpc": "2.0", "id": 3},  # no method
        {"jsonrpc": "2.0", "id": 4, "method": "memory.list", "params": {"runId": 5}},
        {"jsonrpc": "2.0", "id": 5, "method": "no.such.method"},
    ]
    answers = client.raw(json.dumps(batch).encode())
    assert isinstance(answers, list) and len(answers) == 5
    ok = [a for a in answers if a.get("id") == 1]
    assert len(ok) == 1 and ok[0]["result"]["status"] == "ok"
    not_requests = [a for a in answers if a.get("id") in (None, 3)]
    assert len(not_requests) == 2
    for answer in not_requests:
        error_of(answer, "validation_error", -32600)
    (bad_params,) = [a for a in answers if a.get("id") == 4]
    error_of(bad_params, "validation_error", -32602)
    (unknown,) = [a for a in answers if a.get("id") == 5]
    assert error_of(unknown, "not_found", -32601).details["resource"] == "method"


def test_batch_of_numbers_gets_one_error_each(client: RawClient) -> None:
    answers = client.raw(b"[1,2,3]")
    assert isinstance(answers, list) and len(answers) == 3
    for answer in answers:
        assert answer["id"] is None
        error_of(answer, "validation_error", -32600)


def test_batch_of_notifications_gets_no_response(client: RawClient) -> None:
    writer = new_run(client)
    ref = uid("ref")
    batch = [
        json.loads(
            notification(
                "memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": f"n{i}"}}
            )
        )
        for i in range(3)
    ]
    client.send_line(json.dumps(batch).encode())
    health_answer_is_next(client)
    # The notifications took effect all the same.
    seen = eventually(lambda: (lambda e: e if len(e) == 3 else None)(later_list(client, ref)))
    assert sorted(e["content"] for e in seen) == ["n0", "n1", "n2"]


def test_batch_answers_only_its_requests(client: RawClient) -> None:
    batch = [
        json.loads(notification("sidecar.health")),
        {"jsonrpc": "2.0", "id": "only", "method": "sidecar.health"},
        json.loads(notification("no.such.method")),
    ]
    answers = client.raw(json.dumps(batch).encode())
    assert isinstance(answers, list) and [a["id"] for a in answers] == ["only"]


def test_notification_gets_no_response_but_takes_effect(client: RawClient) -> None:
    writer = new_run(client)
    ref = uid("ref")
    client.send_line(
        notification("memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": "n"}})
    )
    health_answer_is_next(client)
    seen = eventually(lambda: later_list(client, ref) or None)
    assert [e["content"] for e in seen] == ["n"]


@pytest.mark.parametrize(
    "line",
    [
        notification("no.such.method"),
        notification("memory.list", {"runId": 5}),
        notification("memory.list", {"runId": "never-begun-run", "memoryRef": "x"}),
        notification("memory.put", {"runId": "x", "memoryRef": "x", "entry": {"id": "y"}}),
        notification("sidecar.health", {"unknown": 1}),
    ],
    ids=["unknown-method", "bad-params", "unknown-run", "bad-entry", "unknown-param"],
)
def test_failing_notification_gets_no_response(client: RawClient, line: bytes) -> None:
    client.send_line(line)
    health_answer_is_next(client)


def test_pipelining_fifty_requests(client: RawClient) -> None:
    prefix = uid("pipe")
    lines = [
        req("run.begin", {"runId": f"{prefix}-{i}", "tenant": "t1"}, rid=f"{prefix}-{i}")
        for i in range(50)
    ]
    answers = pipeline(client, lines)
    assert len(answers) == 50
    ids = [a["id"] for a in answers]
    assert sorted(ids) == sorted(f"{prefix}-{i}" for i in range(50))
    for answer in answers:
        assert answer["result"]["runId"] == answer["id"], answer
        assert answer["result"]["resumed"] is False


def test_pipelined_puts_all_committed(client: RawClient) -> None:
    writer = new_run(client)
    ref = uid("ref")
    lines = [
        req("memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": f"p{i}"}}, i)
        for i in range(50)
    ]
    answers = pipeline(client, lines)
    assert sorted(a["id"] for a in answers) == list(range(50))
    for answer in answers:
        assert checked_entry(answer["result"])["content"] == f"p{answer['id']}"
    # Every acknowledged write is inside a snapshot taken afterwards.
    assert len(later_list(client, ref)) == 50


def error_lines(sidecar: Sidecar) -> list[dict[str, Any]]:
    return [line for line in sidecar.log_lines() if line.get("level") in ("error", "critical")]


def test_pipelined_then_disconnect_without_reading(
    shared_sidecar: Sidecar, client: RawClient
) -> None:
    errors_before = len(error_lines(shared_sidecar))
    writer = new_run(client)
    ref = uid("ref")
    with shared_sidecar.client() as quitter:
        quitter.sock.sendall(
            b"".join(
                req("memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": "q"}}, i)
                + b"\n"
                for i in range(200)
            )
        )
    assert_healthy(shared_sidecar)
    # Whatever of it ran is whole; nothing went wrong inside the sidecar.
    seen = later_list(client, ref, limit=1000)
    assert len(seen) <= 200 and all(e["content"] == "q" for e in seen)
    assert len(error_lines(shared_sidecar)) == errors_before


def test_many_pipelined_requests_with_a_slow_reader(client: RawClient) -> None:
    count = 5000
    lines = b"".join(req("sidecar.health", {}, i) + b"\n" for i in range(count))
    sender = threading.Thread(target=client.sock.sendall, args=(lines,))
    sender.start()
    try:
        time.sleep(0.2)  # let answers pile up unread
        ids = [client.read()["id"] for _ in range(count)]
    finally:
        sender.join(30)
    assert sorted(ids) == list(range(count))
    health_answer_is_next(client)


def test_blank_lines_are_ignored(client: RawClient) -> None:
    client.sock.sendall(b"\n\n   \n\t\n\r\n")
    health_answer_is_next(client, rid="after-blanks")


def test_crlf_line_endings(client: RawClient) -> None:
    client.sock.sendall(
        req("sidecar.health", {}, "crlf-1")
        + b"\r\n"
        + req("sidecar.health", {}, "crlf-2")
        + b"\r\n"
    )
    answers = [client.read(), client.read()]
    assert sorted(a["id"] for a in answers) == ["crlf-1", "crlf-2"]
    assert all(a["result"]["status"] == "ok" for a in answers)


def test_half_line_then_disconnect_harms_no_one(shared_sidecar: Sidecar, client: RawClient) -> None:
    ref = uid("ref")
    for _ in range(5):
        with shared_sidecar.client() as quitter:
            writer = client.call("run.begin", runId=uid(), tenant="t1")["runId"]
            half = req("memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": "h"}})
            quitter.sock.sendall(half[: len(half) // 2])
            assert client.call("sidecar.health")["status"] == "ok"
    # Others are served normally, and the half lines were never executed.
    assert later_list(client, ref) == []
    assert_healthy(shared_sidecar)
    assert "internal_error" not in shared_sidecar.log()


def test_half_line_stall_does_not_block_others(shared_sidecar: Sidecar, client: RawClient) -> None:
    writer = new_run(client)
    ref = uid("ref")
    line = req("memory.put", {"runId": writer, "memoryRef": ref, "entry": {"content": "s"}}, "s")
    with shared_sidecar.client(timeout=10) as staller:
        staller.sock.sendall(line[:20])
        # Another connection does real work while the first one stalls mid-line.
        with shared_sidecar.client() as other:
            other_run = new_run(other)
            put(other, other_run, uid("ref"), "meanwhile")
            assert other.call("sidecar.health")["status"] == "ok"
        # The stalled request is still pending, not executed and not rejected.
        assert later_list(client, ref) == []
        staller.sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            staller.sock.recv(1)
        staller.sock.settimeout(10)
        staller.sock.sendall(line[20:] + b"\n")
        answer = staller.read()
    assert answer["id"] == "s" and answer["result"]["content"] == "s"


# -- bad bytes and odd JSON ------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health","params":{"x":"\xff\xfe"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.h\xc3ealth"}',
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health","params":{"x":"\xed\xa0\x80"}}',
    ],
    ids=["ff-fe", "truncated-sequence", "encoded-surrogate"],
)
def test_invalid_utf8_is_a_parse_error(client: RawClient, line: bytes) -> None:
    answer = client.raw(line)
    assert answer["id"] is None
    error_of(answer, "validation_error", -32700)
    health_answer_is_next(client)


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "a\\ud800b", "\\ud800\\ud800"])
def test_lone_surrogate_escape_is_a_clean_error(client: RawClient, escape: str) -> None:
    writer = new_run(client)
    ref = uid("ref")
    params = {"runId": writer, "memoryRef": ref, "entry": {"content": "PLACEHOLDER"}}
    line = req("memory.put", params, "sur").replace(b"PLACEHOLDER", escape.encode())
    assert escape.encode() in line
    answer = client.raw(line)
    assert "error" in answer, answer
    check_envelope(answer["error"])
    # A parse error (-32700) or a params error (-32602) are both clean; internal_error is not.
    assert answer["error"]["data"]["error"] == "validation_error", answer
    assert answer["error"]["code"] in (-32700, -32602), answer
    assert later_list(client, ref) == []
    health_answer_is_next(client)


def test_paired_surrogate_escape_is_accepted(client: RawClient) -> None:
    writer = new_run(client)
    line = req("memory.put", {"runId": writer, "memoryRef": uid(), "entry": {"content": "x"}})
    line = line.replace(b'"x"', b'"\\ud83d\\ude00"')
    answer = client.raw(line)
    assert answer["result"]["content"] == "\U0001f600"


@pytest.mark.parametrize(
    "literal", ["123456789012345678901234567890", "-123456789012345678901234567890", "1e400"]
)
def test_huge_numbers_never_crash(shared_sidecar: Sidecar, client: RawClient, literal: str) -> None:
    run_id = new_run(client)
    params = {"runId": run_id, "memoryRef": "x", "options": {"limit": 424242}}
    as_limit = req("memory.list", params, "n").replace(b"424242", literal.encode())
    answer = client.raw(as_limit)
    if "error" in answer:
        assert answer["error"]["data"]["error"] == "validation_error", answer
        check_envelope(answer["error"])
    else:
        # A number this large is "above the host maximum": capped, not rejected.
        assert literal[0].isdigit() and answer["result"] == []
    as_id = req("sidecar.health", None, 424242).replace(b"424242", literal.encode())
    answer = client.raw(as_id)
    if "error" in answer:
        error_of(answer, "validation_error", answer["error"]["code"])
        assert answer["error"]["code"] in (-32700, -32600)
    else:
        assert answer["id"] == json.loads(literal)
    health_answer_is_next(client)
    assert_healthy(shared_sidecar)


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b"{" + b'"a":{' * 50_000 + b"}" * 50_001,
        b'{"jsonrpc":"2.0","id":1,"method":"memory.list","params":{"runId":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
    ],
    ids=["open-arrays", "balanced-arrays", "objects", "inside-params"],
)
def test_deep_nesting_does_not_crash(
    shared_sidecar: Sidecar, client: RawClient, line: bytes
) -> None:
    answer = client.raw(line)
    responses = answer if isinstance(answer, list) else [answer]
    for response in responses:
        assert response["error"]["data"]["error"] == "validation_error", response
        check_envelope(response["error"])
    health_answer_is_next(client)
    assert_healthy(shared_sidecar)


# -- the request size cap (sidecar started with --max-request-bytes 4096) --------------------


def padded(rid: str, size: int) -> bytes:
    """A health request line of exactly ``size`` bytes (JSON whitespace as padding)."""
    base = req("sidecar.health", {}, rid)
    assert len(base) < size
    return base[:-1] + b" " * (size - len(base)) + b"}"


def test_line_of_exactly_max_bytes_is_served(small: Sidecar) -> None:
    # Reading: "a request line longer than max_request_bytes" counts the line's bytes without
    # its terminating newline.
    with small.client() as c:
        line = padded("exact", SMALL_MAX)
        assert len(line) == SMALL_MAX
        answer = c.raw(line)
        assert answer["id"] == "exact" and answer["result"]["status"] == "ok"


def test_line_one_byte_over_is_rejected_and_connection_survives(small: Sidecar) -> None:
    with small.client() as c:
        answer = c.raw(padded("over", SMALL_MAX + 1))
        assert answer["id"] is None
        err = error_of(answer, "validation_error", -32600)
        assert err.details.get("field") == "request"
        follow = c.raw(req("sidecar.health", {}, "next"))
        assert follow["id"] == "next" and follow["result"]["status"] == "ok"


@pytest.mark.parametrize("split", [False, True], ids=["one-write", "slow-writes"])
def test_oversized_tail_is_discarded_not_executed(small: Sidecar, split: bool) -> None:
    # The tail of an oversized line is itself a complete request: it must not run.
    hidden = req("sidecar.health", {}, "hidden")
    line = b" " * (SMALL_MAX + 100) + hidden
    with small.client() as c:
        if split:
            for start in range(0, len(line), 1000):
                c.sock.sendall(line[start : start + 1000])
                time.sleep(0.01)
            c.sock.sendall(b"\n")
        else:
            c.send_line(line)
        answer = c.read()
        assert answer["id"] is None
        error_of(answer, "validation_error", -32600)
        follow = c.raw(req("sidecar.health", {}, "next"))
        assert follow["id"] == "next", follow


def test_oversized_line_between_requests_in_one_write(small: Sidecar) -> None:
    with small.client() as c:
        c.sock.sendall(
            req("sidecar.health", {}, "before")
            + b"\n"
            + b'{"jsonrpc":"2.0","id":"big","method":"sidecar.health","pad":"'
            + b"x" * (3 * SMALL_MAX)
            + b'"}\n'
            + req("sidecar.health", {}, "after")
            + b"\n"
        )
        answers = [c.read() for _ in range(3)]
    by_id = {a["id"]: a for a in answers}
    assert set(by_id) == {"before", None, "after"}, answers
    assert by_id["before"]["result"]["status"] == "ok"
    assert by_id["after"]["result"]["status"] == "ok"
    error_of(by_id[None], "validation_error", -32600)


def test_huge_line_without_newline_then_disconnect(small: Sidecar) -> None:
    for _ in range(3):
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            raw.settimeout(10)
            raw.connect(str(small.socket))
            raw.sendall(b"{" * (SMALL_MAX * 8))
        finally:
            raw.close()
    assert_healthy(small)
    assert "internal_error" not in small.log()
