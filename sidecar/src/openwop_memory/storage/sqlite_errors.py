"""The one place where sqlite3's errors become the service's errors."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from openwop_memory_client import UpstreamUnavailableError


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn any sqlite3 error into :class:`UpstreamUnavailableError` (the one place we do)."""
    try:
        yield
    except sqlite3.Error as exc:
        reason = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        raise UpstreamUnavailableError(
            "the SQLite database is failing", {"backend": "sqlite", "reason": reason}
        ) from None
    except ValueError as exc:  # aiosqlite raises ValueError on a closed connection
        raise UpstreamUnavailableError(
            "the SQLite database is closed", {"backend": "sqlite", "reason": "closed"}
        ) from exc
