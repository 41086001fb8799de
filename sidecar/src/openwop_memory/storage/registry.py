"""Storage backends by URL scheme: each scheme's settings model, and its factory, imported
only when the scheme is used.

A backend's settings model is pydantic only (``<backend>/settings.py``), so ``config`` can
validate every scheme's table; its factory is named here, not imported, so an install with
SQLite only never imports a PostgreSQL driver (or anything of a backend it does not use).
A factory receives the URL, its own group of settings and whether it may create the
database; it never sees the daemon's ``Settings`` (storage does not import ``config``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import BaseModel

from .base import Storage, StorageStartupError
from .memory.settings import MemorySettings
from .postgresql.settings import PostgresqlSettings
from .sqlite.settings import SqliteSettings

Factory = Callable[..., Storage]


class Backend(NamedTuple):
    """One scheme's backend: the model of its ``[scheme]`` settings table, and its factory
    as ``"module:function"`` relative to this package (``None``: the settings accept the
    scheme but this build has no backend for it)."""

    settings: type[BaseModel]
    factory: str | None


BACKENDS: dict[str, Backend] = {
    "sqlite": Backend(SqliteSettings, ".sqlite.factory:create"),
    "postgresql": Backend(PostgresqlSettings, ".postgresql.factory:create"),
    # In this process's memory only (tests, in-process services): see storage/memory/.
    "memory": Backend(MemorySettings, ".memory.factory:create"),
}

SCHEMES: tuple[str, ...] = tuple(BACKENDS)


def scheme_of(url: str) -> str:
    """The scheme of a database URL (``""`` when it has none)."""
    scheme, sep, _ = url.partition("://")
    return scheme if sep else ""


def factory_for(url: str) -> Factory:
    """The factory of the backend for ``url``, importing its module now. It is called as
    ``factory(url, group, create=...)``.

    :raises StorageStartupError: no backend of this build serves the URL's scheme.
    """
    scheme = scheme_of(url)
    backend = BACKENDS.get(scheme)
    if backend is None or backend.factory is None:
        if backend is not None:
            raise StorageStartupError(
                f"this build has no {scheme} backend yet; use a sqlite:/// database"
            )
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise StorageStartupError(f"unknown database URL scheme {scheme!r}; expected {known}")
    module_name, _, attribute = backend.factory.partition(":")
    factory: Factory = getattr(importlib.import_module(module_name, __package__), attribute)
    return factory


def create_storage(url: str, groups: Any, *, create: bool) -> Storage:
    """The (not yet opened) backend for ``url``, tuned by its scheme's group of ``groups``
    (any object with an attribute per scheme, such as the daemon's settings).

    :raises StorageStartupError: no backend serves the URL, or its settings are unusable.
    """
    factory = factory_for(url)
    return factory(url, getattr(groups, scheme_of(url)), create=create)
