"""``memory.list`` options v2 on a real sidecar (PROTOCOL.md, list options): ``tokenBudget``,
``rank`` and ``query``; their validation; replays; and that what the full-text index holds
is redacted content only."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openwop_memory.token_count import estimate_tokens
from openwop_memory_client import MemoryListOptions
from support.backends import POSTGRES
from support.names import uid
from support.polling import eventually
from support.protocol import checked_entry, error_of, later_list, new_run, put, req
from support.sidecar import RawClient, Sidecar, module_sidecar

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


@cache
def _options_schema() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / "v2" / "memory-list-options.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """The module's sidecar ranks by keywords only, whose order these tests pin down;
    relevance by meaning is tests/storage/test_semantic.py's."""
    with module_sidecar(tmp_path_factory, "list_options_v2", "--semantic-search=false") as s:
        yield s


def listed(client: RawClient, ref: str, tenant: str, **options: Any) -> list[str]:
    """The contents a run begun now lists with ``options`` (checked against the v2 schema)."""
    _options_schema().validate(options)
    return [e["content"] for e in later_list(client, ref, tenant, **options)]


def fill(client: RawClient, tenant: str, contents: list[str]) -> str:
    """A fresh scope of ``tenant`` holding ``contents``, put in this order; its ref."""
    ref = uid("ref")
    writer = new_run(client, tenant)
    for content in contents:
        put(client, writer, ref, content)
    return ref


# -- tokenBudget ---------------------------------------------------------------------------


def test_token_budget_returns_the_prefix_that_fits(client: RawClient) -> None:
    tenant = uid("t")
    small, big = "one two three", "word " * 50
    ref = fill(client, tenant, [small, small + " four", big, small + " five"])
    newest_first = [small + " five", big, small + " four", small]
    costs = [estimate_tokens(c) for c in newest_first]
    assert costs[1] > sum(costs[0:1]) + costs[2] + costs[3]  # the big one is big
    # The whole list fits a generous budget.
    assert listed(client, ref, tenant, tokenBudget=sum(costs)) == newest_first
    # The prefix stops at the first entry that no longer fits...
    assert listed(client, ref, tenant, tokenBudget=costs[0] + costs[1]) == newest_first[:2]
    # ...but an entry over the whole budget on its own is skipped, not cut.
    budget = costs[0] + costs[2]
    assert budget < costs[1]
    assert listed(client, ref, tenant, tokenBudget=budget) == [newest_first[0], newest_first[2]]
    # Too small for any entry: nothing.
    assert listed(client, ref, tenant, tokenBudget=1) == []


def test_token_budget_and_limit_the_fewer_wins(client: RawClient) -> None:
    tenant = uid("t")
    contents = [f"entry number {n}" for n in range(5)]
    ref = fill(client, tenant, contents)
    cost = estimate_tokens(contents[0])
    assert all(estimate_tokens(c) == cost for c in contents)
    assert len(listed(client, ref, tenant, tokenBudget=3 * cost, limit=2)) == 2
    assert len(listed(client, ref, tenant, tokenBudget=2 * cost, limit=4)) == 2
    assert len(listed(client, ref, tenant, tokenBudget=10 * cost, limit=0)) == 5
    # With a tag filter too.
    assert listed(client, ref, tenant, tokenBudget=10 * cost, tag="none") == []


def test_a_huge_token_budget_skips_nothing(client: RawClient) -> None:
    tenant = uid("t")
    ref = fill(client, tenant, ["alpha", "beta"])
    assert listed(client, ref, tenant, tokenBudget=2**62) == ["beta", "alpha"]
    query = "alpha beta"
    assert listed(client, ref, tenant, tokenBudget=2**62, rank="relevance", query=query) == [
        "beta",
        "alpha",
    ]


# -- rank and query ------------------------------------------------------------------------


def test_relevance_ranks_matches_and_recency_ignores_the_query(client: RawClient) -> None:
    tenant = uid("t")
    ref = fill(
        client,
        tenant,
        [
            "the database migration plan",
            "lunch order for friday",
            "rollback the database migration",
            "database backups run nightly",
        ],
    )
    assert listed(client, ref, tenant, rank="relevance", query="Database rollback?") == [
        "rollback the database migration",
        "database backups run nightly",
        "the database migration plan",
    ]
    assert listed(client, ref, tenant, rank="relevance", query="database", limit=1) == [
        "database backups run nightly"
    ]
    assert listed(client, ref, tenant, rank="relevance", query="giraffe") == []
    everything = listed(client, ref, tenant)
    assert listed(client, ref, tenant, query="giraffe") == everything
    assert listed(client, ref, tenant, rank="recency", query="giraffe") == everything
    # Relevance within a token budget: the best match alone fits.
    best = "rollback the database migration"
    budget = estimate_tokens(best)
    assert listed(
        client, ref, tenant, rank="relevance", query="database rollback", tokenBudget=budget
    ) == [best]


def test_a_replay_ranks_as_the_original_run(client: RawClient) -> None:
    tenant = uid("t")
    ref = fill(client, tenant, ["red apple", "green apple pie", "red wine", "apple juice"])
    run = new_run(client, tenant)
    options = {"rank": "relevance", "query": "red apple"}
    params = {"runId": run, "memoryRef": ref, "options": options}
    first = client.call("memory.list", **params)
    for entry in first:
        checked_entry(entry)
    writer = new_run(client, tenant)
    for n in range(20):
        put(client, writer, ref, f"apple {n}")
    client.call("run.end", runId=run)
    client.call("run.begin", runId=run, tenant=tenant, replay=True)
    assert client.call("memory.list", **params) == first
    assert [e["content"] for e in first][:1] == ["red apple"]


def test_relevance_without_a_query_is_a_validation_error(client: RawClient) -> None:
    """The schema leaves it to the host; PROTOCOL.md says: refused, naming the query."""
    for options in ({"rank": "relevance"}, {"rank": "relevance", "tokenBudget": 5}):
        _options_schema().validate(options)
        line = req("memory.list", {"runId": "no-such-run", "memoryRef": "r", "options": options})
        err = error_of(client.raw(line), "validation_error", -32602)
        assert err.details["field"] == "options.query"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"rank": "best"}, "options.rank"),
        ({"query": ""}, "options.query"),
        ({"query": "x" * 4097}, "options.query"),
        ({"query": 7}, "options.query"),
        ({"tokenBudget": 0}, "options.tokenBudget"),
        ({"tokenBudget": "100"}, "options.tokenBudget"),
        ({"tokenBudget": 1.5}, "options.tokenBudget"),
        ({"tokenBudget": None}, "options.tokenBudget"),
    ],
)
def test_bad_options_are_validation_errors(
    client: RawClient, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(jsonschema.ValidationError):  # the schema refuses them too
        _options_schema().validate(options)
    line = req("memory.list", {"runId": "no-such-run", "memoryRef": "r", "options": options})
    err = error_of(client.raw(line), "validation_error", -32602)
    assert err.details["field"] == field


def test_a_query_of_4096_characters_is_accepted(client: RawClient) -> None:
    tenant = uid("t")
    ref = fill(client, tenant, ["needle in a haystack"])
    query = ("needle " * 600)[:4096]
    assert listed(client, ref, tenant, rank="relevance", query=query) == ["needle in a haystack"]


# -- what the index holds ------------------------------------------------------------------

SECRET = "zebracorn7sekretvalue"  # one word, so a leak would be one indexed term


def _indexed_text(sidecar: Sidecar) -> str:
    """Everything the backend's full-text index holds, as text."""
    if sidecar.backend.name == "sqlite":
        conn = sqlite3.connect(f"file:{sidecar.database}?mode=ro", uri=True)
        try:
            conn.execute(
                "CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, entries_fts, 'row')"
            )
            terms = [row[0] for row in conn.execute("SELECT term FROM temp.vocab")]
            blobs = [bytes(row[0]) for row in conn.execute("SELECT block FROM entries_fts_data")]
        finally:
            conn.close()
        return " ".join(terms) + " ".join(b.decode("latin-1") for b in blobs)
    return POSTGRES.psql(sidecar.database, "SELECT search::text FROM entries")


def test_only_redacted_content_is_indexed(sidecar: Sidecar) -> None:
    tenant = uid("t")
    ref = uid("ref")
    with sidecar.client() as client:
        writer = uid("run")
        client.call(
            "run.begin", runId=writer, tenant=tenant, secrets=[{"id": "k", "value": SECRET}]
        )
        entry = put(client, writer, ref, f"the deploy key is {SECRET} keep it safe")
        assert SECRET not in entry["content"]

        # Indexed after the put's commit, in the background: wait for it.
        def holds_entry() -> str | None:
            text = _indexed_text(sidecar)
            return text if "safe" in text else None

        indexed = eventually(holds_entry)
        assert "redact" in indexed  # the index holds the entry...
        assert SECRET not in indexed.lower()  # ...but never the secret
        assert SECRET[:12] not in indexed.lower()
        if not _semantic(client):
            # By meaning (with the search extra) the query's word pieces may still be near
            # the entry's; tests/storage/test_semantic.py proves the vector holds no secret either.
            assert listed(client, ref, tenant, rank="relevance", query=SECRET) == []
        assert listed(client, ref, tenant, rank="relevance", query="deploy") == [entry["content"]]


def _semantic(client: RawClient) -> bool:
    modes: list[str] = client.call("host.capabilities")["capabilities"]["memory"]["search"]["modes"]
    return "semantic" in modes


# -- the vendor filter (extension) --------------------------------------------------------

FILTER = "vendor.openwop-memory.filter"


def filtered(client: RawClient, ref: str, tenant: str, **options: Any) -> list[str]:
    """Like :func:`listed`, for options holding the extension (outside the v2 schema)."""
    return [e["content"] for e in later_list(client, ref, tenant, **options)]


def test_the_filter_extension(client: RawClient) -> None:
    tenant = uid("t")
    ref = uid("ref")
    writer = new_run(client, tenant)
    one = put(client, writer, ref, "note one", tags=["a", "b"])
    two = put(client, writer, ref, "note two", tags=["b"])
    put(client, writer, ref, "note three", tags=["c"])
    assert filtered(client, ref, tenant, **{FILTER: {"tagsAny": ["a", "c"]}}) == [
        "note three",
        "note one",
    ]
    assert filtered(client, ref, tenant, **{FILTER: {"tagsAll": ["b", "a", "b"]}}) == ["note one"]
    after_one = {"createdAfter": one["createdAt"]}
    assert filtered(client, ref, tenant, **{FILTER: after_one}) == ["note three", "note two"]
    before_two = {"createdBefore": two["createdAt"].replace("Z", "+00:00")}
    assert filtered(client, ref, tenant, **{FILTER: before_two}) == ["note one"]
    assert filtered(client, ref, tenant, tag="b", **{FILTER: after_one}) == ["note two"]
    assert filtered(
        client, ref, tenant, rank="relevance", query="note", **{FILTER: {"tagsAny": ["b"]}}
    ) == ["note two", "note one"]
    assert filtered(client, ref, tenant, **{FILTER: {}}) == ["note three", "note two", "note one"]


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ({"createdAfter": "yesterday"}, "createdAfter"),
        ({"createdBefore": "2026-11-29T15:21:51"}, "createdBefore"),
        ({"tagsAny": []}, "tagsAny"),
        ({"tagsAll": ["x" * 257]}, "tagsAll[0]"),
        ({"tagsAll": ["a"] * 65}, "tagsAll"),
        ({"tags": ["a"]}, "tags"),
    ],
)
def test_a_bad_filter_is_a_validation_error(
    client: RawClient, condition: dict[str, Any], field: str
) -> None:
    tenant = uid("t")
    run = new_run(client, tenant)
    line = req("memory.list", {"runId": run, "memoryRef": "r", "options": {FILTER: condition}})
    err = error_of(client.raw(line), "validation_error", -32602)
    assert err.details["field"] == f"options.{FILTER}.{field}"


def test_the_options_model_dumps_the_filter_under_its_wire_name() -> None:
    """What the client sends for a :class:`MemoryListOptions` holding the filter."""
    wire = {FILTER: {"tagsAny": ["a"]}, "rank": "relevance", "query": "x", "tokenBudget": 9}
    assert MemoryListOptions.model_validate(wire).model_dump(exclude_none=True) == wire
