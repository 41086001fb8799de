"""The client's Python surface: put's keyword forms, typed entries, list keywords (the v2
options, the filter extension and search), every input error raised as the library's own
before anything is sent, the socket default, a run used outside its block, and the blocking
methods' own documentation."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pydantic
import pytest
from openwop_memory.token_count import estimate_tokens
from openwop_memory_client import (
    AsyncMemoryClient,
    AsyncMemoryRun,
    EntryInput,
    MemoryClient,
    MemoryEntry,
    MemoryListOptions,
    MemoryRun,
    MemoryValidationError,
    OpenWopMemoryError,
    RunNotOpenError,
    ValidationError,
)
from support.names import uid
from support.sidecar import Sidecar

pytestmark = pytest.mark.anyio


@pytest.fixture
def client(shared_sidecar: Sidecar) -> Iterator[MemoryClient]:
    with MemoryClient(shared_sidecar.socket) as c:
        yield c


def _puts(client: MemoryClient) -> dict[str, int]:
    counts: dict[str, int] = client.stats()["requests"].get("memory.put", {})
    return dict(counts)


async def test_ttl_and_expires_at_round_trip_through_the_sidecar(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    at = datetime(2099, 5, 4, 3, 2, 1, 123456, tzinfo=timezone(timedelta(hours=2)))
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            before = datetime.now(UTC)
            by_delta = await run.put(ref, "a day", ttl=timedelta(days=1), tags=["x"])
            by_seconds = await run.put(ref, "a minute", ttl=60)
            by_float = await run.put(ref, "a second and a half", ttl=1.5)
            after = datetime.now(UTC)
            fixed = await run.put(ref, "fixed", expires_at=at)
            in_dict = await run.put(ref, {"content": "dict", "expiresAt": at, "tags": ("y",)})
            forever = await run.put(ref, "forever")
        assert by_delta.expires_at is not None and by_seconds.expires_at is not None
        assert before + timedelta(days=1) <= by_delta.expires_at <= after + timedelta(days=1)
        assert before + timedelta(seconds=60) <= by_seconds.expires_at
        assert by_seconds.expires_at <= after + timedelta(seconds=60)
        assert by_float.expires_at is not None
        assert by_float.expires_at <= after + timedelta(seconds=1.5)
        assert fixed.expires_at == at and fixed.expires_at.tzinfo is UTC
        assert in_dict.expires_at == at and in_dict.tags == ("y",)
        assert forever.expires_at is None and by_delta.tags == ("x",)
        async with client.run(uid("r"), tenant) as reader:
            listed = await reader.list(ref)
        assert listed == [forever, in_dict, fixed, by_float, by_seconds, by_delta]
        assert fixed.to_wire()["expiresAt"] == "2099-05-04T01:02:01.123456Z"


def test_entries_are_typed_frozen_objects(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        entry = run.put(ref, "just a string")
    assert isinstance(entry, MemoryEntry)
    assert entry.content == "just a string" and entry.tags == ()
    assert isinstance(entry.created_at, datetime) and entry.created_at.tzinfo is UTC
    assert entry.id.startswith("mem_")
    with pytest.raises(AttributeError):
        entry.content = "changed"  # type: ignore[misc]
    assert set(entry.to_wire()) == {"id", "content", "tags", "createdAt"}


def test_list_keyword_options(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        a = run.put(ref, "a", tags=["k"])
        b = run.put(ref, "b")
        c = run.put(ref, "c", tags=["k"])
    with client.run(uid("r"), tenant) as reader:
        assert reader.list(ref, limit=2) == [c, b]
        assert reader.list(ref, tag="k") == [c, a]
        assert reader.list(ref, limit=1, tag="k") == [c]
        assert reader.list(ref, {"limit": 1}) == [c]
        with pytest.raises(MemoryValidationError, match="not both"):
            reader.list(ref, {"limit": 1}, tag="k")


# What each bad call raises: the library's error naming the field, before sending.
BAD_PUTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("int content", {"content": 42}, "entry", "entry: content must be a string"),
    ("dict int content", {"content": {"content": 42}}, "entry.content", "entry.content: Input"),
    ("unknown key", {"content": {"contnet": "x"}}, "entry.content", "entry.content: Field"),
    ("extra key", {"content": {"content": "x", "id": "m"}}, "entry.id", "entry.id: Extra"),
    ("tags one string", {"content": "x", "tags": "abc"}, "entry.tags", "entry.tags: must be a"),
    (
        "tags an int",
        {"content": "x", "tags": 5},
        "entry.tags",
        "entry.tags: must be a sequence of strings, not int",
    ),
    (
        "tags a mapping",
        {"content": "x", "tags": {"a": "b"}},
        "entry.tags",
        "entry.tags: must be a sequence of strings, not dict",
    ),
    (
        "tags twice",
        {"content": {"content": "x", "tags": ["a"]}, "tags": ["b"]},
        "entry.tags",
        "entry.tags: given both in the entry and as tags=",
    ),
    ("tag not str", {"content": "x", "tags": [1]}, "entry.tags[0]", "entry.tags[0]: Input"),
    (
        "naive",
        {"content": "x", "expires_at": datetime(2099, 1, 1)},
        "entry.expiresAt",
        "entry.expiresAt: a naive datetime names no instant; give it a tzinfo (e.g. UTC)",
    ),
    (
        "naive in dict",
        {"content": {"content": "x", "expiresAt": datetime(2099, 1, 1)}},
        "entry.expiresAt",
        "entry.expiresAt: a naive datetime",
    ),
    (
        "ttl and expires_at",
        {"content": "x", "ttl": 5, "expires_at": datetime.now(UTC)},
        "entry.expiresAt",
        "entry.expiresAt: give ttl or expires_at, not both",
    ),
    (
        "ttl zero",
        {"content": "x", "ttl": 0},
        "entry.expiresAt",
        "entry.expiresAt: ttl must be a positive duration",
    ),
    (
        "ttl negative",
        {"content": "x", "ttl": timedelta(seconds=-1)},
        "entry.expiresAt",
        "entry.expiresAt: ttl must be a positive duration",
    ),
    ("ttl nan", {"content": "x", "ttl": float("nan")}, "entry.expiresAt", "entry.expiresAt: ttl"),
    (
        "ttl str",
        {"content": "x", "ttl": "7d"},
        "entry.expiresAt",
        "entry.expiresAt: ttl must be a timedelta or a number of seconds, not str",
    ),
    ("ttl bool", {"content": "x", "ttl": True}, "entry.expiresAt", "entry.expiresAt: ttl must"),
    (
        "ttl huge",
        {"content": "x", "ttl": 1e12},
        "entry.expiresAt",
        "entry.expiresAt: ttl reaches past the year 9999",
    ),
    (
        "ttl past float",
        {"content": "x", "ttl": 10**400},
        "entry.expiresAt",
        "entry.expiresAt: ttl reaches past the year 9999",
    ),
    (
        "expires_at before year 1 in UTC",
        {"content": "x", "expires_at": datetime.min.replace(tzinfo=timezone(timedelta(hours=5)))},
        "entry.expiresAt",
        "entry.expiresAt: out of range once converted to UTC",
    ),
    (
        "ttl with dict expiry",
        {"content": {"content": "x", "expiresAt": "2099-01-01T00:00:00Z"}, "ttl": 5},
        "entry.expiresAt",
        "entry.expiresAt: given both in the entry and as ttl=",
    ),
    ("key type", {"content": "x", "idempotency_key": 7}, "idempotencyKey", "idempotencyKey: "),
    ("empty key", {"content": "x", "idempotency_key": ""}, "idempotencyKey", "idempotencyKey: "),
]


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [case[1:] for case in BAD_PUTS],
    ids=[case[0] for case in BAD_PUTS],
)
def test_bad_put_is_the_librarys_error_before_sending(
    client: MemoryClient, kwargs: dict[str, Any], field: str, message: str
) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        before = _puts(client)
        with pytest.raises(MemoryValidationError) as err:
            run.put(ref, **kwargs)
        assert _puts(client) == before, "the bad put reached the sidecar"
    assert not isinstance(err.value, pydantic.ValidationError)
    assert err.value.details == {"field": field}
    assert str(err.value).startswith(message)
    assert "Value error" not in str(err.value)


def test_other_bad_input_is_the_librarys_error(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with pytest.raises(MemoryValidationError, match=r"^tenant: String should have at least"):
        client.issue_ref("", "agent")
    with pytest.raises(MemoryValidationError, match=r"^secrets: must be a mapping"):
        client.run(uid("w"), tenant, secrets="sk-not-a-mapping")  # type: ignore[arg-type]
    short = client.run(uid("w"), tenant, secrets={"k": "short"})
    with pytest.raises(MemoryValidationError, match=r"^secrets\[0\]\.value: String should"):
        short.__enter__()
    with client.run(uid("w"), tenant) as run:
        with pytest.raises(MemoryValidationError, match=r"^options\.limit: Input should be"):
            run.list(ref, limit="5")  # type: ignore[arg-type]
        with pytest.raises(MemoryValidationError, match=r"^options\.limit: Input should be"):
            run.list(ref, limit=-1)
        with pytest.raises(MemoryValidationError, match=r"^id: Input should be a valid string"):
            run.get(ref, 7)  # type: ignore[arg-type]
        with pytest.raises(MemoryValidationError, match=r"^secrets\[0\]: must be a mapping"):
            run.add_secrets([("id", "value-long-enough")])  # type: ignore[list-item]
    # The raw escape hatch: a value JSON cannot spell is the library's error, not json's.
    with pytest.raises(MemoryValidationError, match="not representable in JSON") as raw:
        client.call("memory.list", runId=object(), memoryRef=ref)
    assert raw.value.details == {"field": "params"}


def test_validation_error_keeps_its_old_name() -> None:
    assert ValidationError is MemoryValidationError
    assert issubclass(MemoryValidationError, OpenWopMemoryError)
    assert MemoryValidationError.__name__ != pydantic.ValidationError.__name__


def test_a_run_used_outside_its_block_says_so(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    run = client.run(uid("w"), tenant)
    hint = re.escape("use it inside `with client.run(...) as run:`")
    with pytest.raises(RunNotOpenError, match=rf"^run '{run.run_id}' has not begun: {hint}"):
        run.put(ref, "x")
    with pytest.raises(RunNotOpenError, match="has not begun"):
        run.list(ref)
    with run:
        entry = run.put(ref, "x")
    with pytest.raises(RunNotOpenError, match=rf"^run '{run.run_id}' has ended: {hint}"):
        run.put(ref, "y")
    assert run.get(ref, entry.id) is None  # reads still work on the snapshot
    assert isinstance(RunNotOpenError("x"), RuntimeError)


async def test_async_run_outside_its_block_names_async_with(shared_sidecar: Sidecar) -> None:
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        run = client.run(uid("w"), uid("t"))
        with pytest.raises(RunNotOpenError, match=r"`async with client\.run\(\.\.\.\) as run:`"):
            await run.put("ref", "x")


def test_socket_path_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENWOP_MEMORY_SOCKET", "/run/elsewhere/memory.sock")
    assert AsyncMemoryClient().socket_path == "/run/elsewhere/memory.sock"
    assert MemoryClient().socket_path == "/run/elsewhere/memory.sock"
    assert AsyncMemoryClient("/given.sock").socket_path == "/given.sock"
    monkeypatch.setenv("OPENWOP_MEMORY_SOCKET", "")
    assert AsyncMemoryClient().socket_path == "var/openwop-memory.sock"
    monkeypatch.delenv("OPENWOP_MEMORY_SOCKET")
    assert MemoryClient().socket_path == "var/openwop-memory.sock"


def test_entry_input_form_still_works(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        entry = run.put(ref, EntryInput(content="c", tags=["t"]), idempotency_key="k1")
        assert run.put(ref, {"content": "c", "tags": ["t"]}, idempotency_key="k1") == entry


@pytest.mark.parametrize("cls", [MemoryClient, MemoryRun])
def test_blocking_methods_carry_their_own_docstrings(cls: type[object]) -> None:
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__enter__", "__exit__", "__init__"):
            continue
        if not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        doc = inspect.getdoc(member) or ""
        if name == "__init__":
            continue
        assert doc and not doc.startswith("See "), f"{cls.__name__}.{name}: {doc!r}"
    assert "ttl" in (MemoryRun.put.__doc__ or "")


@pytest.mark.parametrize(
    ("blocking", "non_blocking"), [(MemoryClient, AsyncMemoryClient), (MemoryRun, AsyncMemoryRun)]
)
def test_blocking_methods_take_what_the_async_ones_take(
    blocking: type[object], non_blocking: type[object]
) -> None:
    """The blocking face only waits for the async one: the same parameters, the same
    defaults, for every public method (search and the v2 list keywords included)."""
    names = [n for n, m in inspect.getmembers(non_blocking, inspect.isfunction) if n[0] != "_"]
    assert {"list", "search", "put"} <= set(names) or {"run", "issue_ref"} <= set(names)
    for name in names:
        ours = inspect.signature(getattr(blocking, name)).parameters
        theirs = inspect.signature(getattr(non_blocking, name)).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == [
            (p.name, p.kind, p.default) for p in theirs.values()
        ], name


def test_the_client_names_fields_as_the_sidecar_does() -> None:
    from openwop_memory.wire.dispatch import field_path as sidecar_spelling
    from openwop_memory_client._convert import field_path as client_spelling

    for loc in [(), ("entry",), ("entry", "tags", 1), ("secrets", 0, "value"), ("x",) * 300]:
        assert client_spelling(loc) == sidecar_spelling(loc)


def test_the_sidecar_drops_pydantics_prefix_too(client: MemoryClient) -> None:
    with pytest.raises(MemoryValidationError) as err:
        client.call("memory.issueRef", tenant="t", agent=None)
    assert str(err.value) == "agent: null is not allowed; omit the field instead"


# -- list options v2 and search --------------------------------------------------------------
#
# Relevance is asserted by properties any ranking keeps (the search is list with
# rank="relevance"; the clearly best match comes first; a budget keeps a prefix), so that
# these tests check the client, not the sidecar's ranking of the day.

NOTES = [
    "the database migration plan",
    "lunch order for friday",
    "rollback the database migration",
    "database backups run nightly",
]


def _lists(client: MemoryClient) -> int:
    counts: dict[str, int] = client.stats()["requests"].get("memory.list", {})
    return sum(counts.values())


def test_search_and_the_v2_keywords_through_the_sidecar(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        written = [run.put(ref, text, tags=[f"n{i}"]) for i, text in enumerate(NOTES)]
    with client.run(uid("r"), tenant) as reader:
        found = reader.search(ref, "database rollback")
        assert found == reader.list(ref, rank="relevance", query="database rollback")
        assert found[0] == written[2]
        assert all(isinstance(entry, MemoryEntry) for entry in found)
        assert reader.search(ref, "database rollback", limit=1) == found[:1]
        # A budget keeps the longest prefix of the ranking that fits.
        costs = [estimate_tokens(entry.content) for entry in found]
        budget = costs[0] + costs[1]
        assert reader.search(ref, "database rollback", token_budget=budget) == found[:2]
        assert reader.list(ref, token_budget=estimate_tokens(NOTES[3])) == [written[3]]
        assert reader.search(ref, "database", tag="n0") == [written[0]]
        assert reader.list(ref, rank="recency") == written[::-1]


def test_the_filter_keywords_through_the_sidecar(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("w"), tenant) as run:
        one = run.put(ref, "note one", tags=["a", "b"])
        two = run.put(ref, "note two", tags=["b"])
        three = run.put(ref, "note three", tags=["c"])
    with client.run(uid("r"), tenant) as reader:
        assert reader.list(ref, tags_any=["a", "c"]) == [three, one]
        assert reader.list(ref, tags_all=("b", "a")) == [one]
        assert reader.list(ref, created_after=one.created_at) == [three, two]
        # Any offset names the same instant.
        before_two = two.created_at.astimezone(timezone(timedelta(hours=-7)))
        assert reader.list(ref, created_before=before_two) == [one]
        window = reader.list(ref, created_after=one.created_at, created_before=three.created_at)
        assert window == [two]
        assert reader.list(ref, tag="b", created_after=one.created_at) == [two]
        assert reader.search(ref, "note", tags_any=["c"]) == [three]
        assert set(reader.search(ref, "note", tags_all=["b"])) == {one, two}


async def test_the_async_client_searches_too(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            written = [await run.put(ref, text) for text in NOTES]
        async with client.run(uid("r"), tenant) as reader:
            found = await reader.search(ref, "rollback migration", token_budget=10_000)
            assert found[0] == written[2]
            assert found == await reader.list(ref, query="rollback migration", rank="relevance")
            after = await reader.list(ref, created_after=written[1].created_at, limit=5)
            assert after == [written[3], written[2]]


NAIVE = datetime(2026, 1, 1)
FILTER = "options.vendor.openwop-memory.filter"
# What each bad list raises: the library's error naming the field, before sending.
BAD_LISTS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "relevance without a query",
        {"rank": "relevance"},
        "options.query",
        "options.query: rank 'relevance' requires a query",
    ),
    (
        "a query under recency",
        {"query": "x"},
        "options.query",
        "options.query: a query is ignored under rank 'recency' (the default):"
        " give rank='relevance', or call search()",
    ),
    ("a query under explicit recency", {"query": "x", "rank": "recency"}, "options.query", ""),
    (
        "unknown rank",
        {"rank": "best", "query": "x"},
        "options.rank",
        "options.rank: Input should be 'recency' or 'relevance'",
    ),
    ("empty query", {"rank": "relevance", "query": ""}, "options.query", "options.query: String"),
    ("long query", {"rank": "relevance", "query": "q" * 4097}, "options.query", ""),
    ("query not str", {"rank": "relevance", "query": 7}, "options.query", "options.query: Input"),
    ("zero budget", {"token_budget": 0}, "options.tokenBudget", "options.tokenBudget: Input"),
    ("budget str", {"token_budget": "5"}, "options.tokenBudget", "options.tokenBudget: Input"),
    ("budget bool", {"token_budget": True}, "options.tokenBudget", ""),
    (
        "tags_any one string",
        {"tags_any": "ab"},
        f"{FILTER}.tagsAny",
        f"{FILTER}.tagsAny: must be a sequence of strings, not one string",
    ),
    ("tags_any empty", {"tags_any": []}, f"{FILTER}.tagsAny", f"{FILTER}.tagsAny: List should"),
    ("tags_all not str", {"tags_all": ["a", 1]}, f"{FILTER}.tagsAll[1]", ""),
    ("tags_all an int", {"tags_all": 3}, f"{FILTER}.tagsAll", ""),
    (
        "created_after naive",
        {"created_after": NAIVE},
        f"{FILTER}.createdAfter",
        f"{FILTER}.createdAfter: a naive datetime names no instant",
    ),
    (
        "created_before a string",
        {"created_before": "2026-01-01T00:00:00Z"},
        f"{FILTER}.createdBefore",
        f"{FILTER}.createdBefore: created_before must be a datetime, not str",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [case[1:] for case in BAD_LISTS],
    ids=[case[0] for case in BAD_LISTS],
)
def test_bad_list_options_are_the_librarys_error_before_sending(
    client: MemoryClient, kwargs: dict[str, Any], field: str, message: str
) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("r"), tenant) as reader:
        before = _lists(client)
        with pytest.raises(MemoryValidationError) as err:
            reader.list(ref, **kwargs)
        assert _lists(client) == before, "the bad list reached the sidecar"
    assert not isinstance(err.value, pydantic.ValidationError)
    assert err.value.details == {"field": field}
    assert str(err.value).startswith(message or f"{field}: ")


def test_bad_searches_and_option_forms(client: MemoryClient) -> None:
    tenant = uid("t")
    ref = client.issue_ref(tenant, "agent")
    with client.run(uid("r"), tenant) as reader:
        before = _lists(client)
        with pytest.raises(MemoryValidationError, match=r"^options\.query: String should") as e:
            reader.search(ref, "")
        assert e.value.details == {"field": "options.query"}
        with pytest.raises(MemoryValidationError, match=r"^options\.query: rank 'relevance'"):
            reader.search(ref, None)  # type: ignore[arg-type]
        with pytest.raises(MemoryValidationError, match=r"^options\.tokenBudget: "):
            reader.search(ref, "x", token_budget=-1)
        # The mapping and model forms get the relevance check too, as the sidecar would.
        with pytest.raises(MemoryValidationError, match=r"^options\.query: rank 'relevance'"):
            reader.list(ref, {"rank": "relevance"})
        with pytest.raises(MemoryValidationError, match=r"^options\.query: rank 'relevance'"):
            reader.list(ref, MemoryListOptions(rank="relevance"))
        with pytest.raises(MemoryValidationError, match="not both"):
            reader.list(ref, {"limit": 1}, query="x", rank="relevance")
        assert _lists(client) == before, "a bad list reached the sidecar"
        # The wire form is the wire's: a query under recency is ignored there, as specified.
        assert reader.list(ref, {"query": "x"}) == []
        assert reader.list(ref, MemoryListOptions(rank="relevance", query="x")) == []
