"""The typed client's keyed entries *(extension)*: ``put_keyed``, ``get_key``, ``history``,
blocking and async, against a real sidecar."""

from __future__ import annotations

import pytest
from openwop_memory_client import (
    AsyncMemoryClient,
    Change,
    ConflictError,
    KeyedEntry,
    MemoryClient,
    MemoryValidationError,
    Page,
    Revision,
)
from support.names import uid
from support.schemas import check_entry
from support.sidecar import Sidecar

SECRET = "sk-live-0123456789abcdef"


def test_keyed_round_trip(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        with client.run(uid("w"), tenant, {"openai": SECRET}) as writer:
            first = writer.put_keyed(ref, "profile", f"likes tea {SECRET}", expected_revision=0)
            assert isinstance(first, KeyedEntry)
            assert (first.key, first.revision, first.superseded) == ("profile", 1, None)
            assert first.entry.content == "likes tea [REDACTED:openai]"
            check_entry(first.entry.to_wire())
            with pytest.raises(ConflictError) as refused:
                writer.put_keyed(ref, "profile", "likes coffee", expected_revision=0)
            assert refused.value.details["revision"] == 1
            second = writer.put_keyed(ref, "profile", "likes coffee", expected_revision=1)
            assert (second.revision, second.superseded) == (2, first.entry.id)
            assert writer.get_key(ref, "profile") is None  # after the run's snapshot
            with pytest.raises(MemoryValidationError):
                writer.put(ref, "x", idempotency_key="")  # checked before sending
        with client.run(uid("r"), tenant) as reader:
            assert reader.get_key(ref, "profile") == KeyedEntry(second.entry, "profile", 2)
            revisions = reader.history(ref, "profile")
            assert revisions == [
                Revision(2, "current", second.entry),
                Revision(1, "superseded", first.entry),
            ]
            assert reader.history(ref, "profile", before=2, limit=5) == revisions[1:]
            assert reader.get_key(ref, "nothing") is None


@pytest.mark.anyio
async def test_keyed_async(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as writer:
            written = await writer.put_keyed(ref, "k", "v1")
            again = await writer.put_keyed(ref, "k", "v2")
            assert (written.revision, again.revision) == (1, 2)
            history = await writer.history(ref, "k")
            assert [(r.revision, r.state) for r in history] == [(2, "current"), (1, "superseded")]


def test_pages_and_counts(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        with client.run(uid("w"), tenant) as writer:
            for n in range(5):
                writer.put(ref, f"n{n}", tags=["even"] if n % 2 == 0 else [])
        with client.run(uid("r"), tenant) as reader:
            assert reader.count(ref) == 5 and reader.count(ref, tag="even") == 3
            first = reader.page(ref, limit=2)
            assert isinstance(first, Page) and first.next_cursor is not None
            seen = list(first.entries)
            cursor: str | None = first.next_cursor
            while cursor is not None:
                page = reader.page(ref, limit=2, cursor=cursor)
                seen += page.entries
                cursor = page.next_cursor
            assert seen == reader.list(ref)
            with pytest.raises(MemoryValidationError):
                reader.page(ref, cursor="c1.forged")


def test_the_change_feed(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        start = client.changes(tenant)
        assert start.changes == ()
        with client.run(uid("w"), tenant) as writer:
            first = writer.put_keyed(ref, "k", "v1")
            second = writer.put_keyed(ref, "k", "v2")
        feed = client.changes(tenant, cursor=start.next_cursor)
        assert [(c.id, c.operation, c.memory_ref) for c in feed.changes] == [
            (first.entry.id, "put", ref),
            (first.entry.id, "supersede", ref),
            (second.entry.id, "put", ref),
        ]
        assert all(isinstance(c, Change) and c.at.tzinfo is not None for c in feed.changes)
        assert client.changes(tenant, cursor=feed.next_cursor).changes == ()
        with pytest.raises(MemoryValidationError):
            client.changes(uid("other"), cursor=feed.next_cursor)
