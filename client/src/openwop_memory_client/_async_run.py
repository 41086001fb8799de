"""``AsyncMemoryRun``: one run's RFC 0004 ``MemoryAdapter`` over an ``AsyncMemoryClient``.

A run holds its BYOK secrets on the client side too, so that when the sidecar lost the
run's handle (it restarted, or evicted the run) the run can be begun again with the same id
and secrets. The sidecar persisted the snapshot, and the re-begin asks for it with
``replay: true``, so the run keeps seeing exactly what it saw before.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from ._convert import (
    ContentArg,
    OptionsArg,
    Rank,
    SecretsArg,
    TtlArg,
    add_secrets_params,
    begin_params,
    count_params,
    history_params,
    id_params,
    key_params,
    list_params,
    page_params,
    parse_begin,
    parse_count,
    parse_entries,
    parse_entry,
    parse_history,
    parse_keyed,
    parse_optional_entry,
    parse_optional_keyed,
    parse_page,
    put_params,
    secrets_to_wire,
)
from ._entry import KeyedEntry, MemoryEntry, Page, Revision
from ._errors import (
    InternalError,
    OpenWopMemoryError,
    ReplaySnapshotUnavailableError,
    RunNotFoundError,
    RunNotOpenError,
)
from .wire import RunBeginResult

if TYPE_CHECKING:
    from ._async_client import AsyncMemoryClient

__all__ = ["AsyncMemoryRun"]


class AsyncMemoryRun:
    """A run's view of memory; open it with ``async with client.run(...) as run:``.

    Entering sends ``run.begin`` with the run's secrets; exiting sends ``run.end``, which
    discards the run's keyring in the sidecar. Reads see the store as of the run's snapshot
    (:attr:`snapshot_at`), never the run's own writes. ``list``, ``get`` and ``delete``
    also work after the run ended (its snapshot is persisted).

    While the run is open, a ``put`` or ``add_secrets`` that the sidecar answers with
    :class:`RunNotFoundError` (it restarted and lost the run's handle) re-begins the run
    with the same id and all its secrets, on its original snapshot, and is sent once more.

    Secret values never appear in this object's repr or in any error it raises.
    """

    def __init__(
        self,
        client: AsyncMemoryClient,
        run_id: str,
        tenant: str,
        secrets: SecretsArg = None,
        *,
        replay: bool = False,
        as_of: datetime | None = None,
    ) -> None:
        self._client = client
        self.run_id = run_id
        self.tenant = tenant
        self.replay = replay
        self.as_of = as_of
        self._secrets = secrets_to_wire(secrets)
        # How RunNotOpenError tells the caller to open the run; the blocking MemoryRun
        # that wraps this object sets it to "with".
        self._block_hint = "async with"
        self._begun: RunBeginResult | None = None
        self._open = False
        # Bumped by each re-begin, so that calls failing together re-begin only once.
        self._generation = 0
        self._rebegin_lock = anyio.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(run_id={self.run_id!r}, tenant={self.tenant!r},"
            f" secrets={len(self._secrets)})"
        )

    @property
    def snapshot_at(self) -> str:
        """The snapshot's time (RFC 3339). :raises RunNotOpenError: the run has not begun."""
        return self._result().snapshotAt

    @property
    def resumed(self) -> bool:
        """True if the run id was already known to the sidecar when this run began.

        (A ``run.begin`` re-sent after a dropped connection may report True for a new run.)

        :raises RunNotOpenError: the run has not begun.
        """
        return self._result().resumed

    @property
    def read_only(self) -> bool:
        """True for a run begun ``as_of`` a past time: it reads, it never writes.

        :raises RunNotOpenError: the run has not begun.
        """
        return self._result().readOnly

    def _result(self) -> RunBeginResult:
        self._check_begun()
        assert self._begun is not None
        return self._begun

    def _not_open_message(self, state: str) -> str:
        return (
            f"run {self.run_id!r} {state}: use it inside"
            f" `{self._block_hint} client.run(...) as run:`"
        )

    def _check_begun(self) -> None:
        """:raises RunNotOpenError: this object never began its run (its ``with`` block
        was never entered): caught here rather than answered ``unknown run`` later."""
        if self._begun is None:
            raise RunNotOpenError(self._not_open_message("has not begun"))

    def _check_open(self) -> None:
        """:raises RunNotOpenError: the run is not open (a write needs it open)."""
        if not self._open:
            self._check_begun()
            raise RunNotOpenError(self._not_open_message("has ended"))

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Send ``run.begin``.

        :raises ForbiddenError: tenant binding does not let this process use the tenant.
        :raises ReplaySnapshotUnavailableError: ``replay`` and the snapshot is gone.
        :raises MemoryValidationError: a secret or name is malformed (by field, never echoed).
        """
        if self._open:
            raise RuntimeError("this run is already open")
        self._begun = await self._begin(replay=self.replay)
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Send ``run.end``, even when the body was cancelled (bounded by the timeout).

        An error ending the run is raised only if the body succeeded; otherwise the body's
        exception is what propagates.
        """
        self._open = False
        try:
            with anyio.fail_after(self._client.timeout, shield=True):
                await self._client._request("run.end", {"runId": self.run_id})
        except (OpenWopMemoryError, TimeoutError):
            if exc_type is None:
                raise

    async def _begin(self, *, replay: bool) -> RunBeginResult:
        params = begin_params(
            self.run_id, self.tenant, self._secrets, replay=replay, as_of=self.as_of
        )
        return parse_begin(await self._client._request("run.begin", params))

    async def _rebegin(self, generation: int) -> None:
        async with self._rebegin_lock:
            if generation != self._generation:
                return  # another call already re-began the run
            # replay: the run must get its original snapshot back, never a fresh one.
            result = await self._begin(replay=True)
            if self._begun is not None and result.snapshotAt != self._begun.snapshotAt:
                raise ReplaySnapshotUnavailableError(
                    "the sidecar re-began the run on another snapshot",
                    {"runId": self.run_id, "reason": "snapshot_changed"},
                )
            self._generation += 1

    async def _call_open(self, method: str, params: Mapping[str, Any]) -> Any:
        """A call that needs the run open in the sidecar; re-begins it once if it was lost."""
        generation = self._generation
        try:
            return await self._client._request(method, params)
        except RunNotFoundError:
            if not self._open:
                raise
        await self._rebegin(generation)
        return await self._client._request(method, params)

    # -- MemoryAdapter -------------------------------------------------------------------

    async def list(
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
            entries relevant to ``query``, most relevant first (PROTOCOL.md says how
            the sidecar ranks). :meth:`search` is this with ``rank="relevance"``.
        :param query: the text to rank by, 1 to 4096 characters; only with
            ``rank="relevance"``.
        :param token_budget: at most this many tokens of content in all (the sidecar's
            count, ``capabilities()["memory"]["injectionBudget"]``): the longest prefix of
            the ranked list that fits; an entry over the budget on its own is skipped.
            With ``limit``, the fewer entries wins.
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
        self._check_begun()
        params = list_params(
            self.run_id,
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
        return parse_entries(await self._client._request("memory.list", params))

    async def search(
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
        return await self.list(
            memory_ref,
            limit=limit,
            tag=tag,
            query=query,
            rank="relevance",
            token_budget=token_budget,
            tags_any=tags_any,
            tags_all=tags_all,
            created_after=created_after,
            created_before=created_before,
        )

    async def get(self, memory_ref: str, id: str) -> MemoryEntry | None:
        """The entry ``id`` of the scope as the run's snapshot sees it, or ``None``.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = id_params(self.run_id, memory_ref, id)
        return parse_optional_entry(await self._client._request("memory.get", params))

    async def put(
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
        :param idempotency_key: the put's key; a fresh uuid4 when omitted. It is the same
            on every re-send, so the put writes at most once whatever connections drop;
            the same key with the same entry returns the first write.

        The run does not see its own write (it is after its snapshot).

        :raises MemoryValidationError: an argument is malformed or two conflict (nothing
            was sent), or the sidecar refused the entry: too large, ``expiresAt`` not in
            the future (``details.field`` names the field).
        :raises SecretLeakageError: the sidecar's policy refused the entry (``reject`` and
            ``reject-disguised`` when it held a registered secret, a credential pattern,
            or the redaction fail-safe).
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        :raises ConflictError: ``idempotency_key`` was used for a different entry.
        :raises RunNotOpenError: the run was never begun, or has ended.
        :raises ReplaySnapshotUnavailableError: the run had to be re-begun and the sidecar
            no longer has its snapshot (it is never re-begun on a fresh one).
        """
        self._check_open()
        params = put_params(
            self.run_id,
            memory_ref,
            content,
            tags=tags,
            ttl=ttl,
            expires_at=expires_at,
            idempotency_key=idempotency_key,
        )
        return parse_entry(await self._call_open("memory.put", params))

    async def put_keyed(
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
        """*(extension)* Write the entry as the next revision of ``key`` in the scope,
        superseding the key's current revision for every run begun after (runs begun
        before keep seeing it). Arguments as :meth:`put`.

        :param expected_revision: write only if the key's current revision is this one
            (0: the key has none), else :class:`ConflictError` with
            ``details["revision"]``, the current revision; nothing is written then.
        :raises ConflictError: the expected revision was not current, or
            ``idempotency_key`` was used for another entry or key.
        :raises MemoryValidationError, SecretLeakageError, ForbiddenError,
            RunNotOpenError, ReplaySnapshotUnavailableError: as :meth:`put`.
        """
        self._check_open()
        params = put_params(
            self.run_id,
            memory_ref,
            content,
            tags=tags,
            ttl=ttl,
            expires_at=expires_at,
            idempotency_key=idempotency_key,
            key=key,
            expected_revision=expected_revision,
        )
        return parse_keyed(await self._call_open("memory.put", params))

    async def page(
        self,
        memory_ref: str,
        *,
        limit: int | None = None,
        tag: str | None = None,
        cursor: str | None = None,
    ) -> Page:
        """*(extension)* A page of the run's snapshot in :meth:`list`'s order; pass its
        ``next_cursor`` back as ``cursor`` for the next. The pages of one run hold each
        entry of its snapshot once, whatever is written meanwhile.

        :raises MemoryValidationError: ``cursor`` is not one of this scope and run.
        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = page_params(self.run_id, memory_ref, limit, tag, cursor)
        return parse_page(await self._client._request("memory.page", params))

    async def count(self, memory_ref: str, *, tag: str | None = None) -> int:
        """*(extension)* How many entries :meth:`list` would consider, without a limit.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = count_params(self.run_id, memory_ref, tag)
        return parse_count(await self._client._request("memory.count", params))

    async def get_key(self, memory_ref: str, key: str) -> KeyedEntry | None:
        """*(extension)* The revision of ``key`` the run's snapshot sees, or None.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = key_params(self.run_id, memory_ref, key)
        return parse_optional_keyed(await self._client._request("memory.getKey", params))

    async def history(
        self, memory_ref: str, key: str, *, limit: int | None = None, before: int | None = None
    ) -> builtins.list[Revision]:
        """*(extension)* The stored revisions of ``key``, newest first, as the live store
        holds them now (not the run's snapshot): at most ``limit`` (the sidecar's default
        100, at most 1000), those numbered below ``before`` when given (the next page).

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = history_params(self.run_id, memory_ref, key, limit, before)
        return parse_history(await self._client._request("memory.history", params))

    async def delete(self, memory_ref: str, id: str) -> bool:
        """Delete the live entry ``id`` of the scope; True if it existed and now is gone.

        Re-sent after a dropped connection, a delete that had taken effect reports False.

        :raises RunNotOpenError: the run was never begun.
        :raises ForbiddenError: ``memory_ref`` is another tenant's issued ref.
        """
        self._check_begun()
        params = id_params(self.run_id, memory_ref, id)
        result = await self._client._request("memory.delete", params)
        if not isinstance(result, bool):
            raise InternalError("the sidecar answered a malformed memory.delete result")
        return result

    async def add_secrets(self, secrets: SecretsArg) -> int:
        """Add secrets to the run's keyring; returns the keyring's size after the merge.

        :param secrets: a mapping secret id -> value, or an iterable of :class:`SecretSpec`.
        :raises MemoryValidationError: a secret is malformed or the keyring would exceed 256.
        :raises RunNotOpenError: the run was never begun, or has ended.
        """
        self._check_open()
        wire = secrets_to_wire(secrets)
        params = add_secrets_params(self.run_id, wire)
        result = await self._call_open("run.addSecrets", params)
        if not isinstance(result, dict) or not isinstance(result.get("count"), int):
            raise InternalError("the sidecar answered a malformed run.addSecrets result")
        # Kept only once accepted, so that a re-begin never carries a refused secret.
        self._secrets.extend(wire)
        count: int = result["count"]
        return count
