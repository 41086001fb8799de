"""What a type checker sees of the client: checked by ``mypy --strict`` (``make typecheck``),
never run. ``warn_unused_ignores`` (part of ``--strict``) makes each ``type: ignore`` below a
test: if the line stopped being a type error, mypy would report the ignore as unused.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import assert_type

from openwop_memory_client import AsyncMemoryRun, EntryDict, MemoryEntry, MemoryRun


def entry_dicts() -> list[EntryDict]:
    good: EntryDict = {"content": "x", "tags": ["a"], "expiresAt": datetime.now(UTC)}
    misspelled: EntryDict = {"content": "x", "tgas": ["a"]}  # type: ignore[typeddict-unknown-key]
    wrong_type: EntryDict = {"content": 42}  # type: ignore[typeddict-item]
    return [good, misspelled, wrong_type]


def blocking(run: MemoryRun, ref: str) -> None:
    entry = run.put(ref, "content", tags=["a"], ttl=timedelta(days=7))
    assert_type(entry, MemoryEntry)
    assert_type(entry.id, str)
    assert_type(entry.content, str)
    assert_type(entry.tags, tuple[str, ...])
    assert_type(entry.created_at, datetime)
    assert_type(entry.expires_at, datetime | None)
    run.put(ref, "content", ttl=60)
    run.put(ref, {"content": "x", "expiresAt": datetime.now(UTC)})
    run.put(ref, {"contnet": "x"})  # type: ignore[arg-type]
    run.put(ref, "content", ttl="7d")  # type: ignore[arg-type]
    run.put(ref, "content", expires_at="2099-01-01")  # type: ignore[arg-type]
    entry.createdAt  # type: ignore[attr-defined]  # noqa: B018
    assert_type(run.list(ref, limit=5, tag="t"), list[MemoryEntry])
    assert_type(run.get(ref, entry.id), MemoryEntry | None)
    found = run.search(ref, "database rollback", limit=5, token_budget=200, tags_any=["a"])
    assert_type(found, list[MemoryEntry])
    since = datetime.now(UTC) - timedelta(days=1)
    ranked = run.list(ref, query="q", rank="relevance", token_budget=100, created_after=since)
    assert_type(ranked, list[MemoryEntry])
    run.list(ref, rank="best", query="q")  # type: ignore[arg-type]
    run.list(ref, token_budget="100")  # type: ignore[arg-type]
    run.list(ref, created_after="2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    run.list(ref, tokenBudget=100)  # type: ignore[call-arg]
    run.search(ref)  # type: ignore[call-arg]
    run.search(ref, "q", rank="recency")  # type: ignore[call-arg]


async def non_blocking(run: AsyncMemoryRun, ref: str) -> None:
    entry = await run.put(ref, "content", expires_at=datetime.now(UTC) + timedelta(hours=1))
    assert_type(entry.created_at, datetime)
    assert_type(await run.list(ref, limit=5), list[MemoryEntry])
    await run.put(ref, {"contnet": "x"})  # type: ignore[arg-type]
    assert_type(await run.search(ref, "q", created_before=datetime.now(UTC)), list[MemoryEntry])
    await run.list(ref, rank="relevant", query="q")  # type: ignore[arg-type]
