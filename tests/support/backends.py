"""The storage backends the tests run against, each named and able to make a database.

Adding a backend to :data:`BACKENDS` runs the storage contract suite against it; choosing it
with ``pytest --backend NAME`` runs every end-to-end test (every :class:`~support.sidecar.Sidecar`)
against it. Tests keep naming their databases by a path in their work directory; a backend
maps that path to a database of its own (SQLite: the file itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openwop_memory.config import Settings
from openwop_memory.storage.base import Storage
from openwop_memory.storage.registry import create_storage


@dataclass(frozen=True)
class Backend:
    name: str
    url_for: Callable[[Path], str]
    """The database URL of the database a test calls ``path`` (the same one every time)."""

    def storage(self, path: Path, **group: object) -> Storage:
        """A new, unopened store on the database ``path``, with ``group`` as its backend
        settings (``[sqlite]`` keys for SQLite)."""
        settings = Settings.model_validate({"database": self.url_for(path), self.name: group})
        return create_storage(settings)


def _sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


BACKENDS: dict[str, Backend] = {"sqlite": Backend("sqlite", _sqlite_url)}

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
