"""Validation of every field of PROTOCOL.md against a real sidecar: strict JSON types,
unknown params and entry fields, the entry size limit, tags, expiresAt, secrets, name
bounds, idempotency keys, list options and memoryRefs (malformed, tampered, plain)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest
from support.names import uid
from support.protocol import (
    WIRE_TIME,
    assert_healthy,
    assert_resolves_to_nothing,
    checked_entry,
    expect,
    invalid,
    later_list,
    new_run,
    put,
    raw_answer,
    req,
    tampered,
)
from support.schemas import check_list_options
from support.sidecar import RawClient, RpcError, Sidecar


@pytest.fixture
def run(client: RawClient) -> str:
    """An open run of tenant t1 with no secrets."""
    return new_run(client)


def field_of(err: RpcError) -> str:
    """``details.field`` with ``a[0]`` spelt ``a.0``, so both path styles compare equal."""
    field = err.details.get("field")
    assert isinstance(field, str) and field, err.error
    return re.sub(r"\[(\d+)\]", r".\1", field)


def invalid_put(client: RawClient, run_id: str, entry: Any, **extra: Any) -> RpcError:
    return invalid(client, "memory.put", runId=run_id, memoryRef=uid("ref"), entry=entry, **extra)


# -- strict JSON types ---------------------------------------------------------------------

OK_SECRET = {"id": "k", "value": "12345678"}

STRICT_CASES: list[tuple[str, dict[str, Any], str]] = [
    # a string is not an integer, true is not an integer, a fraction is not an integer
    ("memory.list", {"memoryRef": "x", "options": {"limit": "5"}}, "options.limit"),
    ("memory.list", {"memoryRef": "x", "options": {"limit": True}}, "options.limit"),
    ("memory.list", {"memoryRef": "x", "options": {"limit": 5.5}}, "options.limit"),
    ("memory.list", {"memoryRef": "x", "options": {"limit": -1}}, "options.limit"),
    ("memory.list", {"memoryRef": "x", "options": {"limit": [5]}}, "options.limit"),
    ("memory.list", {"memoryRef": "x", "options": {"tag": 5}}, "options.tag"),
    ("memory.list", {"memoryRef": "x", "options": "limit=5"}, "options"),
    ("memory.list", {"memoryRef": "x", "options": [5]}, "options"),
    ("memory.list", {"memoryRef": 5}, "memoryRef"),
    ("memory.list", {"memoryRef": None}, "memoryRef"),
    ("memory.list", {"memoryRef": ["x"]}, "memoryRef"),
    ("memory.list", {}, "memoryRef"),
    ("memory.get", {"memoryRef": "x", "id": 5}, "id"),
    ("memory.get", {"memoryRef": "x"}, "id"),
    ("memory.delete", {"memoryRef": "x", "id": True}, "id"),
    ("memory.put", {"memoryRef": "x", "entry": "content"}, "entry"),
    ("memory.put", {"memoryRef": "x", "entry": None}, "entry"),
    ("memory.put", {"memoryRef": "x", "entry": ["c"]}, "entry"),
    ("memory.put", {"memoryRef": "x"}, "entry"),
    ("memory.put", {"memoryRef": "x", "entry": {}}, "entry.content"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": 5}}, "entry.content"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": None}}, "entry.content"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": True}}, "entry.content"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": ["c"]}}, "entry.content"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": "c", "tags": "a"}}, "entry.tags"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": "c", "tags": {"a": 1}}}, "entry.tags"),
    ("memory.put", {"memoryRef": "x", "entry": {"content": "c", "tags": [1]}}, "entry.tags.0"),
    (
        "memory.put",
        {"memoryRef": "x", "entry": {"content": "c", "tags": ["a", None]}},
        "entry.tags.1",
    ),
    (
        "memory.put",
        {"memoryRef": "x", "entry": {"content": "c", "expiresAt": 4102444800}},
        "entry.expiresAt",
    ),
    (
        "memory.put",
        {"memoryRef": "x", "entry": {"content": "c"}, "idempotencyKey": 5},
        "idempotencyKey",
    ),
    ("run.begin", {"tenant": 5}, "tenant"),
    ("run.begin", {"tenant": "t1", "replay": "true"}, "replay"),
    ("run.begin", {"tenant": "t1", "replay": 1}, "replay"),
    ("run.begin", {"tenant": "t1", "secrets": {}}, "secrets"),
    ("run.begin", {"tenant": "t1", "secrets": "k=v"}, "secrets"),
    ("run.begin", {"tenant": "t1", "secrets": ["12345678"]}, "secrets.0"),
    ("run.begin", {"tenant": "t1", "secrets": [{"id": 1, "value": "12345678"}]}, "secrets.0.id"),
    ("run.begin", {"tenant": "t1", "secrets": [{"id": "k", "value": 12345678}]}, "secrets.0.value"),
    ("run.begin", {"tenant": "t1", "secrets": [OK_SECRET, {"id": "k"}]}, "secrets.1.value"),
    ("run.begin", {}, "tenant"),
    ("run.addSecrets", {}, "secrets"),
    ("run.addSecrets", {"secrets": None}, "secrets"),
]


@pytest.mark.parametrize(
    ("method", "params", "field"), STRICT_CASES, ids=[f"{m}:{f}" for m, _, f in STRICT_CASES]
)
def test_strict_types(client: RawClient, method: str, params: dict[str, Any], field: str) -> None:
    # Params are validated before the run is looked up, so a never-begun run id is fine.
    err = invalid(client, method, runId=uid("never"), **params)
    assert field_of(err) == field, err.error


@pytest.mark.parametrize("bad", [5, True, None, ["r"], {"id": "r"}], ids=repr)
@pytest.mark.parametrize("method", ["memory.list", "run.begin", "run.end", "run.addSecrets"])
def test_run_id_must_be_a_string(client: RawClient, method: str, bad: Any) -> None:
    by_method: dict[str, dict[str, Any]] = {
        "memory.list": {"memoryRef": "x"},
        "run.begin": {"tenant": "t1"},
        "run.end": {},
        "run.addSecrets": {"secrets": []},
    }
    params = by_method[method]
    assert field_of(invalid(client, method, runId=bad, **params)) == "runId"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"tenant": 5, "agent": "a"}, "tenant"),
        ({"tenant": "t", "agent": 5.0}, "agent"),
        ({"tenant": "t", "agent": "a", "namespace": 5}, "namespace"),
        ({"tenant": "t", "agent": "a", "namespace": ["n"]}, "namespace"),
        ({"agent": "a"}, "tenant"),
    ],
)
def test_issue_ref_types(client: RawClient, params: dict[str, Any], field: str) -> None:
    assert field_of(invalid(client, "memory.issueRef", **params)) == field


# -- unknown params and unknown fields -----------------------------------------------------

VALID_PARAMS: dict[str, dict[str, Any]] = {
    "host.capabilities": {},
    "sidecar.health": {},
    "sidecar.stats": {},
    "memory.issueRef": {"tenant": "t1", "agent": "a"},
    "run.begin": {"runId": "r", "tenant": "t1"},
    "run.addSecrets": {"runId": "r", "secrets": []},
    "run.end": {"runId": "r"},
    "memory.list": {"runId": "r", "memoryRef": "x"},
    "memory.get": {"runId": "r", "memoryRef": "x", "id": "i"},
    "memory.put": {"runId": "r", "memoryRef": "x", "entry": {"content": "c"}},
    "memory.delete": {"runId": "r", "memoryRef": "x", "id": "i"},
}


@pytest.mark.parametrize("method", sorted(VALID_PARAMS))
def test_unknown_param_is_named(client: RawClient, method: str) -> None:
    params = dict(VALID_PARAMS[method])
    if "runId" in params:
        params["runId"] = uid()
    params["surpriseParam"] = 1
    err = invalid(client, method, **params)
    assert field_of(err) == "surpriseParam"
    assert "surpriseParam" in err.error["message"] or "surpriseParam" in json.dumps(err.details)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"content": "c", "id": "mem_mine"}, "entry.id"),
        ({"content": "c", "createdAt": "2026-01-01T00:00:00.000000Z"}, "entry.createdAt"),
        ({"content": "c", "ttl": 5}, "entry.ttl"),
        ({"content": "c", "Content": "c"}, "entry.Content"),
    ],
)
def test_unknown_entry_fields_rejected(
    client: RawClient, run: str, entry: dict[str, Any], field: str
) -> None:
    ref = uid("ref")
    err = invalid(client, "memory.put", runId=run, memoryRef=ref, entry=entry)
    assert field_of(err) == field
    assert later_list(client, ref) == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"options": {"offset": 5}}, "options.offset"),
        ({"options": {"limit": 5, "cursor": "x"}}, "options.cursor"),
    ],
)
def test_unknown_list_option_rejected(
    client: RawClient, run: str, params: dict[str, Any], field: str
) -> None:
    err = invalid(client, "memory.list", runId=run, memoryRef="x", **params)
    assert field_of(err) == field


def test_unknown_secret_field_rejected(client: RawClient) -> None:
    secret = {"id": "k", "value": "12345678", "scope": "all"}
    err = invalid(client, "run.begin", runId=uid(), tenant="t1", secrets=[secret])
    assert field_of(err) == "secrets.0.scope"


@pytest.mark.parametrize("options", [{"limit": None}, {"tag": None}], ids=repr)
def test_list_options_are_exactly_the_schema(client: RawClient, run: str, options: Any) -> None:
    # PROTOCOL.md: MemoryListOptions "exactly as memory-list-options.schema.json", where limit
    # is an integer and tag a string: null is neither (the schema itself rejects it).
    with pytest.raises(jsonschema.ValidationError, match="is not of type"):
        check_list_options(options)
    err = invalid(client, "memory.list", runId=run, memoryRef="x", options=options)
    assert field_of(err) == f"options.{next(iter(options))}"


# -- entry size: UTF-8 bytes of content plus tags, as received ----------------------------

LIMIT = 65536


@pytest.mark.parametrize(
    ("content", "tags"),
    [
        ("x" * LIMIT, []),
        ("x" * (LIMIT - 3), ["abc"]),
        ("x" * (LIMIT - 6), ["abc", "abc"]),  # duplicates count as received
        ("x" * (LIMIT - 3), ["abc", "", ""]),  # empty tags weigh nothing
        ("é" * (LIMIT // 2), []),  # 2 bytes each
        ("€" * (LIMIT // 3) + "a", []),  # 3 bytes each: 65535 + 1
        ("\U0001f600" * (LIMIT // 4), []),  # 4 bytes each
        ("x" * (LIMIT - 2), ["é"]),
        ("x" * (LIMIT - 64 * 256), [f"{i:03d}" + "t" * 253 for i in range(64)]),
    ],
    ids=[
        "ascii",
        "with-tag",
        "dup-tags",
        "empty-tags",
        "2-byte",
        "3-byte",
        "4-byte",
        "tag-2-byte",
        "max-tags",
    ],
)
def test_entry_at_size_limit_accepted(
    client: RawClient, run: str, content: str, tags: list[str]
) -> None:
    size = len(content.encode()) + sum(len(t.encode()) for t in tags)
    assert size <= LIMIT
    entry = put(client, run, uid("ref"), content, tags=tags)
    assert entry["content"] == content


@pytest.mark.parametrize(
    ("content", "tags"),
    [
        ("x" * (LIMIT + 1), []),
        ("x" * (LIMIT - 2), ["abc"]),
        ("x" * (LIMIT - 5), ["abc", "abc"]),  # would fit after de-duplication: too late
        ("é" * (LIMIT // 2) + "a", []),
        ("€" * (LIMIT // 3) + "ab", []),
        ("\U0001f600" * (LIMIT // 4) + "a", []),
        ("x" * (LIMIT - 1), ["é"]),
        ("é" * (LIMIT // 4 + 1), ["é" * 256] * 64),
    ],
    ids=["ascii", "with-tag", "dup-tags", "2-byte", "3-byte", "4-byte", "tag-2-byte", "tags-heavy"],
)
def test_entry_over_size_limit_rejected(
    client: RawClient, run: str, content: str, tags: list[str]
) -> None:
    ref = uid("ref")
    err = invalid(
        client, "memory.put", runId=run, memoryRef=ref, entry={"content": content, "tags": tags}
    )
    assert field_of(err).startswith("entry")
    assert later_list(client, ref) == []


@pytest.mark.parametrize(
    "content",
    [
        "",
        "a\x00b",
        "\r\n",
        "\x7f\x9f\x1b",
        "\u2028x\u2029",
        "\ufeff\uffff\U0010ffff",
        "[REDACTED:x]",
    ],
    ids=repr,
)
def test_any_string_content_round_trips(client: RawClient, run: str, content: str) -> None:
    ref = uid("ref")
    entry = put(client, run, ref, content)
    assert entry["content"] == content
    assert later_list(client, ref) == [entry]


# -- tags ----------------------------------------------------------------------------------


def test_tag_count_limit(client: RawClient, run: str) -> None:
    tags = [f"t{i}" for i in range(64)]
    assert put(client, run, uid("ref"), "c", tags=tags)["tags"] == tags
    assert (
        field_of(invalid_put(client, run, {"content": "c", "tags": [*tags, "t64"]})) == "entry.tags"
    )
    # Counted as received: 65 tags that would all be dropped are still 65 tags.
    assert field_of(invalid_put(client, run, {"content": "c", "tags": [""] * 65})) == "entry.tags"
    assert field_of(invalid_put(client, run, {"content": "c", "tags": ["a"] * 65})) == "entry.tags"


def test_tag_length_limit_in_characters(client: RawClient, run: str) -> None:
    assert put(client, run, uid("ref"), "c", tags=["t" * 256])["tags"] == ["t" * 256]
    assert put(client, run, uid("ref"), "c", tags=["é" * 256])["tags"] == ["é" * 256]
    err = invalid_put(client, run, {"content": "c", "tags": ["ok", "fine", "t" * 257]})
    assert field_of(err) == "entry.tags.2"
    err = invalid_put(client, run, {"content": "c", "tags": ["\U0001f600" * 257]})
    assert field_of(err) == "entry.tags.0"


@pytest.mark.parametrize(
    "tag",
    ["\x00", "a\x01", "a\tb", "a\nb", "a\n", "\r", "\x1b[31m", "a\x7f", "\x80", "a\x85", "\x9f"],
    ids=repr,
)
def test_tag_control_characters_rejected(client: RawClient, run: str, tag: str) -> None:
    ref = uid("ref")
    err = invalid(
        client, "memory.put", runId=run, memoryRef=ref, entry={"content": "c", "tags": ["ok", tag]}
    )
    assert field_of(err) == "entry.tags.1"
    assert later_list(client, ref) == []


def test_tags_empty_dropped_duplicates_removed_in_order(client: RawClient, run: str) -> None:
    ref = uid("ref")
    written = put(client, run, ref, "c", tags=["b", "", "a", "b", "c", "a", "", "B"])
    assert written["tags"] == ["b", "a", "c", "B"]
    empty = put(client, run, ref, "d", tags=["", ""])
    assert empty["tags"] == []
    # What is persisted is what was returned (newest first).
    assert later_list(client, ref) == [empty, written]


def test_tag_made_too_long_by_redaction(client: RawClient) -> None:
    run_id = new_run(client, secrets=[{"id": "a-rather-long-secret-id", "value": "hunter22"}])
    tag = "t" * 248 + "hunter22"  # 256 characters as received
    ref = uid("ref")
    err = invalid(
        client,
        "memory.put",
        runId=run_id,
        memoryRef=ref,
        entry={"content": "c", "tags": ["x", tag]},
    )
    assert field_of(err) == "entry.tags.1"
    assert "hunter22" not in json.dumps(err.error)
    assert later_list(client, ref) == []
    # Just short enough after redaction: accepted, redacted.
    ok = put(client, run_id, ref, "c", tags=["t" * 200 + "hunter22"])
    assert ok["tags"] == ["t" * 200 + "[REDACTED:a-rather-long-secret-id]"]


# -- expiresAt -----------------------------------------------------------------------------


def now_text(delta: timedelta = timedelta(0)) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize(
    "expires",
    [
        "",
        "tomorrow",
        "2099-01-01",
        "2099-01-01T00:00:00",  # no offset
        "2099-01-01T00:00:00.123456",  # no offset
        "2099-01-01T00:00Z",
        "2099-01-01 00:00:00",
        "2099-13-01T00:00:00Z",
        "2099-02-30T00:00:00Z",
        "2099-01-01T25:00:00Z",
        "2099-01-01T00:00:00+5:30",
        "2099-01-01T00:00:00+0530",
        "2099-01-01T00:00:00.Z",
        "2099-01-01T00:00:00ZZ",
        " 2099-01-01T00:00:00Z",
        "2099-01-01T00:00:00Z ",
        "4102444800",
        "2000-01-01T00:00:00Z",  # past
        "1970-01-01T00:00:00Z",
        "2000-01-01T00:00:00+05:30",
    ],
)
def test_expires_at_rejected(client: RawClient, run: str, expires: str) -> None:
    ref = uid("ref")
    err = invalid(
        client, "memory.put", runId=run, memoryRef=ref, entry={"content": "c", "expiresAt": expires}
    )
    assert field_of(err) == "entry.expiresAt"
    assert later_list(client, ref) == []


@pytest.mark.parametrize(
    "delta", [timedelta(0), timedelta(seconds=-1), timedelta(milliseconds=-1)], ids=str
)
def test_expires_at_now_ish_rejected(client: RawClient, run: str, delta: timedelta) -> None:
    # "strictly in the future": now (already past when it arrives) is not.
    err = invalid_put(client, run, {"content": "c", "expiresAt": now_text(delta)})
    assert field_of(err) == "entry.expiresAt"


@pytest.mark.parametrize(
    ("written", "returned"),
    [
        ("2099-01-01T00:00:00Z", "2099-01-01T00:00:00.000000Z"),
        ("2099-01-01T00:00:00.5Z", "2099-01-01T00:00:00.500000Z"),
        ("2099-01-01T00:00:00.123456Z", "2099-01-01T00:00:00.123456Z"),
        # finer than a microsecond: truncated, never rounded up (never later than written)
        ("2099-01-01T00:00:00.1234567891Z", "2099-01-01T00:00:00.123456Z"),
        ("2099-12-31T23:59:59.9999999Z", "2099-12-31T23:59:59.999999Z"),
        # offsets are converted to UTC
        ("2099-01-01T05:30:00+05:30", "2099-01-01T00:00:00.000000Z"),
        ("2099-01-01T05:30:00.999999999+05:30", "2099-01-01T00:00:00.999999Z"),
        ("2098-12-31T19:00:00-05:00", "2099-01-01T00:00:00.000000Z"),
        ("2099-01-01T00:00:00-00:00", "2099-01-01T00:00:00.000000Z"),
        ("2099-01-01t00:00:00z", "2099-01-01T00:00:00.000000Z"),  # RFC 3339 allows t and z
    ],
)
def test_expires_at_echoed_in_utc_truncated(
    client: RawClient, run: str, written: str, returned: str
) -> None:
    ref = uid("ref")
    entry = put(client, run, ref, "c", expires_at=written)
    assert entry["expiresAt"] == returned
    # The same instant on every read.
    assert later_list(client, ref) == [entry]


def test_expires_at_near_future_accepted(client: RawClient, run: str) -> None:
    written = now_text(timedelta(minutes=5))
    entry = put(client, run, uid("ref"), "c", expires_at=written)
    assert entry["expiresAt"] == written and WIRE_TIME.match(entry["expiresAt"])


@pytest.mark.parametrize(
    ("expires", "returned"),
    [
        ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"),
        ("9999-12-31T22:00:00-01:00", "9999-12-31T23:00:00.000000Z"),
        # In UTC these are in the year 10000, which no wire time can spell: the same instant
        # cannot be returned, so the only sound answer is validation_error.
        ("9999-12-31T23:59:59-01:00", None),
        ("9999-12-31T20:00:00-05:00", None),
    ],
)
def test_expires_at_far_future_never_breaks_the_scope(
    shared_sidecar: Sidecar, client: RawClient, run: str, expires: str, returned: str | None
) -> None:
    ref = uid("ref")
    entry = {"content": "c", "expiresAt": expires}
    answer = client.request("memory.put", {"runId": run, "memoryRef": ref, "entry": entry})
    try:
        seen = later_list(client, ref)
    except RpcError as exc:
        raise AssertionError(f"scope unreadable after the put {answer}: {exc.error}") from None
    if returned is None:
        assert "error" in answer, answer
        err = RpcError(answer["error"])
        assert (err.code, err.rpc_code) == ("validation_error", -32602), answer
        assert field_of(err) == "entry.expiresAt"
        assert seen == []  # nothing stored
    else:
        assert "result" in answer, answer
        assert checked_entry(answer["result"])["expiresAt"] == returned
        assert seen == [answer["result"]]
    assert_healthy(shared_sidecar)


# -- secrets -------------------------------------------------------------------------------


def test_short_secret_value_named_by_index_never_echoed(client: RawClient) -> None:
    short = "Qz7!xw9"  # 7 characters
    secrets = [
        {"id": "a", "value": "long-enough-1"},
        {"id": "b", "value": "long-enough-2"},
        {"id": "c", "value": short},
    ]
    run_id = uid()
    raw = raw_answer(
        client, req("run.begin", {"runId": run_id, "tenant": "t1", "secrets": secrets})
    )
    assert short.encode() not in raw
    answer = json.loads(raw)
    err = RpcError(answer["error"])
    assert (err.code, err.rpc_code) == ("validation_error", -32602)
    assert field_of(err) == "secrets.2.value"
    # A refused begin opens nothing.
    err = expect(client, "not_found", -32004, "memory.list", runId=run_id, memoryRef="x")
    assert err.details["resource"] == "run"
    # The same in run.addSecrets.
    open_run = new_run(client)
    raw = raw_answer(
        client,
        req(
            "run.addSecrets",
            {"runId": open_run, "secrets": [secrets[0], {"id": "d", "value": short}]},
        ),
    )
    assert short.encode() not in raw
    assert field_of(RpcError(json.loads(raw)["error"])) == "secrets.1.value"
    assert client.call("run.addSecrets", runId=open_run, secrets=[]) == {"count": 0}


@pytest.mark.parametrize(
    ("secret", "field"),
    [
        ({"id": "k", "value": ""}, "secrets.0.value"),
        ({"id": "k", "value": "v" * 4097}, "secrets.0.value"),
        ({"id": "a]b", "value": "12345678"}, "secrets.0.id"),
        ({"id": "]", "value": "12345678"}, "secrets.0.id"),
        ({"id": "", "value": "12345678"}, "secrets.0.id"),
        ({"id": "k" * 129, "value": "12345678"}, "secrets.0.id"),
    ],
    ids=["empty-value", "value-4097", "id-bracket", "id-only-bracket", "id-empty", "id-129"],
)
def test_secret_bounds_rejected(client: RawClient, secret: dict[str, str], field: str) -> None:
    err = invalid(client, "run.begin", runId=uid(), tenant="t1", secrets=[secret])
    assert field_of(err) == field
    if len(secret["value"]) >= 8:
        assert secret["value"] not in json.dumps(err.error)


def test_secret_bounds_accepted(client: RawClient) -> None:
    secrets = [
        {"id": "k" * 128, "value": "12345678"},
        {"id": "[x-like(no close)", "value": "v" * 4096},
        {"id": "ünicode id", "value": "ü" * 8},
    ]
    run_id = new_run(client, secrets=secrets)
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 3}
    entry = put(client, run_id, uid("ref"), "a 12345678 b üüüüüüüü")
    assert entry["content"] == f"a [REDACTED:{'k' * 128}] b [REDACTED:ünicode id]"


def many(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"id": f"s{i}", "value": f"secret-value-{i:05d}"} for i in range(start, start + n)]


def test_secret_count_limits(client: RawClient) -> None:
    err = invalid(client, "run.begin", runId=uid(), tenant="t1", secrets=many(257))
    assert field_of(err) == "secrets"
    run_id = new_run(client, secrets=many(256))
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 256}
    assert field_of(invalid(client, "run.addSecrets", runId=run_id, secrets=many(257))) == "secrets"


def test_add_secrets_cannot_push_keyring_over_256(client: RawClient) -> None:
    run_id = new_run(client, secrets=many(200))
    err = invalid(client, "run.addSecrets", runId=run_id, secrets=many(57, start=200))
    assert field_of(err) == "secrets"
    # Refused whole: nothing was merged.
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 200}
    assert client.call("run.addSecrets", runId=run_id, secrets=many(56, 200)) == {"count": 256}
    # Already-known secrets are no growth; one more new one is.
    assert client.call("run.addSecrets", runId=run_id, secrets=many(10)) == {"count": 256}
    err = invalid(client, "run.addSecrets", runId=run_id, secrets=many(1, start=256))
    assert field_of(err) == "secrets"
    # A resuming run.begin merges into the same keyring under the same cap.
    err = invalid(client, "run.begin", runId=run_id, tenant="t1", secrets=many(1, start=300))
    assert field_of(err) == "secrets"
    assert client.call("run.addSecrets", runId=run_id, secrets=[]) == {"count": 256}


# -- names, run ids and idempotency keys ---------------------------------------------------
# PROTOCOL.md states no length bounds for runId, tenant, agent and namespace; the sidecar's
# wire models use runId 1-256 and names 1-128 characters, without control characters (they
# reach log lines). Empty is never a name; the upper bounds asserted are the implementation's.


@pytest.mark.parametrize(
    "bad", ["", "r" * 257, "a\nb", "a\x00b", "\x7f"], ids=["empty", "257", "newline", "nul", "del"]
)
def test_run_id_bounds_rejected(client: RawClient, bad: str) -> None:
    assert field_of(invalid(client, "run.begin", runId=bad, tenant="t1")) == "runId"
    assert field_of(invalid(client, "memory.list", runId=bad, memoryRef="x")) == "runId"


def test_run_id_and_tenant_upper_bounds_accepted(client: RawClient) -> None:
    run_id = uid()
    run_id += "r" * (256 - len(run_id))
    assert len(run_id) == 256
    tenant = "t" * 128
    assert client.call("run.begin", runId=run_id, tenant=tenant)["tenant"] == tenant
    assert client.call("memory.list", runId=run_id, memoryRef="x") == []


@pytest.mark.parametrize("name", ["tenant", "agent", "namespace"])
@pytest.mark.parametrize(
    "bad", ["", "n" * 129, "a\nb", "a\x00b", "a\x9fb"], ids=["empty", "129", "newline", "nul", "c1"]
)
def test_scope_name_bounds_rejected(client: RawClient, name: str, bad: str) -> None:
    params = {"tenant": "t1", "agent": "a", name: bad}
    assert field_of(invalid(client, "memory.issueRef", **params)) == name
    if name == "tenant":
        assert field_of(invalid(client, "run.begin", runId=uid(), tenant=bad)) == "tenant"


def test_scope_name_upper_bounds_accepted(client: RawClient) -> None:
    ref = client.call("memory.issueRef", tenant="t" * 128, agent="a" * 128, namespace="n" * 128)
    assert isinstance(ref["memoryRef"], str) and ref["memoryRef"]


@pytest.mark.parametrize("key", ["", "k" * 257], ids=["empty", "257"])
def test_idempotency_key_bounds_rejected(client: RawClient, run: str, key: str) -> None:
    err = invalid_put(client, run, {"content": "c"}, idempotencyKey=key)
    assert field_of(err) == "idempotencyKey"


@pytest.mark.parametrize("key", ["k", "k" * 256, "ünï-çødé key with spaces"])
def test_idempotency_key_bounds_accepted(client: RawClient, run: str, key: str) -> None:
    ref = uid("ref")
    first = client.call(
        "memory.put", runId=run, memoryRef=ref, idempotencyKey=key, entry={"content": "c"}
    )
    again = client.call(
        "memory.put", runId=run, memoryRef=ref, idempotencyKey=key, entry={"content": "c"}
    )
    assert again == first
    assert later_list(client, ref) == [first]


# -- list options (one scope of 1005 entries) ----------------------------------------------


@dataclass(frozen=True)
class BigScope:
    ref: str
    reader: str
    entries: list[dict[str, Any]]  # in write order
    first_chunk: set[str]  # ids of the first 100 written (all committed before the rest)


@pytest.fixture(scope="module")
def big(shared_sidecar: Sidecar) -> BigScope:
    ref = uid("big")
    with shared_sidecar.client() as c:
        writer = new_run(c)
        entries: list[dict[str, Any]] = []
        first_chunk: set[str] = set()
        for start in range(0, 1005, 100):
            count = min(100, 1005 - start)
            lines = [
                req(
                    "memory.put",
                    {
                        "runId": writer,
                        "memoryRef": ref,
                        "entry": {
                            "content": f"e{i}",
                            "tags": ["all", "tenth"] if i % 10 == 0 else ["all"],
                        },
                    },
                    i,
                )
                for i in range(start, start + count)
            ]
            c.sock.sendall(b"".join(line + b"\n" for line in lines))
            answers = sorted((c.read() for _ in lines), key=lambda a: int(a["id"]))
            chunk = [a["result"] for a in answers]
            entries += chunk
            if start == 0:
                first_chunk = {e["id"] for e in chunk}
        reader = new_run(c)
    return BigScope(ref, reader, entries, first_chunk)


def listed(client: RawClient, big: BigScope, **params: Any) -> list[dict[str, Any]]:
    result = client.call("memory.list", runId=big.reader, memoryRef=big.ref, **params)
    assert isinstance(result, list)
    stamps = [e["createdAt"] for e in result]
    assert stamps == sorted(stamps, reverse=True), "newest first"
    return result


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, 100),
        ({"options": {}}, 100),
        ({"options": {"limit": 0}}, 100),  # 0 means the host default (PROTOCOL.md)
        ({"options": {"limit": 1}}, 1),
        ({"options": {"limit": 100}}, 100),
        ({"options": {"limit": 101}}, 101),
        ({"options": {"limit": 999}}, 999),
        ({"options": {"limit": 1000}}, 1000),
        ({"options": {"limit": 1001}}, 1000),  # above the host maximum: capped
        ({"options": {"limit": 10**9}}, 1000),
        ({"options": {"limit": 2**63 - 1}}, 1000),
        ({"options": {"tag": "all"}}, 100),
        ({"options": {"tag": "all", "limit": 5000}}, 1000),
        ({"options": {"tag": "tenth"}}, 100),
        ({"options": {"tag": "tenth", "limit": 0}}, 100),
        ({"options": {"tag": "tenth", "limit": 500}}, 101),
        ({"options": {"tag": "tenth", "limit": 3}}, 3),
        ({"options": {"tag": "none-has-this"}}, 0),
        ({"options": {"tag": "ten"}}, 0),  # set membership, not substring
        ({"options": {"tag": "TENTH"}}, 0),  # exact, case-sensitive
        ({"options": {"tag": "ten%"}}, 0),  # no pattern matching
        ({"options": {"tag": "tent_"}}, 0),
        ({"options": {"tag": "*"}}, 0),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_list_limit_and_tag(
    client: RawClient, big: BigScope, params: dict[str, Any], expected: int
) -> None:
    if "options" in params:
        check_list_options(params["options"])
    result = listed(client, big, **params)
    assert len(result) == expected
    tag = params.get("options", {}).get("tag")
    assert all(tag in e["tags"] for e in result) if tag else True
    ids = [e["id"] for e in result]
    assert len(set(ids)) == len(ids)


def test_list_returns_the_newest(client: RawClient, big: BigScope) -> None:
    capped = listed(client, big, options={"limit": 1001})
    # The 5 left out of 1005 are oldest, so all from the first pipelined chunk.
    left_out = {e["id"] for e in big.entries} - {e["id"] for e in capped}
    assert len(left_out) == 5 and left_out <= big.first_chunk
    # Puts of one pipelined chunk may commit in any order; chunks commit in order.
    (newest_tenth,) = listed(client, big, options={"tag": "tenth", "limit": 1})
    assert newest_tenth["content"] == "e1000"
    eleven = listed(client, big, options={"tag": "tenth", "limit": 11})
    assert {e["content"] for e in eleven} == {f"e{i}" for i in range(900, 1001, 10)}
    assert listed(client, big, options={"limit": 1})[0]["content"] in {
        f"e{i}" for i in range(1000, 1005)
    }


@pytest.mark.parametrize(
    ("options", "field"),
    [({"tag": ""}, "options.tag"), ({"tag": "t" * 257}, "options.tag")],
    ids=["empty-tag", "tag-257"],
)
def test_list_tag_bounds(client: RawClient, big: BigScope, options: Any, field: str) -> None:
    err = invalid(client, "memory.list", runId=big.reader, memoryRef=big.ref, options=options)
    assert field_of(err) == field


# -- memoryRef: malformed and tampered refs resolve to nothing ------------------------------


@dataclass(frozen=True)
class RefWorld:
    issued: str
    reader: str
    ids: list[str]  # an entry in each reachable scope below


@pytest.fixture(scope="module")
def world(shared_sidecar: Sidecar) -> RefWorld:
    with shared_sidecar.client() as c:
        issued = c.call("memory.issueRef", tenant="t1", agent=uid("agent"))["memoryRef"]
        writer = new_run(c)
        ids = [
            put(c, writer, ref, f"in {ref[:20]}")["id"]
            for ref in [issued, "b", "x", "a/b", "a\\b", ".", "a", "x" * 512]
        ]
        return RefWorld(issued, new_run(c), ids)


MALFORMED = [
    "",
    "x" * 513,
    "a\x00b",
    "a\x1fb",
    "a\nb",
    "a\tb",
    "\x7f",
    "a\x85b",
    "a/../b",
    "..\\x",
    "..",
    "../x",
    "x/..",
    "a\\..\\b",
    "a/..\\b",
    "/../",
]


@pytest.mark.parametrize("ref", MALFORMED, ids=repr)
def test_malformed_ref_resolves_to_nothing(client: RawClient, world: RefWorld, ref: str) -> None:
    assert_resolves_to_nothing(client, world.reader, ref, world.ids)


def test_tampered_issued_ref_resolves_to_nothing(client: RawClient, world: RefWorld) -> None:
    cases = tampered(world.issued)[::7]  # the issuing module checks every one of them
    assert len(cases) >= 8
    for ref in cases:
        assert_resolves_to_nothing(client, world.reader, ref, world.ids)
    # And nothing was deleted through any of them.
    assert [e["id"] for e in later_list(client, world.issued)] == [world.ids[0]]


@pytest.mark.parametrize(
    "ref", ["a/..b", "...", "a..b", "..a", "a/...", "x" * 512, "ünï/çødé", " "]
)
def test_well_formed_plain_refs_work(client: RawClient, run: str, ref: str) -> None:
    unique = (ref + uid(""))[-512:] if len(ref) < 500 else ref[:499] + uid("")
    assert len(unique) <= 512
    entry = put(client, run, unique, "c")
    assert later_list(client, unique) == [entry]


def test_plain_ref_is_scoped_to_the_run_tenant(client: RawClient) -> None:
    ref = uid("shared-plain")
    mine = put(client, new_run(client, "t1"), ref, "t1 wrote this")
    # Tenant t2 using the same string sees its own (empty) scope: no forbidden, no t1 data.
    t2_run = new_run(client, "t2")
    assert client.call("memory.list", runId=t2_run, memoryRef=ref) == []
    assert client.call("memory.get", runId=t2_run, memoryRef=ref, id=mine["id"]) is None
    assert client.call("memory.delete", runId=t2_run, memoryRef=ref, id=mine["id"]) is False
    theirs = put(client, t2_run, ref, "t2 wrote this")
    assert later_list(client, ref, "t1") == [mine]
    assert later_list(client, ref, "t2") == [theirs]
