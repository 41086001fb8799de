"""What the SQL backends' keyword statements share: the end that picks the best matches.

A statement scores the visible matches of its terms in a CTE ``s (seq, score)``, beside
``n (total)`` and ``df (term, cnt)`` (the counts
:func:`~openwop_memory.retrieval.fusion.keyword_ceiling` needs). Its end keeps the best,
ties newest first. Without a token budget it takes the limit first and reads the rows of
those kept alone: each match's row was read once already, to check it against the
snapshot, and a second read of every match doubled the cost of a common word (SQLite, a
word in 9,500 entries of a 100,000-entry scope: 45 ms, 28 without). A budget must apply
before the limit, so with one every match's row is read again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """A backend's spelling of the parts that differ: ``counts`` (the total and the
    comma-joined term counts, from ``n`` and ``df``), the ``limit`` and ``budget``
    parameters, ``tokens`` (the token count of the entry row ``e``), ``same_scope`` (added
    to each join of ``e``, or ``""``) and ``unbudgeted`` (the condition on ``s`` without a
    budget, or ``""``)."""

    counts: str
    limit: str
    budget: str
    tokens: str
    same_scope: str = ""
    unbudgeted: str = ""


def best_matches(dialect: Dialect, columns: str, *, rows: bool, budget: bool) -> str:
    """What follows ``SELECT`` at the end of a keyword statement: each kept match's
    ``seq``, score and the counts, then its ``columns`` (of ``e``) if ``rows``; within the
    budget if ``budget``."""
    d = dialect
    read = f", {columns}" if rows else ""
    if budget:
        return (
            f"e.seq, s.score, {d.counts}{read} FROM s JOIN entries e ON e.seq = s.seq"
            f"{d.same_scope} WHERE {d.tokens} <= {d.budget}"
            f" ORDER BY s.score DESC, e.seq DESC LIMIT {d.limit}"
        )
    where = f" WHERE {d.unbudgeted}" if d.unbudgeted else ""
    best = f"SELECT seq, score FROM s{where} ORDER BY score DESC, seq DESC LIMIT {d.limit}"
    joined = f" JOIN entries e ON e.seq = h.seq{d.same_scope}" if rows else ""
    return (
        f"h.seq, h.score, {d.counts}{read} FROM ({best}) h{joined}"
        " ORDER BY h.score DESC, h.seq DESC"
    )
