"""Makes the PostgreSQL backend from a ``postgresql://`` URL and the ``[postgresql]`` settings.

Imported only when a ``postgresql://`` database is configured: it imports the driver, which
is the optional extra ``openwop-memory[postgresql]``.
"""

from __future__ import annotations

from ..config import Settings
from .base import Storage, StorageStartupError


def create(url: str, settings: Settings) -> Storage:
    """A :class:`~.postgresql.PostgresqlStorage` for ``url``, tuned by ``settings.postgresql``.

    :raises StorageStartupError: the driver is not installed.
    """
    try:
        from .postgresql import PostgresqlStorage
    except ImportError:
        raise StorageStartupError(
            "the PostgreSQL driver is not installed; install openwop-memory[postgresql]"
        ) from None
    group = settings.postgresql
    return PostgresqlStorage(
        url,
        create=settings.create_database,
        pool_min_size=group.pool_min_size,
        pool_max_size=group.pool_max_size,
        connect_timeout=group.connect_timeout,
        command_timeout=group.command_timeout,
        scope_cache_size=group.scope_cache_size,
        prepared_statements=group.prepared_statements,
    )
