"""The reads of the in-memory backend over a :class:`~.database.Database`: which rows a list
considers, the keyword candidates, and the snapshot of a run as of a time.

Pure functions of the database's state, synchronous: each read is one step of the event
loop, so it sees one consistent state, as a read transaction would.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from ..base import EntryRow, KeywordCandidates, ListFilter, Scope, as_of_position
from .database import Database, Row
from .keywords import idf_scores, matches, stems


def kept_by(where: ListFilter | None, row: Row) -> bool:
    """Whether ``row`` meets ``where`` (SQLite's ``_where_sql``)."""
    if where is None:
        return True
    tags = row.tag_set
    if where.tags_any and tags.isdisjoint(where.tags_any):
        return False
    if where.tags_all and not tags.issuperset(where.tags_all):
        return False
    created = row.entry.created_us
    if where.created_after_us is not None and created <= where.created_after_us:
        return False
    return where.created_before_us is None or created < where.created_before_us


def considered(
    row: Row, snapshot: int, now_us: int, tag: str | None, where: ListFilter | None
) -> bool:
    """Whether a list at ``snapshot`` and ``now_us`` considers ``row``: visible, with
    ``tag`` when given, kept by ``where`` (the token bound is the caller's)."""
    return (
        row.visible(snapshot, now_us)
        and (tag is None or tag in row.tag_set)
        and kept_by(where, row)
    )


def newest_first(
    database: Database,
    scope: Scope,
    snapshot: int,
    now_us: int,
    tag: str | None,
    where: ListFilter | None,
    *,
    max_tokens: int | None = None,
    before: int | None = None,
) -> Iterator[Row]:
    """The rows a list of ``scope`` considers, newest first (``seq`` descending), those
    of at most ``max_tokens`` tokens and below position ``before`` when given."""
    rows = database.scopes.get(scope)
    if not rows:
        return
    for row in reversed(rows.values()):
        if row.seq > snapshot or (before is not None and row.seq >= before):
            continue
        if max_tokens is not None and row.entry.tokens > max_tokens:
            continue
        if considered(row, snapshot, now_us, tag, where):
            yield row


def keyword_candidates(
    database: Database,
    scope: Scope,
    snapshot: int,
    now_us: int,
    terms: Sequence[str],
    limit: int,
    tag: str | None,
    max_tokens: int | None,
    where: ListFilter | None,
) -> KeywordCandidates:
    """See :meth:`Storage.keyword_candidates`: the rows considered that match a term,
    scored by :func:`~.keywords.idf_scores` over the matches counted before ``max_tokens``
    applies (as SQLite counts them), best first, ties newest first.

    A rule copied from SQL: when no hit is left (none matched, or ``max_tokens`` left none
    out of those that did), the answer carries no counts, as SQLite's, whose counts ride on
    the hit rows, has none to give.
    """
    phrases = [stems(term) for term in terms]
    found: list[tuple[Row, list[int]]] = []
    counts = [0] * len(phrases)
    for row in newest_first(database, scope, snapshot, now_us, tag, where):
        ordered, as_set = row.indexed()
        hit = [n for n, phrase in enumerate(phrases) if matches(ordered, as_set, phrase)]
        if hit:
            found.append((row, hit))
            for n in hit:
                counts[n] += 1
    scores = idf_scores(len(found), counts, [hit for _, hit in found])
    ranked = [
        (score, row)
        for score, (row, _) in zip(scores, found, strict=True)
        if max_tokens is None or row.entry.tokens <= max_tokens
    ]
    if not ranked:
        return KeywordCandidates([])
    # ``found`` is newest first and the sort is stable: equal scores stay newest first.
    ranked.sort(key=lambda scored: -scored[0])
    best = ranked[:limit]
    hits = [(row.seq, score) for score, row in best]
    rows: dict[int, EntryRow] = {row.seq: row.entry for _, row in best}
    return KeywordCandidates(hits, len(found), tuple(n for n in counts if n), rows)


def as_of_seq(database: Database, as_of_us: int) -> int:
    """The snapshot of a run begun at ``as_of_us`` (before the clock), from the change
    feed's write positions (:func:`~openwop_memory.storage.base.as_of_position`). The
    feed is in commit order and its times never go back, so its records up to ``as_of_us``
    are a prefix of it."""
    writes = [c for c in database.changes if c.seq is not None]
    end = bisect.bisect_right(writes, as_of_us, key=lambda c: c.at_us)
    at_or_before = max((c.seq for c in writes[:end] if c.seq is not None), default=None)
    first_after = writes[0].seq if at_or_before is None and writes else None
    return as_of_position(at_or_before=at_or_before, first_after=first_after, clock=database.seq)
