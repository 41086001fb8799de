"""Makes the PostgreSQL backend from a ``postgresql://`` URL and the ``[postgresql]`` settings.

Imported only when a ``postgresql://`` database is configured: it imports the driver, which
is the optional extra ``openwop-memory[postgresql]``.
"""

from __future__ import annotations

import re
import urllib.parse

from ..base import Storage, StorageStartupError
from .settings import PostgresqlSettings

# A host of the URL's host list as the driver reads it: a Unix socket path, a bracketed
# IPv6 address, or a name or IPv4 address; each with an optional numeric port.
_HOSTSPEC = re.compile(r"(/.*|\[[^\]]+\](:[0-9]*)?|[^:\[\]]*(:[0-9]*)?)")


def create(url: str, group: PostgresqlSettings, *, create: bool) -> Storage:
    """A :class:`~.backend.PostgresqlStorage` for ``url``, tuned by ``group`` (the
    ``[postgresql]`` table); ``create``: it may create the schema in an empty database.

    :raises StorageStartupError: the URL's host list cannot be read, or the driver is not
        installed.
    """
    check_url(url)
    try:
        from .backend import PostgresqlStorage
    except ImportError:
        raise StorageStartupError(
            "the PostgreSQL driver is not installed; install openwop-memory[postgresql]"
        ) from None
    return PostgresqlStorage(
        url,
        create=create,
        pool_min_size=group.pool_min_size,
        pool_max_size=group.pool_max_size,
        connect_timeout=group.connect_timeout,
        command_timeout=group.command_timeout,
        scope_cache_size=group.scope_cache_size,
        prepared_statements=group.prepared_statements,
    )


def check_url(url: str) -> None:
    """Refuse a URL whose form the driver would fail on with a traceback (an unclosed IPv6
    bracket, a port that is not a number), in one line that never quotes the URL: it may
    carry a password.

    :raises StorageStartupError: the URL is malformed.
    """
    problem = "it is not a URL (an IPv6 host must be written [address])"
    try:
        netloc = urllib.parse.urlsplit(url).netloc
    except ValueError:
        netloc = None
    if netloc is not None:
        hosts = netloc.rpartition("@")[2]
        bad = [spec for spec in hosts.split(",") if _HOSTSPEC.fullmatch(spec) is None]
        if not bad:
            return
        problem = "a host's port is not a number, or an IPv6 host is not written [address]"
    raise StorageStartupError(f"the database URL is malformed: {problem}")
