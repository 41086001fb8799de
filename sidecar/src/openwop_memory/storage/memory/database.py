"""What an in-memory database holds, and the process's databases by name.

A :class:`Database` is the whole state of one ``memory://NAME`` database: the commit clock,
the entry rows (each row one object, indexed by scope, id and ``seq``), idempotency keys,
keyed revisions, runs and the change feed. It has no transactions: the backend changes it
only in synchronous code between two awaits, so every method of the backend is one atomic
step of the event loop, and commit order is the order those steps run in.

The rows mirror SQLite's tables (``storage/sqlite/schema.py``) closely on purpose: ``seq``
is the commit position, a tombstone is a row with ``deleted_seq``, a keyed revision is a
row with a ``revision``. Only what SQLite keeps in a separate table for speed (the
full-text index) is derived here, from the row, when a search first needs it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from ..base import EntryRow, Scope
from .keywords import stems

HISTORY_SINCE_US = 1
"""When a run as of a time is exact from. A rule copied from SQL: a SQLite or PostgreSQL
database made at the latest schema records ``history_since_us`` as its clock then plus
one, which for a new database is 1 µs (earlier databases start at their upgrade); an
in-memory database always has its whole history, so it starts where a new one does."""


@dataclass(slots=True)
class Row:
    """One stored entry (an ``entries`` row, its tags and its ``entry_keys`` row)."""

    seq: int
    scope: Scope
    entry: EntryRow
    vector: bytes | None
    tag_set: frozenset[str]
    deleted_seq: int | None = None  # the commit position of its delete or supersede
    deleted_us: int | None = None
    # A keyed revision: the keyed digest of its entry key, its number, and when a later
    # revision or a delete ended it.
    entry_key: str | None = None
    revision: int | None = None
    ended_us: int | None = None
    # The stems of the content (its full-text index terms), made by the first search.
    stems: tuple[str, ...] | None = None
    stem_set: frozenset[str] = frozenset()

    @property
    def expires_us(self) -> int | None:
        return self.entry.expires_us

    def visible(self, snapshot: int, now_us: int) -> bool:
        """The rule every read applies (SQLite's ``_VISIBLE``): committed at or before the
        snapshot, not deleted at or before it, not expired at ``now_us``."""
        expires = self.entry.expires_us
        return (
            self.seq <= snapshot
            and (self.deleted_seq is None or self.deleted_seq > snapshot)
            and (expires is None or expires > now_us)
        )

    def live(self, now_us: int) -> bool:
        """Neither deleted nor expired at ``now_us``."""
        expires = self.entry.expires_us
        return self.deleted_seq is None and (expires is None or expires > now_us)

    def indexed(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """The row's index terms, in order and as a set (computed once)."""
        if self.stems is None:
            self.stems = stems(self.entry.content)
            self.stem_set = frozenset(self.stems)
        return self.stems, self.stem_set

    def size(self) -> int:
        """Bytes of what the row holds (its content, tags and vector), for the gauges."""
        entry = self.entry
        return (
            len(entry.content.encode(errors="surrogatepass"))
            + sum(len(tag.encode(errors="surrogatepass")) for tag in entry.tags)
            + len(self.vector or b"")
        )


@dataclass(slots=True)
class KeptKey:
    """An idempotency key: the digest of the put that made it, its entry, its time."""

    digest: bytes
    entry_seq: int
    created_us: int


@dataclass(slots=True)
class RunRow:
    """A run's row: its snapshot (``None``: a marker, past retention) and times."""

    snapshot_seq: int | None
    snapshot_us: int
    touched_us: int
    as_of_us: int | None


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """A change feed record; ``seq`` is the write's commit position (``None`` for expiry
    and forget, which change no snapshot's entries)."""

    pos: int
    tenant: str
    scope_key: str
    entry_id: str
    op: str
    at_us: int
    seq: int | None


@dataclass(slots=True)
class Database:
    """The state of one in-memory database (see the module docstring)."""

    ref_key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    seq: int = 0  # the latest commit position
    last_us: int = 0  # the latest time stamped: createdAt never goes below it
    # Each scope's rows by seq, in seq order (rows are only ever added at the end).
    scopes: dict[Scope, dict[int, Row]] = field(default_factory=dict)
    by_seq: dict[int, Row] = field(default_factory=dict)
    by_id: dict[str, Row] = field(default_factory=dict)
    keys: dict[tuple[Scope, str], KeptKey] = field(default_factory=dict)
    # Each entry key's stored revisions, by (scope, entry key), in revision order.
    revisions: dict[tuple[Scope, str], list[Row]] = field(default_factory=dict)
    runs: dict[str, dict[str, RunRow]] = field(default_factory=dict)  # run id -> tenant -> row
    changes: list[ChangeRow] = field(default_factory=list)  # in pos order
    next_pos: int = 1
    # What the gauges count without a scan: the rows holding a tombstone, the rows with an
    # expiry (their seqs), and the bytes all rows hold.
    tombstones: int = 0
    expiring: set[int] = field(default_factory=set)
    bytes_held: int = 0
    open_stores: int = 0  # stores of this process that have it open

    def advance(self, clock_us: int) -> None:
        """Start a write at ``clock_us``: the time it stamps never goes below an earlier one."""
        if clock_us > self.last_us:
            self.last_us = clock_us

    def stamp(self) -> tuple[int, int]:
        """The next commit position, and the createdAt to go with it."""
        self.seq += 1
        return self.seq, self.last_us

    def snapshot_taken(self) -> None:
        """A snapshot was taken at ``last_us``: every later write is stamped after it (as
        SQLite's ``Txn.snapshot_taken``), so a snapshot is exactly the writes stamped at or
        before its time."""
        self.last_us += 1

    def record(
        self, tenant: str, scope_key: str, entry_id: str, op: str, at_us: int, seq: int | None
    ) -> None:
        """Append a change feed record."""
        self.changes.append(ChangeRow(self.next_pos, tenant, scope_key, entry_id, op, at_us, seq))
        self.next_pos += 1

    def scope_rows(self, scope: Scope) -> dict[int, Row]:
        """The scope's rows, the scope made if it is new (as a write makes its row)."""
        rows = self.scopes.get(scope)
        if rows is None:
            rows = self.scopes[scope] = {}
        return rows

    def add(self, row: Row) -> None:
        """Store a new row (its ``seq`` above every row of its scope)."""
        self.scope_rows(row.scope)[row.seq] = row
        self.by_seq[row.seq] = row
        self.by_id[row.entry.id] = row
        if row.entry.expires_us is not None:
            self.expiring.add(row.seq)
        self.bytes_held += row.size()
        if row.entry_key is not None:
            self.revisions.setdefault((row.scope, row.entry_key), []).append(row)

    def tombstone(self, row: Row, seq: int, at_us: int) -> None:
        """End ``row`` at commit position ``seq`` (a delete, or a later revision's put)."""
        row.deleted_seq, row.deleted_us = seq, at_us
        if row.revision is not None:
            row.ended_us = at_us
        self.tombstones += 1

    def remove(self, row: Row) -> None:
        """Remove a row and all that hangs on it (its tags, index terms, vector and key
        revision go with the object); idempotency keys naming it are the caller's."""
        del self.scopes[row.scope][row.seq]
        del self.by_seq[row.seq]
        del self.by_id[row.entry.id]
        self.expiring.discard(row.seq)
        self.bytes_held -= row.size()
        if row.deleted_seq is not None:
            self.tombstones -= 1
        if row.entry_key is not None:
            key = (row.scope, row.entry_key)
            kept = [r for r in self.revisions[key] if r is not row]
            if kept:
                self.revisions[key] = kept
            else:
                del self.revisions[key]

    def new_row(
        self,
        seq: int,
        scope: Scope,
        entry: EntryRow,
        vector: bytes | None,
    ) -> Row:
        """A row for ``entry`` at ``seq`` (not stored yet)."""
        return Row(seq, scope, entry, vector, frozenset(entry.tags))


_DATABASES: dict[str, Database] = {}
"""The process's in-memory databases by name: each lives as long as the process (or until
:func:`drop` removes it), so stores opened on one name, one after the other or at once,
share its data."""


def named(name: str, *, create: bool) -> tuple[Database, bool] | None:
    """The database ``name`` of this process and whether it was made now; ``None`` when it
    has none of that name and ``create`` is false."""
    database = _DATABASES.get(name)
    if database is not None:
        return database, False
    if not create:
        return None
    database = _DATABASES[name] = Database()
    return database, True


def drop(name: str, database: Database) -> None:
    """Forget the database ``name`` if it is still ``database``."""
    if _DATABASES.get(name) is database:
        del _DATABASES[name]
