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


# Counting runs in C: one translate per class of byte (the class marked, every other byte
# made a space), then either a split into runs, each run's cost looked up by its length,
# or, where a split would make an object per word, counts of patterns: a 1 KiB put spent
# 30 µs here with four splits, a quarter of its event-loop time, and 15 µs with this mix.
# A Python loop or a regular expression per word would cost several times more.
def _keeping(kept: bytes) -> bytes:
    return bytes(b if b in kept else 0x20 for b in range(256))


def _marking(kept: bytes) -> bytes:
    return bytes(0x78 if b in kept else 0x20 for b in range(256))  # 0x78: "x"


_LETTER_BYTES = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_WHITESPACE_BYTES = b" \t\n\r\x0b\x0c"
_LETTERS = _marking(_LETTER_BYTES)
_WHITESPACE = _marking(_WHITESPACE_BYTES)
# Before the text, so that every run has a space before it in every class's marking (a
# non-ASCII byte is in no class).
_LEAD = b"\x80"
_TABLE_SIZE = 256  # longer runs are costed by the formula itself
# Digits and punctuation come in few runs: split, each run looked up by its length.
_SPLIT: list[tuple[bytes, Callable[[int], int]]] = [
    (_keeping(b"0123456789"), lambda n: (n + 2) // 3),
    (_keeping(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), lambda n: (n + 1) // 2),
]
_BY_LENGTH = [(table, cost, [cost(n) for n in range(_TABLE_SIZE)]) for table, cost in _SPLIT]


def estimate_tokens(text: str) -> int:
    """The estimated token count of ``text`` (see the module's docstring); 0 for ``""``."""
    data = text.encode("utf-8", "surrogatepass")
    # A newline costs 1 wherever it is (in a run of whitespace too, which errs high).
    count = data.count(b"\n") + len(data) - len(text)
    led = _LEAD + data
    # Letters: a word of n costs 1 + max(0, n - 3) // 4. Every word starts at " x", and
    # with its first 3 letters dropped, "xxxx" occurs max(0, n - 3) // 4 times in it
    # (matches never overlap, nor span words).
    marked = led.translate(_LETTERS)
    count += marked.count(b" x") + marked.replace(b" xxx", b" ").count(b"xxxx")
    for table, cost, by_length in _BY_LENGTH:
        runs = data.translate(table).split()
        try:
            count += sum(map(by_length.__getitem__, map(len, runs)))
        except IndexError:  # a run of _TABLE_SIZE or more
            count += sum(map(cost, map(len, runs)))
    # Whitespace: 2 for a run of two or more, a lone space (or tab...) nothing.
    count += 2 * led.translate(_WHITESPACE).count(b" xx")
    return count
