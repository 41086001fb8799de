"""The storage interface every backend implements, and the plain records it trades in.

The logical clock is the store's commit order: every write takes the next sequence number
inside its own transaction, and a snapshot is a sequence number. An entry is visible to a
snapshot ``S`` when ``created_seq <= S`` and it is not deleted as of ``S`` (``deleted_seq``
is null or greater than ``S``) and not expired at the time of the read.

Every method may raise :class:`~openwop_memory_client.UpstreamUnavailableError` when the
database is unreachable or failing; backends translate their driver's errors into it in
one place and never let a driver exception escape.

A failed write leaves no trace: a backend updates what it keeps in memory about the data
(ids it cached, clocks) only after the transaction that wrote it has committed, so a
rolled-back write can never be answered, nor leave an id that points at another tenant's
data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class Scope:
    """A memory scope: a tenant plus a backend-opaque key (issued or plain ref)."""

    tenant: str
    key: str


class EntryRow(NamedTuple):
    """A stored entry as the wire returns it (times in µs since the epoch).

    A named tuple because list answers build a hundred of these per call: it constructs
    several times faster than a frozen dataclass.
    """

    id: str
    content: str
    tags: tuple[str, ...]
    created_us: int
    expires_us: int | None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A persisted run: its tenant and snapshot, and whether ``begin_run`` just made it."""

    run_id: str
    tenant: str
    snapshot_seq: int
    snapshot_us: int
    created: bool


@dataclass(frozen=True, slots=True)
class PutRequest:
    """A redacted, validated entry to store; ``digest`` covers the redacted entry only."""

    scope: Scope
    content: str
    tags: tuple[str, ...]
    expires_us: int | None
    idempotency_key: str | None
    digest: bytes


@dataclass(slots=True)
class SweepCounts:
    """What one sweep pass removed."""

    expired_entries: int = 0
    purged_tombstones: int = 0
    expired_runs: int = 0
    purged_runs: int = 0
    purged_idempotency_keys: int = 0
    errors: list[str] = field(default_factory=list)


class Storage(Protocol):
    """A memory store with snapshot reads. Implementations: SQLite (and PostgreSQL)."""

    async def open(self) -> None:
        """Connect, check the database is usable, and migrate its schema.

        :raises StorageStartupError: the database cannot be used (not WAL, newer schema, ...).
        """

    async def close(self) -> None:
        """Flush pending writes, checkpoint, and disconnect. Idempotent."""

    async def ref_key(self) -> bytes:
        """The MAC key for issued refs, created once per database and shared by all sidecars."""

    async def begin_run(
        self, run_id: str, tenant: str, *, replay: bool, now_us: int, retention_us: int
    ) -> RunRecord:
        """Return the run's persisted snapshot, taking and persisting a new one if needed.

        A run within retention keeps its snapshot; a run past retention (or never begun)
        gets a fresh one, unless ``replay`` is set.

        :raises ForbiddenError: the run exists under another tenant.
        :raises ReplaySnapshotUnavailableError: ``replay`` and no snapshot within retention.
        """

    async def find_run(self, run_id: str, *, now_us: int, retention_us: int) -> RunRecord | None:
        """The run's snapshot if it was begun and is within retention, else ``None``."""

    async def touch_runs(self, run_ids: list[str], now_us: int) -> None:
        """Keep these (open) runs' snapshots retained as of ``now_us``."""

    async def put(self, request: PutRequest, now_us: int) -> EntryRow:
        """Store a new entry (or return the one an earlier put with the same key stored).

        Returns only after the write is committed.

        :raises ConflictError: the idempotency key was used with a different entry.
        """

    async def delete(self, scope: Scope, entry_id: str, now_us: int) -> bool:
        """Tombstone a live, unexpired entry of the scope; ``False`` if there was none."""

    async def list(
        self, scope: Scope, snapshot_seq: int, now_us: int, limit: int, tag: str | None
    ) -> list[EntryRow]:
        """Entries visible to the snapshot, newest first (ties in commit order)."""

    async def get(
        self, scope: Scope, snapshot_seq: int, now_us: int, entry_id: str
    ) -> EntryRow | None:
        """One entry visible to the snapshot, or ``None``."""

    async def sweep(self, now_us: int, retention_us: int, batch_size: int) -> SweepCounts:
        """Delete expired entries and purge what retention no longer needs, in small batches."""

    async def health(self) -> dict[str, object]:
        """A content-free description of the backend; raises if it cannot answer.

        Its ``problems`` list names what makes the backend degraded right now (empty when
        it is ok), e.g. ``writes_failing`` until a write succeeds again.
        """


class StorageStartupError(Exception):
    """The database cannot be used; the message says why and what to do."""
