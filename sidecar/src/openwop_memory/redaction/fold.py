"""The folded view of a text that the redactor searches: its *skeleton*.

The skeleton keeps only letters and digits, folded so that the usual disguises vanish:
compatibility forms (NFKD: fullwidth letters, ligatures), combining marks, case, and common
look-alike letters (Cyrillic and Greek homoglyphs, ``0``/``o``, ``1``/``l``/``i``) all fold
to one character; everything else (spaces, punctuation, newlines, invisible and format
characters) is dropped. A secret's skeleton found in a text's skeleton therefore covers the
secret written with separators between its characters, in another case, with zero-width
characters inside it, and so on.

:func:`skeleton` promises a skeleton plus a way back: :meth:`Skeleton.origin` maps a
position of the skeleton to the index of the original character it came from.
"""

# ruff: noqa: RUF001

from __future__ import annotations

import itertools
import re
import unicodedata
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple

# Look-alikes, keyed by their case-folded form so that a case change cannot get past them
# (ambiguous letters are this table's purpose, hence the RUF001 exemption above). Where the
# capital and small letter look like different Latin letters, the capital's wins.
_CONFUSABLES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p",
    "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "ԁ": "d",
    "ԛ": "q", "ԝ": "w", "ɡ": "g", "ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ζ": "z", "η": "h", "ι": "i", "κ": "k", "μ": "m", "ν": "n",
    "ο": "o", "ρ": "p", "τ": "t", "υ": "y", "χ": "x", "ω": "w",
    # Latin
    "ı": "i", "ℓ": "l", "ǀ": "l",
}  # fmt: skip

# Within ASCII: digits and letters that stand in for each other in a disguise.
_ASCII_LOOKALIKES = {"0": "o", "1": "l", "i": "l"}


def _fold_ascii(ch: str) -> str:
    if not ch.isalnum():
        return ""
    low = ch.lower()
    return _ASCII_LOOKALIKES.get(low, low)


def _fold_char(ch: str) -> str:
    """What one character contributes to a skeleton (possibly several characters, or none)."""
    if ch.isascii():
        return _fold_ascii(ch)
    out = []
    for part in unicodedata.normalize("NFKD", ch):
        if unicodedata.combining(part) or not part.isalnum():
            continue
        for c in part.casefold():
            c = _CONFUSABLES.get(c, c)
            out.append(_fold_ascii(c) if c.isascii() else c)
    return "".join(out)


class _FoldTable(dict[int, str]):
    """``str.translate`` table that folds every code point, computed on first sight."""

    def __missing__(self, codepoint: int) -> str:
        folded = _fold_char(chr(codepoint))
        self[codepoint] = folded
        return folded


class _WidthTable(dict[int, str]):
    """``str.translate`` table to ``chr(w)``, ``w`` the skeleton characters a code point
    yields (for the way back; a fold is never longer than a few characters)."""

    def __missing__(self, codepoint: int) -> str:
        width = chr(len(_FOLD_TABLE[codepoint]))
        self[codepoint] = width
        return width


_FOLD_TABLE = _FoldTable()
_WIDTH_TABLE = _WidthTable()
_ASCII_TABLE = bytes((_fold_ascii(chr(b)) or "\0").encode()[0] for b in range(128)) + bytes(
    range(128, 256)
)
_ASCII_DELETE = bytes(b for b in range(128) if not _fold_ascii(chr(b)))
_ASCII_WIDTH_BYTES = bytes(1 if _fold_ascii(chr(b)) else 0 for b in range(256))


def fold(text: str) -> str:
    """The skeleton of ``text`` without the way back (used for needles)."""
    if text.isascii():
        return text.encode().translate(_ASCII_TABLE, _ASCII_DELETE).decode()
    return text.translate(_FOLD_TABLE)


@dataclass
class Skeleton:
    """A text's skeleton: ASCII ``bytes`` when it folded to ASCII, else a ``str``.

    The text is kept as segments, alternately ASCII and not, each with where it starts in
    the skeleton and in the text, so that :meth:`origin` only measures the segment a
    position falls in.
    """

    text: str
    data: bytes | str
    _skel_starts: list[int] = field(repr=False)
    _text_starts: list[int] = field(repr=False)
    _ends: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def origin(self, position: int) -> int:
        """Index in ``text`` of the character that produced skeleton ``position``."""
        # The last segment starting at or before it (segments folding to nothing come first).
        i = bisect_right(self._skel_starts, position) - 1
        ends = self._ends.get(i)
        start = self._text_starts[i]
        if ends is None:
            stop = self._text_starts[i + 1] if i + 1 < len(self._text_starts) else len(self.text)
            segment = self.text[start:stop]
            if segment.isascii():
                widths = segment.encode().translate(_ASCII_WIDTH_BYTES)
            else:
                widths = segment.translate(_WIDTH_TABLE).encode("latin-1")
            ends = self._ends[i] = list(itertools.accumulate(widths))
        return start + bisect_right(ends, position - self._skel_starts[i])


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# Past this many non-ASCII runs per character, one pass per character beats segments.
_SEGMENTS_PER_CHAR = 1 / 256


def skeleton_bytes(text: str) -> bytes:
    """The skeleton of ``text`` as UTF-8 bytes, without the way back: always equal to
    ``skeleton(text).data`` encoded (a skeleton never holds a surrogate, so this never
    raises). What a search that only asks whether anything matches needs."""
    if text.isascii():
        return _ascii_skeleton(text)
    return text.translate(_FOLD_TABLE).encode()


def _ascii_skeleton(text: str) -> bytes:
    return text.encode().translate(_ASCII_TABLE, _ASCII_DELETE)


def skeleton(text: str) -> Skeleton:
    """The skeleton of ``text``. ASCII stretches fold on the bytes fast path; the rest one
    character at a time."""
    if text.isascii():
        return Skeleton(text, _ascii_skeleton(text), [0], [0])
    pieces: list[str] = []
    skel_starts: list[int] = []
    text_starts: list[int] = []
    length = at = 0

    def add(start: int, folded: str) -> None:
        nonlocal length
        skel_starts.append(length)
        text_starts.append(start)
        pieces.append(folded)
        length += len(folded)

    runs = list(_NON_ASCII.finditer(text))
    if len(runs) > len(text) * _SEGMENTS_PER_CHAR:
        return Skeleton(text, text.translate(_FOLD_TABLE), [0], [0])
    for m in runs:
        if m.start() > at:
            add(at, text[at : m.start()].encode().translate(_ASCII_TABLE, _ASCII_DELETE).decode())
        add(m.start(), m.group().translate(_FOLD_TABLE))
        at = m.end()
    if at < len(text):
        add(at, text[at:].encode().translate(_ASCII_TABLE, _ASCII_DELETE).decode())
    joined = "".join(pieces)
    return Skeleton(text, joined.encode() if joined.isascii() else joined, skel_starts, text_starts)


class Folded(NamedTuple):
    """A value's skeleton and, per skeleton character, the characters of the value around it
    that fold to nothing (its punctuation), so a hit can take them in.

    Kept as the value plus where each skeleton character came from, in slope-one segments:
    a long key with a few dashes costs a few integers, not a list entry per character. A
    tuple of atoms and arrays, so the garbage collector soon stops walking it.
    """

    text: str
    source: str
    # Segment j: skeleton k >= seg_skel[j] came from source index seg_src[j] + k - seg_skel[j].
    seg_skel: array[int]
    seg_src: array[int]

    def _src(self, k: int) -> int:
        j = bisect_right(self.seg_skel, k) - 1
        return self.seg_src[j] + k - self.seg_skel[j]

    def before(self, k: int) -> str:
        """What folds to nothing just before skeleton character ``k`` (``-1`` the last)."""
        k %= len(self.text)
        src = self._src(k)
        previous = self._src(k - 1) if k else -1
        return "" if previous == src else self.source[previous + 1 : src]

    def after(self, k: int) -> str:
        """... and just after it."""
        k %= len(self.text)
        src = self._src(k)
        following = self._src(k + 1) if k + 1 < len(self.text) else len(self.source)
        return "" if following == src else self.source[src + 1 : following]


_ASCII_GAPS = re.compile(r"[^A-Za-z0-9]+")


def folded(value: str) -> Folded:
    """``value``'s :class:`Folded`; ASCII values (nearly all keys) on a fast path."""
    seg_skel = array("I")
    seg_src = array("I")
    if value.isascii():
        # An ASCII character folds to itself or to nothing, so only the gaps start segments.
        removed = 0
        if value[:1].isalnum():
            seg_skel.append(0)
            seg_src.append(0)
        for gap in _ASCII_GAPS.finditer(value):
            removed += gap.end() - gap.start()
            if gap.end() < len(value):
                seg_skel.append(gap.end() - removed)
                seg_src.append(gap.end())
        return Folded(fold(value), value, seg_skel, seg_src)
    chars: list[str] = []
    for src, ch in enumerate(value):
        piece = _FOLD_TABLE[ord(ch)]
        for c in piece:
            k = len(chars)
            if not seg_skel or seg_src[-1] + k - seg_skel[-1] != src:
                seg_skel.append(k)
                seg_src.append(src)
            chars.append(c)
    return Folded("".join(chars), value, seg_skel, seg_src)
