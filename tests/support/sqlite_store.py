"""An open :class:`SqliteStorage` on a real file, for tests that drive the backend directly."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from openwop_memory.storage.sqlite import SqliteStorage


@contextlib.asynccontextmanager
async def opened(path: Path, **kwargs: object) -> AsyncIterator[SqliteStorage]:
    """The store at ``path`` opened with ``kwargs``; closed on the way out, with any
    ``before_statement`` seam a test set removed first (the close commits and checkpoints)."""
    store = SqliteStorage(str(path), **kwargs)  # type: ignore[arg-type]
    await store.open()
    try:
        yield store
    finally:
        store._writer.before_statement = None
        await store.close()
