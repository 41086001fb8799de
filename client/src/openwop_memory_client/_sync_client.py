"""``MemoryClient`` and ``MemoryRun``: the blocking face of the async client.

Each ``MemoryClient`` runs one event loop in a helper thread (an anyio blocking portal)
holding one :class:`AsyncMemoryClient`; every method hands its coroutine to that loop and
waits. So the blocking client has exactly the async client's behaviour (multiplexing,
reconnects, re-begins, timeouts, errors) and may be shared by many threads.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._async_client import AsyncMemoryClient
from ._async_run import AsyncMemoryRun
from ._convert import EntryArg, OptionsArg, SecretsArg
from .wire import MemoryEntry

__all__ = ["MemoryClient", "MemoryRun"]

T = TypeVar("T")


class MemoryClient:
    """Blocking client of the sidecar on ``socket_path``: ``with MemoryClient(path) as c:``.

    Takes the same settings as :class:`AsyncMemoryClient` and raises the same errors.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        timeout: float = 10.0,
        connect_timeout: float = 2.0,
        reconnect_attempts: int = 8,
        reconnect_backoff: float = 0.05,
        reconnect_backoff_max: float = 2.0,
        max_retries: int = 3,
    ) -> None:
        self._async = AsyncMemoryClient(
            socket_path,
            timeout=timeout,
            connect_timeout=connect_timeout,
            reconnect_attempts=reconnect_attempts,
            reconnect_backoff=reconnect_backoff,
            reconnect_backoff_max=reconnect_backoff_max,
            max_retries=max_retries,
        )
        self._portal: BlockingPortal | None = None
        self._stack: ExitStack | None = None

    @property
    def socket_path(self) -> str:
        return self._async.socket_path

    @property
    def timeout(self) -> float:
        return self._async.timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.socket_path!r})"

    def __enter__(self) -> Self:
        """Start the helper loop and connect. :raises SidecarUnavailableError: as async."""
        if self._stack is not None:
            raise RuntimeError("this client is already open")
        with ExitStack() as stack:
            portal = stack.enter_context(start_blocking_portal())
            stack.enter_context(portal.wrap_async_context_manager(self._async))
            self._stack = stack.pop_all()
        self._portal = portal
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def _call(self, func: Callable[[], Awaitable[T]]) -> T:
        if self._portal is None:
            raise RuntimeError("the client is not open; use `with` on it")
        return self._portal.call(func)

    def capabilities(self) -> dict[str, Any]:
        """See :meth:`AsyncMemoryClient.capabilities`."""
        return self._call(self._async.capabilities)

    def issue_ref(self, tenant: str, agent: str, namespace: str = "default") -> str:
        """See :meth:`AsyncMemoryClient.issue_ref`."""
        return self._call(partial(self._async.issue_ref, tenant, agent, namespace))

    def health(self) -> dict[str, Any]:
        """See :meth:`AsyncMemoryClient.health`."""
        return self._call(self._async.health)

    def stats(self) -> dict[str, Any]:
        """See :meth:`AsyncMemoryClient.stats`."""
        return self._call(self._async.stats)

    def call(self, method: str, /, **params: Any) -> Any:
        """See :meth:`AsyncMemoryClient.call`."""
        return self._call(partial(self._async.call, method, **params))

    def run(
        self,
        run_id: str,
        tenant: str,
        secrets: SecretsArg = None,
        *,
        replay: bool = False,
    ) -> MemoryRun:
        """A run to open with ``with``; see :class:`AsyncMemoryRun`."""
        return MemoryRun(self, self._async.run(run_id, tenant, secrets, replay=replay))


class MemoryRun:
    """The blocking face of :class:`AsyncMemoryRun`: ``with client.run(...) as run:``."""

    def __init__(self, client: MemoryClient, run: AsyncMemoryRun) -> None:
        self._client = client
        self._run = run
        self._cm: AbstractContextManager[AsyncMemoryRun] | None = None

    def __repr__(self) -> str:
        return repr(self._run).replace(type(self._run).__name__, type(self).__name__, 1)

    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def tenant(self) -> str:
        return self._run.tenant

    @property
    def snapshot_at(self) -> str:
        """See :attr:`AsyncMemoryRun.snapshot_at`."""
        return self._run.snapshot_at

    @property
    def resumed(self) -> bool:
        """See :attr:`AsyncMemoryRun.resumed`."""
        return self._run.resumed

    def __enter__(self) -> Self:
        """Send ``run.begin``; see :meth:`AsyncMemoryRun.__aenter__`."""
        if self._cm is not None:
            raise RuntimeError("this run is already open")
        if self._client._portal is None:
            raise RuntimeError("the client is not open; use `with` on it")
        cm = self._client._portal.wrap_async_context_manager(self._run)
        cm.__enter__()
        self._cm = cm
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Send ``run.end``; see :meth:`AsyncMemoryRun.__aexit__`."""
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(exc_type, exc, tb)

    def list(self, memory_ref: str, options: OptionsArg = None) -> builtins.list[MemoryEntry]:
        """See :meth:`AsyncMemoryRun.list`."""
        return self._client._call(partial(self._run.list, memory_ref, options))

    def get(self, memory_ref: str, id: str) -> MemoryEntry | None:
        """See :meth:`AsyncMemoryRun.get`."""
        return self._client._call(partial(self._run.get, memory_ref, id))

    def put(
        self, memory_ref: str, entry: EntryArg, *, idempotency_key: str | None = None
    ) -> MemoryEntry:
        """See :meth:`AsyncMemoryRun.put`."""
        return self._client._call(
            partial(self._run.put, memory_ref, entry, idempotency_key=idempotency_key)
        )

    def delete(self, memory_ref: str, id: str) -> bool:
        """See :meth:`AsyncMemoryRun.delete`."""
        return self._client._call(partial(self._run.delete, memory_ref, id))

    def add_secrets(self, secrets: SecretsArg) -> int:
        """See :meth:`AsyncMemoryRun.add_secrets`."""
        return self._client._call(partial(self._run.add_secrets, secrets))
