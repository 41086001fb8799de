"""The redactor's shortcut for entries that cannot hold a secret (``redaction/redact.py``).

:func:`nothing_to_find` lets :func:`redact_entry` return an entry as it is without the full
search. It must be sound: whenever it says there is nothing to find, the full search
(:func:`redact_in_full`) indeed finds nothing. Checked here on generated texts built to sit
on its edges: every disguise of :data:`support.disguises.DISGUISES` whole and cut short
(encodings, escapes, look-alikes, separators, fragments), runs of an encoding's alphabet
around the length a blob needs, half-written escapes, credential anchors with and without a
body, markers, arbitrary Unicode; all of it split across content and tags at random points.
Each of the shortcut's tests is also held to the machinery it stands for, one by one.

The shortcut must also be taken where it is meant to be (plain prose): a test below fails if
it stops being taken, so the speed it buys cannot be lost silently. Speed itself is measured
in ``bench/redaction_bench.py``, not here.
"""

from __future__ import annotations

import itertools
import random
import string

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from openwop_memory.redaction.credential_patterns import (
    PATTERNS,
    find_credentials,
    may_hold_credentials,
)
from openwop_memory.redaction.decode import (
    Budget,
    blobs,
    escape_views,
    may_hold_blobs,
    may_hold_escapes,
)
from openwop_memory.redaction.fold import skeleton, skeleton_bytes
from openwop_memory.redaction.keyring import FIELD_SEPARATOR
from openwop_memory.redaction.redact import (
    EMPTY_KEYRING,
    Keyring,
    PatternPolicy,
    Redacted,
    marker,
    nothing_to_find,
    redact_entry,
    redact_in_full,
)
from support.disguises import DISGUISES, KEY_KINDS, fake_key

pytestmark = pytest.mark.backend_independent

# Bounded so that the file takes a few seconds: the keyrings are compiled once, and an
# example redacts a few hundred characters.
EXAMPLES = 200

_RNG = random.Random(20261201)
# One key of every kind, and two that fold to too little to be searched in the skeleton and
# are matched verbatim instead.
KEYS = {kind: fake_key(_RNG, kind) for kind in KEY_KINDS} | {
    "literal-punctuation": "@@##!!%%&&",
    "literal-short": "Zq7-Lp2x",
}
KEYRING = Keyring.compile({value: secret_id for secret_id, value in KEYS.items()})
# Two run secrets, as a run registers them.
TWO_SECRETS = Keyring.compile({"Kq8vN2xR7mLp4TzW9yBc": "run-1", "pässwörd-ключ-2024!": "run-2"})
KEYRINGS = (KEYRING, TWO_SECRETS, EMPTY_KEYRING)

_B64 = string.ascii_letters + string.digits + "+/_-"
_HEX = "0123456789abcdefABCDEF"
_WORDS = (
    "the user prefers concise answers",
    "deploy after the review of the draft",
    "budget for the project is fixed",
    "R&D; x = 5; 100% sure",
    "see https://example.org/a?b=c&d=e",
    "a_long_snake_case_identifier_name",
    "internationalization",
)
_ANCHORS = sorted({anchor for pattern in PATTERNS for anchor in pattern.anchors})
_ESCAPE_BITS = (
    *("%", "%4", "%41", "%0A", "&#", "&#6", "&#65;", "&amp;", "&#x41;"),
    *("\\u00", "\\u0041", "\\x4", "\\x00", "\\101", "\\n", "=4", "=41", "=\n", "=\r\n"),
)
_MARKERS = ("[REDACTED:", "[REDACTED:run-1]", marker("pattern:jwt"), "[REDACTED:]")


@st.composite
def _disguised(draw: st.DrawFn) -> str:
    """A key in one of its disguises, whole or any piece of it."""
    secret = draw(st.sampled_from(sorted(KEYS.values())))
    form = DISGUISES[draw(st.sampled_from(sorted(DISGUISES)))](secret)
    start = draw(st.integers(0, len(form)))
    end = draw(st.integers(start, len(form)))
    return draw(st.sampled_from((form, form[start:end], form[:end], form[start:])))


_EDGES = st.one_of(
    st.sampled_from(_WORDS),
    st.text(max_size=24),  # any Unicode: marks, controls, compatibility forms, NUL
    st.text(st.characters(exclude_categories=()), max_size=8),  # lone surrogates too
    st.text(_B64, min_size=12, max_size=20),  # around the 16 characters a blob needs
    st.text(_HEX, min_size=28, max_size=44),  # around the 32 a hex blob needs; digests
    st.text(string.ascii_letters + string.digits, min_size=14, max_size=40),  # identifiers
    st.sampled_from(_ESCAPE_BITS),
    st.sampled_from(_MARKERS),
    st.builds(lambda a, body: a + body, st.sampled_from(_ANCHORS), st.text(_B64, max_size=90)),
)
# Half disguises, half the shortcut's edges.
_PIECES = _disguised() | _EDGES


@st.composite
def entries(draw: st.DrawFn) -> tuple[str, tuple[str, ...]]:
    """Pieces joined with spaces or nothing, cut into content and up to three tags at random
    points (so a piece may be split across fields)."""
    pieces = draw(st.lists(_PIECES, max_size=6))
    text = draw(st.sampled_from(("", " ", ", "))).join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=3)))
    bounds = [0, *cuts, len(text)]
    fields = [text[a:b] for a, b in itertools.pairwise(bounds)]
    return fields[0], tuple(fields[1:])


_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@example(entry=("#123 the user prefers concise answers", ("bench", "group:17")), ring=1, on=True)
@example(entry=("ghp_" + "a1B2" * 9, ()), ring=2, on=True)
@example(entry=("aGVsbG8gd29ybGQh", ()), ring=0, on=False)  # a 16-character base64 run
@example(entry=("Kq8vN2xR", ("7mLp4TzW9yBc",)), ring=1, on=False)  # split across fields
@given(entry=entries(), ring=st.integers(0, len(KEYRINGS) - 1), on=st.booleans())
def test_the_shortcut_is_taken_only_when_the_full_search_finds_nothing(
    entry: tuple[str, tuple[str, ...]], ring: int, on: bool
) -> None:
    content, tags = entry
    keyring = KEYRINGS[ring]
    patterns: PatternPolicy = "rewrite" if on else "off"
    full = redact_in_full(keyring, content, tags, patterns=patterns)
    if nothing_to_find(keyring, FIELD_SEPARATOR.join((content, *tags)), on):
        assert full == Redacted(content, tags, (), False), full
    assert redact_entry(keyring, content, tags, patterns=patterns) == full


@_SETTINGS
@given(entry=entries(), ring=st.integers(0, len(KEYRINGS) - 1))
def test_each_test_of_the_shortcut_answers_for_its_machinery(
    entry: tuple[str, tuple[str, ...]], ring: int
) -> None:
    """Each "may hold" test says False only when what it stands for finds nothing."""
    text = FIELD_SEPARATOR.join((entry[0], *entry[1]))
    keyring = KEYRINGS[ring]
    skel = skeleton(text).data
    assert skeleton_bytes(text) == (skel if isinstance(skel, bytes) else skel.encode())
    if not keyring.may_match(text):
        assert keyring.scan(text) == []
    if not may_hold_credentials(text):
        assert find_credentials(text) == []
    if not may_hold_escapes(text):
        assert list(escape_views(text, 1 << 20, lambda s, e: True, lambda s, e: (0, 1 << 62))) == []
    if not may_hold_blobs(text):
        assert list(blobs(text, Budget(1 << 20), lambda s, e: True)) == []


@pytest.mark.parametrize("name", sorted(DISGUISES))
def test_no_disguise_of_any_key_takes_the_shortcut(name: str) -> None:
    """Every disguise of the realistic keys (which the full search finds) declines it,
    credential patterns on or off; cut in two across fields, the result is the full
    search's (which finds what can still be found of it)."""
    for value in (KEYS[kind] for kind in KEY_KINDS):
        text = DISGUISES[name](value)
        for on in (False, True):
            assert not nothing_to_find(KEYRING, f"note: {text} ok", on), (value, text)
        half = len(text) // 2
        content, tags = "note: " + text[:half], (text[half:] + " ok",)
        full = redact_in_full(KEYRING, content, tags)
        assert redact_entry(KEYRING, content, tags) == full


PROSE = (
    "#123 the user prefers concise answers, deploy after the review of the draft, budget "
    "for the project is fixed, meeting moved to thursday afternoon, keep the tone friendly"
)


@pytest.mark.parametrize(
    ("keyring", "patterns"),
    [(TWO_SECRETS, True), (TWO_SECRETS, False), (EMPTY_KEYRING, True), (EMPTY_KEYRING, False)],
    ids=["two-secrets", "two-secrets-no-patterns", "empty-keyring", "nothing-at-all"],
)
def test_plain_prose_takes_the_shortcut(keyring: Keyring, patterns: bool) -> None:
    """The entry the bench measures: if this fails, the shortcut has stopped working."""
    text = FIELD_SEPARATOR.join((PROSE, "bench", "group:17"))
    assert nothing_to_find(keyring, text, patterns)
    result = redact_entry(keyring, PROSE, ("bench", "group:17"))
    assert result == Redacted(PROSE, ("bench", "group:17"), (), False)


@pytest.mark.parametrize(
    "aside",
    [
        "fixed in 3f5e2c1d9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",  # a commit: hex, but not text
        "see https://example.org/docs?page=2&lang=en",  # an anchor ("://"), no credential
        "call OpenAIClientConfig2024 first",  # a run that could be base64, decodes to noise
        "x = 5; R&D; 100% sure; path/to/some_module_name.py",  # escape characters, no escape
    ],
    ids=["digest", "url", "identifier", "punctuation"],
)
def test_what_notes_often_hold_still_takes_the_shortcut(aside: str) -> None:
    text = PROSE + ", " + aside
    assert nothing_to_find(TWO_SECRETS, text, True)
    assert redact_in_full(TWO_SECRETS, text, ()) == Redacted(text, (), (), False)


@pytest.mark.parametrize(
    "text",
    [
        PROSE + " [REDACTED:run-1]",  # a marker: the full search must see it blanked
        PROSE + " 50%41 off",  # an escape
        PROSE + " QUJDREVGR0hJSktMTU5P",  # a run long enough to be base64
        PROSE + " ghp_" + "a1B2" * 9,  # a credential's shape
        PROSE + " Kq8vN2xR7mLp",  # a fragment of a run secret
        # A long text with a run that could be an encoding is not decoded twice.
        (PROSE + " ") * 30 + "3f5e2c1d9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
    ],
    ids=["marker", "escape", "blob", "credential", "fragment", "long-with-a-run"],
)
def test_anything_that_could_hide_a_secret_declines_the_shortcut(text: str) -> None:
    assert not nothing_to_find(TWO_SECRETS, text, True)
