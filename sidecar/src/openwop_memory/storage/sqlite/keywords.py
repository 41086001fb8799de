"""Keyword indexing after the put's commit, exact at every snapshot (SQLite).

A put's transaction writes the entry's row and not its terms (the full-text insert was most
of a small put's cost). ``fts_progress.indexed_seq`` is the commit position up to which
every row is in ``entries_fts``; :class:`KeywordIndexer` moves it forward, a batch of rows a
transaction, shortly after puts commit, on the writer thread, paced so that a backlog
never holds the writer for long. Whatever it has not reached
yet, a search indexes first (:meth:`KeywordIndexer.through`): every row a snapshot can see
is then in the index, and the index holds the same terms for them whenever and wherever the
search runs (the terms are a pure function of the stored, redacted content), so a ranking
at a snapshot is the same on the first execution, on a replay and on another sidecar of the
file. Nothing depends on the background keeping up; it only spares searches the work.

Commit order makes a position enough: sequence numbers are reserved in commit order by
the one writer at a time, so no row at or below a committed position can appear later.
A transaction indexes rows at or below the position it began at only (``Txn.start_seq``):
the rows its own group's puts add are inserted at its end, after the index op has run.
"""

from __future__ import annotations

from ..catch_up import CatchUp
from .writer import GroupCommit, Txn

BATCH = 32
"""Rows indexed in one transaction: under a millisecond of FTS5 work for entries of 30
words (p50 0.7 ms, max 10 ms at 20,000 entries), so a put queued behind it waits little."""

_PROGRESS = "SELECT indexed_seq FROM fts_progress"
_ROWS = "SELECT seq, scope_pk, content FROM entries WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
_INSERT = "INSERT INTO entries_fts (rowid, scope_pk, content) VALUES (?, ?, ?)"
_ADVANCE = "UPDATE fts_progress SET indexed_seq = ?"


def index_batch(txn: Txn) -> tuple[int, int]:
    """In ``txn``: index up to :data:`BATCH` rows above the recorded position and at or
    below ``txn.start_seq``, and record the new position. Returns the position and how many
    rows were indexed; fewer than :data:`BATCH` means every row up to ``txn.start_seq`` is
    indexed. Another sidecar of the file may have moved the position already: it is read in
    the transaction, never assumed."""
    (done,) = txn.conn.execute(_PROGRESS).fetchone()
    top = txn.start_seq
    if done >= top:
        return int(done), 0
    rows = txn.conn.execute(_ROWS, (done, top, BATCH)).fetchall()
    position = int(rows[-1][0]) if len(rows) == BATCH else top
    txn.conn.executemany(_INSERT, rows)
    txn.conn.execute(_ADVANCE, (position,))
    return position, len(rows)


class KeywordIndexer:
    """Moves ``fts_progress`` forward after puts (:attr:`catch_up`), and on demand before
    a search."""

    def __init__(self, writer: GroupCommit) -> None:
        self._writer = writer
        # A lower bound of the database's position: this process's commits only.
        self.indexed_seq = 0
        self.catch_up = CatchUp(self._batch, BATCH, "keyword_indexing_failed")

    async def _batch(self) -> int:
        """One batch; the rows it indexed.

        :raises MemoryServiceError: the commit failed (nothing was indexed).
        """
        position, count = await self._writer.write(index_batch)
        self.indexed_seq = max(self.indexed_seq, position)
        return int(count)

    async def through(self, position: int) -> None:
        """Return once every row at or below ``position`` (a committed position, such as a
        snapshot) is indexed.

        :raises MemoryServiceError: a commit failed; the search cannot be exact, so it fails.
        """
        # A batch short of BATCH has indexed everything committed before it began, which
        # includes ``position``: the loop ends even if the position was never a commit's.
        while self.indexed_seq < position and await self._batch() == BATCH:
            pass
