"""Makes the SQLite backend from a ``sqlite://`` URL and the ``[sqlite]`` settings."""

from __future__ import annotations

from .backend import SqliteStorage
from .settings import SqliteSettings


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///path`` URL (``sqlite:////abs`` for absolute)."""
    return url.removeprefix("sqlite://").removeprefix("/")


def create(url: str, group: SqliteSettings, *, create: bool) -> SqliteStorage:
    """A :class:`SqliteStorage` for ``url``, tuned by ``group`` (the ``[sqlite]`` table);
    ``create``: it may create a missing database file."""
    return SqliteStorage(
        sqlite_path(url),
        create=create,
        synchronous=group.synchronous,
        busy_timeout_ms=int(group.busy_timeout * 1000),
        read_connections=group.read_connections,
        inline_point_reads=group.inline_point_reads,
        scope_cache_size=group.scope_cache_size,
    )
