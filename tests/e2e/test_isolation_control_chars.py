"""Issue 20, row 10: control characters in ids, tag filters and idempotency keys are a
``validation_error`` naming the field, on either backend (``--backend postgresql`` runs
them against PostgreSQL, whose ``text`` cannot hold U+0000), and never count as a database
failure: no ``upstream_unavailable``, in the answer or in ``sidecar.stats``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.names import uid
from support.protocol import invalid, new_run, put
from support.sidecar import RawClient

CONTROLS = ["\x00", "a\x00b", "\x01", "a\x1bb", "\x7f", "a\x85b", "\x9f"]


def _upstream_failures(client: RawClient) -> int:
    requests: dict[str, dict[str, int]] = client.call("sidecar.stats")["requests"]
    return sum(outcomes.get("upstream_unavailable", 0) for outcomes in requests.values())


def _field(details: dict[str, Any]) -> str:
    field = details.get("field")
    assert isinstance(field, str), details
    return re.sub(r"\[(\d+)\]", r".\1", field)


@pytest.fixture
def run(client: RawClient) -> str:
    return new_run(client)


@pytest.mark.parametrize("bad", CONTROLS, ids=repr)
def test_control_characters_in_ids_are_validation_errors(
    client: RawClient, run: str, bad: str
) -> None:
    ref = uid("ref")
    stored = put(client, run, ref, "kept", tags=["t"])
    before = _upstream_failures(client)
    for method in ("memory.get", "memory.delete"):
        err = invalid(client, method, runId=run, memoryRef=ref, id=bad)
        assert _field(err.details) == "id", err.error
    err = invalid(
        client,
        "memory.put",
        runId=run,
        memoryRef=ref,
        entry={"content": "c"},
        idempotencyKey=f"key{bad}",
    )
    assert _field(err.details) == "idempotencyKey", err.error
    assert _upstream_failures(client) == before
    # The entry is untouched (a later run sees it) and the connection still served.
    later = new_run(client)
    assert client.call("memory.get", runId=later, memoryRef=ref, id=stored["id"]) == stored


@pytest.mark.parametrize("bad", CONTROLS, ids=repr)
def test_control_characters_in_tag_filters_are_validation_errors(
    client: RawClient, run: str, bad: str
) -> None:
    ref = uid("ref")
    before = _upstream_failures(client)
    filter_key = "vendor.openwop-memory.filter"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tag": bad}, "options.tag"),
        ({"tag": bad, "rank": "relevance", "query": "word"}, "options.tag"),
        ({filter_key: {"tagsAny": ["ok", bad]}}, f"options.{filter_key}.tagsAny.1"),
        ({filter_key: {"tagsAll": [bad]}}, f"options.{filter_key}.tagsAll.0"),
    ]
    for options, field in cases:
        err = invalid(client, "memory.list", runId=run, memoryRef=ref, options=options)
        assert _field(err.details) == field, (options, err.error)
    assert _upstream_failures(client) == before


def test_control_characters_in_a_query_find_nothing_cleanly(client: RawClient, run: str) -> None:
    # A query is read as words, so its control characters are separators, not an error.
    ref = uid("ref")
    before = _upstream_failures(client)
    options = {"rank": "relevance", "query": "a\x00b\x01"}
    assert client.call("memory.list", runId=run, memoryRef=ref, options=options) == []
    assert _upstream_failures(client) == before
