"""The ``[memory]`` settings group, validated by this model (``storage.registry`` names it
for its scheme). Pydantic only: ``config`` imports it without importing the backend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class MemorySettings(BaseModel):
    """The ``[memory]`` group: the in-memory backend has nothing to tune (no file, no pool,
    no writer thread), so the table takes no key; it exists so that every registered scheme
    has its table, as ``config`` requires."""

    model_config = ConfigDict(extra="forbid", frozen=True)
