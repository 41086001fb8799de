"""SR-1 write-time redaction end to end (RFC 0004 §D; PROTOCOL.md `memory.put`).

Secrets go in through ``run.begin`` / ``run.addSecrets``; what comes back from ``put``,
``list`` and ``get`` is checked, and so are the bytes of every file the sidecar writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.on_disk import entry_count, files_of
from support.protocol import (
    TENANT,
    begin,
    later_list,
    leaked_ids,
    put,
    put_error,
    secrets_param,
)
from support.schemas import check_capabilities, check_envelope
from support.shared import SharedClient
from support.sidecar import RawClient, Sidecar

ALPHA = "SECRET-ALPHA-9f8e7d6c"
BETA = "SECRET-BETA-0a1b2c3d4e"
GAMMA = "sk_GAMMA_55aa66bb77cc"
ALL_SECRETS = (ALPHA, BETA, GAMMA)
# What no error of a put rejected for a secret may show: the secrets and the rest of the entry.
NEVER_SHOWN = (*ALL_SECRETS, "REJECT-MARKER")


# -- helpers ------------------------------------------------------------------------------


def assert_absent(files: dict[str, bytes], needles: list[str]) -> None:
    for name, data in files.items():
        for needle in needles:
            assert needle.encode() not in data, f"{needle!r} found in {name}"


def assert_no_secret(value: Any) -> None:
    text = json.dumps(value)
    for s in ALL_SECRETS:
        assert s not in text, text


# -- rewrite ------------------------------------------------------------------------------


def test_secrets_in_content_and_every_tag_are_replaced(shared_client: SharedClient) -> None:
    applied_before = shared_client.call("sidecar.stats")["redactionsApplied"]
    ref = "notes"
    begin(shared_client, "w", secrets=secrets_param(k1=ALPHA, k2=BETA))
    written = [
        put(
            shared_client,
            "w",
            ref,
            f"a {ALPHA} b {BETA} c {ALPHA}",
            [ALPHA, f"x:{BETA}", "plain", f"{ALPHA}{BETA}", f"pre{ALPHA}post"],
        ),
        put(shared_client, "w", ref, f"{BETA}", ["source:test"]),
        put(shared_client, "w", ref, "no secret here", [f"only-tag {BETA}"]),
    ]
    assert written[0]["content"] == "a [REDACTED:k1] b [REDACTED:k2] c [REDACTED:k1]"
    assert written[0]["tags"] == [
        "[REDACTED:k1]",
        "x:[REDACTED:k2]",
        "plain",
        "[REDACTED:k1][REDACTED:k2]",
        "pre[REDACTED:k1]post",
    ]
    assert written[1]["content"] == "[REDACTED:k2]"
    assert written[1]["tags"] == ["source:test"]
    assert written[2]["content"] == "no secret here"
    assert written[2]["tags"] == ["only-tag [REDACTED:k2]"]
    for e in written:
        assert_no_secret(e)

    # What put returned is exactly what is read back, by list, tag list and get.
    view = later_list(shared_client, ref, run="r")
    assert view == written[::-1]
    assert shared_client.call(
        "memory.list", runId="r", memoryRef=ref, options={"tag": "plain"}
    ) == [written[0]]
    assert shared_client.call(
        "memory.list", runId="r", memoryRef=ref, options={"tag": "[REDACTED:k1]"}
    ) == [written[0]]
    assert shared_client.call("memory.list", runId="r", memoryRef=ref, options={"tag": ALPHA}) == []
    for e in written:
        assert shared_client.call("memory.get", runId="r", memoryRef=ref, id=e["id"]) == e
    # At least one per redacted put, however the counter counts (this sidecar: 9, one per
    # secret id per field).
    assert shared_client.call("sidecar.stats")["redactionsApplied"] - applied_before >= 3


def test_tags_equal_after_redaction_are_one_tag(shared_client: SharedClient) -> None:
    begin(shared_client, "w", secrets=secrets_param(k=ALPHA))
    entry = put(shared_client, "w", "n", "c", [f"x {ALPHA}", "x [REDACTED:k]", "y"])
    assert entry["tags"] == ["x [REDACTED:k]", "y"]
    assert later_list(shared_client, "n", run="r") == [entry]


def test_longest_secret_wins(shared_client: SharedClient) -> None:
    # Registered shortest first, so registration order cannot be what makes it work.
    begin(shared_client, "w", secrets=secrets_param(short="abcdefgh", long="abcdefgh12345678"))
    entry = put(
        shared_client,
        "w",
        "n",
        "abcdefgh12345678 abcdefgh abcdefgh1234 abcdefghabcdefgh12345678 xabcdefgh12345678x",
        ["abcdefgh12345678", "abcdefgh", "abcdefgh1234567"],
    )
    # "abcdefgh1234" is 12 characters of the long secret: a fragment, so the long one names it.
    assert entry["content"] == (
        "[REDACTED:long] [REDACTED:short] [REDACTED:long]"
        " [REDACTED:short][REDACTED:long] x[REDACTED:long]x"
    )
    # The third tag became the first one after redaction, so it is dropped as a duplicate.
    assert entry["tags"] == ["[REDACTED:long]", "[REDACTED:short]"]
    assert later_list(shared_client, "n", run="r") == [entry]


def test_regex_characters_are_literal_and_case_is_not(shared_client: SharedClient) -> None:
    # Folded, the first value has only 7 letters, too few to match loosely: it is matched
    # verbatim. The second is long enough that its case changes count as the secret.
    special = "p.ss(w)rd+[x]*?"
    begin(shared_client, "w", secrets=secrets_param(re=special, case="CaseSensitive-1"))
    entry = put(
        shared_client,
        "w",
        "n",
        f"pXss(w)rd+[x]*? {special} casesensitive-1 CaseSensitive-1",
        [f"a{special}b", "p.ss(w)rd+[x]"],
    )
    assert entry["content"] == "pXss(w)rd+[x]*? [REDACTED:re] [REDACTED:case] [REDACTED:case]"
    assert entry["tags"] == ["a[REDACTED:re]b", "p.ss(w)rd+[x]"]
    assert later_list(shared_client, "n", run="r") == [entry]


def test_secrets_added_later_and_on_resume_are_used(shared_client: SharedClient) -> None:
    begin(shared_client, "w", secrets=secrets_param(a=ALPHA))
    before = put(shared_client, "w", "n", f"{ALPHA} {BETA}")
    assert before["content"] == f"[REDACTED:a] {BETA}"  # BETA is not registered yet
    assert shared_client.call("run.addSecrets", runId="w", secrets=secrets_param(b=BETA)) == {
        "count": 2
    }
    after = put(shared_client, "w", "n", f"{ALPHA} {BETA} {GAMMA}", [BETA])
    assert after["content"] == f"[REDACTED:a] [REDACTED:b] {GAMMA}"
    assert after["tags"] == ["[REDACTED:b]"]
    # Re-beginning the open run merges its secrets into the keyring.
    assert begin(shared_client, "w", secrets=secrets_param(g=GAMMA))["resumed"] is True
    resumed = put(shared_client, "w", "n", f"{ALPHA} {BETA} {GAMMA}")
    assert resumed["content"] == "[REDACTED:a] [REDACTED:b] [REDACTED:g]"
    assert shared_client.call("run.addSecrets", runId="w", secrets=[]) == {"count": 3}
    assert later_list(shared_client, "n", run="r") == [resumed, after, before]


def test_concurrent_secret_merges_lose_nothing(shared_client: SharedClient) -> None:
    begin(shared_client, "w")
    values = {f"s{i}": f"MERGE-{hashlib.sha256(bytes([i])).hexdigest()[:24]}" for i in range(24)}
    # Pipelined on one connection, the merges run concurrently; each compiles its keyring off
    # the event loop, so they finish in any order and must not overwrite one another.
    for i, (secret_id, value) in enumerate(values.items()):
        params = shared_client.scoped(
            {"runId": "w", "secrets": secrets_param(**{secret_id: value})}
        )
        request = {"jsonrpc": "2.0", "id": 1000 + i, "method": "run.addSecrets", "params": params}
        shared_client.send_line(json.dumps(request).encode())
    counts = sorted(shared_client.read()["result"]["count"] for _ in values)
    assert counts[-1] == len(values)
    entry = put(shared_client, "w", "n", " ".join(values.values()))
    assert entry["content"] == " ".join(f"[REDACTED:{k}]" for k in values)


def test_a_secret_id_may_not_carry_a_secret_value(shared_client: SharedClient) -> None:
    # The id is written into every marker: an id holding a value would store the value.
    for where in ("run.begin", "run.addSecrets"):
        if where == "run.begin":
            err = shared_client.error(
                "run.begin",
                runId=f"w-{where}",
                tenant=TENANT,
                secrets=secrets_param(**{ALPHA: ALPHA}),
            )
        else:
            begin(shared_client, f"w-{where}", secrets=secrets_param(a=ALPHA))
            err = shared_client.error(
                "run.addSecrets", runId=f"w-{where}", secrets=secrets_param(**{f"x{ALPHA}": BETA})
            )
        assert err.code == "validation_error"
        assert err.details["field"] == "secrets[0].id"
        assert ALPHA not in json.dumps(err.error)


def test_a_secret_of_another_run_is_not_applied(shared_client: SharedClient) -> None:
    begin(shared_client, "owner", secrets=secrets_param(mine=ALPHA))
    begin(shared_client, "stranger")
    owned = put(shared_client, "owner", "n", f"x {ALPHA}")
    foreign = put(shared_client, "stranger", "n", f"x {ALPHA}", [ALPHA])
    assert owned["content"] == "x [REDACTED:mine]"
    assert foreign["content"] == f"x {ALPHA}"  # stranger's keyring does not hold it
    assert foreign["tags"] == [ALPHA]
    assert later_list(shared_client, "n", run="r") == [foreign, owned]


def test_json_escapes_do_not_hide_a_secret(shared_client: SharedClient) -> None:
    begin(shared_client, "w", secrets=secrets_param(k=ALPHA))
    escaped = "".join(f"\\u{ord(ch):04x}" for ch in ALPHA)
    line = (
        '{"jsonrpc":"2.0","id":"esc","method":"memory.put",'
        f'"params":{{"runId":"{shared_client.prefix}w",'
        f'"memoryRef":"n","entry":{{"content":"<{escaped}>","tags":["{escaped}"]}}}}}}'
    )
    answer = shared_client.raw(line.encode())
    assert answer["result"]["content"] == "<[REDACTED:k]>", answer
    assert answer["result"]["tags"] == ["[REDACTED:k]"], answer


def test_redacted_output_never_holds_a_secret(shared_client: SharedClient) -> None:
    """Replacing one secret must not make another appear (here: ``]`` of a marker)."""
    first, second = "FIRST-SECRET-1", "]tail-value-2"
    begin(shared_client, "w", secrets=secrets_param(a=first, b=second))
    content = f"{first}tail-value-2"  # holds `first`; `second` appears only after redaction
    response = shared_client.request(
        "memory.put", {"runId": "w", "memoryRef": "n", "entry": {"content": content}}
    )
    if "result" in response:
        stored = response["result"]["content"]
        assert first not in stored and second not in stored, stored
        expected = [stored]
    else:
        check_envelope(response["error"])
        assert response["error"]["data"]["error"] in {"secret_leakage", "validation_error"}
        assert first not in json.dumps(response) and second not in json.dumps(response)
        expected = []
    assert [e["content"] for e in later_list(shared_client, "n", run="r")] == expected


@pytest.mark.sqlite_only
def test_tag_grown_past_256_by_redaction_is_validation_error(
    sidecar: Sidecar, rpc: RawClient
) -> None:
    value = "12345678"  # marker [REDACTED:k] is 12 characters: each match grows a tag by 4
    begin(rpc, "w", secrets=[{"id": "k", "value": value}, {"id": "i" * 100, "value": BETA}])
    at_limit = "t" * 244 + value  # 252 characters sent, 256 stored
    ok = put(rpc, "w", "n", "fits", [at_limit])
    assert ok["tags"] == ["t" * 244 + "[REDACTED:k]"] and len(ok["tags"][0]) == 256

    over = "u" * 245 + value  # 253 characters sent, 257 after redaction
    err = put_error(rpc, "w", "n", "TAG-OVERFLOW-CONTENT-c0ffee", ["fine", over])
    assert err.code == "validation_error" and err.rpc_code == -32602, err.error
    assert re.fullmatch(r"(entry\.)?tags[\[.]1\]?", str(err.details.get("field"))), err.error
    # A long secret id: 222 characters sent, 312 after redaction.
    err = put_error(rpc, "w", "n", "TAG-OVERFLOW-CONTENT-c0ffee", ["x" * 200 + f" {BETA}"])
    assert err.code == "validation_error"
    assert BETA not in json.dumps(err.error)
    assert later_list(rpc, "n", run="r") == [ok]
    assert entry_count(sidecar.database) == 1
    assert "TAG-OVERFLOW-CONTENT" not in sidecar.log()


def test_idempotency_compares_the_redacted_entry(shared_client: SharedClient) -> None:
    begin(shared_client, "with-secret", secrets=secrets_param(k=ALPHA))
    first = put(shared_client, "with-secret", "n", f"token {ALPHA}", idempotencyKey="idem")
    assert first["content"] == "token [REDACTED:k]"
    # A retry by the same run: the same after redaction.
    assert put(shared_client, "with-secret", "n", f"token {ALPHA}", idempotencyKey="idem") == first
    # A retry whose text already holds the marker is the same entry after redaction.
    begin(shared_client, "without-secret")
    assert (
        put(shared_client, "without-secret", "n", "token [REDACTED:k]", idempotencyKey="idem")
        == first
    )
    # Without the secret in its keyring the plaintext differs after redaction: conflict.
    err = put_error(shared_client, "without-secret", "n", f"token {ALPHA}", idempotencyKey="idem")
    assert err.code == "conflict"
    assert ALPHA not in json.dumps(err.error)
    assert later_list(shared_client, "n", run="r") == [first]


# -- reject -------------------------------------------------------------------------------


@pytest.fixture
def rejecting(workdir: Path) -> Iterator[tuple[Sidecar, RawClient]]:
    with Sidecar(workdir, "--redaction", "reject") as s, s.client() as c:
        yield s, c


@pytest.mark.sqlite_only
def test_reject_policy_fails_the_put_and_writes_nothing(
    rejecting: tuple[Sidecar, RawClient],
) -> None:
    s, c = rejecting
    check_capabilities(c.call("host.capabilities"))
    assert "long-term" in c.call("host.capabilities")["capabilities"]["agents"]["memoryBackends"]
    begin(c, "w", secrets=secrets_param(a=ALPHA, b=BETA, g=GAMMA))

    err = put_error(c, "w", "n", f"REJECT-MARKER {ALPHA}", ["t"])
    assert leaked_ids(err, *NEVER_SHOWN) == ["a"]
    assert err.details["field"] in {"content", "entry.content"}

    err = put_error(c, "w", "n", "REJECT-MARKER clean", ["ok", f"REJECT-MARKER {BETA}"])
    assert leaked_ids(err, *NEVER_SHOWN) == ["b"]
    assert re.fullmatch(r"(entry\.)?tags[\[.]1\]?", err.details["field"]), err.error

    # Several secrets in several fields: every id, the first field.
    err = put_error(c, "w", "n", f"{GAMMA} REJECT-MARKER {ALPHA}", [f"{BETA}", "x"])
    assert sorted(leaked_ids(err, *NEVER_SHOWN)) == ["a", "b", "g"]
    assert err.details["field"] in {"content", "entry.content"}

    # The key of a rejected put was not consumed.
    leaked_ids(put_error(c, "w", "n", f"{ALPHA}", idempotencyKey="kept-free"), *NEVER_SHOWN)
    clean = put(c, "w", "n", "clean content", ["clean"], idempotencyKey="kept-free")
    assert clean["content"] == "clean content"

    assert later_list(c, "n", run="r") == [clean]
    assert entry_count(s.database) == 1
    stats = c.call("sidecar.stats")
    assert stats["requests"]["memory.put"] == {"secret_leakage": 4, "ok": 1}
    assert stats["redactionsApplied"] == 0
    assert "REJECT-MARKER" not in s.log()
    assert_absent({"log": s.log().encode()}, list(ALL_SECRETS))


@pytest.mark.sqlite_only
@pytest.mark.parametrize("policy", ["rewrite", "reject"])
def test_field_names_the_tag_index_as_sent(workdir: Path, policy: str) -> None:
    """Empty and duplicate tags are dropped before redaction; ``details.field`` must still
    name the offending tag by its index in the request, not in the normalised list."""
    with Sidecar(workdir, "--redaction", policy) as s, s.client() as c:
        begin(c, "w", secrets=[{"id": "k", "value": "12345678"}])
        tags = ["", "dup", "dup", "v" * 245 + "12345678"]  # grows to 257 under rewrite
        err = put_error(c, "w", "n", "clean", tags)
        expected = "validation_error" if policy == "rewrite" else "secret_leakage"
        assert err.code == expected, err.error
        field = str(err.details.get("field"))
        assert re.fullmatch(r"(entry\.)?tags[\[.]3\]?", field), (
            f"details.field {field!r} should name the request's tag index 3"
        )
        assert entry_count(s.database) == 0


# -- nothing secret on disk or in the log -------------------------------------------------


@pytest.mark.sqlite_only
def test_no_secret_in_any_file_during_and_after_a_burst(workdir: Path) -> None:
    sidecar = Sidecar(workdir)
    with sidecar, sidecar.client() as c1, sidecar.client() as c2:
        ref = str(c1.call("memory.issueRef", tenant=TENANT, agent="burst")["memoryRef"])
        begin(c1, "burst-1", secrets=secrets_param(alpha=ALPHA, beta=BETA))
        begin(c2, "burst-2", secrets=secrets_param(gamma=GAMMA))
        c2.call("run.addSecrets", runId="burst-2", secrets=secrets_param(alpha2=ALPHA))

        # burst-1 knows alpha and beta only, burst-2 gamma and alpha: write each run's
        # own secrets so every stored value must have been redacted.
        def own_burst(c: RawClient, run: str, start: int, known: tuple[str, ...]) -> None:
            lines = []
            for i in range(start, start + 100):
                s1, s2 = known[i % len(known)], known[(i + 1) % len(known)]
                entry = {
                    "content": f"CONTENT-MARKER-{i:04d} {s1} and {s2}{s1}",
                    "tags": [f"TAG-MARKER-{i:04d}", f"k:{s2}", s1, f"{s1}-{s2}"],
                }
                c.next_id += 1
                lines.append(
                    json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "id": c.next_id,
                            "method": "memory.put",
                            "params": {"runId": run, "memoryRef": ref, "entry": entry},
                        }
                    )
                )
            c.sock.sendall(("\n".join(lines) + "\n").encode())
            for _ in lines:
                answer = c.read()
                assert "result" in answer, answer
                assert_no_secret(answer["result"])

        own_burst(c1, "burst-1", 0, (ALPHA, BETA))
        own_burst(c2, "burst-2", 1000, (GAMMA, ALPHA))
        # Failed puts carrying secrets: redaction grows a tag past 256; an idempotency conflict.
        for i in range(3):
            err = put_error(c1, "burst-1", ref, f"CONTENT-MARKER-X{i} {BETA}", ["v" * 240 + BETA])
            assert err.code == "validation_error"
        put(c1, "burst-1", ref, f"CONTENT-MARKER-K {ALPHA}", idempotencyKey="burst-key")
        err = put_error(c1, "burst-1", ref, f"CONTENT-MARKER-K2 {BETA}", idempotencyKey="burst-key")
        assert err.code == "conflict"
        # Deleted entries, too (their content was redacted before it was ever stored).
        begin(c1, "reader")
        view = c1.call("memory.list", runId="reader", memoryRef=ref, options={"limit": 1000})
        assert len(view) == 201
        for e in view[:20]:
            assert c1.call("memory.delete", runId="reader", memoryRef=ref, id=e["id"]) is True
        assert_no_secret(view)

        running = files_of(workdir)
        assert any(name.endswith("-wal") and data for name, data in running.items()), running.keys()
        assert_absent(running, list(ALL_SECRETS))
        # Positive control: the scan does see stored content (here, in the db or its WAL).
        assert any(b"CONTENT-MARKER-0007" in d for n, d in running.items() if ".db" in n)
    assert sidecar.proc is not None and sidecar.proc.returncode == 0

    stopped = files_of(workdir)
    assert any(n.endswith(".db") for n in stopped), stopped.keys()
    assert_absent(stopped, list(ALL_SECRETS))
    assert any(b"TAG-MARKER-0099" in d for n, d in stopped.items() if n.endswith(".db"))
    logs = {n: d for n, d in stopped.items() if n.endswith(".log")}
    assert logs and all(d for d in logs.values())
    assert_absent(logs, ["CONTENT-MARKER", "TAG-MARKER", "[REDACTED:"])


def test_no_content_or_tag_in_the_log_on_any_path(sidecar: Sidecar, rpc: RawClient) -> None:
    begin(rpc, "w", secrets=secrets_param(a=ALPHA))
    put(rpc, "w", "n", "LOGCHECK-CONTENT-ok", ["LOGCHECK-TAG-ok"], idempotencyKey="idem-1")
    conflicting = {"content": "LOGCHECK-CONTENT-conflict", "tags": ["LOGCHECK-TAG-conflict"]}
    err = rpc.error(
        "memory.put", runId="w", memoryRef="n", entry=conflicting, idempotencyKey="idem-1"
    )
    assert err.code == "conflict"
    bad: list[dict[str, Any]] = [
        {"content": "LOGCHECK-CONTENT-bad", "tags": ["LOGCHECK-TAG-bad\x00"]},
        {"content": "LOGCHECK-CONTENT-bad", "tags": ["LOGCHECK-TAG-long" * 40]},
        {"content": "LOGCHECK-CONTENT-bad", "expiresAt": "LOGCHECK-not-a-time"},
        {"content": "LOGCHECK-CONTENT-bad", "id": "LOGCHECK-id"},
    ]
    for entry in bad:
        assert rpc.error("memory.put", runId="w", memoryRef="n", entry=entry).code == (
            "validation_error"
        )
    assert rpc.error("memory.put", runId="nope", memoryRef="n", entry=bad[0]).code in {
        "validation_error",
        "not_found",
    }
    begin(rpc, "r")
    rpc.call("memory.list", runId="r", memoryRef="n", options={"tag": "LOGCHECK-TAG-ok"})
    log = sidecar.log()
    assert sidecar.log_lines(), "the sidecar wrote no JSON log lines"
    assert "LOGCHECK" not in log
    assert ALPHA not in log
