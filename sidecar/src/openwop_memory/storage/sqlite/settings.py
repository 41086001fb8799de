"""The ``[sqlite]`` settings group, validated by this model (``storage.registry`` names it
for its scheme). Pydantic only: ``config`` imports it without importing the backend."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...setting_types import Seconds


class SqliteSettings(BaseModel):
    """The ``[sqlite]`` group: tuning of the SQLite backend (ignored by other backends)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    synchronous: Literal["NORMAL", "FULL", "EXTRA"] = Field(
        default="NORMAL",
        description="SQLite durability: NORMAL survives a crash of the process, FULL or EXTRA "
        "also a power loss, at the cost of an fsync per commit",
    )
    busy_timeout: Seconds = Field(
        default=5.0, description="how long a write waits for another process writing the same file"
    )
    read_connections: int = Field(
        default=2, ge=1, le=64, description="read-only SQLite connections"
    )
    inline_point_reads: bool = Field(
        default=True,
        description="serve lookups by id on the event loop from a connection that never waits "
        "for a lock; false keeps every read off the loop",
    )
    scope_cache_size: int = Field(
        default=4096,
        ge=1,
        description="scope ids kept in memory (about 200 bytes each); a miss costs one "
        "indexed lookup when writing",
    )
