"""The storage backends the tests run against, each named and able to make a database.

Adding a backend to :data:`BACKENDS` runs the storage contract suite against it; choosing it
with ``pytest --backend NAME`` runs every end-to-end test (every :class:`~support.sidecar.Sidecar`)
against it. Tests keep naming their databases by a path in their work directory; a backend
maps that path to a database of its own (SQLite: the file itself; memory: the in-memory
database of this process named after it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openwop_memory.config import Settings
from openwop_memory.storage.base import Storage
from openwop_memory.storage.registry import create_storage

from support.postgres import PostgresServer


@dataclass(frozen=True)
class Backend:
    name: str
    url_for: Callable[[Path], str]
    """The database URL of the database a test calls ``path`` (the same one every time)."""
    shared: bool = True
    """Its databases are reached from other processes too (a sidecar's, a CLI's); false for
    the in-memory backend, whose databases live in one process (tests marked
    ``across_processes`` skip it)."""
    migrated: bool = True
    """Its databases have a schema with numbered migrations (tests marked ``migrates``, which
    build a database of an older schema, skip a backend without)."""

    def storage(self, path: Path, **group: object) -> Storage:
        """A new, unopened store on the database ``path``, with ``group`` as its backend
        settings (``[sqlite]`` keys for SQLite)."""
        settings = Settings.model_validate({"database": self.url_for(path), self.name: group})
        return create_storage(settings.database, settings, create=settings.create_database)


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _memory_url(path: Path) -> str:
    """The in-memory database named after the path: the same one every time in this process
    (a sidecar is another process, with a database of its own)."""
    return f"memory://{path}"


class _PostgresDatabases:
    """One throwaway server for the whole test session, started on first use, and one
    database per path a test names (created on first use, the same one after that)."""

    def __init__(self) -> None:
        self.server: PostgresServer | None = None
        self._created: set[str] = set()

    def url_for(self, path: Path) -> str:
        if self.server is None:
            self.server = PostgresServer().__enter__()
        name = self.database_name(path)
        if name not in self._created:
            self.server.create_database(name)
            self._created.add(name)
        return self.server.url(name)

    def database_name(self, path: Path) -> str:
        return "t_" + hashlib.sha256(str(path).encode()).hexdigest()[:24]

    def psql(self, path: Path, sql: str) -> str:
        """Run ``sql`` as the superuser in the database of ``path`` (made if need be)."""
        self.url_for(path)
        assert self.server is not None
        return self.server.psql(sql, self.database_name(path))

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()


POSTGRES = _PostgresDatabases()

BACKENDS: dict[str, Backend] = {
    "sqlite": Backend("sqlite", _sqlite_url),
    "postgresql": Backend("postgresql", POSTGRES.url_for),
    "memory": Backend("memory", _memory_url, shared=False, migrated=False),
}

_selected = "sqlite"


def select(name: str) -> None:
    """Make ``name`` the backend of every sidecar started from now on (see conftest)."""
    global _selected
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    _selected = name


def selected() -> Backend:
    """The backend end-to-end tests run against."""
    return BACKENDS[_selected]
