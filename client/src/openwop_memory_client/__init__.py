"""openwop-memory-client: the thin Python client of the openwop-memory sidecar.

``AsyncMemoryClient`` (anyio) and its blocking twin ``MemoryClient`` speak PROTOCOL.md over
the sidecar's Unix socket; ``client.run(...)`` opens a run whose ``list``/``get``/``put``/
``delete`` are RFC 0004's ``MemoryAdapter``. Errors are the one hierarchy of ``_errors``.
"""

from ._async_client import AsyncMemoryClient
from ._async_run import AsyncMemoryRun
from ._errors import (
    ConflictError,
    ForbiddenError,
    InternalError,
    MemoryServiceError,
    MethodNotFoundError,
    NotFoundError,
    OpenWopMemoryError,
    RateLimitedError,
    ReplaySnapshotUnavailableError,
    RequestTimeoutError,
    RunNotFoundError,
    SecretLeakageError,
    SidecarUnavailableError,
    TransportError,
    UpstreamUnavailableError,
    ValidationError,
    error_from_wire,
)
from ._sync_client import MemoryClient, MemoryRun
from .wire import EntryInput, MemoryEntry, MemoryListOptions, RunBeginResult, SecretSpec

__version__ = "0.1.0"

__all__ = [
    "AsyncMemoryClient",
    "AsyncMemoryRun",
    "ConflictError",
    "EntryInput",
    "ForbiddenError",
    "InternalError",
    "MemoryClient",
    "MemoryEntry",
    "MemoryListOptions",
    "MemoryRun",
    "MemoryServiceError",
    "MethodNotFoundError",
    "NotFoundError",
    "OpenWopMemoryError",
    "RateLimitedError",
    "ReplaySnapshotUnavailableError",
    "RequestTimeoutError",
    "RunBeginResult",
    "RunNotFoundError",
    "SecretLeakageError",
    "SecretSpec",
    "SidecarUnavailableError",
    "TransportError",
    "UpstreamUnavailableError",
    "ValidationError",
    "error_from_wire",
]
