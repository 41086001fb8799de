"""Makes the in-memory backend from a ``memory://NAME`` URL and the ``[memory]`` settings."""

from __future__ import annotations

from ..base import StorageStartupError
from .backend import MemoryStorage
from .settings import MemorySettings


def memory_name(url: str) -> str:
    """The database name of a ``memory://NAME`` URL.

    :raises StorageStartupError: the URL names no database (``memory://``).
    """
    name = url.removeprefix("memory://")
    if not name:
        raise StorageStartupError(
            "an in-memory database needs a name: memory://NAME (stores opened on the same "
            "name in one process share it)"
        )
    return name


def create(url: str, group: MemorySettings, *, create: bool) -> MemoryStorage:
    """A :class:`MemoryStorage` for ``url`` (``group``, the ``[memory]`` table, has nothing
    to set); ``create``: it may make the named database if this process has none of it."""
    return MemoryStorage(memory_name(url), create=create)
