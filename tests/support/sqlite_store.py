"""An open :class:`SqliteStorage` on a real file, for tests that drive the backend directly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from openwop_memory.storage.sqlite.backend import SqliteStorage


@contextlib.asynccontextmanager
async def opened(
    path: Path, *, background_keywords: bool = False, **kwargs: object
) -> AsyncIterator[SqliteStorage]:
    """The store at ``path`` opened with ``kwargs``; closed on the way out, with any
    ``before_statement`` seam a test set removed first (the close commits and checkpoints).
    The keyword indexer's background commits are off unless asked for: they would land
    among the commits these tests count and fault (a search still indexes what it needs)."""
    store = SqliteStorage(str(path), **kwargs)  # type: ignore[arg-type]
    store.keywords.catch_up.enabled = background_keywords
    await store.open()
    try:
        yield store
    finally:
        store._writer.before_statement = None
        await store.close()
