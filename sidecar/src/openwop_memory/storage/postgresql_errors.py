"""The one place where the PostgreSQL driver's errors become the service's errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import asyncpg
from openwop_memory_client import UpstreamUnavailableError

# The connection is unusable (closed, reset, its backend terminated, a broken protocol
# state: asyncpg's InternalClientError), or the server did not answer in time.
CONNECTION_ERRORS = (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError)

# Worth one more try in a fresh transaction: nothing was written, and the conflict is gone.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Turn any driver, connection or timeout error into :class:`UpstreamUnavailableError`.

    ``details.reason`` is the SQLSTATE of a server error, else the error's class name; a
    message from the server is never passed on (it may quote a value).
    """
    try:
        yield
    except asyncpg.PostgresError as exc:
        raise UpstreamUnavailableError(
            "the PostgreSQL database is failing",
            {"backend": "postgresql", "reason": exc.sqlstate or type(exc).__name__},
        ) from None
    except CONNECTION_ERRORS as exc:
        raise UpstreamUnavailableError(
            "the PostgreSQL database is unreachable",
            {"backend": "postgresql", "reason": type(exc).__name__},
        ) from None


def is_retryable(exc: BaseException) -> bool:
    """A serialization failure or deadlock: the transaction may simply be run again."""
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in RETRYABLE_SQLSTATES
