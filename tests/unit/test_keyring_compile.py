"""The keyring compiles quickly and compactly, and finds exactly what it found before.

A keyring of 256 secrets of 4,096 characters took 3.6 s and ~64 MiB of Python objects, most
of it ``folded()`` walking every value one character at a time (three times per value) and
keeping two list entries per character. The compact form must answer the same questions.
"""

from __future__ import annotations

import base64
import random
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openwop_memory.redaction import Keyring, redact_entry
from openwop_memory.redaction import keyring as keyring_module
from openwop_memory.redaction.fold import fold, folded

# In process: the keyring's compiler, which no backend reaches.
pytestmark = pytest.mark.backend_independent

# Letters, digits, punctuation, spaces and a few characters that fold to several or to none.
_CHARS = st.sampled_from([*"aZ09-_./ +=:", "ß", "ﬁ", "é", "\u200b", "Ⅻ", "\uff21", "\u0301"])


def _reference(value: str) -> tuple[str, list[str], list[str]]:
    """The original per-character ``folded()``: the contract the compact form keeps."""
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
    return "".join(chars), before, after


@given(st.lists(_CHARS, max_size=40).map("".join))
def test_folded_matches_the_per_character_reference(value: str) -> None:
    text, before, after = _reference(value)
    compact = folded(value)
    assert compact.text == text
    assert [compact.before(k) for k in range(len(text))] == before
    assert [compact.after(k) for k in range(len(text))] == after
    if text:
        assert (compact.before(-1), compact.after(-1)) == (before[-1], after[-1])


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=60))
def test_folded_ascii_fast_path_matches_the_reference(value: str) -> None:
    text, before, after = _reference(value)
    compact = folded(value)
    assert compact.text == text
    assert [compact.before(k) for k in range(len(text))] == before
    assert [compact.after(k) for k in range(len(text))] == after


def _texts(values: list[str]) -> list[str]:
    """Texts holding the values plainly, in part, disguised and encoded, and none at all."""
    a, b, c = sorted(values)[0], values[len(values) // 2], values[-1]
    return [
        f"plain {a} and {c}.",
        f"part of one: {b[5:40]} end",
        f"reversed {a[::-1]} and spaced {' '.join(c[:30])}",
        f"base64 {base64.b64encode(b.encode()).decode()} hex {c.encode().hex()}",
        "nothing secret here at all, just prose " * 20,
        f"{a}{b}{c}",
        # The tail of a value before the whole of it: the tail's windows may sit in a later
        # automaton than the head's, and must still be read in text order.
        f"tail {a[200:]} then whole {a}",
    ]


@pytest.mark.parametrize("chunk_bytes", [400, keyring_module._CHUNK_BYTES])
def test_a_keyring_built_in_chunks_finds_what_one_automaton_finds(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    """A hundred 300-character keys need ~79 KiB of fragment keys: two automata or more
    (with 400-byte chunks, one value's keys span several)."""
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits
    values = ["".join(rng.choice(alphabet) for _ in range(300)) for _ in range(100)]
    ids = {v: f"k{i}" for i, v in enumerate(values)}
    monkeypatch.setattr(keyring_module, "_CHUNK_BYTES", chunk_bytes)
    chunked = Keyring.compile(ids)
    monkeypatch.setattr(keyring_module, "_CHUNK_BYTES", 1 << 30)
    whole = Keyring.compile(ids)
    assert len(chunked._windows_acs) > 1 and len(whole._windows_acs) == 1
    for text in _texts(values):
        assert set(chunked.scan(text)) == set(whole.scan(text))
        assert redact_entry(chunked, text, ("tag " + text[:50],), patterns="rewrite") == (
            redact_entry(whole, text, ("tag " + text[:50],), patterns="rewrite")
        )
        assert not any(
            v in redact_entry(chunked, text, (), patterns="rewrite").content for v in values
        )
