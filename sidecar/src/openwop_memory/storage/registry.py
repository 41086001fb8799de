"""Storage backends by URL scheme, each imported only when its scheme is used.

A backend module is named here, not imported, so an install with SQLite only never imports
a PostgreSQL driver (or anything of a backend it does not use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Storage, StorageStartupError

if TYPE_CHECKING:
    from ..config import Settings

Factory = Callable[[str, "Settings"], Storage]

# scheme → "module:function" (relative to this package) making the backend from the URL and
# the settings, or None for a scheme the settings accept but this build has no backend for.
_BACKENDS: dict[str, str | None] = {
    "sqlite": ".sqlite_factory:create",
    "postgresql": ".postgresql_factory:create",
}

SCHEMES: tuple[str, ...] = tuple(_BACKENDS)


def scheme_of(url: str) -> str:
    """The scheme of a database URL (``""`` when it has none)."""
    scheme, sep, _ = url.partition("://")
    return scheme if sep else ""


def factory_for(url: str) -> Factory:
    """The factory of the backend for ``url``, importing its module now.

    :raises StorageStartupError: no backend of this build serves the URL's scheme.
    """
    scheme = scheme_of(url)
    target = _BACKENDS.get(scheme)
    if target is None:
        if scheme in _BACKENDS:
            raise StorageStartupError(
                f"this build has no {scheme} backend yet; use a sqlite:/// database"
            )
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise StorageStartupError(f"unknown database URL scheme {scheme!r}; expected {known}")
    module_name, _, attribute = target.partition(":")
    factory: Factory = getattr(importlib.import_module(module_name, __package__), attribute)
    return factory


def create_storage(settings: Settings) -> Storage:
    """The (not yet opened) backend for ``settings.database``.

    :raises StorageStartupError: no backend serves the URL, or its settings are unusable.
    """
    return factory_for(settings.database)(settings.database, settings)
