"""JSON-RPC 2.0 dispatch: one request line in, one response line (or none) out.

This module is the whole wire layer above framing, JSON-RPC 2.0 included: it parses with
orjson, checks the request object's shape itself (so it can name the bad member), looks the
method up in a typed table (:mod:`.methods`), calls it and writes the response object.

Why not jsonrpcserver (the design card's first choice): its public API
(``async_dispatch_to_serializable``, even with our parser and no schema validator) binds
the params to the method's signature and runs every request through ``asyncio.gather``.
Measured in one process on this machine, a trivial method costs 36.7 µs of CPU a request
that way, against 3.1 µs through its private ``call``/``to_response`` (what this module
used, reading ``_value``/``_error`` and oslash's ``Left``) and 0.8 µs written here, with
a floor of 0.6 µs for parsing and writing the line alone; importing its package also
imports jsonschema: +70 ms of start-up and +15 MiB resident. A sidecar get costs tens of
µs of CPU in all, so the public API would add about half again; the envelope rules
(docs/PROTOCOL.md) are a few dozen lines, owned here, pinned by tests/e2e/test_protocol.py
and tests/e2e/test_wire_fuzz.py. Every error is written as PROTOCOL.md's envelope.
Every request's outcome is counted for ``sidecar.stats``; :mod:`.access_log` decides
whether it also gets a (content-free) log line.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import Coroutine, Mapping
from types import CoroutineType
from typing import Any, NamedTuple, Protocol

import orjson
import pydantic
import structlog
from openwop_memory_client import (
    InternalError,
    MemoryServiceError,
    MethodNotFoundError,
    RateLimitedError,
    ValidationError,
)
from openwop_memory_client.wire import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ChangesParams,
    CountParams,
    DeleteParams,
    EmptyParams,
    GetKeyParams,
    GetParams,
    HistoryParams,
    IssueRefParams,
    ListParams,
    PageParams,
    PutParams,
    RunAddSecretsParams,
    RunBeginParams,
    RunEndParams,
    SearchParams,
)

from ..service.memory import BOUND_TENANTS, CALLER_UID, MemoryService
from ..service.metrics import CONTENT_TYPE
from .access_log import MAX_LOGGED_ID_CHARS, AccessLog
from .methods import AnyMethod, Bound, Method, bind
from .tenant_binding import ANY_TENANT

log = structlog.get_logger("openwop_memory.request")

# Methods whose answer has no size bound but the request's own limit (many entries).
_UNBOUNDED_ANSWERS = frozenset({"memory.list", "memory.history", "memory.page"})


class Pacer(Protocol):
    """The connection's say on when a request may start making its answer (see
    :class:`~.framing.AnswerPacer`)."""

    @property
    def unbounded(self) -> asyncio.Lock: ...

    def fits(self, reserve: int = 0) -> bool: ...

    async def ready(self, reserve: int = 0) -> None: ...

    def room(self) -> int: ...


class Caller(NamedTuple):
    """Who sent a request line, as its connection knows: the tenants it may use (``None``:
    tenant binding is off) and its Unix user (``None``: not a worker's connection)."""

    tenants: frozenset[str] | None
    uid: int | None


_NOBODY = Caller(None, None)
_MAX_BATCH = 256
# What a batch member refused for the connection's unread answers is told to wait: about
# the time a reading client takes to read them.
_BATCH_RETRY_AFTER_MS = 100
_REQUEST_MEMBERS = frozenset({"jsonrpc", "method", "params", "id"})

_METHODS: dict[str, AnyMethod[MemoryService]] = {
    "host.capabilities": Method(
        EmptyParams, lambda s, p: s.capabilities(), now=lambda s, p: s.capabilities()
    ),
    "memory.issueRef": Method(
        IssueRefParams, lambda s, p: s.issue_ref(p), now=lambda s, p: s.issue_ref(p)
    ),
    "run.begin": Method(RunBeginParams, lambda s, p: s.run_begin(p)),
    "run.addSecrets": Method(RunAddSecretsParams, lambda s, p: s.run_add_secrets(p)),
    "run.end": Method(RunEndParams, lambda s, p: s.run_end(p), now=lambda s, p: s.run_end(p)),
    "memory.list": Method(ListParams, lambda s, p: s.list(p)),
    # At once when the run is open here and the backend reads without waiting; else the
    # stored read, from the params validated once and without trying get_now again.
    "memory.get": Method(
        GetParams,
        lambda s, p: s.get(p),
        now=lambda s, p: s.get_now(p),
        later=lambda s, p: s.get_stored(p),
    ),
    "memory.put": Method(PutParams, lambda s, p: s.put(p)),
    "memory.delete": Method(DeleteParams, lambda s, p: s.delete(p)),
    "memory.page": Method(PageParams, lambda s, p: s.page(p)),
    "memory.changes": Method(ChangesParams, lambda s, p: s.changes(p)),
    "memory.count": Method(CountParams, lambda s, p: s.count(p)),
    "memory.search": Method(SearchParams, lambda s, p: s.search(p)),
    "memory.getKey": Method(GetKeyParams, lambda s, p: s.get_key(p)),
    "memory.history": Method(HistoryParams, lambda s, p: s.history(p)),
    "sidecar.health": Method(EmptyParams, lambda s, p: s.health()),
    "sidecar.stats": Method(
        EmptyParams, lambda s, p: s.stats_snapshot(), now=lambda s, p: s.stats_snapshot()
    ),
    "sidecar.metrics": Method(EmptyParams, lambda s, p: _metrics_answer(s)),
}
"""The workers' methods. Those with ``now`` may answer without waiting (see :class:`Method`)."""


class _Failure(NamedTuple):
    """What a method raised, as our envelope (a result is any JSON value, ``None`` too)."""

    error: MemoryServiceError


async def _metrics_answer(service: MemoryService) -> dict[str, str]:
    return {"contentType": CONTENT_TYPE, "text": (await service.metrics()).decode()}


def validation_error_from(exc: pydantic.ValidationError) -> ValidationError:
    """Our envelope for a pydantic failure: the field's path and pydantic's message.

    Pydantic's ``msg`` describes the constraint, never the input, so no value leaks.
    """
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    field = field_path(first["loc"])
    # Pydantic prefixes the message of a ValueError our validators raise; it says nothing.
    message = first["msg"].removeprefix("Value error, ")
    return ValidationError(f"{field}: {message}", {"field": field})


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("entry", "tags", 1)`` → ``entry.tags[1]``: one spelling for every field name."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path[:200] or "params"


def _failure(exc: Exception) -> _Failure:
    """A method's failure as our envelope, with every unexpected exception made an
    ``internal_error``."""
    if isinstance(exc, pydantic.ValidationError):
        return _Failure(validation_error_from(exc))
    if isinstance(exc, MemoryServiceError):
        return _Failure(exc)
    return _Failure(_internal(exc))


def _internal(exc: BaseException) -> InternalError:
    correlation_id = uuid.uuid4().hex[:16]
    # Frames only: an exception's message may quote the content that caused it.
    frames = [
        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}"
        for f in traceback.extract_tb(exc.__traceback__)
    ]
    log.error(
        "internal_error",
        correlation_id=correlation_id,
        error_type=type(exc).__name__,
        frames=frames[-8:],
    )
    return InternalError("internal error", {"correlationId": correlation_id})


def _error_object(err: MemoryServiceError) -> dict[str, Any]:
    return {"code": err.wire_rpc_code, "message": err.message, "data": err.envelope()}


class Dispatcher:
    """Turns request lines into response lines against one :class:`MemoryService`.

    By default it serves the workers' methods (``_METHODS``) with the service as their
    target; the admin socket's dispatcher is the same machinery with another table bound
    to its own target (``methods=bind(ADMIN_METHODS, inspector)``, see :mod:`.admin`).
    """

    def __init__(
        self,
        service: MemoryService,
        *,
        max_inflight: int = 4096,
        max_request_bytes: int = 1 << 20,
        answer_bytes: int = 2 << 20,
        access_log: AccessLog | None = None,
        methods: Mapping[str, Bound] | None = None,
    ) -> None:
        self.service = service
        self.max_request_bytes = max_request_bytes
        # The most one list answer holds (the service stops there): an answer of unbounded
        # size starts only once the connection's unread answers leave room for that much.
        self.answer_bytes = answer_bytes
        self.max_inflight = max_inflight
        self.inflight = 0
        self.access_log = access_log if access_log is not None else AccessLog()
        self._methods = bind(_METHODS, service) if methods is None else methods

    async def handle_line(
        self,
        line: bytes,
        pacer: Pacer | None = None,
        *,
        tenants: frozenset[str] | None = None,
        uid: int | None = None,
    ) -> bytes | None:
        """The response line (with its newline) for one request line, or ``None``.

        With a ``pacer``, the request waits for its turn before it runs (a malformed line is
        answered at once: its answer is small). With ``tenants`` (tenant binding is on),
        a method naming a tenant not among them is ``forbidden``, and a method naming a run
        means only a run of one of them (another tenant's is answered as absent). ``uid``
        is the Unix user of a worker's connection: the share a run it begins is charged to
        (``None``: no worker's, as on the admin socket).

        :raises ConnectionResetError: the pacer's client left while the request waited.
        """
        answer = self.take_line(line, pacer, tenants=tenants, uid=uid)
        if answer is None or type(answer) is bytes:
            return answer
        assert not isinstance(answer, bytes)
        return await answer

    def take_line(
        self,
        line: bytes,
        pacer: Pacer | None = None,
        *,
        tenants: frozenset[str] | None = None,
        uid: int | None = None,
    ) -> bytes | Coroutine[Any, Any, bytes | None] | None:
        """:meth:`handle_line`'s answer when it is ready without waiting, else a coroutine
        that makes it (and must be awaited or closed).

        Answered at once: a line that is not JSON, and the methods of ``_AT_ONCE`` when
        they need not wait (memory.get of a run open here on a backend that reads without
        waiting, for one). The pacer needs no asking for those: their answers are small.
        """
        started = time.perf_counter()
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            return _line(self._refuse(_invalid(PARSE_ERROR, "not valid UTF-8 JSON"), started))
        caller = _NOBODY if tenants is None and uid is None else Caller(tenants, uid)
        if _well_formed(request) and self.inflight < self.max_inflight:
            method = self._methods.get(request["method"])
            if method is not None and method.start_now is not None:
                _bind_caller(caller)
                try:
                    result = method.start_now(request.get("params", _NO_PARAMS), caller.tenants)
                except Exception as exc:  # noqa: BLE001 - any bug becomes internal_error
                    result = _failure(exc)
                if type(result) is CoroutineType:  # it must wait after all: paced, counted
                    return self._handle(request, started, pacer, caller, result)
                answer = self._finish(request, result, started)
                return None if answer is None else _line(answer)
        return self._handle(request, started, pacer, caller)

    async def _handle(
        self,
        request: Any,
        started: float,
        pacer: Pacer | None,
        caller: Caller,
        pending: Coroutine[Any, Any, object] | None = None,
    ) -> bytes | None:
        """``pending``: the coroutine an at-once method left to make its answer."""
        try:
            return await self._paced(request, started, pacer, caller, pending)
        finally:
            if pending is not None:
                pending.close()  # never awaited if the client left first; else a no-op

    async def _paced(
        self,
        request: Any,
        started: float,
        pacer: Pacer | None,
        caller: Caller,
        pending: Coroutine[Any, Any, object] | None,
    ) -> bytes | None:
        if isinstance(request, list):
            if not request or len(request) > _MAX_BATCH:
                error = _invalid(INVALID_REQUEST, f"a batch holds 1 to {_MAX_BATCH} requests")
                return _line(self._refuse(error, started))
            if pacer is None:
                return await self._batch(request, started, caller, None)
            async with pacer.unbounded:
                if not pacer.fits(self.answer_bytes):
                    await pacer.ready(self.answer_bytes)
                return await self._batch(request, started, caller, pacer.room())
        if pacer is None:
            answer = await self._dispatch_one(request, started, caller, pending)
        elif _unbounded(request):
            async with pacer.unbounded:
                if not pacer.fits(self.answer_bytes):
                    await pacer.ready(self.answer_bytes)
                answer = await self._dispatch_one(request, started, caller, pending)
        else:
            if not pacer.fits():
                await pacer.ready()
            answer = await self._dispatch_one(request, started, caller, pending)
        return None if answer is None else _line(answer)

    async def _batch(
        self,
        requests: list[Any],
        started: float,
        caller: Caller,
        room: int | None,
    ) -> bytes | None:
        """The batch's answer line: its members run in order, each answer encoded as it
        is made. With ``room`` (what the connection's unread answers leave of their
        budget), the answers count against it: once a member could take them past it (a
        list by up to ``answer_bytes``, another by its one entry), that member and every
        later one are refused with ``rate_limited`` instead of run."""
        parts: list[bytes] = []
        spent = 0
        refusing = False
        for request in requests:
            if not refusing and room is not None:
                reserve = self.answer_bytes if _unbounded(request) else 0
                refusing = spent + reserve > room
            if refusing and _well_formed(request):  # a malformed one is refused as usual
                answer = self._refuse_in_batch(request, started)
            else:
                answer = await self._dispatch_one(request, started, caller)
            if answer is not None:
                encoded = orjson.dumps(answer)
                spent += len(encoded) + 1
                parts.append(encoded)
        if not parts:
            return None
        return b"[" + b",".join(parts) + b"]\n"

    def _refuse_in_batch(self, request: Any, started: float) -> dict[str, Any] | None:
        """A well-formed batch member refused for the connection's unread answers
        (``None`` for a notification, which gets no answer)."""
        error = RateLimitedError(
            "the batch's answers would exceed the connection's unread-answer budget",
            {"retryAfterMs": _BATCH_RETRY_AFTER_MS},
        )
        name = request["method"] if request["method"] in self._methods else "-"
        answer = self._refuse(error, started, request.get("id"), name)
        return answer if "id" in request else None

    def oversized(self) -> bytes:
        """The answer to a request line longer than ``max_request_bytes`` (counted, logged)."""
        cap = self.max_request_bytes
        error = _invalid(
            INVALID_REQUEST, f"the request line exceeds {cap} bytes", maxRequestBytes=cap
        )
        return _line(self._refuse(error, time.perf_counter()))

    @staticmethod
    def at_capacity(retry_after_ms: int) -> bytes:
        """The one line a connection beyond ``max_connections`` gets before it is closed:
        ``rate_limited`` with ``id: null`` (no request of it was read)."""
        return refusal_line("the sidecar is at its connection limit", retry_after_ms)

    def _refuse(
        self, err: MemoryServiceError, started: float, request_id: Any = None, method: str = "-"
    ) -> dict[str, Any]:
        """Count and log a request refused before any method ran; its response object."""
        self.service.stats.count(method, err.code)
        # Refusals are errors: the access log always wants them (it rate-limits them).
        self.access_log.write(
            method, err.code, time.perf_counter() - started, request_id, err.wire_rpc_code
        )
        return {"jsonrpc": "2.0", "error": _error_object(err), "id": request_id}

    async def _dispatch_one(
        self,
        request: Any,
        started: float,
        caller: Caller = _NOBODY,
        pending: Coroutine[Any, Any, object] | None = None,
    ) -> dict[str, Any] | None:
        problem = None if _well_formed(request) else _shape_problem(request)
        if problem is not None:
            rid = request.get("id") if isinstance(request, dict) and _valid_id(request) else None
            error = _invalid(INVALID_REQUEST, f"not a JSON-RPC 2.0 request: {problem}", problem)
            return self._refuse(error, started, rid)
        method = self._methods.get(request["method"])
        refusal: MemoryServiceError | None = None
        if method is None:
            refusal = MethodNotFoundError("unknown method")
        elif self.inflight >= self.max_inflight:
            refusal = RateLimitedError("the sidecar is at capacity", {"retryAfterMs": 50})
        if refusal is not None:
            # Only known method names are counted, so stats keys stay a closed set.
            name = request["method"] if method is not None else "-"
            answer = self._refuse(refusal, started, request.get("id"), name)
            return answer if "id" in request else None
        assert method is not None
        self.inflight += 1
        started = time.perf_counter()
        try:
            # Set again here: this may run in another task than the at-once attempt did.
            _bind_caller(caller)
            try:
                result: object = pending
                if result is None:
                    result = method.start(request.get("params", _NO_PARAMS), caller.tenants)
                # Every async handler is a coroutine function; the rest answer at once.
                if type(result) is CoroutineType:
                    result = await result
            except Exception as exc:  # noqa: BLE001 - any bug becomes internal_error
                result = _failure(exc)
        except BaseException:  # the client or a shutdown left: the request was cancelled
            self.inflight -= 1
            self._account(request["method"], "cancelled", started, request)
            raise
        self.inflight -= 1
        return self._finish(request, result, started)

    def _finish(
        self, request: dict[str, Any], result: object, started: float
    ) -> dict[str, Any] | None:
        """Count and log a method's result; its response object (``None``: a notification,
        a request without an ``id`` member)."""
        if isinstance(result, _Failure):
            err = result.error
            envelope = err.envelope()
            self._account(request["method"], err.code, started, request, envelope)
            if "id" not in request:
                return None
            error = {"code": err.wire_rpc_code, "message": err.message, "data": envelope}
            return {"jsonrpc": "2.0", "error": error, "id": request["id"]}
        self._account(request["method"], "ok", started, request)
        if "id" not in request:
            return None
        return {"jsonrpc": "2.0", "result": result, "id": request["id"]}

    def _account(
        self,
        method: str,
        outcome: str,
        started: float,
        request: dict[str, Any],
        error_data: Any = None,
    ) -> None:
        seconds = time.perf_counter() - started
        self.service.stats.observe(method, outcome, seconds)
        access_log = self.access_log
        if access_log.wants(outcome, seconds):
            context = self._log_context(request, error_data)
            access_log.write(method, outcome, seconds, request.get("id"), context=context)

    def _log_context(self, request: dict[str, Any], error_data: Any) -> dict[str, Any]:
        """What ties a request's log line to its run: the run id and the tenant (named, or
        the open run's), and a refused leak's secret ids. Ids, never values or content."""
        context: dict[str, Any] = {}
        params = request.get("params")
        if isinstance(params, dict):
            run_id, tenant = params.get("runId"), params.get("tenant")
            if isinstance(run_id, str):
                context["run_id"] = run_id[:MAX_LOGGED_ID_CHARS]
                if tenant is None:
                    tenant = self.service.open_run_tenant(run_id)
            if isinstance(tenant, str):
                context["tenant"] = tenant[:MAX_LOGGED_ID_CHARS]
        details = error_data.get("details") if isinstance(error_data, dict) else None
        if isinstance(details, dict):
            if isinstance(details.get("secretIds"), list):
                context["secret_ids"] = [str(s)[:MAX_LOGGED_ID_CHARS] for s in details["secretIds"]]
            if isinstance(details.get("correlationId"), str):  # the internal_error line's
                context["correlation_id"] = details["correlationId"]
        return context


def refusal_line(message: str, retry_after_ms: int) -> bytes:
    """A ``rate_limited`` answer line with ``id: null``: what a connection refused as a
    whole gets before it is closed."""
    error = RateLimitedError(message, {"retryAfterMs": retry_after_ms})
    return _line({"jsonrpc": "2.0", "error": _error_object(error), "id": None})


def _unbounded(request: Any) -> bool:
    """Whether the request's answer has no size bound but ``answer_bytes`` (a list)."""
    return isinstance(request, dict) and request.get("method") in _UNBOUNDED_ANSWERS


def _bind_caller(caller: Caller) -> None:
    """Tell the service which tenants' runs the call may mean (tenant binding): a run of
    another tenant is then answered as absent, neither refused nor revealed; and whose
    share a run it begins is charged to (its uid)."""
    tenants = caller.tenants
    BOUND_TENANTS.set(None if tenants is None or ANY_TENANT in tenants else tenants)
    CALLER_UID.set(caller.uid)


def _invalid(rpc_code: int, message: str, field: str = "request", **extra: Any) -> ValidationError:
    return ValidationError(message, {"field": field, **extra}, rpc_code=rpc_code)


def _line(response: Any) -> bytes:
    return orjson.dumps(response, option=orjson.OPT_APPEND_NEWLINE)


def _valid_id(request: dict[str, Any]) -> bool:
    rid = request.get("id")
    return rid is None or (isinstance(rid, (str, int)) and not isinstance(rid, bool))


def _well_formed(request: Any) -> bool:
    """The common case of :func:`_shape_problem` in one expression (orjson makes exact
    types, and ``bool`` is not ``int`` here): true only for a well-formed request."""
    return (
        type(request) is dict
        and request.get("jsonrpc") == "2.0"
        and type(request.get("method")) is str
        and type(request.get("params", _NO_PARAMS)) is dict
        and type(request.get("id")) in _ID_TYPES
        and request.keys() <= _REQUEST_MEMBERS
    )


_NO_PARAMS: dict[str, Any] = {}
_ID_TYPES = frozenset({str, int, type(None)})


def _shape_problem(request: Any) -> str | None:
    """The offending member of a malformed request object, or ``None`` if well-formed."""
    if not isinstance(request, dict):
        return "request"
    if request.get("jsonrpc") != "2.0":
        return "jsonrpc"
    if not isinstance(request.get("method"), str):
        return "method"
    if "params" in request and not isinstance(request["params"], dict):
        return "params"
    if "id" in request and not _valid_id(request):
        return "id"
    if not request.keys() <= _REQUEST_MEMBERS:
        return "request"
    return None
