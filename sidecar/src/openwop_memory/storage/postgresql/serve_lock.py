"""The serve lock of a PostgreSQL database: a session-level advisory lock on a connection of
its own, outside the pool.

Every sidecar serving the database holds it shared (many sidecars share one database); an
import holds it exclusive. So an import is refused while any sidecar serves the database (it
would change the memoryRef key under sidecars that keep the one they read at their start,
splitting the memory), and a sidecar does not start while an import runs. The server drops
the lock with its session, so a sidecar that dies, or loses that connection, holds none:
while its connection is down, the lock guards nothing (the sidecar logs
``serve_lock_lost``). Behind a pooler in transaction mode, a session lock lands on some
server connection: run an import against the server itself.

The caller translates the driver's errors (``errors.startup_error``).
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

import anyio
import asyncpg
import structlog

from ..base import DatabaseInUseError

log = structlog.get_logger("openwop_memory.storage")

# Beside the migration and sweep locks' keys (postgresql.py), in the same namespace of
# ours, and distinct from both: a serving sidecar holds this one for as long as it runs, so
# sharing the sweep's key would make every sweep find it taken.
SERVE_LOCK = 0x6F70_656E_776F_7003
_APPLICATION = "openwop-memory serve lock"

# Who holds the lock, for the refusal: pg_locks splits a bigint key into two oids.
_HOLDERS = (
    "SELECT a.application_name, a.client_addr::text AS addr FROM pg_locks l"
    " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
    " AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 1"
    " AND l.granted AND l.pid <> pg_backend_pid()"
)


class AdvisoryServeLock:
    """The lock, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, dsn: str, *, connect_timeout: float) -> None:
        self._dsn = dsn
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        self._exclusive = False

    async def acquire(self, *, exclusive: bool) -> None:
        """Connect and take the lock without waiting: shared to serve, exclusive to import.

        :raises DatabaseInUseError: it is held the other way (a sidecar serves, or an
            import runs), or exclusive by another import.
        :raises asyncpg.PostgresError, OSError, TimeoutError: the driver's (the caller
            translates them).
        """
        if self._conn is not None:
            return
        role = "import" if exclusive else "serve"
        conn = await asyncpg.connect(
            self._dsn,
            timeout=self._connect_timeout,
            statement_cache_size=0,
            # What the refusal of an import shows of the sidecars that hold the lock.
            server_settings={
                "application_name": f"{_APPLICATION} ({role}, pid {os.getpid()} on "
                f"{socket.gethostname()})"[:63]
            },
        )
        try:
            take = "pg_try_advisory_lock" if exclusive else "pg_try_advisory_lock_shared"
            if not await conn.fetchval(f"SELECT {take}($1)", SERVE_LOCK):
                raise DatabaseInUseError(await self._held_message(conn, exclusive))
        except BaseException:
            conn.terminate()
            raise
        if not exclusive:
            conn.add_termination_listener(_lost)
        self._conn, self._exclusive = conn, exclusive

    async def release(self) -> None:
        """Drop the lock with its session (idempotent; never raises)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.remove_termination_listener(_lost)
        # Said, not only left to the session's end: behind a pooler the lock stays on a
        # server connection the pooler keeps (best effort: it may hand us another one).
        unlock = "pg_advisory_unlock" if self._exclusive else "pg_advisory_unlock_shared"
        with anyio.move_on_after(1), contextlib.suppress(Exception):
            await conn.fetchval(f"SELECT {unlock}($1)", SERVE_LOCK)
        conn.terminate()

    async def _held_message(self, conn: Any, exclusive: bool) -> str:
        if not exclusive:
            return "an import into this database is running; start the sidecar once it is done"
        rows = await conn.fetch(_HOLDERS, SERVE_LOCK >> 32, SERVE_LOCK & 0xFFFF_FFFF)
        who = [
            str(r["application_name"]).removeprefix(_APPLICATION + " ").strip("()")
            + (f" from {r['addr']}" if r["addr"] else "")
            for r in rows
        ]
        some = f"{len(who)} sidecars serve" if len(who) != 1 else "a sidecar serves"
        shown = f" ({'; '.join(who)})" if who else ""
        return (
            f"{some} this database{shown}; stop every sidecar on it first: one keeps the "
            "memoryRef key it read at its start"
        )


def _lost(_conn: object) -> None:
    log.error(
        "serve_lock_lost",
        backend="postgresql",
        hint="the connection holding the serve lock closed: until this sidecar restarts, an "
        "import into its database is not refused",
    )
