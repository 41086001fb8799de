"""The terms of text for keyword relevance: an entry's (:func:`index_terms`) and a query's
(:func:`query_terms`).

A placeholder with the seam's names (the recall work owns the real analysis): words of
letters, digits and underscores, lower-cased; a query drops English stop words.
"""

from __future__ import annotations

import re

# At most this many distinct terms of a query are looked up: each costs an index lookup,
# and a longer query adds noise rather than precision.
MAX_QUERY_TERMS = 32
# English stop words, never looked up: they match most entries (costly, and no help to the
# ranking). The Snowball list PostgreSQL's "english" configuration drops, so that both
# backends read a query alike.
STOP_WORDS = frozenset(
    [
        "i",
        "me",
        "my",
        "myself",
        "we",
        "our",
        "ours",
        "ourselves",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "her",
        "hers",
        "herself",
        "it",
        "its",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "what",
        "which",
        "who",
        "whom",
        "this",
        "that",
        "these",
        "those",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "a",
        "an",
        "the",
        "and",
        "but",
        "if",
        "or",
        "because",
        "as",
        "until",
        "while",
        "of",
        "at",
        "by",
        "for",
        "with",
        "about",
        "against",
        "between",
        "into",
        "through",
        "during",
        "before",
        "after",
        "above",
        "below",
        "to",
        "from",
        "up",
        "down",
        "in",
        "out",
        "on",
        "off",
        "over",
        "under",
        "again",
        "further",
        "then",
        "once",
        "here",
        "there",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "nor",
        "not",
        "only",
        "own",
        "same",
        "so",
        "than",
        "too",
        "very",
        "s",
        "t",
        "can",
        "will",
        "just",
        "don",
        "should",
        "now",
    ]
)
# Word characters of any script; an apostrophe or other punctuation ends a term, as it
# does for both full-text engines' tokenizers.
_TERM = re.compile(r"\w+")


def index_terms(text: str) -> list[str]:
    """The terms of an entry's content for the keyword index, in order, repeats kept (a
    term's count in the entry is its term frequency): every word, lower-cased."""
    return _TERM.findall(text.lower())


def query_terms(query: str) -> list[str]:
    """The distinct terms of a free-text query, lower-cased, in their first order, at most
    :data:`MAX_QUERY_TERMS`: words of letters, digits and underscores, less
    :data:`STOP_WORDS`. A backend looks each up as one word (stemmed as its engine stems),
    so no query syntax ever reaches it."""
    terms: list[str] = []
    seen: set[str] = set()
    for match in _TERM.finditer(query.lower()):
        term = match.group()
        if term not in seen and term not in STOP_WORDS:
            seen.add(term)
            terms.append(term)
            if len(terms) == MAX_QUERY_TERMS:
                break
    return terms
