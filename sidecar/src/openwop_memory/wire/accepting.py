"""The accept loop every listener shares: workers', the admin socket's and the metrics one.

Running out of file descriptors (or of the kernel's memory for a socket) must never end
the process: every open run's keyring lives in it. So an accept that fails for want of
resources waits a short, growing pause (10 ms to 1 s) and tries again, while the
connection waits in the kernel's backlog and the open ones go on being served; the
episode is logged once when it starts and once when it ends.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import structlog

from ..service.stats import ConnectionStats

log = structlog.get_logger("openwop_memory.server")

# accept() fails with these while the process or the system is out of descriptors (or of
# the memory for a socket); the connection waits in the backlog until one is freed.
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
BACKOFF_FIRST = 0.01
BACKOFF_MAX = 1.0

Handler = Callable[[anyio.abc.SocketStream], Awaitable[None]]


def _lack_of_resources(exc: Exception) -> int | None:
    """The errno of an accept that failed for want of resources, else None.

    anyio raises the OSError itself for a TCP listener and wraps it in
    ``BrokenResourceError`` for a Unix one.
    """
    cause = exc.__cause__ if isinstance(exc, anyio.BrokenResourceError) else exc
    if isinstance(cause, OSError) and cause.errno in OUT_OF_RESOURCES:
        return cause.errno
    return None


async def accept_forever(
    listener: anyio.abc.SocketListener,
    handle: Handler,
    stats: ConnectionStats,
    name: str,
) -> None:
    """Hand every connection ``listener`` accepts to ``handle`` (awaited before the next
    accept: it must only decide, refuse or start a task), until the listener is closed.

    An accept that fails for want of descriptors is counted in ``stats.accept_failures``
    and retried after a pause (see the module); ``name`` labels the log lines.

    :raises OSError: or ``anyio.BrokenResourceError``: accept failed for another reason.
    """
    backoff = 0.0
    failures = 0  # of the current episode without descriptors
    with contextlib.suppress(anyio.ClosedResourceError):
        while True:
            try:
                stream = await listener.accept()
            except (OSError, anyio.BrokenResourceError) as exc:
                code = _lack_of_resources(exc)
                if code is None:
                    raise
                stats.accept_failures += 1
                if failures == 0:
                    log.warning(
                        "accept_failing",
                        listener=name,
                        reason=errno.errorcode.get(code, "unknown"),
                        open_connections=stats.open,
                    )
                failures += 1
                backoff = min(max(2 * backoff, BACKOFF_FIRST), BACKOFF_MAX)
                await anyio.sleep(backoff)
                continue
            if failures:
                log.info("accept_resumed", listener=name, failed_attempts=failures)
                failures, backoff = 0, 0.0
            await handle(stream)
