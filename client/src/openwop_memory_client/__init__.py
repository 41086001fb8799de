"""openwop-memory-client: the thin Python client of the openwop-memory sidecar."""

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
from ._models import EntryInput, MemoryEntry, MemoryListOptions, RunBeginResult, SecretSpec

__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "EntryInput",
    "ForbiddenError",
    "InternalError",
    "MemoryEntry",
    "MemoryListOptions",
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
