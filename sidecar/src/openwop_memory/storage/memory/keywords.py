"""Keyword matching and scoring for the in-memory backend, after SQLite's FTS5 index.

SQLite indexes content with ``tokenize = 'porter unicode61 remove_diacritics 2'``
(``storage/sqlite/schema.py``) and looks each query term up as a quoted FTS5 string. This
module copies that in Python, as closely as is reasonable:

- **Tokens** (``unicode61``): runs of letters, digits and private-use characters; every
  other character separates tokens (an underscore too, so ``foo_bar`` is two tokens), but
  the combining diacritics FTS5 knows (:data:`_MARKS`) belong to the token they follow and
  are dropped. A token is case-folded, and a letter that is an ASCII letter plus such
  diacritics becomes that ASCII letter (``remove_diacritics 2``: ``é`` is ``e``, ``ø`` stays).
  Characters newer than SQLite's Unicode tables (or case pairs it lacks) may fold otherwise:
  a difference in rare scripts, not in what a search of ordinary text finds.
- **Stems** (``porter``): :func:`~.porter.stem` of each token.
- **Matching**: a term matches an entry whose stems hold the term's stems in a row (a term
  is one token but for underscores and the like, which make it a phrase, as in FTS5).

The score of :meth:`Storage.keyword_candidates` is computed from these matches by
:func:`idf_scores`, the same formula as SQLite's ``_SCORES``.
"""

from __future__ import annotations

import functools
import math
import unicodedata
from collections.abc import Sequence

from .porter import stem

# The combining marks FTS5's unicode61 treats as diacritics (token characters it drops),
# as SQLite 3.40 has them: U+0300-U+0331 but a few.
_MARKS = frozenset(
    chr(code)
    for first, last in (
        (0x300, 0x304),
        (0x306, 0x30C),
        (0x30F, 0x30F),
        (0x311, 0x311),
        (0x31B, 0x31B),
        (0x323, 0x328),
        (0x32D, 0x32E),
        (0x330, 0x331),
    )
    for code in range(first, last + 1)
)


@functools.lru_cache(maxsize=8192)
def _fold(char: str) -> str | None:
    """What ``char`` adds to the token it is in: its folded form, ``""`` for a diacritic
    (dropped), ``None`` for a separator."""
    if char < "\x80":
        return char.lower() if char.isalnum() else None
    if char in _MARKS:
        return ""
    category = unicodedata.category(char)
    if category[0] not in "LN" and category != "Co":
        return None
    folded = char.casefold()
    # A fold that expands (ß to ss) is one FTS5 does not make: it lowercases only.
    lower = folded if len(folded) == 1 else char.lower()
    out = []
    for c in lower:
        if c in _MARKS:
            continue
        parts = unicodedata.normalize("NFD", c)
        if len(parts) > 1 and parts[0].isascii() and all(m in _MARKS for m in parts[1:]):
            out.append(parts[0])
        else:
            out.append(c)
    return "".join(out)


def tokens(text: str) -> list[str]:
    """The folded tokens of ``text``, in order (before stemming)."""
    found: list[str] = []
    current: list[str] = []
    for char in text:
        folded = _fold(char)
        if folded is None:
            if current:
                found.append("".join(current))
                current = []
        else:
            current.append(folded)
    if current:
        found.append("".join(current))
    return [token for token in found if token]


def stems(text: str) -> tuple[str, ...]:
    """The stems of ``text``'s tokens, in order: what the index holds for an entry."""
    return tuple(stem(token) for token in tokens(text))


def matches(entry: tuple[str, ...], entry_set: frozenset[str], phrase: tuple[str, ...]) -> bool:
    """Whether an entry's stems (``entry``, and the same as a set) hold ``phrase`` (a
    term's stems) in a row. An empty phrase matches nothing."""
    if not phrase:
        return False
    if len(phrase) == 1:
        return phrase[0] in entry_set
    if not entry_set.issuperset(phrase):
        return False
    width = len(phrase)
    return any(entry[i : i + width] == phrase for i in range(len(entry) - width + 1))


def idf_scores(total: int, counts: Sequence[int], matched: Sequence[Sequence[int]]) -> list[float]:
    """Each entry's keyword score: the sum, over the terms it matches (``matched``: term
    numbers per entry), of ``ln(1 + (N - n + 0.5) / (n + 0.5))`` with ``N = total`` and
    ``n = counts[term]``, rounded to 9 decimals as SQLite and PostgreSQL round it (so that
    near-equal sums order alike on every backend).

    A rule copied from SQL (``_SCORES`` in ``storage/sqlite/backend.py``, and again in
    ``storage/postgresql/backend.py``): it depends on the matches alone, so it could be
    computed once above the backends from ``total`` and ``counts``.
    """
    weight = [math.log(1.0 + (total - n + 0.5) / (n + 0.5)) if n else 0.0 for n in counts]
    return [round(sum(weight[term] for term in terms), 9) for terms in matched]
