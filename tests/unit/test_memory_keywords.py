"""The in-memory backend's keyword terms are SQLite's: its Python tokenizer and Porter
stemmer (``storage/memory/keywords.py``, ``porter.py``) give the terms FTS5's ``porter
unicode61 remove_diacritics 2`` tokenizer puts in the index, read back through ``fts5vocab``,
for every word of this repository's documentation and code and for the cases that differ
most (diacritics, case, underscores, scripts other than Latin)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest
from openwop_memory.storage.memory.keywords import idf_scores, matches, stems
from openwop_memory.storage.memory.porter import stem

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]

TRICKY = [
    "Deployments RUNNING smoothly",
    "caf\u00e9 cafe\u0301 na\u00efve Z\u00fcrich \u00f8re stra\u00dfe \u1e9e",
    "\u0130stanbul \u0142\u00f3d\u017a foo_bar x\u00b2 \u00bd \u2163",
    "\u0394\u03b5\u03bb\u03c4\u03b1 \u041c\u043e\u0441\u043a\u0432\u0430",
    "\u65e5\u672c\u8a9e \u00c6sir \u0153uvre \ufb01ne abc\u0301def ponies caresses feed agreed",
    "NUL\x00inside it's don't e-mail 3.14 v2 ab abs sses ies generalizations oscillators",
    "hopping hoping filing failing sized tanned falling hissing fizzed conflated troubled",
    "happy sky relational conditional rational valenci hesitanci digitizer conformabli",
    "radicalli differentli vileli analogousli vietnamization predication operator feudalism",
    "decisiveness hopefulness callousness formaliti sensitiviti sensibiliti triplicate",
    "formative formalize electriciti electrical hopeful goodness revival allowance inference",
    "airliner gyroscopic adjustable defensible irritant replacement adjustment dependent",
    "adoption homologou communism activate angulariti homologous effective bowdlerize",
    "probate rate cease controll roll",
]


def _fts5_terms(texts: list[str]) -> list[tuple[str, ...]]:
    """Each text's terms, as FTS5 indexes them with SQLite's tokenizer."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute(
            "CREATE VIRTUAL TABLE f USING fts5"
            " (content, tokenize = 'porter unicode61 remove_diacritics 2')"
        )
        db.execute("CREATE VIRTUAL TABLE v USING fts5vocab (f, 'instance')")
        db.executemany(
            "INSERT INTO f (rowid, content) VALUES (?, ?)",
            [(n, text) for n, text in enumerate(texts, start=1)],
        )
        found: dict[int, list[tuple[int, str]]] = {}
        for doc, term, offset in db.execute("SELECT doc, term, offset FROM v"):
            found.setdefault(doc, []).append((offset, term))
    finally:
        db.close()
    return [tuple(t for _, t in sorted(found.get(n, []))) for n in range(1, len(texts) + 1)]


def test_the_terms_of_tricky_text_are_fts5s() -> None:
    assert [stems(text) for text in TRICKY] == _fts5_terms(TRICKY)


def test_the_terms_of_every_word_of_the_repository_are_fts5s() -> None:
    words: set[str] = set()
    for pattern in ("docs/*.md", "*.md", "sidecar/src/**/*.py"):
        for path in ROOT.glob(pattern):
            words.update(path.read_text(errors="replace").split())
    # Emoji modifiers are symbols in Python's Unicode tables, letters in SQLite's older ones.
    ordered = sorted(w for w in words if not any("\U0001f3fb" <= c <= "\U0001f3ff" for c in w))
    mine = [stems(word) for word in ordered]
    differ = [
        (w, m, f) for w, m, f in zip(ordered, mine, _fts5_terms(ordered), strict=True) if m != f
    ]
    assert len(ordered) > 5000
    assert differ == []


def test_short_and_long_tokens_are_not_stemmed() -> None:
    assert stem("is") == "is"
    assert stem("running") == "run"
    long = "running" * 10  # 70 bytes: past FTS5's 64
    assert stem(long) == long


def test_a_term_of_several_tokens_matches_them_in_a_row() -> None:
    entry = stems("call foo bar now")
    assert matches(entry, frozenset(entry), stems("foo_bar"))
    assert not matches(entry, frozenset(entry), stems("bar_foo"))
    assert not matches(entry, frozenset(entry), ())


def test_scores_are_bm25_idf_sums_rounded() -> None:
    # Three entries match: "rare" in one, "common" in all three.
    scores = idf_scores(3, [1, 3], [[0, 1], [1], [1]])
    assert scores[0] > scores[1] == scores[2] > 0
    assert scores[1] == round(math.log(1 + 0.5 / 3.5), 9)
