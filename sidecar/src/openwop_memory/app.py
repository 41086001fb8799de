"""The sidecar's components, built from :class:`~.config.Settings` in one place.

:func:`open_app` makes and opens everything a sidecar serves requests with: the secrets
directory (only when ``secrets_dir`` is set), the storage backend the database URL names,
the memoryRef codec over the database's key, the memory service, the dispatcher with its
access log, and the sweeper. The server runs a process around them (socket, signals,
connections, shutdown); tests that drive the service in process use the same function, so
what they test is what the server serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import structlog

from .config import Settings
from .errors import StartupError
from .service.embedding import EmbeddingModel
from .service.inspector import Inspector
from .service.memory import MemoryService, ServiceConfig
from .service.refs import RefCodec
from .service.stats import Stats
from .service.sweeper import Sweeper
from .storage.base import DatabaseUnreachableError, Storage, StorageStartupError
from .storage.registry import create_storage
from .wire.access_log import AccessLog
from .wire.admin import ADMIN_METHODS
from .wire.dispatch import Dispatcher
from .wire.methods import bind

if TYPE_CHECKING:
    # Imported when secrets_dir is set (see load_secrets_directory): most sidecars have none.
    from .service.secrets_directory import SecretsDirectory


log = structlog.get_logger("openwop_memory.app")

# The back-off between attempts to reach the database at start-up: doubling from the first
# to the last, so a server a second late costs a fraction of a second, and a long wait costs
# one attempt (and one log line) every few seconds.
_WAIT_FIRST = 0.25
_WAIT_MAX = 4.0


@dataclass(frozen=True, slots=True)
class App:
    """An opened sidecar's components. Close it (:meth:`aclose`, or ``async with``) to
    flush and close the storage; nothing else holds a resource.

    ``stats`` is the service's counters, which the wire layer also counts connections in.
    ``secrets_directory`` is None when ``secrets_dir`` is not set; otherwise it is loaded,
    and the server watches it (and reloads it on SIGHUP).
    """

    storage: Storage
    service: MemoryService
    dispatcher: Dispatcher
    admin_dispatcher: Dispatcher  # the admin socket's (see wire/admin.py)
    sweeper: Sweeper
    secrets_directory: SecretsDirectory | None
    stats: Stats

    async def aclose(self) -> None:
        """Flush pending writes and close the storage, even in a cancelled scope. Idempotent."""
        with anyio.CancelScope(shield=True):
            await self.storage.close()

    async def __aenter__(self) -> App:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def open_app(settings: Settings, *, notify: Callable[[str], object] | None = None) -> App:
    """Build and open every component ``settings`` describe; ``async with await
    open_app(settings) as app:`` closes it again.

    A database server that cannot be reached is waited for (see :func:`_open_storage`);
    ``notify`` gets the ``STATUS=`` lines for systemd meanwhile. If a step fails, what the
    earlier ones opened is closed before the error propagates.

    :raises StartupError: ``secrets_dir`` cannot be listed, no backend serves the database
        URL, the database cannot be used (see
        :meth:`~openwop_memory.storage.base.Storage.open`), or its server stayed
        unreachable for ``database_wait``.
    """
    secrets_directory = await load_secrets_directory(settings)
    storage = await _open_storage(settings, notify or (lambda _message: None))
    try:
        refs = RefCodec(await storage.ref_key())
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await storage.close()
        if isinstance(exc, StorageStartupError):
            raise StartupError(str(exc)) from None
        raise
    stats = Stats()
    service = MemoryService(
        storage,
        refs,
        ServiceConfig(
            redaction=settings.redaction,
            credential_patterns=settings.credential_patterns,
            max_entry_size_bytes=settings.max_entry_size_bytes,
            max_answer_bytes=settings.answer_bytes(),
            replay_retention_us=int(settings.replay_retention * 1_000_000),
            max_open_runs=settings.max_open_runs,
            run_idle_timeout_s=settings.run_idle_timeout or None,
            max_run_secret_bytes=settings.max_run_secret_bytes,
            max_keyring_memory_bytes=settings.max_keyring_memory_bytes,
            # Forget is served on the admin socket alone: without one, nothing can forget.
            forget=settings.admin_socket is not None,
        ),
        host_secrets=secrets_directory,
        stats=stats,
        embedding=EmbeddingModel(enabled=settings.semantic_search, model=settings.embedding_model),
    )
    dispatcher = Dispatcher(
        service,
        max_inflight=settings.max_inflight,
        max_request_bytes=settings.max_request_bytes,
        answer_bytes=settings.answer_bytes(),
        access_log=AccessLog(
            every_request=settings.access_log, slow_after=settings.slow_request_threshold
        ),
    )
    admin = Dispatcher(
        service,
        max_request_bytes=settings.max_request_bytes,
        access_log=dispatcher.access_log,
        methods=bind(
            ADMIN_METHODS,
            Inspector(
                service,
                storage,
                max_list_limit=ServiceConfig.max_list_limit,
                forget_batch=settings.sweep_batch,
            ),
        ),
    )
    sweeper = Sweeper(service, interval=settings.sweep_interval, batch=settings.sweep_batch)
    return App(storage, service, dispatcher, admin, sweeper, secrets_directory, stats)


async def _open_storage(settings: Settings, notify: Callable[[str], object]) -> Storage:
    """The opened storage backend, after waiting up to ``database_wait`` for a server that
    cannot be reached yet (a boot where the database starts after the sidecar): an attempt,
    then a back-off doubling from 0.25 s to 4 s, one ``database_waiting`` line (warning) and
    one ``STATUS=`` per failed attempt. The last attempt starts within ``database_wait``,
    so a start fails at most one ``connect_timeout`` after it.

    :raises StartupError: the database cannot be used (a wrong password, no such database:
        at once), or stayed unreachable for ``database_wait``.
    """
    started = anyio.current_time()
    delay = _WAIT_FIRST
    attempt = 0
    while True:
        attempt += 1
        storage = _create_storage(settings)
        storage.lock_at_open(exclusive=False)  # an import now is refused (see Storage)
        try:
            await storage.open()
        except DatabaseUnreachableError as exc:
            waited = anyio.current_time() - started
            left = settings.database_wait - waited
            if left <= 0:
                attempts = f"{attempt} attempt" + ("s" if attempt > 1 else "")
                raise StartupError(
                    f"{exc} (waited {waited:.1f} s, {attempts}: database_wait)"
                ) from None
            pause = min(delay, left)
            log.warning(
                "database_waiting",
                attempt=attempt,
                retry_in_seconds=round(pause, 2),
                waited_seconds=round(waited, 1),
                wait_seconds=settings.database_wait,
                reason=str(exc),
            )
            notify(f"STATUS=waiting for the database (attempt {attempt}): {exc}")
            await anyio.sleep(pause)
            delay = min(delay * 2, _WAIT_MAX)
        except StorageStartupError as exc:
            raise StartupError(str(exc)) from None
        else:
            return storage


def _create_storage(settings: Settings) -> Storage:
    """The (unopened) storage backend named by ``settings.database``.

    :raises StartupError: the URL names a backend this build does not have.
    """
    try:
        return create_storage(settings.database, settings, create=settings.create_database)
    except StorageStartupError as exc:
        raise StartupError(str(exc)) from None


async def load_secrets_directory(settings: Settings) -> SecretsDirectory | None:
    """The secrets of ``secrets_dir``, read once so that the first put already sees them;
    None when the setting is not set. A missing directory loads empty (with a warning).

    :raises StartupError: the directory exists but cannot be listed.
    """
    if settings.secrets_dir is None:
        return None
    from .service.secrets_directory import SecretsDirectory

    directory = SecretsDirectory(Path(settings.secrets_dir))
    try:
        await anyio.to_thread.run_sync(directory.reload)
    except OSError as exc:
        raise StartupError(
            f"cannot read secrets_dir {settings.secrets_dir}: {exc.strerror}"
        ) from None
    return directory
