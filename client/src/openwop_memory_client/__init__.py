"""openwop-memory-client: the thin Python client of the openwop-memory sidecar.

``AsyncMemoryClient`` (anyio) and its blocking twin ``MemoryClient`` speak PROTOCOL.md over
the sidecar's Unix socket; ``client.run(...)`` opens a run whose ``list``/``get``/``put``/
``delete`` are RFC 0004's ``MemoryAdapter``, returning :class:`MemoryEntry` objects
(snake_case attributes, ``datetime`` values). Errors are the one hierarchy of ``_errors``;
:class:`MemoryValidationError` was called ``ValidationError``, which remains an alias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._entry import Change, ChangePage, EntryDict, KeyedEntry, MemoryEntry, Page, Revision
from ._errors import (
    ConflictError,
    ForbiddenError,
    InternalError,
    MemoryServiceError,
    MemoryValidationError,
    MethodNotFoundError,
    NotFoundError,
    OpenWopMemoryError,
    RateLimitedError,
    ReplaySnapshotUnavailableError,
    RequestTimeoutError,
    RunNotFoundError,
    RunNotOpenError,
    SecretLeakageError,
    SidecarUnavailableError,
    TransportError,
    UpstreamUnavailableError,
    ValidationError,
    error_from_wire,
)
from .wire import EntryInput, MemoryListOptions, RunBeginResult, SecretSpec

if TYPE_CHECKING:
    from ._async_client import AsyncMemoryClient
    from ._async_run import AsyncMemoryRun
    from ._sync_client import MemoryClient, MemoryRun

# The clients are imported on first use: the sidecar imports this package for its errors
# and wire models only, and the clients' modules (anyio's thread portal, the result
# parsers) would cost every sidecar start-up time and memory it never uses.
_CLIENTS = {
    "AsyncMemoryClient": "._async_client",
    "AsyncMemoryRun": "._async_run",
    "MemoryClient": "._sync_client",
    "MemoryRun": "._sync_client",
}

__version__ = "0.1.0"

__all__ = [
    "AsyncMemoryClient",
    "AsyncMemoryRun",
    "Change",
    "ChangePage",
    "ConflictError",
    "EntryDict",
    "EntryInput",
    "ForbiddenError",
    "InternalError",
    "KeyedEntry",
    "MemoryClient",
    "MemoryEntry",
    "MemoryListOptions",
    "MemoryRun",
    "MemoryServiceError",
    "MemoryValidationError",
    "MethodNotFoundError",
    "NotFoundError",
    "OpenWopMemoryError",
    "Page",
    "RateLimitedError",
    "ReplaySnapshotUnavailableError",
    "RequestTimeoutError",
    "Revision",
    "RunBeginResult",
    "RunNotFoundError",
    "RunNotOpenError",
    "SecretLeakageError",
    "SecretSpec",
    "SidecarUnavailableError",
    "TransportError",
    "UpstreamUnavailableError",
    "ValidationError",
    "error_from_wire",
]


def __getattr__(name: str) -> Any:
    """The client classes, imported when first asked for (PEP 562).

    :raises AttributeError: ``name`` is not one of this package's names.
    """
    module = _CLIENTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value
