"""The one place where the PostgreSQL driver's errors become the service's errors."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import asyncpg
from openwop_memory_client import UpstreamUnavailableError

from ...logs import describe_exception
from ..base import DatabaseUnreachableError, StorageStartupError

# The connection is unusable (closed, reset, its backend terminated, a broken protocol
# state: asyncpg's InternalClientError), or the server did not answer in time.
CONNECTION_ERRORS = (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError)

# Worth one more try in a fresh transaction: nothing was written, and the conflict is gone.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock

# At start-up, a server that is still starting (57P03), full (53300) or between its socket
# and its backend (class 08) may serve a moment later: waited for, as an unreachable one is.
_NOT_YET_SQLSTATES = frozenset({"57P03", "53300"})
# What to check, by SQLSTATE, after the server's own message.
_STARTUP_HINTS = {
    "28P01": "check the user name and password of the database URL",
    "28000": "check that the server's pg_hba.conf lets this user connect from this host",
    "3D000": "check the database name in the URL, or create the database",
    "42501": "grant the user CREATE on the database's schema (GRANT CREATE ON SCHEMA public "
    "TO ...), or let a user who may create the tables once",
}
# socket() or connect() refused by the host, not by the server: a sandbox (systemd's
# RestrictAddressFamilies=, PrivateNetwork=, IPAddressDeny=) or a firewall.
_SANDBOXED_ERRNOS = frozenset({errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES, errno.ENETUNREACH})


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


def startup_error(exc: BaseException, dsn: str) -> StorageStartupError:
    """The start-up error for a driver or connection error raised while opening ``dsn``.

    A server error carries the server's own message and SQLSTATE, and a hint: at start-up
    the only statements run are the sidecar's own (connect, migrate), so the message quotes
    no stored value; it may name the user and the database, never the password (and the
    password, were it ever quoted, is blanked). A connection error says what the host
    answered; it is a :class:`DatabaseUnreachableError`, worth waiting for, as are a server
    still starting or out of connection slots. The URL itself is never repeated.
    """
    password = urlsplit(dsn).password
    if isinstance(exc, asyncpg.PostgresError):
        code = exc.sqlstate or type(exc).__name__
        message = _blank(str(getattr(exc, "message", "") or type(exc).__name__), dsn, password)
        hint = _STARTUP_HINTS.get(code, "check the URL and the server's log")
        text = f"cannot open the PostgreSQL database: {message} ({code}); {hint}"
        if code in _NOT_YET_SQLSTATES or code.startswith("08"):
            return DatabaseUnreachableError(text)
        return StorageStartupError(text)
    what = _blank(describe_exception(exc), dsn, password)
    hint = "check that the server is up and that this host may connect to it"
    if isinstance(exc, OSError) and exc.errno in _SANDBOXED_ERRNOS:
        hint = (
            "this host refused the connection itself: under the shipped systemd unit, add "
            "its PostgreSQL drop-in (see systemd/README.md)"
        )
    return DatabaseUnreachableError(f"cannot reach the PostgreSQL server ({what}); {hint}")


def _blank(text: str, dsn: str, password: str | None) -> str:
    """``text`` with the URL and the password (as written, and decoded) replaced."""
    text = text.replace(dsn, "[the database URL]")
    for secret in {password, unquote(password)} if password else ():
        text = text.replace(secret, "[password]")
    return text
