"""How tokens are counted.

``tokenBudget`` is counted with :func:`estimate_tokens`, a documented
estimate rather than a tokenizer: a real tokenizer's vocabulary is megabytes to load and
the exact count differs between models anyway. The estimate is meant to be an upper bound
in practice: on English text it is never more than 10 % below ``cl100k_base`` or
``o200k_base`` (``tests/unit/test_token_estimate.py`` measures it against both, on the
paragraphs of Python's own reference documentation), and on English prose it sits on
average about a quarter above them. It counts:

- a word (a run of ASCII letters): 1, plus 1 for every whole 4 letters past its third,
  i.e. ``1 + max(0, len - 3) // 4``;
- a run of digits: 1 per 3 digits (tokenizers split numbers in threes);
- a run of other visible ASCII characters (punctuation): 1 per 2 characters;
- whitespace: a lone space is free (it joins the next word), a run of two or more
  whitespace characters 2, and every newline 1 more;
- every non-ASCII character: one less than its UTF-8 length in bytes (an accented letter
  1, most CJK characters 2, an emoji 3).

The rule is versioned by :data:`TOKEN_COUNTER`: a stored count (backends keep one per
entry, to skip entries over a budget in the database) is only ever compared with counts
of the same rule.
"""

from __future__ import annotations

from collections.abc import Callable

TOKEN_COUNTER = "openwop-memory-estimate-1"  # noqa: S105 - a name, not a password
"""The name ``host.capabilities`` gives the token count (``injectionBudget.tokenCounter``)."""

APPROXIMATED_TOKENIZER = "cl100k_base"
"""The tokenizer :func:`estimate_tokens` is measured against (and bounds, within 10 %)."""


# Counting runs in C: one translate per class of byte (the class kept, every other byte
# made a space), a split into runs, and each run's cost looked up by its length; a Python
# loop or a regular expression per word would cost several times more on every put.
def _keeping(kept: bytes) -> bytes:
    return bytes(b if b in kept else 0x20 for b in range(256))


_LETTERS = _keeping(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = _keeping(b"0123456789")
_SYMBOLS = _keeping(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
# Whitespace becomes "w" and everything else a space, so that the runs split out are the
# runs of whitespace.
_WHITESPACE = bytes(0x77 if b in b" \t\n\r\x0b\x0c" else 0x20 for b in range(256))
_TABLE_SIZE = 256  # longer runs are costed by the formula itself
_COSTS: list[tuple[bytes, Callable[[int], int]]] = [
    (_LETTERS, lambda n: 1 + max(0, n - 3) // 4),
    (_DIGITS, lambda n: (n + 2) // 3),
    (_SYMBOLS, lambda n: (n + 1) // 2),
    (_WHITESPACE, lambda n: 2 if n >= 2 else 0),
]
_BY_LENGTH = [(table, cost, [cost(n) for n in range(_TABLE_SIZE)]) for table, cost in _COSTS]


def estimate_tokens(text: str) -> int:
    """The estimated token count of ``text`` (see the module's docstring); 0 for ``""``."""
    data = text.encode("utf-8", "surrogatepass")
    # A newline costs 1 wherever it is (in a run of whitespace too, which errs high).
    count = data.count(b"\n") + len(data) - len(text)
    for table, cost, by_length in _BY_LENGTH:
        lengths = list(map(len, data.translate(table).split()))
        if lengths and max(lengths) >= _TABLE_SIZE:
            count += sum(map(cost, lengths))
        else:
            count += sum(map(by_length.__getitem__, lengths))
    return count
