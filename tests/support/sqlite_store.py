"""An open :class:`SqliteStorage` on a real file, for tests that drive the backend directly."""

from __future__ import annotations

import contextlib
import sqlite3
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


def wal_bytes(database: Path) -> int:
    """The size of ``database``'s WAL file."""
    return Path(f"{database}-wal").stat().st_size


def stored_bytes(database: Path) -> bytes:
    """What ``database``'s file and its WAL hold, as raw bytes (the file's, then the WAL's)."""
    wal = Path(f"{database}-wal")
    return database.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def wal_frames(database: Path) -> int:
    """How many frames ``database``'s WAL holds now (the log's length, not its file's
    size: a restarted WAL is written over from its start). Read with a PASSIVE checkpoint
    of its own, which changes nothing a reader sees."""
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        frames: int = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    finally:
        conn.close()
    return frames
