"""The one place where sqlite3's errors become the service's errors."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from openwop_memory_client import UpstreamUnavailableError


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn any sqlite3 error into :class:`UpstreamUnavailableError` (see :func:`translated`)."""
    try:
        yield
    except (sqlite3.Error, ValueError) as exc:
        raise translated(exc) from (exc if isinstance(exc, ValueError) else None)


def translated(exc: sqlite3.Error | ValueError) -> UpstreamUnavailableError:
    """The error the service sees for a sqlite3 error (the one place they are translated).

    ``ValueError`` is what aiosqlite raises on a closed connection.
    """
    if isinstance(exc, ValueError):
        return UpstreamUnavailableError(
            "the SQLite database is closed", {"backend": "sqlite", "reason": "closed"}
        )
    reason = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    return UpstreamUnavailableError(
        "the SQLite database is failing", {"backend": "sqlite", "reason": reason}
    )
