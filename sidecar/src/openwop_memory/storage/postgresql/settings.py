"""The ``[postgresql]`` settings group, validated by this model (``storage.registry`` names
it for its scheme). Pydantic only: ``config`` imports it without importing the driver."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ...setting_types import Seconds


class PostgresqlSettings(BaseModel):
    """The ``[postgresql]`` group: the PostgreSQL backend's pool (ignored by other backends)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool_min_size: int = Field(
        default=1, ge=0, le=1000, description="connections the pool keeps open when idle"
    )
    pool_max_size: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="most connections to the database at once (count them against the "
        "server's max_connections, times the number of sidecars)",
    )
    connect_timeout: Seconds = Field(
        default=5.0, description="how long opening a connection may take before a call fails"
    )
    command_timeout: Seconds = Field(
        default=10.0,
        description="how long a statement may take before the call fails with upstream_unavailable",
    )
    scope_cache_size: int = Field(
        default=4096,
        ge=1,
        description="scope ids kept in memory (about 200 bytes each); a miss costs one "
        "indexed lookup when writing",
    )
    prepared_statements: bool = Field(
        default=True,
        description="keep each connection's statements prepared (a round trip less per "
        "statement); set false behind a pooler in transaction mode, such as PgBouncer "
        "before 1.21",
    )
