"""The tag index, written after the put's commit and exact at every snapshot (SQLite).

``entry_tags`` (scope, tag, seq) is how a list by tag finds a scope's tagged entries without
reading the others. Its rows were the dearest part of a tagged put's transaction: each tag
lands on its own leaf page, so a group commit of puts with a few distinct tags dirtied a
page per tag (7-9 µs of the event loop's CPU per put with two tags, 32 clients). A put now writes
the entry's row alone; its ``tags`` column already holds the tags, and
``fts_progress.tagged_seq`` is the commit position up to which every row's tags are in
``entry_tags``. The keyword indexer (``keywords.py``) moves it forward by up to :data:`BATCH`
rows, eight times its own step, in a transaction of its own before each of its batches (a
put waits behind one short transaction, not the two together), and goes on while either
step is full.

Reads never wait for it. A row above the position is tested by its ``tags`` column
(:data:`HAS_TAG_SQL` tests every row so); a list by tag reads the rows above the position
through the scope's index and the rows at or below it through ``entry_tags``
(:func:`tagged_union`). Either way a snapshot shows the same entries whenever it is read.
A write that must find every row with a tag (``forget``) brings the position up to its own
transaction's start first (:func:`index_tags`).
"""

from __future__ import annotations

from .writer import Txn

BATCH = 256
"""Rows whose tags one transaction indexes: 0.9-1.2 ms for two tags a row at 60,000
entries (about the time of a keyword batch), so a put queued behind it waits little."""

_POSITION = "SELECT tagged_seq FROM fts_progress"
POSITION_SQL = f"({_POSITION})"
"""SQL: the position at or below which every row's tags are in ``entry_tags``."""

HAS_TAG_SQL = "EXISTS (SELECT 1 FROM json_each(e.tags) WHERE value = :tag)"
"""SQL: whether the entry row ``e`` has the tag ``:tag``. The row is read anyway, and its
column is exact whether or not it is indexed yet."""

_NEXT = "SELECT seq FROM entries WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT 1 OFFSET ?"
_INSERT = (
    "INSERT OR IGNORE INTO entry_tags (scope_pk, tag, seq)"
    " SELECT e.scope_pk, j.value, e.seq FROM entries e, json_each(e.tags) j"
    " WHERE e.seq > ? AND e.seq <= ?"
)
_ADVANCE = "UPDATE fts_progress SET tagged_seq = ?"


def index_tags(txn: Txn, limit: int | None = BATCH) -> tuple[int, bool]:
    """In ``txn``: put the tags of up to ``limit`` rows (``None``: every row) above the
    recorded position and at or below ``txn.start_seq`` into ``entry_tags``, and record the
    new position. Returns it, and whether the limit stopped it short of ``txn.start_seq``.
    ``OR IGNORE``: a row's tags may be there already (an import writes them at its insert,
    and a database made before version 12 did at put). Another sidecar of the file may have
    moved the position: it is read in the transaction, never assumed."""
    (done,) = txn.conn.execute(_POSITION).fetchone()
    top = txn.start_seq
    if done >= top:
        return int(done), False
    position = top
    if limit is not None:
        row = txn.conn.execute(_NEXT, (done, top, limit - 1)).fetchone()
        if row is not None:
            position = int(row[0])
    txn.conn.execute(_INSERT, (done, position))
    txn.conn.execute(_ADVANCE, (position,))
    return position, position < top


def tagged_union(columns: str, scope_pk: str, conditions: str, top: str = ":snap") -> str:
    """SQL: the seq and ``columns`` of the scope's entries ``e`` that have ``:tag``, seq at
    or below ``top`` (an SQL expression; it bounds both arms' index ranges), meeting
    ``conditions`` (each starting with `` AND``), as a compound of two arms: the rows above
    the tag index's position by their column, the rest through ``entry_tags``. Each arm
    yields its rows in the order of its index, so ``ORDER BY 1`` over the compound merges
    the two lazily: a ``LIMIT`` reads no more of either than it needs (the second arm leads
    with ``t.seq``, or the planner would sort it)."""
    return (
        f"SELECT e.seq, {columns} FROM entries e WHERE e.scope_pk = {scope_pk}"
        f" AND e.seq > {POSITION_SQL} AND e.seq <= {top}"
        f" AND {HAS_TAG_SQL}{conditions}"
        " UNION ALL "
        f"SELECT t.seq, {columns} FROM entry_tags t JOIN entries e ON e.seq = t.seq"
        f" WHERE t.scope_pk = {scope_pk} AND t.tag = :tag"
        f" AND t.seq <= min({top}, {POSITION_SQL}){conditions}"
    )
