"""``MemoryClient`` and ``MemoryRun``: the blocking face of the async client.

Each ``MemoryClient`` runs one event loop in a helper thread (an anyio blocking portal)
holding one :class:`AsyncMemoryClient`; every method hands its coroutine to that loop and
waits. So the blocking client has exactly the async client's behaviour (multiplexing,
reconnects, re-begins, timeouts, errors) and may be shared by many threads: the logic, and
every check of the arguments, is the async client's; this module only waits for it.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from datetime import datetime
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._async_client import AsyncMemoryClient
from ._async_run import AsyncMemoryRun
from ._convert import ContentArg, OptionsArg, Rank, SecretsArg, TtlArg
from ._entry import ChangePage, KeyedEntry, MemoryEntry, Page, Revision

__all__ = ["MemoryClient", "MemoryRun"]

T = TypeVar("T")


class MemoryClient:
    """Blocking client of the sidecar on ``socket_path``: ``with MemoryClient(path) as c:``.

    May be shared by many threads: their calls share one connection.

    :param socket_path: the sidecar's Unix socket; when omitted (or None),
        ``$OPENWOP_MEMORY_SOCKET``, else ``var/openwop-memory.sock`` (the sidecar's default).
    :param timeout: seconds to wait for the answer to one request once it is sent
        (:class:`RequestTimeoutError` after that).
    :param connect_timeout: seconds one connection attempt may take.
    :param reconnect_attempts: connection attempts before :class:`SidecarUnavailableError`;
        the delay between them starts at ``reconnect_backoff`` seconds and doubles up to
        ``reconnect_backoff_max``.
    :param max_retries: how many times one call is sent again after the connection dropped
        under it.
    :raises ValueError: a setting is out of range.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
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
        """The socket this client connects to."""
        return self._async.socket_path

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._async.timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.socket_path!r})"

    def __enter__(self) -> Self:
        """Start the helper loop and connect.

        :raises SidecarUnavailableError: no sidecar answered the connection attempts.
        """
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
        """Close the connection and stop the helper loop."""
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.__exit__(exc_type, exc, tb)

    def _call(self, func: Callable[[], Awaitable[T]]) -> T:
        if self._portal is None:
            raise RuntimeError("the client is not open; use `with MemoryClient(...) as client:`")
        return self._portal.call(func)

    def capabilities(self) -> dict[str, Any]:
        """The ``capabilities`` object of ``host.capabilities`` (``agents`` and ``memory``)."""
        return self._call(self._async.capabilities)

    def issue_ref(self, tenant: str, agent: str, namespace: str = "default") -> str:
        """The sidecar-issued memoryRef of the scope (tenant, agent, namespace).

        :raises MemoryValidationError: a name is empty, too long or holds a control
            character (nothing was sent).
        :raises ForbiddenError: the socket's tenant binding does not allow ``tenant``.
        """
        return self._call(partial(self._async.issue_ref, tenant, agent, namespace))

    def changes(
        self, tenant: str, *, cursor: str | None = None, limit: int | None = None
    ) -> ChangePage:
        """*(extension)* See :meth:`AsyncMemoryClient.changes`."""
        return self._call(partial(self._async.changes, tenant, cursor=cursor, limit=limit))

    def health(self) -> dict[str, Any]:
        """``sidecar.health``: ``{status, version, uptimeSeconds, storage}``."""
        return self._call(self._async.health)

    def stats(self) -> dict[str, Any]:
        """``sidecar.stats``: counters by method and outcome, active runs, redactions."""
        return self._call(self._async.stats)

    def call(self, method: str, /, **params: Any) -> Any:
        """Call any method with by-name ``params``; returns its raw JSON ``result``.

        Re-sent after a dropped connection like every call, except a ``memory.put``
        without an ``idempotencyKey``, which could write twice.

        :raises MemoryServiceError: the typed error the sidecar answered.
        :raises TransportError: the sidecar could not be reached or did not answer.
        """
        return self._call(partial(self._async.call, method, **params))

    def run(
        self,
        run_id: str,
        tenant: str,
        secrets: SecretsArg = None,
        *,
        replay: bool = False,
        as_of: datetime | None = None,
    ) -> MemoryRun:
        """A run to open with ``with client.run(...) as run:``; see :class:`MemoryRun`.

        :param secrets: the run's BYOK secrets: a mapping secret id -> value, or an
            iterable of :class:`SecretSpec`.
        :param replay: begin on the snapshot the run id already has (resume a run).
        :param as_of: a read-only run that sees exactly what a run begun at this past time
            (an aware datetime within the replay retention) saw; it takes no secrets.
        :raises MemoryValidationError: ``secrets`` is neither form.
        """
        run = self._async.run(run_id, tenant, secrets, replay=replay, as_of=as_of)
        run._block_hint = "with"
        return MemoryRun(self, run)


class MemoryRun:
    """A run's view of memory: ``with client.run(...) as run:``.

    Entering sends ``run.begin`` with the run's secrets; exiting sends ``run.end``. Reads
    see the store as of the run's snapshot (:attr:`snapshot_at`), never the run's own
    writes; ``list``, ``get`` and ``delete`` also work after the block ended. If the
    sidecar lost the open run (it restarted), ``put`` and ``add_secrets`` re-begin it on
    its original snapshot and are sent once more. Secret values never appear in its repr
    or errors.
    """

    def __init__(self, client: MemoryClient, run: AsyncMemoryRun) -> None:
        self._client = client
        self._run = run
        self._cm: AbstractContextManager[AsyncMemoryRun] | None = None

    def __repr__(self) -> str:
        return repr(self._run).replace(type(self._run).__name__, type(self).__name__, 1)

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._run.run_id

    @property
    def tenant(self) -> str:
        """The tenant the run belongs to."""
        return self._run.tenant

    @property
    def snapshot_at(self) -> str:
        """The snapshot's time (RFC 3339). :raises RunNotOpenError: the run has not begun."""
        return self._run.snapshot_at

    @property
    def resumed(self) -> bool:
        """True if the run id was already known to the sidecar when this run began.

        :raises RunNotOpenError: the run has not begun.
        """
        return self._run.resumed

    @property
    def read_only(self) -> bool:
        """True for a run begun ``as_of`` a past time (it never writes).

        :raises RunNotOpenError: the run has not begun.
        """
        return self._run.read_only

    def __enter__(self) -> Self:
        """Send ``run.begin``.

        :raises ForbiddenError: tenant binding does not let this process use the tenant.
        :raises ReplaySnapshotUnavailableError: ``replay`` and the snapshot is gone.
        :raises MemoryValidationError: a secret or name is malformed (never echoed).
        """
        if self._cm is not None:
            raise RuntimeError("this run is already open")
        if self._client._portal is None:
            raise RuntimeError("the client is not open; use `with MemoryClient(...) as client:`")
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
        """Send ``run.end``, which discards the run's keyring in the sidecar.

        An error ending the run is raised only if the block succeeded.
        """
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(exc_type, exc, tb)

    def list(
        self,
        memory_ref: str,
        options: OptionsArg = None,
        *,
        limit: int | None = None,
        tag: str | None = None,
        query: str | None = None,
        rank: Rank | None = None,
        token_budget: int | None = None,
        tags_any: Sequence[str] | None = None,
        tags_all: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> builtins.list[MemoryEntry]:
        """Entries of the scope in the run's snapshot, unexpired, newest first (or by
        relevance to ``query``).

        :param limit: at most this many entries; omitted or 0 means the sidecar's default
            (100), and more than its maximum (1000) means the maximum.
        :param tag: only entries carrying this tag.
        :param rank: ``"recency"`` (the default: newest first) or ``"relevance"``: the
            entries relevant to ``query``, most relevant first. :meth:`search` is this
            with ``rank="relevance"``.
        :param query: the text to rank by, 1 to 4096 characters; only with
            ``rank="relevance"``.
        :param token_budget: at most this many tokens of content in all (the sidecar's
            count): the longest prefix of the ranked list that fits; an entry over the
            budget on its own is skipped. With ``limit``, the fewer entries wins.
        :param tags_any: *(extension)* only entries carrying at least one of these tags.
        :param tags_all: *(extension)* only entries carrying every one of these tags.
        :param created_after: *(extension)* only entries created strictly after this
            aware ``datetime``.
        :param created_before: *(extension)* only entries created strictly before it.
        :param options: the same options as a :class:`MemoryListOptions` or a mapping in
            the wire's spelling (the earlier form; not together with the keywords).

        Every condition given must hold. A malformed or tampered ref yields ``[]``.

        :raises MemoryValidationError: an option is malformed, ``rank="relevance"`` has
            no query, or a ``query`` keyword comes without ``rank="relevance"`` (it would
            be ignored); nothing was sent.
        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        return self._client._call(
            partial(
                self._run.list,
                memory_ref,
                options,
                limit=limit,
                tag=tag,
                query=query,
                rank=rank,
                token_budget=token_budget,
                tags_any=tags_any,
                tags_all=tags_all,
                created_after=created_after,
                created_before=created_before,
            )
        )

    def search(
        self,
        memory_ref: str,
        query: str,
        *,
        limit: int | None = None,
        token_budget: int | None = None,
        tag: str | None = None,
        tags_any: Sequence[str] | None = None,
        tags_all: Sequence[str] | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
    ) -> builtins.list[MemoryEntry]:
        """The entries of the run's snapshot relevant to ``query``, most relevant first:
        :meth:`list` with ``rank="relevance"``; the other keywords are :meth:`list`'s.
        (``capabilities()["memory"]["search"]["modes"]`` says how the sidecar judges
        relevance: by keywords alone, or with ``semantic`` by meaning too.)

        :param query: the text to search for, 1 to 4096 characters.

        :raises MemoryValidationError: ``query`` or an option is malformed (nothing was
            sent).
        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        return self._client._call(
            partial(
                self._run.search,
                memory_ref,
                query,
                limit=limit,
                token_budget=token_budget,
                tag=tag,
                tags_any=tags_any,
                tags_all=tags_all,
                created_after=created_after,
                created_before=created_before,
            )
        )

    def get(self, memory_ref: str, id: str) -> MemoryEntry | None:
        """The entry ``id`` of the scope as the run's snapshot sees it, or ``None``.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        return self._client._call(partial(self._run.get, memory_ref, id))

    def put(
        self,
        memory_ref: str,
        content: ContentArg,
        *,
        tags: Sequence[str] = (),
        ttl: TtlArg = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> MemoryEntry:
        """Write an entry and return it as stored: secrets redacted, id and created_at set.

        :param content: the entry's text; or a whole entry, as a dict ``{"content",
            "tags"?, "expiresAt"?}`` (:class:`EntryDict`) or an :class:`EntryInput`.
        :param tags: the entry's tags (duplicates and empty tags are dropped).
        :param ttl: the entry expires this long from now: a ``timedelta`` or seconds.
        :param expires_at: the entry expires at this aware ``datetime`` (not with ``ttl``).
            Without either, the entry never expires.
        :param idempotency_key: the put's key; a fresh uuid4 when omitted. The same on
            every re-send, so the put writes at most once.

        :raises MemoryValidationError: an argument is malformed or two conflict (nothing
            was sent), or the sidecar refused the entry (``details.field``).
        :raises SecretLeakageError: the sidecar's secret policy refused the entry.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        :raises ConflictError: ``idempotency_key`` was used for a different entry.
        :raises RunNotOpenError: the run was never begun, or has ended.
        """
        return self._client._call(
            partial(
                self._run.put,
                memory_ref,
                content,
                tags=tags,
                ttl=ttl,
                expires_at=expires_at,
                idempotency_key=idempotency_key,
            )
        )

    def put_keyed(
        self,
        memory_ref: str,
        key: str,
        content: ContentArg,
        *,
        expected_revision: int | None = None,
        tags: Sequence[str] = (),
        ttl: TtlArg = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> KeyedEntry:
        """*(extension)* See :meth:`AsyncMemoryRun.put_keyed`."""
        return self._client._call(
            partial(
                self._run.put_keyed,
                memory_ref,
                key,
                content,
                expected_revision=expected_revision,
                tags=tags,
                ttl=ttl,
                expires_at=expires_at,
                idempotency_key=idempotency_key,
            )
        )

    def page(
        self,
        memory_ref: str,
        *,
        limit: int | None = None,
        tag: str | None = None,
        cursor: str | None = None,
    ) -> Page:
        """*(extension)* See :meth:`AsyncMemoryRun.page`."""
        return self._client._call(
            partial(self._run.page, memory_ref, limit=limit, tag=tag, cursor=cursor)
        )

    def count(self, memory_ref: str, *, tag: str | None = None) -> int:
        """*(extension)* See :meth:`AsyncMemoryRun.count`."""
        return self._client._call(partial(self._run.count, memory_ref, tag=tag))

    def get_key(self, memory_ref: str, key: str) -> KeyedEntry | None:
        """*(extension)* See :meth:`AsyncMemoryRun.get_key`."""
        return self._client._call(partial(self._run.get_key, memory_ref, key))

    def history(
        self, memory_ref: str, key: str, *, limit: int | None = None, before: int | None = None
    ) -> builtins.list[Revision]:
        """*(extension)* See :meth:`AsyncMemoryRun.history`."""
        return self._client._call(
            partial(self._run.history, memory_ref, key, limit=limit, before=before)
        )

    def delete(self, memory_ref: str, id: str) -> bool:
        """Delete the live entry ``id`` of the scope; True if it existed and now is gone.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        return self._client._call(partial(self._run.delete, memory_ref, id))

    def add_secrets(self, secrets: SecretsArg) -> int:
        """Add secrets to the run's keyring; returns the keyring's size after the merge.

        :raises MemoryValidationError: a secret is malformed or the keyring would exceed 256.
        :raises RunNotOpenError: the run was never begun, or has ended.
        """
        return self._client._call(partial(self._run.add_secrets, secrets))
