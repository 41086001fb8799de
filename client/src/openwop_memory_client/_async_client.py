"""``AsyncMemoryClient``: one multiplexed connection to the sidecar, with reconnects.

Many tasks may call one client at once; their requests share one Unix-socket connection
and a reader task matches answers by JSON-RPC id. When the connection drops (the sidecar
restarted), the next call reconnects with exponential backoff and calls in flight are sent
again. Re-sending is safe: reads are reads, every ``memory.put`` of a run carries an
idempotency key, ``run.begin``/``run.addSecrets`` merge, and ``memory.delete``/``run.end``
only report ``False`` the second time.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from ._async_run import AsyncMemoryRun
from ._convert import SecretsArg, changes_params, issue_ref_params, parse_changes
from ._entry import ChangePage
from ._errors import (
    InternalError,
    MemoryValidationError,
    RequestTimeoutError,
    SidecarUnavailableError,
)
from ._errors import error_from_wire as _error_from_wire
from ._transport import ConnectionLost, MultiplexedConnection

__all__ = ["DEFAULT_SOCKET", "SOCKET_ENV", "AsyncMemoryClient", "default_socket_path"]

_log = logging.getLogger("openwop_memory_client")


# Where a client given no socket path looks: the variable a deployment sets (the systemd
# unit and the Kubernetes manifest both do), then the sidecar's own default, relative to
# the working directory as `make run` creates it.
SOCKET_ENV = "OPENWOP_MEMORY_SOCKET"
DEFAULT_SOCKET = "var/openwop-memory.sock"


def default_socket_path() -> str:
    """``$OPENWOP_MEMORY_SOCKET`` if set and not empty, else ``var/openwop-memory.sock``."""
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def _encode(request_id: int, method: str, params: Mapping[str, Any]) -> bytes:
    """One request line.

    :raises MemoryValidationError: a param is not JSON (a type JSON cannot spell, NaN or an
        infinity) or a string is not encodable as UTF-8; the message names the type only.
    """
    request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    try:
        text = json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        # json's own messages name the type or say "Out of range float values": no value.
        raise MemoryValidationError(
            f"{method}: a param is not representable in JSON ({exc})", {"field": "params"}
        ) from None
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        # The codec's message quotes the offending character, which may be part of a secret.
        raise MemoryValidationError(
            "a string param holds a lone surrogate (not UTF-8)", {"field": "params"}
        ) from None


class AsyncMemoryClient:
    """Async client of the openwop-memory sidecar listening on ``socket_path``.

    Use it as ``async with AsyncMemoryClient(path) as client:``; entering connects (with
    the reconnect policy below) and exiting closes the connection.

    :param socket_path: the sidecar's Unix socket; when omitted (or None),
        ``$OPENWOP_MEMORY_SOCKET``, else ``var/openwop-memory.sock`` (the sidecar's default).
    :param timeout: seconds to wait for the answer to one request once it is sent
        (:class:`RequestTimeoutError` after that). Reconnecting is bounded separately.
    :param connect_timeout: seconds one connection attempt may take.
    :param reconnect_attempts: connection attempts before :class:`SidecarUnavailableError`;
        the first is immediate, then the delay starts at ``reconnect_backoff`` seconds and
        doubles up to ``reconnect_backoff_max``.
    :param max_retries: how many times one call is sent again after the connection dropped
        under it, before :class:`SidecarUnavailableError`.
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
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be positive")
        if reconnect_attempts < 1 or max_retries < 0:
            raise ValueError("reconnect_attempts must be >= 1 and max_retries >= 0")
        if not 0 <= reconnect_backoff <= reconnect_backoff_max:
            raise ValueError("need 0 <= reconnect_backoff <= reconnect_backoff_max")
        self._path = os.fspath(socket_path) if socket_path is not None else default_socket_path()
        self._timeout = float(timeout)
        self._connect_timeout = float(connect_timeout)
        self._attempts = reconnect_attempts
        self._backoff = float(reconnect_backoff)
        self._backoff_max = float(reconnect_backoff_max)
        self._max_retries = max_retries
        self._ids = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._conn: MultiplexedConnection | None = None
        self._connect_lock = anyio.Lock()
        # Callers queued behind a failed connection cycle fail with it instead of each
        # running the whole backoff schedule again.
        self._cycle = 0
        self._last_failure: SidecarUnavailableError | None = None

    @property
    def socket_path(self) -> str:
        return self._path

    @property
    def timeout(self) -> float:
        return self._timeout

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._path!r})"

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Connect. :raises SidecarUnavailableError: no sidecar answered the attempts."""
        if self._tg is not None:
            raise RuntimeError("this client is already open")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        try:
            await self._connection()
        except BaseException:
            self._tg = None
            tg.cancel_scope.cancel()
            await tg.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg, self._tg = self._tg, None
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()
        if tg is not None:
            tg.cancel_scope.cancel()
            # Not handed the body's exception: the task group would wrap it in a group, and
            # the caller must get it as raised. The reader task never raises.
            await tg.__aexit__(None, None, None)

    # -- methods -------------------------------------------------------------------------

    async def capabilities(self) -> dict[str, Any]:
        """The ``capabilities`` object of ``host.capabilities`` (``agents`` and ``memory``)."""
        result = await self._request("host.capabilities", {})
        if not isinstance(result, dict) or not isinstance(result.get("capabilities"), dict):
            raise InternalError("the sidecar answered malformed capabilities")
        capabilities: dict[str, Any] = result["capabilities"]
        return capabilities

    async def issue_ref(self, tenant: str, agent: str, namespace: str = "default") -> str:
        """The sidecar-issued memoryRef of the scope (tenant, agent, namespace).

        :raises MemoryValidationError: a name is empty, too long or holds a control
            character (nothing was sent).
        :raises ForbiddenError: the socket's tenant binding does not allow ``tenant``.
        """
        result = await self._request("memory.issueRef", issue_ref_params(tenant, agent, namespace))
        if not isinstance(result, dict) or not isinstance(result.get("memoryRef"), str):
            raise InternalError("the sidecar answered a malformed memory.issueRef result")
        ref: str = result["memoryRef"]
        return ref

    async def changes(
        self, tenant: str, *, cursor: str | None = None, limit: int | None = None
    ) -> ChangePage:
        """*(extension)* ``memory.changes``: the tenant's change records after ``cursor``
        (from the start of the retained feed without it), in commit order, content-free;
        pass ``next_cursor`` back to resume.

        :raises MemoryValidationError: ``cursor`` is not one of this tenant's feed.
        :raises ForbiddenError: the socket's tenant binding does not allow ``tenant``.
        """
        params = changes_params(tenant, cursor, limit)
        return parse_changes(await self._request("memory.changes", params))

    async def health(self) -> dict[str, Any]:
        """``sidecar.health``: ``{status, version, uptimeSeconds, storage}``."""
        return await self._object("sidecar.health")

    async def stats(self) -> dict[str, Any]:
        """``sidecar.stats``: counters by method and outcome, active runs, redactions."""
        return await self._object("sidecar.stats")

    async def call(self, method: str, /, **params: Any) -> Any:
        """Call any method with by-name ``params``; returns its raw JSON ``result``.

        Re-sent after a dropped connection like every call, except a ``memory.put``
        without an ``idempotencyKey``, which could write twice (it raises
        :class:`SidecarUnavailableError` instead when its fate is unknown).

        :raises MemoryServiceError: the typed error the sidecar answered.
        :raises TransportError: see :class:`AsyncMemoryClient`.
        """
        safe = method != "memory.put" or "idempotencyKey" in params
        return await self._request(method, params, retry_in_flight=safe)

    def run(
        self,
        run_id: str,
        tenant: str,
        secrets: SecretsArg = None,
        *,
        replay: bool = False,
        as_of: datetime | None = None,
    ) -> AsyncMemoryRun:
        """A run to open with ``async with``; see :class:`AsyncMemoryRun`.

        ``secrets`` is a mapping secret id -> value or an iterable of :class:`SecretSpec`.
        With ``as_of`` (an aware datetime within the replay retention) the run is read-only
        and sees exactly what a run begun at that time saw; it takes no secrets.
        """
        return AsyncMemoryRun(self, run_id, tenant, secrets, replay=replay, as_of=as_of)

    async def _object(self, method: str) -> dict[str, Any]:
        result = await self._request(method, {})
        if not isinstance(result, dict):
            raise InternalError(f"the sidecar answered a malformed {method} result")
        return result

    # -- requests --------------------------------------------------------------------------

    async def _request(
        self, method: str, params: Mapping[str, Any], *, retry_in_flight: bool = True
    ) -> Any:
        """The ``result`` of one request, re-sent on a fresh connection if the old one dropped.

        A request that may already have reached the sidecar is re-sent only if
        ``retry_in_flight``.

        :raises MemoryServiceError: the typed error the sidecar answered.
        :raises SidecarUnavailableError: no connection, or it dropped more than
            ``max_retries`` times under this call.
        :raises RequestTimeoutError: no answer within ``timeout`` seconds.
        """
        request_id = next(self._ids)
        line = _encode(request_id, method, params)
        losses = 0
        while True:
            conn = await self._connection()
            try:
                response = await conn.request(request_id, line)
                break
            except RequestTimeoutError:
                raise RequestTimeoutError(
                    f"{method}: no answer from the sidecar within {self._timeout:g} s"
                ) from None
            except ConnectionLost as lost:
                losses += 1
                if losses > self._max_retries or (lost.sent and not retry_in_flight):
                    raise SidecarUnavailableError(
                        f"{method}: the connection to the sidecar was lost"
                    ) from None
                _log.info("connection lost during %s; sending it again (%d)", method, losses)
        if "error" in response:
            raise _error_from_wire(response["error"])
        if "result" not in response:
            raise InternalError(f"the sidecar answered {method} with neither result nor error")
        return response["result"]

    async def _connection(self) -> MultiplexedConnection:
        """The live connection, connecting first if there is none.

        :raises SidecarUnavailableError: every attempt failed (also raised to callers that
            were waiting for that same round of attempts).
        """
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._tg is None:
            raise RuntimeError("the client is not open; use `async with` on it")
        cycle = self._cycle
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            if self._cycle != cycle and self._last_failure is not None:
                raise SidecarUnavailableError(str(self._last_failure))
            self._cycle += 1
            try:
                conn = await self._dial()
            except SidecarUnavailableError as exc:
                self._last_failure = exc
                raise
            self._last_failure = None
            self._conn = conn
            return conn

    async def _dial(self) -> MultiplexedConnection:
        assert self._tg is not None
        delay = self._backoff
        reason = ""
        for attempt in range(1, self._attempts + 1):
            try:
                with anyio.fail_after(self._connect_timeout):
                    stream = await anyio.connect_unix(self._path)
            except (OSError, TimeoutError) as exc:
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                if attempt < self._attempts:
                    _log.info("cannot connect to %s (%s); retrying", self._path, reason)
                    await anyio.sleep(delay)
                    delay = min(delay * 2, self._backoff_max)
                continue
            conn = MultiplexedConnection(stream, answer_timeout=self._timeout)
            self._tg.start_soon(conn.read_forever)
            return conn
        raise SidecarUnavailableError(
            f"no sidecar answers on {self._path} after {self._attempts} attempts ({reason})"
        )
