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
import unicodedata
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


class _FoldWidth(dict[str, int]):
    """How many skeleton characters each character yields (for the way back)."""

    def __missing__(self, ch: str) -> int:
        width = len(_FOLD_TABLE[ord(ch)])
        self[ch] = width
        return width


_FOLD_TABLE = _FoldTable()
_FOLD_WIDTH = _FoldWidth()
_ASCII_TABLE = bytes((_fold_ascii(chr(b)) or "\0").encode()[0] for b in range(128)) + bytes(
    range(128, 256)
)
_ASCII_DELETE = bytes(b for b in range(128) if not _fold_ascii(chr(b)))
_ASCII_WIDTH = [1 if _fold_ascii(chr(b)) else 0 for b in range(256)]


def fold(text: str) -> str:
    """The skeleton of ``text`` without the way back (used for needles)."""
    if text.isascii():
        return text.encode().translate(_ASCII_TABLE, _ASCII_DELETE).decode()
    return text.translate(_FOLD_TABLE)


@dataclass
class Skeleton:
    """A text's skeleton. ``ascii`` says whether ``data`` is ASCII ``bytes`` or a ``str``."""

    text: str
    data: bytes | str
    _ends: list[int] | None = field(default=None, repr=False)

    def origin(self, position: int) -> int:
        """Index in ``text`` of the character that produced skeleton ``position``."""
        if self._ends is None:
            # Built only when something was found, which is rare; one C-level pass.
            if isinstance(self.data, bytes):
                widths = map(_ASCII_WIDTH.__getitem__, self.text.encode())
            else:
                widths = map(_FOLD_WIDTH.__getitem__, self.text)
            self._ends = list(itertools.accumulate(widths))
        return bisect_right(self._ends, position)


def skeleton(text: str) -> Skeleton:
    """The skeleton of ``text``: ASCII bytes on the fast path, else a ``str``."""
    if text.isascii():
        return Skeleton(text, text.encode().translate(_ASCII_TABLE, _ASCII_DELETE))
    return Skeleton(text, text.translate(_FOLD_TABLE))


class Folded(NamedTuple):
    """A value's skeleton and, per skeleton character, the characters of the value around it
    that fold to nothing (its punctuation), so a hit can take them in."""

    text: str
    before: list[str]  # what folds to nothing just before skeleton character k
    after: list[str]  # ... and just after it


def folded(value: str) -> Folded:
    chars: list[str] = []
    before: list[str] = []
    after: list[str] = []
    gap = ""
    for ch in value:
        piece = fold(ch)
        if not piece:
            gap += ch
            if after:
                after[-1] += ch
            continue
        for i, c in enumerate(piece):
            chars.append(c)
            before.append(gap if i == 0 else "")
            after.append("")
        gap = ""
    return Folded("".join(chars), before, after)
