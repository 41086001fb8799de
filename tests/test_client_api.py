"""The client's Python surface: put's keyword forms, typed entries, list keywords, every
input error raised as the library's own before anything is sent, the socket default, a run
used outside its block, and the blocking methods' own documentation."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pydantic
import pytest
from openwop_memory_client import (
    AsyncMemoryClient,
    EntryInput,
    MemoryClient,
    MemoryEntry,
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


def test_the_client_names_fields_as_the_sidecar_does() -> None:
    from openwop_memory.wire.dispatch import field_path as sidecar_spelling
    from openwop_memory_client._convert import field_path as client_spelling

    for loc in [(), ("entry",), ("entry", "tags", 1), ("secrets", 0, "value"), ("x",) * 300]:
        assert client_spelling(loc) == sidecar_spelling(loc)


def test_the_sidecar_drops_pydantics_prefix_too(client: MemoryClient) -> None:
    with pytest.raises(MemoryValidationError) as err:
        client.call("memory.issueRef", tenant="t", agent=None)
    assert str(err.value) == "agent: null is not allowed; omit the field instead"
