"""The one error hierarchy of openwop-memory, shared by the client and the sidecar.

Every error that crosses the wire is a :class:`MemoryServiceError` subclass whose class
attributes name its OpenWOP envelope code (``error``) and its JSON-RPC code (``rpc_code``).
The sidecar raises these; the client turns each error response back into the same class.

::

    OpenWopMemoryError                   anything this package raises
    ├── MemoryServiceError               an error envelope from the sidecar (.code, .details)
    │   ├── MemoryValidationError        validation_error        -32602 (-32700, -32600)
    │   ├── NotFoundError                not_found               -32004 (-32601)
    │   │   ├── MethodNotFoundError      not_found, resource=method
    │   │   └── RunNotFoundError         not_found, resource=run
    │   ├── ForbiddenError               forbidden               -32003
    │   ├── SecretLeakageError           secret_leakage          -32010
    │   ├── ConflictError                conflict                -32009
    │   ├── ReplaySnapshotUnavailableError replay_memory_snapshot_unavailable -32011
    │   ├── RateLimitedError             rate_limited            -32029
    │   ├── UpstreamUnavailableError     upstream_unavailable    -32005
    │   └── InternalError                internal_error          -32603
    ├── RunNotOpenError                  a run used outside its ``with`` block (never sent)
    └── TransportError                   the client could not talk to the sidecar
        ├── SidecarUnavailableError      no sidecar answers on the socket
        └── RequestTimeoutError          no answer within the call's timeout

Messages never carry entry content or secret values; ``details`` carries ids and field names.

``ValidationError`` is the former name of :class:`MemoryValidationError`, kept as an alias
(the same class) so that existing ``except ValidationError`` clauses keep working; it will be
removed in a later release. The new name cannot be mistaken for pydantic's
``ValidationError``, which this package never lets escape from a client call.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .wire import INVALID_PARAMS, METHOD_NOT_FOUND

__all__ = [
    "ConflictError",
    "ForbiddenError",
    "InternalError",
    "MemoryServiceError",
    "MemoryValidationError",
    "MethodNotFoundError",
    "NotFoundError",
    "OpenWopMemoryError",
    "RateLimitedError",
    "ReplaySnapshotUnavailableError",
    "RequestTimeoutError",
    "RunNotFoundError",
    "RunNotOpenError",
    "SecretLeakageError",
    "SidecarUnavailableError",
    "TransportError",
    "UpstreamUnavailableError",
    "ValidationError",
    "error_from_wire",
]


class OpenWopMemoryError(Exception):
    """Base of every exception this package raises."""


class MemoryServiceError(OpenWopMemoryError):
    """An OpenWOP error envelope: ``{"error": code, "message": ..., "details": {...}}``."""

    code: ClassVar[str] = "internal_error"
    rpc_code: ClassVar[int] = -32603

    def __init__(
        self,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        rpc_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        # A few codes map to more than one JSON-RPC code (see PROTOCOL.md's table).
        self.wire_rpc_code = self.rpc_code if rpc_code is None else rpc_code

    def envelope(self) -> dict[str, Any]:
        """The OpenWOP error envelope, as placed in the JSON-RPC error's ``data``."""
        return {"error": self.code, "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class MemoryValidationError(MemoryServiceError):
    """Malformed input; ``details.field`` names the offending field (never its value).

    Raised by the sidecar, and by the client before sending when it can tell the input is
    malformed (a wrong type, an unknown entry key, a naive datetime, a non-positive ttl).
    """

    code = "validation_error"
    rpc_code = INVALID_PARAMS


# The former name, kept for one release: see the module docstring.
ValidationError = MemoryValidationError


class NotFoundError(MemoryServiceError):
    """An unknown method or run; ``details.resource`` says which."""

    code = "not_found"
    rpc_code = -32004


class MethodNotFoundError(NotFoundError):
    rpc_code = METHOD_NOT_FOUND

    def __init__(
        self,
        message: str = "unknown method",
        details: dict[str, Any] | None = None,
        *,
        rpc_code: int | None = None,
    ) -> None:
        super().__init__(message, {"resource": "method", **(details or {})}, rpc_code=rpc_code)


class RunNotFoundError(NotFoundError):
    def __init__(
        self,
        message: str = "unknown run",
        details: dict[str, Any] | None = None,
        *,
        rpc_code: int | None = None,
    ) -> None:
        super().__init__(message, {"resource": "run", **(details or {})}, rpc_code=rpc_code)


class ForbiddenError(MemoryServiceError):
    """A run touched another tenant's memory, or (tenant binding) this process may not use
    the tenant it named."""

    code = "forbidden"
    rpc_code = -32003


class SecretLeakageError(MemoryServiceError):
    """Policy ``reject``: the entry held a registered secret (``details.secretIds``)."""

    code = "secret_leakage"
    rpc_code = -32010


class ConflictError(MemoryServiceError):
    """An idempotency key was reused with a different entry."""

    code = "conflict"
    rpc_code = -32009


class ReplaySnapshotUnavailableError(MemoryServiceError):
    """``replay: true`` for a run whose snapshot is past retention or was never taken."""

    code = "replay_memory_snapshot_unavailable"
    rpc_code = -32011


class RateLimitedError(MemoryServiceError):
    """The sidecar sheds load; retry after ``details.retryAfterMs``."""

    code = "rate_limited"
    rpc_code = -32029


class UpstreamUnavailableError(MemoryServiceError):
    """The database is unreachable or failing."""

    code = "upstream_unavailable"
    rpc_code = -32005


class InternalError(MemoryServiceError):
    """Anything else; ``details.correlationId`` matches the sidecar's log line."""

    code = "internal_error"
    rpc_code = -32603


class RunNotOpenError(OpenWopMemoryError, RuntimeError):
    """A run was used before its ``with``/``async with`` block began it, or ``put`` or
    ``add_secrets`` after the block ended it. Nothing was sent to the sidecar."""


class TransportError(OpenWopMemoryError):
    """The client could not exchange a request with the sidecar."""


class SidecarUnavailableError(TransportError):
    """Nothing answers on the socket (after the client's reconnect attempts)."""


class RequestTimeoutError(TransportError):
    """The sidecar did not answer within the call's timeout."""


_BY_CODE: dict[str, type[MemoryServiceError]] = {
    cls.code: cls
    for cls in (
        MemoryValidationError,
        NotFoundError,
        ForbiddenError,
        SecretLeakageError,
        ConflictError,
        ReplaySnapshotUnavailableError,
        RateLimitedError,
        UpstreamUnavailableError,
        InternalError,
    )
}


def error_from_wire(error: Any) -> MemoryServiceError:
    """Build the typed exception for a JSON-RPC ``error`` object.

    Never raises: an error object that is not a well-formed envelope becomes an
    :class:`InternalError` carrying the JSON-RPC message.
    """
    if not isinstance(error, dict):
        return InternalError("malformed error response")
    rpc_code = error.get("code") if isinstance(error.get("code"), int) else None
    data = error.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("error"), str):
        return InternalError(str(error.get("message", "error")), rpc_code=rpc_code)
    raw_details = data.get("details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    message = str(data.get("message", data["error"]))
    cls = _BY_CODE.get(data["error"], InternalError)
    if cls is NotFoundError:
        resource = details.get("resource")
        if resource == "run":
            return RunNotFoundError(message, details, rpc_code=rpc_code)
        if resource == "method":
            return MethodNotFoundError(message, details, rpc_code=rpc_code)
    return cls(message, details, rpc_code=rpc_code)
