"""The storage interface every backend implements, and the plain records it trades in.

What a backend promises:

- **Outcomes, not errors.** A method reports what it found (a record, an enum, a small
  result); the service alone decides what is an error for the client and spells the wire
  ``details``. Domain rules (the entry-id format, the retention horizons) come from
  :mod:`openwop_memory.domain` or as arguments; a backend applies them and defines none.
- **Failures.** Every method may raise
  :class:`~openwop_memory_client.UpstreamUnavailableError` when the database is unreachable
  or failing, and nothing else; each backend translates its driver's errors into it in one
  place and never lets a driver exception escape. :meth:`Storage.open` raises
  :class:`StorageStartupError` instead.
- **Commit order and snapshots.** Writes have a total commit order among the writes a run
  can see (at least per tenant). A :data:`Snapshot` is a point in that order, taken when a
  run begins; an entry is visible to it when it was committed at or before that point, was
  not deleted at or before it, and has not expired at the time of the read. The snapshot is
  opaque: the service stores it and hands it back unchanged to the backend that issued it.
- **createdAt** never goes backwards in commit order, and a run's ``snapshot_us`` sits
  between the createdAt of the entries inside its snapshot and those after it.
- **Idempotency keys pin their entry**: while a key is kept, the entry it stored is
  returned by a repeated put even after that entry was deleted or expired.
- **Durability**: a write method returns only after its commit is durable.
- **A failed write leaves no trace**: a backend updates what it keeps in memory about the
  data (ids it cached, clocks) only after the transaction that wrote it has committed, so a
  rolled-back write can never be answered, nor leave an id that points at another tenant's
  data.
- Every argument is keyword-only.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, NewType, Protocol, runtime_checkable

from ..domain import NotNow, SweepHorizons

Snapshot = NewType("Snapshot", int)
"""A run's position in its tenant's commits: the tenant's commit sequence number when the
run began. The run sees every entry of the tenant committed at or below it (an entry's
``seq`` is its commit's number), as the entries were then."""


@dataclass(frozen=True, slots=True)
class Scope:
    """A memory scope: a tenant plus a backend-opaque key (issued or plain ref)."""

    tenant: str
    key: str


UNCOUNTED = -1
"""The ``tokens`` of the entry a put returns when its backend counts tokens after the
commit (SQLite, for short content: see ``storage/sqlite/keywords.py``); every read gives
the count."""


class EntryRow(NamedTuple):
    """A stored entry as the wire returns it (times in µs since the epoch), with its
    estimated token count (:func:`~openwop_memory.token_count.estimate_tokens` of the content,
    stored with it; :data:`UNCOUNTED` in a put's answer when the backend counts it later).

    A named tuple because list answers build a hundred of these per call: it constructs
    several times faster than a frozen dataclass.
    """

    id: str
    content: str
    tags: tuple[str, ...]
    created_us: int
    expires_us: int | None
    tokens: int
    score: float | None = None
    """Its relevance in [0, 1] when a search found it
    (:class:`~openwop_memory.retrieval.search.Search`), else ``None``."""


@dataclass(frozen=True, slots=True)
class ListFilter:
    """What a list or search keeps besides its ``tag``, each condition applying when given:
    entries holding at least one of ``tags_any``, all of ``tags_all`` (both without
    duplicates), created strictly after ``created_after_us`` and strictly before
    ``created_before_us``."""

    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    created_after_us: int | None = None
    created_before_us: int | None = None


class RunKey(NamedTuple):
    """What names a run: its tenant and its id (the same id under two tenants is two runs)."""

    tenant: str
    run_id: str


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A persisted run: its tenant and snapshot (and the time the snapshot was taken).
    ``as_of_us`` is set for a read-only run begun as of that past time (then also its
    ``snapshot_us``); ``None`` for a run that writes."""

    run_id: str
    tenant: str
    snapshot: Snapshot
    snapshot_us: int
    as_of_us: int | None = None


class BeginOutcome(enum.Enum):
    """What :meth:`Storage.begin_run` found and did."""

    CREATED = "created"  # a new snapshot was taken and persisted (new run, or past retention)
    RESUMED = "resumed"  # the run's retained snapshot, now touched
    RETENTION_EXPIRED = "retention_expired"  # replay: the run's snapshot is past retention
    UNKNOWN_RUN = "unknown_run"  # replay: no snapshot was ever taken for the run
    # The tenant's run of this id is of the other kind (read-only or not), or read-only as
    # of another time.
    AS_OF_MISMATCH = "as_of_mismatch"
    AS_OF_FUTURE = "as_of_future"  # as of a time past the store's clock
    # As of a time before the store's history is exact (its upgrade to the schema).
    AS_OF_UNAVAILABLE = "as_of_unavailable"


@dataclass(frozen=True, slots=True)
class BeginResult:
    """``run`` is set exactly when ``outcome`` is CREATED or RESUMED."""

    outcome: BeginOutcome
    run: RunRecord | None = None


# The outcomes of begin_run that carry no record, built once (begin is a hot path).
REFUSED: dict[BeginOutcome, BeginResult] = {
    outcome: BeginResult(outcome)
    for outcome in (
        BeginOutcome.RETENTION_EXPIRED,
        BeginOutcome.UNKNOWN_RUN,
        BeginOutcome.AS_OF_MISMATCH,
        BeginOutcome.AS_OF_FUTURE,
        BeginOutcome.AS_OF_UNAVAILABLE,
    )
}


class FoundRun(NamedTuple):
    """What :func:`classify_run` needs of a run's stored row (of the tenant beginning it)."""

    has_snapshot: bool  # False: a run marker, its snapshot past retention
    touched_us: int
    as_of_us: int | None = None  # a read-only run's time (RunRecord.as_of_us)


def classify_run(
    found: FoundRun | None,
    *,
    tenant: str,
    replay: bool,
    retention_cutoff_us: int,
    as_of_us: int | None = None,
) -> BeginOutcome:
    """What :meth:`Storage.begin_run` does with the run it found, the one rule every backend
    applies: ``found`` is the stored row of ``tenant``'s run of that id, or ``None`` for a
    run that tenant never began (another tenant's run of the same id is another run).

    RESUMED: keep the snapshot (touch it). CREATED: take a fresh snapshot (a new run, or one
    past retention without ``replay``). AS_OF_MISMATCH: the retained run is not the one
    asked for (read-only as of ``as_of_us``, or writing when that is ``None``). The others
    write nothing. A run as of a time is always reproducible, so ``replay`` never refuses
    one.
    """
    replay = replay and as_of_us is None
    if found is None:
        return BeginOutcome.UNKNOWN_RUN if replay else BeginOutcome.CREATED
    if found.has_snapshot and found.touched_us > retention_cutoff_us:
        if found.as_of_us != as_of_us:
            return BeginOutcome.AS_OF_MISMATCH
        return BeginOutcome.RESUMED
    return BeginOutcome.RETENTION_EXPIRED if replay else BeginOutcome.CREATED


def refuse_as_of(as_of_us: int, *, clock_us: int, history_since_us: int) -> BeginOutcome | None:
    """Why a run as of ``as_of_us`` cannot be begun on a store whose clock reads
    ``clock_us`` and whose exact history starts at ``history_since_us``: AS_OF_FUTURE,
    AS_OF_UNAVAILABLE, or None (it can)."""
    if as_of_us > clock_us:
        return BeginOutcome.AS_OF_FUTURE
    if as_of_us < history_since_us:
        return BeginOutcome.AS_OF_UNAVAILABLE
    return None


def as_of_position(*, at_or_before: int | None, first_after: int | None, clock: int) -> int:
    """The snapshot of a run begun at a past time T, from the change feed's write positions
    (the sequence number of each put, supersede and delete, which a backend stamps in
    commit order with times that never go back and that are later than every snapshot
    taken before them): the newest position written at or before T; else, when the feed no
    longer holds it (older than retention), the position before the first written after
    T; else (nothing written since) the ``clock``. Any position from the newest write at
    or before T up to the one before the first after it shows exactly the same entries,
    so each answer is the snapshot a run begun at T took."""
    if at_or_before is not None:
        return at_or_before
    if first_after is not None:
        return first_after - 1
    return clock


@dataclass(frozen=True, slots=True)
class PutRequest:
    """A redacted, validated entry to store; ``digest`` covers the redacted entry only.
    ``vector`` is the embedding of the redacted content
    (:meth:`~retrieval.encoders.wordllama.Embedder.vector`), stored in the entry's own row so
    that whatever removes the row removes it too; ``None`` without the embedding model."""

    scope: Scope
    content: str
    tags: tuple[str, ...]
    expires_us: int | None
    idempotency_key: str | None
    digest: bytes
    vector: bytes | None = None
    # A keyed put (an extension): the keyed digest of the entry key (as idempotency keys
    # are stored, so no plaintext key reaches the database), and the revision the caller
    # expects to be current (0: none), or None for no check.
    entry_key: str | None = None
    expected_revision: int | None = None


Embed = Callable[[list[str]], Awaitable[list[bytes | None]]]
"""The vectors of these texts (``None`` for a text without a word), as a put's would be."""

PENDING_VECTOR = b"\x00"
"""The ``vector`` a put stores when its vector is computed after it (the sidecar's indexer
replaces it, :meth:`Storage.set_vectors`); a search computes a still pending one itself.
No vector is one byte long. ``None`` means no vector at all (put without a model)."""

NO_VECTOR = b""
"""What replaces :data:`PENDING_VECTOR` for content without a word (no vector to compute)."""


class VectorRow(NamedTuple):
    """An entry's vector as :meth:`Storage.vectors_after` reads it: ``content`` only where the
    vector is still :data:`PENDING_VECTOR` (to compute it from)."""

    seq: int
    expires_us: int | None
    vector: bytes
    content: str | None = None


@dataclass(frozen=True, slots=True)
class KeywordCandidates:
    """What :meth:`Storage.keyword_candidates` found: ``hits`` as ``(seq, keyword score)``;
    ``total`` entries matching any term, ``counts`` how many match each term that matches
    at all (in no particular order); the hits' rows by ``seq`` when they were asked for
    (else possibly empty)."""

    hits: list[tuple[int, float]]
    total: int = 0
    counts: tuple[int, ...] = ()
    rows: dict[int, EntryRow] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CandidateCheck:
    """What :meth:`Storage.check_candidates` found: the ``seq`` of the candidates a search
    keeps, of every candidate still stored, and the rows of those kept when they were
    asked for (empty otherwise)."""

    kept: set[int]
    stored: set[int]
    rows: dict[int, EntryRow] = field(default_factory=dict)


class PutOutcome(enum.Enum):
    """What :meth:`Storage.put` did."""

    STORED = "stored"  # a new entry was committed
    REPLAYED = "replayed"  # the key was kept with the same digest: the earlier entry
    KEY_CONFLICT = "key_conflict"  # the key was kept with another digest; nothing written
    # The key was kept with the same digest, but its entry's expiresAt has passed: its
    # content is erased (or about to be), so there is nothing to return; nothing written.
    KEY_EXPIRED = "key_expired"
    # A keyed put whose expected revision is not the key's current one; nothing written.
    REVISION_CONFLICT = "revision_conflict"


@dataclass(frozen=True, slots=True)
class PutResult:
    """``entry`` is set exactly when ``outcome`` is STORED or REPLAYED. For a keyed entry,
    ``revision`` is its revision; on REVISION_CONFLICT, it is the key's current revision
    (0: none). ``superseded`` is the id of the revision a STORED keyed put superseded."""

    outcome: PutOutcome
    entry: EntryRow | None = None
    revision: int | None = None
    superseded: str | None = None


KEY_CONFLICT = PutResult(PutOutcome.KEY_CONFLICT)
KEY_EXPIRED = PutResult(PutOutcome.KEY_EXPIRED)


def replayed(entry: EntryRow | None, now_us: int) -> PutResult:
    """The answer to a put whose kept key has the same digest: the key's ``entry`` (``None``
    once the sweep erased it), or KEY_EXPIRED when it is gone or expired at ``now_us``."""
    if entry is None or (entry.expires_us is not None and entry.expires_us <= now_us):
        return KEY_EXPIRED
    return PutResult(PutOutcome.REPLAYED, entry)


class RevisionState(enum.Enum):
    """Where a revision of a key stands in the live store."""

    CURRENT = "current"  # not deleted (it may have expired: then it is not returned)
    SUPERSEDED = "superseded"  # a later revision of the key replaced it
    DELETED = "deleted"  # deleted by id, with no later revision replacing it


class Revision(NamedTuple):
    """One stored revision of a key: its number (1, 2, ... per key and scope), its entry,
    and its state."""

    revision: int
    entry: EntryRow
    state: RevisionState


class Change(NamedTuple):
    """A change feed record: its position (increasing in the tenant's commit order), the
    scope's key, the entry's id, the operation (``put``, ``supersede``, ``delete``,
    ``expire``, ``forget``) and its time (µs). No content, no tags."""

    position: int
    scope_key: str
    entry_id: str
    op: str
    at_us: int


@dataclass(slots=True)
class SweepCounts:
    """What one sweep pass removed, and the steps that failed (content-free reasons)."""

    expired_entries: int = 0
    purged_tombstones: int = 0
    expired_runs: int = 0
    purged_runs: int = 0
    purged_idempotency_keys: int = 0
    purged_changes: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StorageHealth:
    """A content-free description of a backend, as ``sidecar.health`` shows it under
    ``storage``: the backend's name and schema version, what makes it degraded now
    (``problems``, such as ``writes_failing``; none when it is ok), and backend-specific
    properties (wire-spelt keys, JSON values)."""

    backend: str
    schema_version: int
    problems: tuple[str, ...] = ()
    properties: Mapping[str, str | int | bool] = field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "schemaVersion": self.schema_version,
            **self.properties,
            "problems": list(self.problems),
        }


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as stored, for an operator: ``retained`` is false for a marker (a run whose
    snapshot went past retention)."""

    run_id: str
    tenant: str
    snapshot_us: int
    touched_us: int
    retained: bool


@dataclass(frozen=True, slots=True)
class ScopeInfo:
    """A scope of a tenant and its live entries now (not deleted, not expired)."""

    scope: Scope
    live_entries: int


@dataclass(frozen=True, slots=True)
class FoundEntry:
    """An entry found by id alone, whatever its tenant: its scope, and whether it is
    deleted (a tombstone some snapshot may still see), and when a later revision of its
    key ended it, that revision's id."""

    scope: Scope
    entry: EntryRow
    deleted: bool
    superseded_by: str | None = None


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """An entry with its scope, as :meth:`Storage.export_entries` reads it and
    :meth:`Storage.import_entries` writes it (content as stored: redacted). ``embedding``
    is the stored vector of the content an import computed, as a put computes it (never
    exported: it belongs to the model of the database it is in)."""

    scope: Scope
    entry: EntryRow
    embedding: bytes | None = None


@dataclass(frozen=True, slots=True)
class StorageGauges:
    """What a backend can tell cheaply about its size and its commits, for the metrics.

    ``entries`` and ``scopes`` are exact counts where a backend counts cheaply: the live
    entries (neither deleted nor expired at the call) and the scopes stored. Where it
    cannot, ``entries_estimate`` and ``scopes_estimate`` are its planner's estimates of
    the rows stored (deleted and unswept expired ones included). ``None``: the backend
    does not know it.
    """

    database_bytes: int | None = None
    wal_bytes: int | None = None
    entries: int | None = None
    scopes: int | None = None
    entries_estimate: int | None = None
    scopes_estimate: int | None = None
    commits: int | None = None  # transactions committed by this process
    committed_writes: int | None = None  # writes those commits carried (group commits)
    # Commits by the writes they carried: (upper bound, commits) per bucket, not cumulative,
    # the last bound None (unbounded).
    batch_sizes: tuple[tuple[int | None, int], ...] | None = None


class Lifecycle(Protocol):
    """Opening, locking and closing a store, its clock and its memoryRef key: what every
    user of a store needs, whichever role it uses."""

    def lock_at_open(self, *, exclusive: bool) -> None:
        """Have :meth:`open` take the database's serve lock, which :meth:`close` releases:
        shared for a sidecar that serves it (every one holds it, on both backends),
        exclusive for an import, which must not change the memoryRef key under a sidecar
        that keeps the one it read at its start. Without this call, nothing is locked (an
        export reads beside running sidecars)."""

    async def open(self) -> None:
        """Connect, check the database is usable, and migrate its schema.

        :raises DatabaseInUseError: the serve lock is held the other way (see
            :meth:`lock_at_open`).
        :raises StorageStartupError: the database cannot be used (not WAL, newer schema, ...).
        """

    async def close(self) -> None:
        """Flush pending writes and disconnect. Idempotent."""

    async def discard(self) -> None:
        """Close, and remove what :meth:`open` created where that is a file (an import
        that failed into a new SQLite database: the file, its ``-wal``, ``-shm`` and lock
        file), never a file that existed before. A PostgreSQL database keeps its tables."""

    def clock_us(self) -> int:
        """Now, in µs since the epoch, as this store judges time: what the service passes as
        ``now_us`` and ``retention_cutoff_us``, and checks ``expiresAt`` against. A store
        shared by several hosts answers with the database's clock, so that skew between the
        hosts' clocks cannot make them disagree about expiry or retention. Called on every
        request: it must not wait for anything.
        """

    async def ref_key(self) -> bytes:
        """The MAC key for issued refs, created once per database and shared by all sidecars."""


class WorkerPath(Protocol):
    """What serving the workers' requests needs: runs and their snapshots, the reads and
    writes of entries at a snapshot, the change feed, and the search primitives."""

    async def begin_run(
        self,
        *,
        run_id: str,
        tenant: str,
        replay: bool,
        now_us: int,
        retention_cutoff_us: int,
        as_of_us: int | None = None,
    ) -> BeginResult:
        """In one transaction: classify the run (:func:`classify_run`) and take a snapshot if
        it needs one.

        A run is named by its tenant and its id together: runs of the same id under other
        tenants are other runs, never looked at (so an id taken by one tenant neither
        blocks another tenant nor tells it anything). A run of ``tenant`` with a snapshot
        touched after ``retention_cutoff_us``: RESUMED (touched at ``now_us``). Otherwise, with
        ``replay``: RETENTION_EXPIRED if the run is known, UNKNOWN_RUN if not; without it:
        CREATED, with a fresh snapshot touched at ``now_us``. Only CREATED and RESUMED write.

        A fresh snapshot's time (``snapshot_us``) is the store's clock, and every write
        committed after it is stamped later, so the snapshot is exactly the writes stamped
        at or before that time. With ``as_of_us`` the run is read-only and its snapshot is
        the one a run begun then took (:func:`as_of_position`), with ``snapshot_us`` equal
        to ``as_of_us``: AS_OF_FUTURE if that is past the store's clock, AS_OF_UNAVAILABLE
        if it is before the store's exact history begins (its schema's upgrade to runs as
        of a time). An import writes a change record for each entry it adds, at the
        import's time, so a run as of a time before an import does not see its entries.
        """

    async def find_runs(self, *, run_id: str, retention_cutoff_us: int) -> Sequence[RunRecord]:
        """The runs of this id, one per tenant that began one, with a snapshot touched after
        ``retention_cutoff_us``, ordered by tenant (the caller picks between tenants)."""

    async def touch_runs(self, *, runs: Sequence[RunKey], now_us: int) -> None:
        """Mark these runs' snapshots (those that have one) as used at ``now_us``."""

    async def put(self, *, request: PutRequest, now_us: int) -> PutResult:
        """Store a new entry, unless its idempotency key is already kept in its scope.

        With ``entry_key``, in the same transaction: the key's current revision (its
        latest, if neither deleted nor expired at ``now_us``) must be
        ``expected_revision`` when that is given, else REVISION_CONFLICT (nothing
        written); the new entry becomes revision ``latest + 1`` and the current one is
        tombstoned at the new entry's commit position. Writers of the key (of any
        sidecar sharing the database) are serialised, so no acknowledged revision is lost.

        A new entry gets its id from :func:`~openwop_memory.domain.new_entry_id` and its
        createdAt from the commit; ``now_us`` dates the idempotency key. A kept key whose
        entry expired at or before ``now_us`` (or was swept) answers KEY_EXPIRED with the
        same digest, KEY_CONFLICT with another: an expired entry is never returned.
        """

    async def get_key(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_key: str
    ) -> tuple[EntryRow, int] | None:
        """The revision of ``entry_key`` (a keyed digest) the snapshot sees, with its
        number: the one entry of the key visible to it (a supersede ends the old revision
        at the new one's commit position, as a delete does), else ``None``."""

    async def key_history(
        self, *, scope: Scope, now_us: int, entry_key: str, limit: int, before: int | None = None
    ) -> Sequence[Revision]:
        """Up to ``limit`` stored revisions of ``entry_key`` in ``scope``, newest first, as
        the live store holds them at ``now_us``: expired ones are left out (their content
        is never returned), superseded and deleted ones stay until the sweep purges them
        (not before the replay retention has passed since they ended). With ``before``, only
        revisions numbered below it (the next page)."""

    async def changes(self, *, tenant: str, after: int, limit: int) -> Sequence[Change]:
        """Up to ``limit`` change records of ``tenant`` past position ``after``, in commit
        order. Each is written in the transaction of its change, so the feed holds every
        committed change (of every sidecar sharing the database) and no other; records go
        once older than the replay retention (the sweep)."""

    async def set_vectors(self, vectors: Sequence[tuple[str, bytes]]) -> None:
        """Store each ``(entry id, vector)``'s vector in place of the entry's
        :data:`PENDING_VECTOR`; an entry gone, or whose vector is not pending, is left as it
        is. Nothing else changes (no clock, no change record): a vector is derived from
        the content, and a search computes a pending one identically.

        :raises UpstreamUnavailableError: the database could not be written.
        """

    async def delete(self, *, scope: Scope, entry_id: str, now_us: int) -> bool:
        """Tombstone the entry if it is in ``scope``, live and unexpired at ``now_us``;
        ``False`` (nothing written) if there was none."""

    async def keyword_candidates(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        terms: Sequence[str],
        limit: int,
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
        rows: bool = True,
    ) -> KeywordCandidates:
        """Up to ``limit`` of the entries :meth:`list` would consider (same visibility, tag,
        token and ``where`` rules) that match at least one of ``terms`` in the backend's
        full-text index, the highest keyword score first (ties newest first); none for no
        terms; with ``rows``, their rows too (a hybrid search reads only its answer's). What
        the snapshot holds that is not indexed yet is indexed first, so the answer is the
        same whenever it is asked.

        **Keyword score.** A term (see :func:`~openwop_memory.retrieval.text.query_terms`)
        matches an entry whose content holds the word, as the backend's engine stems it. An
        entry's score is the sum, over the terms it matches, of ``ln(1 + (N - n + 0.5) /
        (n + 0.5))`` (BM25's inverse document frequency), where ``N`` is the number of
        visible entries of the scope matching any term and ``n`` the number matching this
        one, counted after ``tag`` and ``where`` but before ``max_tokens`` apply. ``N`` and
        the ``n`` of each term that matches are returned with the hits (for
        :func:`~openwop_memory.retrieval.fusion.keyword_ceiling`).

        Nothing outside the snapshot weighs in: the same snapshot and terms give the same
        hits for as long as no entry expires.
        """

    async def vectors_after(self, *, scope: Scope, after: int) -> Sequence[VectorRow]:
        """The entries of ``scope`` stored with a vector (or a :data:`PENDING_VECTOR`) whose
        ``seq`` is above ``after``, in ``seq`` order, whatever any snapshot shows of them
        (:meth:`check_candidates` says that)."""

    async def check_candidates(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        seqs: Sequence[int],
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
        rows: bool = True,
    ) -> CandidateCheck:
        """Of the entries of ``scope`` numbered ``seqs``: those :meth:`list` would consider
        (same visibility, tag, token and ``where`` rules), with their rows if ``rows``, and
        those still stored at all (a sweep or forget removes rows). Without ``rows`` the
        check reads no content: a search checks many more candidates than it answers with."""

    async def list(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        limit: int,
        tag: str | None,
        max_tokens: int | None = None,
        where: ListFilter | None = None,
    ) -> list[EntryRow]:
        """Up to ``limit`` entries of ``scope`` visible to the snapshot at ``now_us`` (with
        ``tag`` among their tags, if given, at most ``max_tokens`` tokens, if given, and
        kept by ``where``, if given), newest first (ties in commit order)."""

    async def page(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        limit: int,
        tag: str | None,
        where: ListFilter | None,
        before: int | None,
    ) -> Sequence[tuple[int, EntryRow]]:
        """What :meth:`list` returns (without a token bound), each entry with its position
        in the list (an integer, decreasing along it), those before position ``before``
        only when given: the next page. Under one snapshot the pages together hold each
        entry the snapshot shows once, whatever is written meanwhile (an entry expiring
        between two pages drops out)."""

    async def count(
        self,
        *,
        scope: Scope,
        snapshot: Snapshot,
        now_us: int,
        tag: str | None,
        where: ListFilter | None,
    ) -> int:
        """How many entries :meth:`list` would consider (no limit)."""

    async def get(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | None:
        """The entry of ``scope`` with this id if visible to the snapshot, else ``None``."""


class Maintenance(Protocol):
    """The work the sweeper and an operator's forget do: removal in batches, content-free."""

    async def sweep(self, *, horizons: SweepHorizons, batch_size: int) -> SweepCounts:
        """Remove what the horizons allow, in batches of ``batch_size`` so writers never stall.

        Expired entries go whatever pins them, and with them every byte of their content
        the backend can reach (their idempotency keys stay, holding a digest only, so a
        repeated put is refused rather than stored again); idempotency keys past
        ``key_cutoff_us`` go; runs touched at or before ``run_cutoff_us`` lose their snapshot but
        keep a marker, and markers touched at or before ``marker_cutoff_us`` go; a tombstoned
        entry goes once no remaining snapshot can see it. A failing step is recorded in
        ``errors`` and the other steps still run.
        """

    async def forget(self, *, tenant: str, tag: str, batch_size: int) -> int:
        """Physically remove every entry of ``tenant`` carrying ``tag``, in all its scopes,
        deleted or not, and return how many went (for operators: RFC 0080's forget).

        This is outside the replay envelope: snapshots that saw these entries stop seeing
        them. The entry rows go, and with them all that hangs on a row (its tags, its
        full-text index terms, whatever else a backend keeps per entry), and the
        idempotency keys that pinned them (a put repeated with such a key stores anew).
        Other tenants' entries are never touched, whatever their tags. It runs in
        transactions of at most ``batch_size`` entries, so writers never stall; an entry
        put with ``tag`` while it runs may survive it.
        """


class OperatorAccess(Protocol):
    """What an operator's commands need beyond a run: every run and scope, an entry by id
    in any tenant, export and import."""

    async def list_runs(self, *, limit: int) -> Sequence[RunInfo]:
        """Up to ``limit`` stored runs, the most recently touched first (for operators)."""

    async def list_scopes(self, *, tenant: str, now_us: int) -> Sequence[ScopeInfo]:
        """Every scope of ``tenant`` with its live entries at ``now_us`` (for operators)."""

    async def find_entry(self, *, entry_id: str) -> FoundEntry | None:
        """The entry with this id in any tenant, deleted or not (for operators)."""

    def export_entries(
        self, *, now_us: int, batch_size: int
    ) -> AsyncGenerator[Sequence[StoredEntry], None]:
        """Every entry of every tenant that is live at ``now_us`` (neither deleted nor
        expired), read as of one consistent point while writers go on, in commit order
        (of each tenant, at least), in lists of at most ``batch_size``. Runs, snapshots,
        tombstones and idempotency keys are not part of it (for operators: export)."""

    async def adopt_ref_key(self, *, key: bytes) -> bool:
        """Make ``key`` the database's memoryRef key, so that refs issued against the
        database it came from reach the same scopes here. True when it is now the key (it
        was already, or the database held no scope yet, so nothing was reachable through
        the old one); False, nothing written, when the database holds scopes or runs
        (whose workers hold refs) under another key. A sidecar serving this database would
        keep the key it read at its start: an import holds the exclusive serve lock (see
        :meth:`lock_at_open`), so none does.
        """

    async def import_entries(self, *, entries: Sequence[StoredEntry]) -> int:
        """Store ``entries`` in one transaction, in their order, each committed now but
        keeping its id, scope, content, tags, createdAt and expiresAt (its token count is
        counted again); an entry whose id is already stored, here or earlier in
        ``entries``, is skipped. Returns how many were stored. A later put's createdAt is
        never below an imported one (for operators: import)."""


class Observability(Protocol):
    """What the metrics and the health probe read: sizes, counts, the backend's state."""

    async def gauges(self) -> StorageGauges:
        """Sizes and commit counts for the metrics; cheap (no table scan)."""

    async def health(self) -> StorageHealth:
        """A content-free description of the backend; raises if it cannot answer.

        Its ``problems`` name what makes the backend degraded right now (none when it is
        ok), e.g. ``writes_failing`` until a write succeeds again.
        """


class Storage(Lifecycle, WorkerPath, Maintenance, OperatorAccess, Observability, Protocol):
    """A memory store with snapshot reads, in every role: what a backend implements
    (SQLite, PostgreSQL, the in-memory one), with :class:`ReadsNow` and :class:`FileBackup`
    where it can. A user of one role takes that role's type (``Search`` a
    :class:`WorkerPath`, an import or export a :class:`Lifecycle` and
    :class:`OperatorAccess`), so what it may call is what it needs."""


@runtime_checkable
class ReadsNow(Protocol):
    """A backend that may answer a point read without waiting (SQLite: a local file read
    counts as not waiting); the service asks it first and falls back to :meth:`Storage.get`.
    PostgreSQL has no such role: every read is a round trip to the server."""

    def get_now(
        self, *, scope: Scope, snapshot: Snapshot, now_us: int, entry_id: str
    ) -> EntryRow | NotNow | None:
        """What :meth:`get` would return, when the backend has it without waiting for I/O
        it would otherwise await; else :data:`~openwop_memory.domain.NOT_NOW`. It lets a
        request be answered without a task of its own."""


@runtime_checkable
class FileBackup(Protocol):
    """A backend whose database is one file this process can copy while serving
    (SQLite); others are backed up with their own tools (PostgreSQL: ``pg_dump``)."""

    async def backup(self, *, path: str) -> int:
        """Write a consistent copy of the whole database to the new file ``path`` (created
        0600: it holds every tenant's memory), check it, and return its size in bytes.

        :raises ValidationError: ``path`` exists.
        :raises UpstreamUnavailableError: the copy failed or did not pass its check (the
            partial file is removed).
        """


class StorageStartupError(Exception):
    """The database cannot be used; the message says why and what to do."""


class DatabaseInUseError(StorageStartupError):
    """The serve lock is held the other way: a sidecar serves the database an import is
    for, or an import runs into the database a sidecar is starting on."""


class DatabaseUnreachableError(StorageStartupError):
    """The database server could not be reached, or is not accepting connections yet: worth
    waiting for at start-up (``database_wait``), unlike a wrong password or a missing
    database, which no wait repairs."""
