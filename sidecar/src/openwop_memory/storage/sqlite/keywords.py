"""Keyword indexing and token counting after the put's commit, exact at every snapshot
(SQLite).

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

**Token counts.** A put of short content (at most :data:`COUNT_LATER_MAX_CHARS`) stores
``tokens`` as :data:`~..base.UNCOUNTED` and the same batch that indexes its row counts it
(the estimate was an eighth of the event loop's CPU per 1 KiB put). Until then every read
counts it from the content, in Python (``counted``) or in SQL (:data:`TOKENS_SQL`), so a
budget keeps or drops the same entries whenever it runs: the count is a pure function of the
stored content, like the terms. Longer content is counted at its put, as before: counting it
later would rewrite its row's overflow pages, a second copy of the content in the WAL.
"""

from __future__ import annotations

from ...token_count import estimate_tokens
from ..base import UNCOUNTED
from ..catch_up import CatchUp
from .tags import index_tags
from .writer import GroupCommit, Txn

BATCH = 32
"""Rows indexed in one transaction: under a millisecond of FTS5 work for entries of 30
words (p50 0.7 ms, max 10 ms at 20,000 entries), so a put queued behind it waits little."""

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


def index_batch(txn: Txn) -> tuple[int, int]:
    """In ``txn``: index up to :data:`BATCH` rows above the recorded position and at or
    below ``txn.start_seq``, count the tokens of those stored uncounted, and record the new
    position. Returns the position and how many rows were indexed; fewer than :data:`BATCH`
    means every row up to ``txn.start_seq`` is indexed. Another sidecar of the file may have
    moved the position already: it is read in the transaction, never assumed."""
    (done,) = txn.conn.execute(_PROGRESS).fetchone()
    top = txn.start_seq
    if done >= top:
        return int(done), 0
    rows = txn.conn.execute(_ROWS, (done, top, BATCH)).fetchall()
    position = int(rows[-1][0]) if len(rows) == BATCH else top
    txn.conn.executemany(_INSERT, [row[:3] for row in rows])
    uncounted = [(estimate_tokens(content), seq) for seq, _, content, n in rows if n < 0]
    if uncounted:
        txn.conn.executemany(_COUNT, uncounted)
    txn.conn.execute(_ADVANCE, (position,))
    return position, len(rows)


class KeywordIndexer:
    """Moves ``fts_progress`` forward (the tags' position too) after puts
    (:attr:`catch_up`), and on demand before a search."""

    def __init__(self, writer: GroupCommit) -> None:
        self._writer = writer
        # A lower bound of the database's position: this process's commits only.
        self.indexed_seq = 0
        # The tags' position as this process's last step left it, and whether that step
        # stopped at its limit.
        self._tagged_seq = 0
        self._more_tags = True
        self.catch_up = CatchUp(self._batch, BATCH, "keyword_indexing_failed")

    async def _batch(self) -> int:
        """A step of the tags (``tags.py``), then a batch of keywords, each its own
        transaction (a put waits behind one of them, not both); :data:`BATCH` while either
        was full, else the rows whose keywords it indexed. A search's catch-up takes the
        tags' steps too: they are eight times longer, so the tags are done before the
        keywords, and no backlog of them is left to compete with the searches after it.

        :raises MemoryServiceError: a commit failed.
        """
        # Skipped while the last step left the tags caught up beyond the keywords: an
        # empty step is a transaction all the same (a catch-up of 100,000 entries paid
        # about half a second for them). Skipping only leaves rows to the reads' cover.
        if self._more_tags or self._tagged_seq <= self.indexed_seq:
            self._tagged_seq, self._more_tags = await self._writer.write(index_tags)
        position, count = await self._writer.write(index_batch)
        self.indexed_seq = max(self.indexed_seq, position)
        return BATCH if self._more_tags else int(count)

    async def through(self, position: int) -> None:
        """Return once every row at or below ``position`` (a committed position, such as a
        snapshot) is indexed.

        :raises MemoryServiceError: a commit failed; the search cannot be exact, so it fails.
        """
        # A batch short of BATCH has indexed everything committed before it began, which
        # includes ``position``: the loop ends even if the position was never a commit's.
        while self.indexed_seq < position and await self._batch() == BATCH:
            pass
