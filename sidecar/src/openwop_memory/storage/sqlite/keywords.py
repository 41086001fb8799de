"""Keyword indexing and token counting after the put's commit, exact at every snapshot
(SQLite).

A put's transaction writes the entry's row and not its terms (the full-text insert was most
of a small put's cost). ``fts_progress.indexed_seq`` is the commit position up to which
every row is in ``entries_fts``; :class:`KeywordIndexer` moves it forward shortly after puts
commit, on the writer thread, a chunk of rows at a time and as many chunks a transaction as
its bound allows while no write waits (:func:`index_batch`), paced so that a backlog never
holds the writer for long. Whatever it has not reached
yet, a search indexes first (:meth:`KeywordIndexer.through`): every row a snapshot can see
is then in the index, and the index holds the same terms for them whenever and wherever the
search runs (the terms are a pure function of the stored, redacted content), so a ranking
at a snapshot is the same on the first execution, on a replay and on another sidecar of the
file. Nothing depends on the background keeping up; it only spares searches the work.

Commit order makes a position enough: sequence numbers are reserved in commit order by
the one writer at a time, so no row at or below a committed position can appear later.
A transaction indexes rows at or below the position it began at only (``Txn.start_seq``):
the rows its own group's puts add are inserted at its end, after the index op has run.

**Token counts.** A put of short content (at most :data:`COUNT_LATER_MAX_CHARS`) stores
``tokens`` as :data:`~..base.UNCOUNTED` and the same batch that indexes its row counts it
(the estimate was an eighth of the event loop's CPU per 1 KiB put). Until then every read
counts it from the content, in Python (``counted``) or in SQL (:data:`TOKENS_SQL`), so a
budget keeps or drops the same entries whenever it runs: the count is a pure function of the
stored content, like the terms. Longer content is counted at its put, as before: counting it
later would rewrite its row's overflow pages, a second copy of the content in the WAL.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ...token_count import estimate_tokens
from ..base import UNCOUNTED
from ..catch_up import CatchUp
from .writer import GroupCommit, Txn

CHUNK = 32
"""Rows read and indexed at a time: under a millisecond of FTS5 work for entries of 30 words
(p50 0.7 ms, max 10 ms at 20,000 entries), so a put that comes meanwhile waits little."""

BACKGROUND_ROWS = 256
"""Rows the background indexes in one transaction while no write waits for the writer.
FTS5 writes the terms of a transaction as one new segment and merges segments as they pile
up, so the rows a transaction holds set the cost of each (1 KiB of random words: 95 µs a
row 32 a transaction, 60 at 128, 46 at 512). Chunk by chunk, a put that comes meanwhile
still waits for one chunk only."""

SEARCH_ROWS = 1024
"""Rows a search's catch-up indexes in one transaction (it waits for all of them)."""

COUNT_LATER_MAX_CHARS = 2048
"""Content up to this long is counted after its put: as ASCII text its row stays on its
page (of 4 KiB), so writing the count rewrites that page alone."""

TOKEN_FUNCTION = "openwop_estimate_tokens"  # noqa: S105 - a name, not a password
"""The SQL function :data:`TOKENS_SQL` calls: :func:`estimate_tokens`, on reader connections."""

TOKENS_SQL = f"(CASE WHEN e.tokens >= 0 THEN e.tokens ELSE {TOKEN_FUNCTION}(e.content) END)"
"""SQL: the token count of the entry row ``e``, counted or not yet."""

_PROGRESS = "SELECT indexed_seq FROM fts_progress"
_ROWS = (
    "SELECT seq, scope_pk, content, tokens FROM entries WHERE seq > ? AND seq <= ?"
    " ORDER BY seq LIMIT ?"
)
_INSERT = "INSERT INTO entries_fts (rowid, scope_pk, content) VALUES (?, ?, ?)"
_COUNT = "UPDATE entries SET tokens = ? WHERE seq = ?"
_ADVANCE = "UPDATE fts_progress SET indexed_seq = ?"


def tokens_to_store(content: str) -> int:
    """What a put stores as ``tokens``: :data:`~..base.UNCOUNTED` for short content (counted
    by the indexing batch), else the count."""
    return UNCOUNTED if len(content) <= COUNT_LATER_MAX_CHARS else estimate_tokens(content)


def counted(tokens: int, content: str) -> int:
    """The token count of a row that stored ``tokens`` for ``content``."""
    return tokens if tokens >= 0 else estimate_tokens(content)


def index_batch(txn: Txn, most: int, writes_waiting: Callable[[], bool]) -> tuple[int, bool]:
    """In ``txn``: index the rows above the recorded position and at or below
    ``txn.start_seq``, :data:`CHUNK` at a time, count the tokens of those stored uncounted,
    and record the new position. Stops after the chunk that reaches ``most`` rows, or after
    any chunk once other ops share ``txn`` or ``writes_waiting()`` (they wait for it).

    Returns the position and whether rows may be left: False means every row up to
    ``txn.start_seq`` is indexed. Another sidecar of the file may have moved the position
    already: it is read in the transaction, never assumed."""
    conn = txn.conn
    (position,) = conn.execute(_PROGRESS).fetchone()
    top = txn.start_seq
    if position >= top:
        return int(position), False
    indexed = 0
    while True:
        rows = conn.execute(_ROWS, (position, top, CHUNK)).fetchall()
        conn.executemany(_INSERT, [row[:3] for row in rows])
        uncounted = [(estimate_tokens(content), seq) for seq, _, content, n in rows if n < 0]
        if uncounted:
            conn.executemany(_COUNT, uncounted)
        indexed += len(rows)
        if len(rows) < CHUNK:
            position, more = top, False
            break
        position = int(rows[-1][0])
        if indexed >= most or txn.ops > 1 or writes_waiting():
            more = True
            break
    conn.execute(_ADVANCE, (position,))
    return position, more


class KeywordIndexer:
    """Moves ``fts_progress`` forward after puts (:attr:`catch_up`), and on demand before
    a search."""

    def __init__(self, writer: GroupCommit) -> None:
        self._writer = writer
        # A lower bound of the database's position: this process's commits only.
        self.indexed_seq = 0
        self.catch_up = CatchUp(self._batch, "keyword_indexing_failed")

    async def _batch(self, most: int = BACKGROUND_ROWS) -> bool:
        """One transaction of up to ``most`` rows (see :func:`index_batch`); whether rows
        may be left.

        :raises MemoryServiceError: the commit failed (nothing was indexed).
        """
        writer = self._writer
        position, more = await writer.write(
            functools.partial(index_batch, most=most, writes_waiting=writer.writes_waiting)
        )
        self.indexed_seq = max(self.indexed_seq, position)
        return bool(more)

    async def through(self, position: int) -> None:
        """Return once every row at or below ``position`` (a committed position, such as a
        snapshot) is indexed.

        :raises MemoryServiceError: a commit failed; the search cannot be exact, so it fails.
        """
        # A transaction that leaves no row has indexed everything committed before it
        # began, which includes ``position``: the loop ends even if the position was never
        # a commit's.
        while self.indexed_seq < position and await self._batch(SEARCH_ROWS):
            pass
