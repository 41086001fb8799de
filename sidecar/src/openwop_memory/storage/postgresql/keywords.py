"""Keyword indexing after the put's commit, exact at every snapshot (PostgreSQL).

A put's transaction writes the entry's row with ``search`` NULL: ``to_tsvector`` over the
content was the largest part of a small put's statement. :class:`KeywordIndexer` fills it
in shortly after puts commit, a batch of rows a transaction, taking the rows nobody else
is indexing (``FOR UPDATE SKIP LOCKED``), so the sidecars of a fleet share the backlog
instead of queueing on it, and whichever sidecar wrote a row, any of them may index it.
Whatever the background has not reached yet, a search indexes first
(:meth:`KeywordIndexer.through`): every row of the scope at or below the snapshot then has
its vector, and the vector is a pure function of the stored, redacted content (the same
configuration, the same text), so a ranking at a snapshot is the same on the first
execution, on a replay and on another sidecar. Nothing depends on the background keeping
up; it only spares searches the work.

A snapshot is exact per tenant (``schema.py``): every row at or below it has committed, so
"NULL at or below the snapshot" is a finite set that no later write adds to. The partial
index ``entries_unindexed`` (migration 9) keeps both queries off the table's bulk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..catch_up import CatchUp
from .schema import SEARCH_CONFIG

Op = Callable[[Any, list[Callable[[], None]]], Awaitable[int]]
Write = Callable[[Op], Awaitable[int]]

BATCH = 64
"""Rows indexed in one transaction by the background: a few milliseconds of the server's
``to_tsvector`` for entries of a few hundred bytes."""
SCOPE_BATCH = 512
"""Rows a search indexes in one transaction of its catch-up (it waits for all of them)."""

# Only rows no sweep can take (not deleted, no expiry): the others are left to the searches
# at snapshots that see them, so the background never holds a row a sweep wants (the sweep
# passes over locked rows, and would leave one for its next pass; its time is the caller's,
# not the database's, so "not expired yet" is no safe test here).
_ANY_PENDING = (
    "SELECT scope_pk, seq, content FROM entries WHERE search IS NULL AND deleted_seq IS NULL"
    " AND expires_us IS NULL ORDER BY scope_pk, seq LIMIT $1 FOR UPDATE SKIP LOCKED"
)
# Not SKIP LOCKED: a row another transaction is indexing must be waited for (it commits its
# vector, and the re-check of ``search IS NULL`` then passes over it), or the search would
# run without it. Rows are locked in seq order, as every catch-up of the scope locks them.
_SCOPE_PENDING = (
    "SELECT scope_pk, seq, content FROM entries"
    " WHERE scope_pk = (SELECT scope_pk FROM scopes WHERE tenant = $1 AND key = $2)"
    " AND search IS NULL AND seq <= $3 ORDER BY seq LIMIT $4 FOR UPDATE"
)
_SET = (
    f"UPDATE entries e SET search = to_tsvector('{SEARCH_CONFIG}', u.text)"
    " FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u (scope_pk, seq, text)"
    " WHERE e.scope_pk = u.scope_pk AND e.seq = u.seq"
)


def searchable(content: bytes) -> str:
    """The text the vector is made of: the stored content, with U+0000 (which ``text``
    cannot hold) read as a space."""
    return content.decode().replace("\x00", " ")


async def _set_vectors(conn: Any, rows: Sequence[Any]) -> None:
    await conn.execute(
        _SET,
        [r[0] for r in rows],
        [r[1] for r in rows],
        [searchable(bytes(r[2])) for r in rows],
    )


class KeywordIndexer:
    """Fills in ``entries.search`` after puts (:attr:`catch_up`), and on demand before a
    search. ``write`` runs an op in a transaction of its own (the backend's ``_write``)."""

    def __init__(self, write: Write) -> None:
        self._write = write
        self.catch_up = CatchUp(self._batch, BATCH, "keyword_indexing_failed")

    async def _batch(self) -> int:
        """Index up to :data:`BATCH` rows nobody else is indexing; how many it indexed.

        :raises MemoryServiceError: the commit failed (nothing was indexed).
        """

        async def op(conn: Any, effects: list[Callable[[], None]]) -> int:
            rows = await conn.fetch(_ANY_PENDING, BATCH)
            if rows:
                await _set_vectors(conn, rows)
            return len(rows)

        return await self._write(op)

    async def through(self, *, tenant: str, scope_key: str, snapshot: int) -> None:
        """Return once every row of the scope at or below ``snapshot`` has its vector.

        :raises MemoryServiceError: a commit failed; the search cannot be exact, so it fails.
        """

        async def op(conn: Any, effects: list[Callable[[], None]]) -> int:
            rows = await conn.fetch(_SCOPE_PENDING, tenant, scope_key, snapshot, SCOPE_BATCH)
            if rows:
                await _set_vectors(conn, rows)
            return len(rows)

        # Until a pass finds none: rows another transaction was indexing are waited for and
        # then passed over, so a short pass does not mean that none is left.
        while await self._write(op):
            pass
