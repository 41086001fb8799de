"""Every error code of PROTOCOL.md's table that a client can provoke, with its JSON-RPC code,
its envelope and its details; and the rule that no error carries content or a secret."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.names import uid
from support.protocol import (
    assert_healthy,
    error_of,
    expect,
    invalid,
    issue,
    later_list,
    new_run,
    pipeline,
    put,
    raw_answer,
    req,
)
from support.schemas import check_envelope
from support.sidecar import RawClient, Sidecar, module_sidecar


@pytest.fixture(scope="module")
def rejecting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    with module_sidecar(tmp_path_factory, "reject", "--redaction", "reject") as s:
        yield s


# -- validation_error: -32700 bad JSON ----------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b'{"jsonrpc":"2.0","id":1,"method":',
        b"nul",
        b"{'jsonrpc':'2.0','id':1,'method':'sidecar.health'}",
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health",}',
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health"} {"jsonrpc":"2.0"}',
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health","params":{"a":NaN}}',
        b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health\x01"}',
        b"\xff\xfe\xfd",
        b"\xef\xbb\xbf" + b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health"}',
    ],
    ids=[
        "open-brace",
        "truncated",
        "bad-literal",
        "single-quotes",
        "trailing-comma",
        "two-values",
        "nan",
        "raw-control-char",
        "invalid-utf8",
        "utf8-bom",
    ],
)
def test_parse_error(client: RawClient, line: bytes) -> None:
    answer = client.raw(line)
    assert answer["id"] is None, answer
    error_of(answer, "validation_error", -32700)
    assert client.call("sidecar.health")["status"] == "ok"  # the connection is still usable


# -- validation_error: -32600 not a request ------------------------------------------------


@pytest.mark.parametrize(
    ("request_obj", "field"),
    [
        (5, "request"),
        ("sidecar.health", "request"),
        (None, "request"),
        ({"id": 1, "method": "sidecar.health"}, "jsonrpc"),
        ({"jsonrpc": "1.0", "id": 1, "method": "sidecar.health"}, "jsonrpc"),
        ({"jsonrpc": 2.0, "id": 1, "method": "sidecar.health"}, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1}, "method"),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, "method"),
        ({"jsonrpc": "2.0", "id": 1, "method": None}, "method"),
        ({"jsonrpc": "2.0", "id": 1, "method": "sidecar.health", "params": []}, "params"),
        ({"jsonrpc": "2.0", "id": 1, "method": "sidecar.health", "params": [1]}, "params"),
        ({"jsonrpc": "2.0", "id": 1, "method": "sidecar.health", "params": "x"}, "params"),
        ({"jsonrpc": "2.0", "id": 1, "method": "sidecar.health", "params": None}, "params"),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "sidecar.health"}, "id"),
        ({"jsonrpc": "2.0", "id": [1], "method": "sidecar.health"}, "id"),
        ({"jsonrpc": "2.0", "id": True, "method": "sidecar.health"}, "id"),
        ({"jsonrpc": "2.0", "id": 1.5, "method": "sidecar.health"}, "id"),
    ],
    ids=repr,
)
def test_not_a_request(client: RawClient, request_obj: Any, field: str) -> None:
    answer = client.raw(json.dumps(request_obj).encode())
    err = error_of(answer, "validation_error", -32600)
    assert err.details.get("field") == field, err.error
    # JSON-RPC 2.0: the id is echoed when it could be read (every case here but a bad id
    # has id 1), else null.
    given = request_obj.get("id") if isinstance(request_obj, dict) else None
    assert answer["id"] == (None if field == "id" else given), answer
    assert client.call("sidecar.health")["status"] == "ok"


def test_empty_batch(client: RawClient) -> None:
    answer = client.raw(b"[]")
    assert isinstance(answer, dict) and answer["id"] is None, answer
    error_of(answer, "validation_error", -32600)


def test_batch_member_that_is_a_batch(client: RawClient) -> None:
    answers = client.raw(b'[[{"jsonrpc":"2.0","id":1,"method":"sidecar.health"}]]')
    assert isinstance(answers, list) and len(answers) == 1
    assert answers[0]["id"] is None
    error_of(answers[0], "validation_error", -32600)


def test_invalid_request_without_id_is_still_answered(client: RawClient) -> None:
    # It cannot be told apart from a notification, so JSON-RPC 2.0 answers it with id null.
    answer = client.raw(b'{"jsonrpc":"2.0","method":5}')
    assert answer["id"] is None
    error_of(answer, "validation_error", -32600)


# -- validation_error: -32602 bad params ---------------------------------------------------


def test_bad_params(client: RawClient) -> None:
    err = invalid(client, "run.begin", runId=5, tenant="t1")
    assert err.details["field"] == "runId"
    err = invalid(client, "memory.issueRef", tenant="t1")
    assert err.details["field"] == "agent"
    err = invalid(client, "memory.list", runId="r", memoryRef="x", colour="blue")
    assert err.details["field"] == "colour"


def test_params_are_validated_before_the_run_is_looked_up(client: RawClient) -> None:
    never = uid("never")
    other_tenant = issue(client, "t2")
    # An unknown run or a foreign ref never masks a malformed request.
    assert invalid(client, "memory.list", runId=never, memoryRef="x", options={"limit": "5"})
    assert invalid(client, "memory.get", runId=never, memoryRef="x", id=5)
    assert invalid(client, "memory.delete", runId=never, memoryRef="x")
    assert invalid(client, "run.addSecrets", runId=never, secrets=[{"id": "k", "value": "short"}])
    run_id = new_run(client)
    entry = {"content": "c", "expiresAt": "2000-01-01T00:00:00Z"}
    err = invalid(client, "memory.put", runId=never, memoryRef="x", entry=entry)
    assert err.details["field"] == "entry.expiresAt"
    err = invalid(client, "memory.put", runId=run_id, memoryRef=other_tenant, entry=entry)
    assert err.details["field"] == "entry.expiresAt"
    big = {"content": "x" * 65537}
    err = invalid(client, "memory.put", runId=never, memoryRef="x", entry=big)
    assert err.details["field"].startswith("entry")


# -- not_found -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method", ["no.such.method", "memory.List", "memory.", "", "rpc.discover", "memory.list "]
)
def test_unknown_method(client: RawClient, method: str) -> None:
    answer = client.raw(req(method, {}, "m"))
    assert answer["id"] == "m"
    err = error_of(answer, "not_found", -32601)
    assert err.details["resource"] == "method"


def test_unknown_method_without_params(client: RawClient) -> None:
    answer = client.raw(b'{"jsonrpc":"2.0","id":"m","method":"no.such"}')
    assert error_of(answer, "not_found", -32601).details["resource"] == "method"


def test_unknown_run_for_every_method_taking_run_id(client: RawClient) -> None:
    ref = issue(client, "t1")
    never = uid("never")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory.list", {"memoryRef": ref}),
        ("memory.list", {"memoryRef": "plain", "options": {"limit": 1}}),
        ("memory.get", {"memoryRef": ref, "id": "mem_x"}),
        ("memory.put", {"memoryRef": ref, "entry": {"content": "c"}}),
        ("memory.put", {"memoryRef": ref, "entry": {"content": "c"}, "idempotencyKey": "k"}),
        ("memory.delete", {"memoryRef": ref, "id": "mem_x"}),
        ("run.addSecrets", {"secrets": [{"id": "k", "value": "12345678"}]}),
    ]
    for method, params in calls:
        err = expect(client, "not_found", -32004, method, runId=never, **params)
        assert err.details["resource"] == "run", (method, err.error)
    # run.end answers false rather than not_found (PROTOCOL.md, run.end).
    assert client.call("run.end", runId=never) == {"ended": False}
    # Nothing was written by the failed put.
    assert later_list(client, ref) == []


def test_put_needs_the_run_open_but_reads_do_not(client: RawClient) -> None:
    ref = issue(client, "t1", uid("agent"))
    writer = new_run(client)
    entry = put(client, writer, ref, "kept")
    reader = new_run(client)
    client.call("run.end", runId=reader)
    # An ended run's snapshot is still readable (PROTOCOL.md, "Which runs may call what").
    assert client.call("memory.list", runId=reader, memoryRef=ref) == [entry]
    assert client.call("memory.get", runId=reader, memoryRef=ref, id=entry["id"]) == entry
    err = expect(
        client,
        "not_found",
        -32004,
        "memory.put",
        runId=reader,
        memoryRef=ref,
        entry={"content": "c"},
    )
    assert err.details["resource"] == "run"
    err = expect(
        client,
        "not_found",
        -32004,
        "run.addSecrets",
        runId=reader,
        secrets=[{"id": "k", "value": "12345678"}],
    )
    assert err.details["resource"] == "run"
    assert client.call("memory.delete", runId=reader, memoryRef=ref, id=entry["id"]) is True


# -- forbidden -----------------------------------------------------------------------------


def test_cross_tenant_issued_ref_is_forbidden(client: RawClient) -> None:
    agent = uid("agent")
    ref_t2 = issue(client, "t2", agent)
    owner = new_run(client, "t2")
    theirs = put(client, owner, ref_t2, "t2 private")
    intruder = new_run(client, "t1")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory.list", {}),
        ("memory.list", {"options": {"limit": 5, "tag": "x"}}),
        ("memory.get", {"id": theirs["id"]}),
        ("memory.put", {"entry": {"content": "from t1"}}),
        ("memory.delete", {"id": theirs["id"]}),
    ]
    for method, params in calls:
        err = expect(
            client, "forbidden", -32003, method, runId=intruder, memoryRef=ref_t2, **params
        )
        assert "t2 private" not in json.dumps(err.error)
    # Nothing leaked, nothing written, nothing deleted.
    assert later_list(client, ref_t2, "t2") == [theirs]
    # The same agent name under t1 is a different scope, not forbidden.
    assert later_list(client, issue(client, "t1", agent), "t1") == []


def test_another_tenants_run_id_answers_as_an_id_never_used(client: RawClient) -> None:
    """A replay of another tenant's run id fails exactly as for an id nobody began (no
    existence oracle), open here or only persisted; the run itself is untouched."""
    run_id, never = uid(), uid()
    first = client.call("run.begin", runId=run_id, tenant="t1")
    for _ in range(2):  # open here, then ended (only its persisted snapshot remains)
        taken = expect(client, "replay_memory_snapshot_unavailable", -32011, "run.begin",
                       runId=run_id, tenant="t2", replay=True)  # fmt: skip
        unused = expect(client, "replay_memory_snapshot_unavailable", -32011, "run.begin",
                        runId=never, tenant="t2", replay=True)  # fmt: skip
        assert taken.error["message"] == unused.error["message"]
        assert taken.details == {**unused.details, "runId": run_id}
        client.call("run.end", runId=run_id)
    assert client.call("run.begin", runId=run_id, tenant="t1") == {**first, "resumed": True}


# -- conflict ------------------------------------------------------------------------------


def test_idempotency_conflict(client: RawClient) -> None:
    ref = uid("ref")
    run_id = new_run(client)
    params: dict[str, Any] = {"runId": run_id, "memoryRef": ref, "idempotencyKey": "key-1"}
    first = client.call("memory.put", entry={"content": "one", "tags": ["a"]}, **params)
    # The same entry again: the first one back, nothing new written.
    assert client.call("memory.put", entry={"content": "one", "tags": ["a"]}, **params) == first
    for different in [
        {"content": "two", "tags": ["a"]},
        {"content": "one"},
        {"content": "one", "tags": ["b"]},
        {"content": "one", "tags": ["a"], "expiresAt": "2099-01-01T00:00:00Z"},
    ]:
        err = expect(client, "conflict", -32009, "memory.put", entry=different, **params)
        assert "two" not in json.dumps(err.error)
    assert later_list(client, ref) == [first]
    # The key is per scope: another ref with the same key is a fresh write.
    other = client.call(
        "memory.put",
        runId=run_id,
        memoryRef=ref + "-other",
        idempotencyKey="key-1",
        entry={"content": "two"},
    )
    assert other["id"] != first["id"] and other["content"] == "two"


# -- replay_memory_snapshot_unavailable ----------------------------------------------------


def test_replay_of_never_begun_run(client: RawClient) -> None:
    run_id = uid("never")
    err = expect(
        client,
        "replay_memory_snapshot_unavailable",
        -32011,
        "run.begin",
        runId=run_id,
        tenant="t1",
        replay=True,
    )
    assert err.details["reason"] == "unknown_run"
    assert err.details["runId"] == run_id
    # The refused replay opened nothing: the run is still unknown...
    err = expect(client, "not_found", -32004, "memory.list", runId=run_id, memoryRef="x")
    assert err.details["resource"] == "run"
    # ...and a plain begin afterwards takes a fresh snapshot.
    assert client.call("run.begin", runId=run_id, tenant="t1")["resumed"] is False


# -- secret_leakage (sidecar under --redaction reject) -------------------------------------


def test_secret_leakage_under_reject(rejecting: Sidecar) -> None:
    secret = "leak-" + uid("VALUE")
    other = "leak-" + uid("OTHER")
    ref = uid("ref")
    with rejecting.client() as c:
        run_id = new_run(c, secrets=[{"id": "k1", "value": secret}, {"id": "k2", "value": other}])
        cases: list[tuple[dict[str, Any], str, list[str]]] = [
            ({"content": f"x {secret} y"}, "content", ["k1"]),
            ({"content": f"{secret}{other}"}, "content", ["k1", "k2"]),
            ({"content": "clean", "tags": ["ok", f"t:{other}"]}, "tags", ["k2"]),
        ]
        for entry, field, ids in cases:
            line = req("memory.put", {"runId": run_id, "memoryRef": ref, "entry": entry}, "p")
            raw = raw_answer(c, line)
            assert secret.encode() not in raw and other.encode() not in raw
            err = error_of(json.loads(raw), "secret_leakage", -32010)
            assert field in err.details["field"], err.error
            assert sorted(err.details["secretIds"]) == ids
        # With an idempotency key too; the refused put does not consume the key.
        err = expect(
            c,
            "secret_leakage",
            -32010,
            "memory.put",
            runId=run_id,
            memoryRef=ref,
            idempotencyKey="k",
            entry={"content": secret},
        )
        assert later_list(c, ref) == []  # nothing was written
        clean = c.call(
            "memory.put",
            runId=run_id,
            memoryRef=ref,
            idempotencyKey="k",
            entry={"content": "clean"},
        )
        assert clean["content"] == "clean"
        assert later_list(c, ref) == [clean]
        # A secret added later is enforced too.
        c.call("run.addSecrets", runId=run_id, secrets=[{"id": "k3", "value": "late-secret-1"}])
        err = expect(
            c,
            "secret_leakage",
            -32010,
            "memory.put",
            runId=run_id,
            memoryRef=ref,
            entry={"content": "a late-secret-1"},
        )
        assert err.details["secretIds"] == ["k3"]
    log = rejecting.log()
    assert secret not in log and other not in log and "late-secret-1" not in log


@pytest.mark.anyio
async def test_a_secret_surviving_the_rewrite_passes_is_refused_and_nothing_stored(
    tmp_path: Path,
) -> None:
    """The ``leaked`` outcome, from a real input: each rewrite pass uncovers the secret
    that the one it rewrote split (a secret inside a secret inside a secret, each split
    around the next), so after the last pass the outer one is still found. Under
    ``rewrite`` (which otherwise stores the rewritten entry) the put is refused and
    nothing is stored; one level less is rewritten and stored."""
    from openwop_memory.app import open_app
    from openwop_memory.config import Settings
    from support.backends import selected

    inner, middle, outer = (os.urandom(8).hex() for _ in range(3))
    half_m, half_o = len(middle) // 2, len(outer) // 2
    nested = outer[:half_o] + middle[:half_m] + inner + middle[half_m:] + outer[half_o:]
    settings = Settings.model_validate({"database": selected().url_for(tmp_path / "lk.db")})
    async with await open_app(settings) as app:
        dispatcher = app.dispatcher

        async def call(method: str, **params: Any) -> Any:
            line = await dispatcher.handle_line(req(method, params))
            assert line is not None
            return json.loads(line)

        ref = (await call("memory.issueRef", tenant="t", agent="a"))["result"]["memoryRef"]
        secrets = [{"id": "k1", "value": outer}, {"id": "k2", "value": middle}]
        await call(
            "run.begin", runId="r", tenant="t", secrets=[*secrets, {"id": "k3", "value": inner}]
        )
        entry = {"content": f"x {nested} y", "tags": ["plain"]}
        answer = await call("memory.put", runId="r", memoryRef=ref, entry=entry)
        err = error_of(answer, "secret_leakage", -32010)
        assert err.details["field"] == "entry.content"
        # The ids are those of the secrets rewritten on the way, not of the survivor.
        assert err.details["secretIds"] == ["k2", "k3"]
        shown = json.dumps(answer)
        assert all(s not in shown for s in (inner, middle, outer, nested[:8]))
        await call("run.begin", runId="r2", tenant="t")
        assert (await call("memory.list", runId="r2", memoryRef=ref))["result"] == []
        stats = (await call("sidecar.stats"))["result"]
        assert stats["requests"]["memory.put"]["secret_leakage"] == 1
        assert app.service.stats.refusals == {"survived": 1}
        # One level less needs two passes, which there are: rewritten and stored.
        two = outer[:half_o] + middle + outer[half_o:]
        await call("run.begin", runId="w", tenant="t", secrets=secrets)
        put_two = await call("memory.put", runId="w", memoryRef=ref, entry={"content": two})
        assert put_two["result"]["content"] == "[REDACTED:k1]"


# -- rate_limited (a sidecar allowed one request in flight) --------------------------------


def test_rate_limited_when_at_capacity(tmp_path_factory: pytest.TempPathFactory) -> None:
    with (
        module_sidecar(tmp_path_factory, "rate", "--max-inflight", "1") as s,
        s.client() as c,
    ):
        run_id = new_run(c)
        lines = [
            req("memory.put", {"runId": run_id, "memoryRef": "r", "entry": {"content": str(i)}}, i)
            for i in range(64)
        ]
        answers = pipeline(c, lines)
        assert sorted(a["id"] for a in answers) == list(range(64))
        limited = [a for a in answers if "error" in a]
        assert limited, "64 pipelined puts with --max-inflight 1 should shed some"
        for answer in limited:
            err = error_of(answer, "rate_limited", -32029)
            assert isinstance(err.details["retryAfterMs"], int) and err.details["retryAfterMs"] > 0
        written = 64 - len(limited)
        assert len(later_list(c, "r")) == written  # a shed put wrote nothing


# -- no error carries content or a secret value --------------------------------------------


def test_no_error_carries_content_or_secret_values(shared_sidecar: Sidecar) -> None:
    mark = uid("MARKER")  # distinctive: appears nowhere unless echoed
    secret = f"{mark}-secret"
    with shared_sidecar.client() as c:
        t2_ref = issue(c, "t2")
        run_id = new_run(c, secrets=[{"id": "k", "value": secret}])
        c.call(
            "memory.put",
            runId=run_id,
            memoryRef="m",
            idempotencyKey="ik",
            entry={"content": f"{mark} first"},
        )

        def put_line(entry: Any, **extra: Any) -> bytes:
            params = {"runId": run_id, "memoryRef": "m", "entry": entry, **extra}
            return req("memory.put", params, "x")

        failing: list[bytes] = [
            put_line({"content": mark + "x" * 70_000}),
            put_line({"content": mark, "expiresAt": "yesterday"}),
            put_line({"content": mark, "expiresAt": "2000-01-01T00:00:00Z"}),
            put_line({"content": mark, "id": mark}),
            put_line({"content": mark, "createdAt": mark}),
            put_line({"content": 5, "tags": [mark, 7]}),
            put_line({"content": mark, "tags": [mark + "\x00"]}),
            put_line({"content": mark, "tags": [mark * 20]}),
            put_line({"content": mark, "tags": [mark] * 65}),
            put_line({"content": mark, "bogus": mark}),
            put_line({"content": f"{mark} {secret}"}, idempotencyKey="ik"),  # conflict
            put_line({"content": f"{mark} {secret}"}, idempotencyKey=""),
            req("memory.put", {"runId": run_id, "memoryRef": t2_ref, "entry": {"content": mark}}),
            req("memory.put", {"runId": run_id, "memoryRef": "a/../b", "entry": {"content": mark}}),
            req("memory.put", {"runId": uid(), "memoryRef": "m", "entry": {"content": secret}}),
            req("memory.put", {"runId": run_id, "memoryRef": "m", "entry": mark}),
            req(
                "run.begin",
                {"runId": uid(), "tenant": "t1", "secrets": [{"id": "a]b", "value": secret}]},
            ),
            req(
                "run.begin",
                {"runId": uid(), "tenant": "t1", "secrets": [{"id": "k", "value": secret * 300}]},
            ),
            req(
                "run.begin",
                {"runId": uid(), "tenant": "t1", "secrets": [{"id": "k", "value": secret, "x": 1}]},
            ),
            req(
                "run.begin",
                {
                    "runId": uid(),
                    "tenant": "t1",
                    "secrets": [{"id": f"k{i}", "value": f"{secret}{i}"} for i in range(257)],
                },
            ),
            req(
                "run.begin",
                {
                    "runId": uid(),
                    "tenant": "t1",
                    "secrets": [{"id": "k", "value": 5}, {"id": "j", "value": secret}],
                    "extra": mark,
                },
            ),
            req(
                "run.begin",
                {
                    "runId": run_id,
                    "tenant": "t2",
                    "replay": True,
                    "secrets": [{"id": "k", "value": secret + "2"}],
                },
            ),
            req("run.addSecrets", {"runId": uid(), "secrets": [{"id": "k", "value": secret}]}),
            req(
                "run.addSecrets",
                {
                    "runId": run_id,
                    "secrets": [{"id": "k", "value": mark[:7]}, {"id": "", "value": secret}],
                },
            ),
            req("no.such.method", {"content": mark, "value": secret}),
            req("memory.list", {"runId": run_id, "memoryRef": "m", "options": {"tag": mark * 20}}),
            b'{"jsonrpc":"2.0","id":1,"method":"memory.put","params":{"entry":{"content":"%s"'
            % mark.encode(),
            b'{"jsonrpc":"2.0","id":1,"method":"memory.put","params":["%s"]}' % secret.encode(),
            b'{"jsonrpc":"2.0","id":1,"method":"memory.put","params":{"entry":{"content":"%s\xff"}}}'
            % mark.encode(),
            b'{"jsonrpc":"2.0","id":1,"method":"memory.put","params":{"x":"%s"},"extra":1}'
            % secret.encode(),
            b'{"jsonrpc":"2.0","id":1,"method":"memory.put","pad":"%s%s"}'
            % (secret.encode(), b"x" * (1 << 20)),
        ]
        for line in failing:
            raw = raw_answer(c, line)
            assert mark.encode() not in raw, (line[:200], raw)
            assert b"Traceback" not in raw and b'File "' not in raw, raw
            answer = json.loads(raw)
            assert "error" in answer, (line[:200], answer)
            check_envelope(answer["error"])
            assert answer["error"]["data"]["error"] != "internal_error", answer
    assert_healthy(shared_sidecar)
    assert mark not in shared_sidecar.log()


# -- upstream_unavailable: -32005 ----------------------------------------------------------


@pytest.mark.sqlite_only
def test_a_database_held_by_another_writer_is_upstream_unavailable_and_recovers(
    workdir: Path,
) -> None:
    with Sidecar(workdir, "--sqlite-busy-timeout", "200ms") as sidecar, sidecar.client() as c:
        ref = issue(c, "t1")
        c.call("run.begin", runId="w", tenant="t1")
        # Another process's writer holds the database's write lock past the busy timeout.
        blocker = sqlite3.connect(str(sidecar.database), isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            err = c.error("memory.put", runId="w", memoryRef=ref, entry={"content": "held"})
            check_envelope(err.error)
            assert err.rpc_code == -32005
            assert err.code == "upstream_unavailable"
            assert err.details["backend"] == "sqlite"
            assert "held" not in json.dumps(err.error)
            # Reads are not blocked by a writer in WAL mode, and health tells the truth.
            assert c.call("memory.list", runId="w", memoryRef=ref) == []
            health = c.call("sidecar.health")
            assert health["status"] == "degraded", health
            assert health["storage"]["problems"] == ["writes_failing"]
            assert health["storage"]["lastWriteError"] == "SQLITE_BUSY"
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # Health's own probe write finds the lock free again.
        assert c.call("sidecar.health")["status"] == "ok"
        # Nothing half-written, and the next put goes through.
        entry = c.call("memory.put", runId="w", memoryRef=ref, entry={"content": "after"})
        c.call("run.begin", runId="r", tenant="t1")
        assert c.call("memory.list", runId="r", memoryRef=ref) == [entry]
        assert c.call("sidecar.stats")["requests"]["memory.put"]["upstream_unavailable"] == 1


# -- internal_error: -32603 ----------------------------------------------------------------


@pytest.mark.anyio
async def test_an_unexpected_failure_is_internal_error_with_a_correlation_id_and_frames_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler's unforeseen exception answers ``internal_error`` whose details carry only
    a correlation id, and the log lines carry that id and the frames, never the exception's
    message (it may quote content or a secret)."""
    from openwop_memory.app import open_app
    from openwop_memory.config import Settings
    from structlog.testing import capture_logs
    from support.backends import selected

    mark = "MARK-" + uid()
    settings = Settings.model_validate({"database": selected().url_for(tmp_path / "ie.db")})
    async with await open_app(settings) as app:
        dispatcher = app.dispatcher
        ref = json.loads(
            await dispatcher.handle_line(req("memory.issueRef", {"tenant": "t", "agent": "a"}))
            or b"null"
        )["result"]["memoryRef"]
        await dispatcher.handle_line(req("run.begin", {"runId": "r", "tenant": "t"}))

        async def broken(*args: object, **kwargs: object) -> Any:
            raise RuntimeError(f"content {mark} secret")

        monkeypatch.setattr(app.service._storage, "list", broken)
        with capture_logs() as captured:
            line = await dispatcher.handle_line(
                req("memory.list", {"runId": "r", "memoryRef": ref}, rid=7)
            )
        assert line is not None
        answer = json.loads(line)
        assert answer["id"] == 7
        err = error_of(answer, "internal_error", -32603)
        correlation_id = err.details["correlationId"]
        assert isinstance(correlation_id, str) and len(correlation_id) == 16
        assert err.details == {"correlationId": correlation_id}
        assert mark not in line.decode()
        internal = [c for c in captured if c["event"] == "internal_error"]
        assert len(internal) == 1, captured
        assert internal[0]["correlation_id"] == correlation_id
        assert internal[0]["error_type"] == "RuntimeError"
        frames = internal[0]["frames"]
        assert frames and all(f.count(":") == 2 for f in frames), frames
        assert any(f.startswith("memory.py:") for f in frames), frames
        # The access log's line for the request names the same id, so the two can be joined.
        access = [c for c in captured if c["event"] == "request"]
        assert [(a["outcome"], a["correlation_id"]) for a in access] == [
            ("internal_error", correlation_id)
        ]
        assert mark not in repr(captured)
        # The failure is the request's alone: the next request is answered.
        monkeypatch.undo()
        again = json.loads(
            await dispatcher.handle_line(req("memory.list", {"runId": "r", "memoryRef": ref}))
            or b"null"
        )
        assert again["result"] == []
