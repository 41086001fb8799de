"""What a sidecar leaves on disk, read from outside it: every file's bytes, and its SQLite
file through a read-only connection (safe beside the running sidecar)."""

from __future__ import annotations

import sqlite3
import stat
from contextlib import closing
from pathlib import Path
from typing import Any


def files_of(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` (database, WAL, shared memory, logs) by its
    relative path, as bytes."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if stat.S_ISREG(path.lstat().st_mode)
    }


def query(database: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on the SQLite file ``database``, opened read-only."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        return list(db.execute(sql, params).fetchall())


def entry_count(database: Path) -> int:
    """How many entry rows the SQLite file ``database`` holds (live, deleted or expired)."""
    [(count,)] = query(database, "SELECT count(*) FROM entries")
    return int(count)
