"""The redactor against disguised secrets, as a pure function (no sidecar).

Every disguise of :data:`support.disguises.DISGUISES`, applied to every key of a realistic
keyring, is written into prose, in the content and in a tag. The contract checked
(``redaction/redact.py``): nothing of the secret survives (no 8-character window of it, and
nothing of its disguised text), the marker of the right id takes its place, the prose
around it is unchanged byte for byte, and redacting the result again changes nothing.
Further tests cover overlapping secrets, secrets split across fields, fragments and the
``disguised`` flag of a finding.
"""

from __future__ import annotations

import base64
import random
from typing import Literal

import pytest
from openwop_memory.redaction.redact import (
    MIN_SECRET_CHARS,
    Finding,
    Keyring,
    Redacted,
    marker,
    redact_entry,
)
from support.disguises import (
    CASE_DISGUISES,
    DISGUISES,
    MIN_FRAGMENT_ALNUM,
    alnum_count,
    alnum_piece,
    expect_disguised,
    fake_keys,
    public_prefix,
    split_across_fields,
    surviving_windows,
)

pytestmark = pytest.mark.backend_independent

KEYS: dict[str, str] = fake_keys(random.Random(20261129), 10)  # secret id -> value
KEYRING = Keyring.compile({value: secret_id for secret_id, value in KEYS.items()})

# The prose around a disguise. It meets the disguise with CJK letters followed by a space,
# which no secret, encoding or separator uses: so a match can never legitimately grow into
# the prose, and every byte of it must come back unchanged.
BEFORE = "Deploy notes (draft, ünïcödé): the worker wrote 参照 "
AFTER = " 完了 — rotate it after the review.\nNext: 日本語のメモ, ok."
OTHER_TAG = "source:notes"

# Names of the disguises grouped as the redactor's contract lists them. Every name of
# DISGUISES is in exactly one group and every group is non-empty (test below), so a
# disguise cannot be added without saying which promise it exercises.
CONTRACT: dict[str, tuple[str, ...]] = {
    "verbatim": ("raw",),
    "case changes": ("upper", "lower", "swapcase", "alternating_case"),
    "reversal": ("reversed",),
    "rot13": ("rot13",),
    "NFKC compatibility forms": ("fullwidth", "math_bold"),
    "invisible or format characters": (
        "zero_width_space",
        "zero_width_joiner",
        "soft_hyphen",
        "bom",
        "invisible_mix",
    ),
    "combining marks": ("combining_marks",),
    "look-alike letters": (
        "homoglyph_cyrillic",
        "homoglyph_cyrillic_upper",
        "homoglyph_greek",
        "homoglyph_mixed",
    ),
    "separators between characters": (
        "spaced",
        "dotted",
        "dashed_groups",
        "newline_groups",
        "mixed_separators",
    ),
    "base64 standard and URL-safe, with and without padding": (
        "base64",
        "base64_nopad",
        "base64url",
        "base64url_nopad",
    ),
    "inside a base64 or base32 blob, any alignment, line-wrapped": (
        "base64_blob_align0",
        "base64_blob_align1",
        "base64_blob_align2",
        "base64url_blob_align1",
        "base64_blob_wrap76",
        "base64_blob_wrap64",
        "base32_blob_align0",
        "base32_blob_align1",
        "base32_blob_align2",
        "base32_blob_align3",
        "base32_blob_align4",
    ),
    "hex lower and upper": ("hex_lower", "hex_upper"),
    "percent-encoding": ("percent", "percent_interleaved"),
    "JSON string escaping": ("json_string", "backslash_u"),
    "SHA-256 hex digest": ("sha256_hex",),
    "HTML entities, all or part": ("html_decimal", "html_hex", "html_interleaved"),
    "escape sequences, all or part": (
        "backslash_u_interleaved",
        "backslash_u_head",
        "backslash_x",
        "backslash_x_interleaved",
        "octal",
        "octal_interleaved",
        "quoted_printable",
        "quoted_printable_interleaved",
    ),
    "UTF-16 then hex or base64": (
        "utf16le_hex",
        "utf16be_hex",
        "utf16le_base64",
        "utf16be_base64",
    ),
    "nested encodings up to depth 3, gzip": (
        "base64_of_base64",
        "hex_of_base64",
        "base64_of_hex",
        "hex_of_hex",
        "base64_triple",
        "gzip_base64",
    ),
    "fragments of 12 or more letters and digits": (
        "fragment_middle",
        "fragment_with_prefix",
        "fragment_tail",
    ),
}
TABLE = sorted(DISGUISES)


def redact(content: str, tags: tuple[str, ...] = (), keyring: Keyring = KEYRING) -> Redacted:
    return redact_entry(keyring, content, tags, patterns="rewrite")


def assert_idempotent(result: Redacted, keyring: Keyring = KEYRING) -> None:
    again = redact(result.content, result.tags, keyring)
    assert (again.content, again.tags) == (result.content, result.tags), "not idempotent"


def secret_findings(result: Redacted, field: str) -> list[Finding]:
    return [f for f in result.findings if f.field == field and f.kind == "secret"]


def check_replaced(text: str, secret_id: str, disguise: str) -> None:
    """``text`` is ``BEFORE + <disguised secret> + AFTER`` redacted: the prose is intact, the
    marker of ``secret_id`` stands between, and no 8-character window of any secret is left
    (a public prefix such as ``sk-proj-`` alone does not count: it names a format)."""
    assert text.startswith(BEFORE), f"prose before the secret changed: {text!r}"
    assert text.endswith(AFTER), f"prose after the secret changed: {text!r}"
    middle = text[len(BEFORE) : len(text) - len(AFTER)]
    assert marker(secret_id) in middle, f"{marker(secret_id)} missing: {middle!r}"
    for value in KEYS.values():
        left = surviving_windows(
            value, [text], casefold=disguise in CASE_DISGUISES, public=public_prefix(value)
        )
        assert not left, f"pieces of a secret survive: {left} in {middle!r}"


@pytest.mark.parametrize("secret_id", sorted(KEYS))
@pytest.mark.parametrize("disguise", TABLE)
def test_a_disguised_secret_in_the_content_is_replaced(disguise: str, secret_id: str) -> None:
    disguised = DISGUISES[disguise](KEYS[secret_id])
    result = redact(BEFORE + disguised + AFTER, (OTHER_TAG,))
    check_replaced(result.content, secret_id, disguise)
    assert result.tags == (OTHER_TAG,)
    assert not result.leaked
    [finding] = secret_findings(result, "content")
    assert secret_id in finding.secret_ids, result.findings
    # A hit is "disguised" unless the value, or a fragment of it, was there verbatim.
    assert finding.disguised == expect_disguised(disguise, KEYS[secret_id], disguised), finding
    assert_idempotent(result)


@pytest.mark.parametrize("secret_id", sorted(KEYS))
@pytest.mark.parametrize("disguise", TABLE)
def test_a_disguised_secret_in_a_tag_is_replaced(disguise: str, secret_id: str) -> None:
    disguised = DISGUISES[disguise](KEYS[secret_id])
    result = redact("plain content", (OTHER_TAG, BEFORE + disguised + AFTER))
    assert result.content == "plain content"
    assert result.tags[0] == OTHER_TAG
    check_replaced(result.tags[1], secret_id, disguise)
    assert not result.leaked
    [finding] = secret_findings(result, "tags[1]")
    assert secret_id in finding.secret_ids, result.findings
    assert_idempotent(result)


@pytest.mark.parametrize("secret_id", sorted(KEYS))
@pytest.mark.parametrize("disguise", TABLE)
def test_the_replaced_span_is_exactly_the_disguised_text(disguise: str, secret_id: str) -> None:
    """The smallest span covering the disguised secret is replaced, and when the secret was
    only visible after decoding, the whole encoded run: here that is the disguise itself
    (every disguise keeps its separators and marks inside), all of it and nothing more.
    Separate from the tests above, which check that nothing leaks."""
    disguised = DISGUISES[disguise](KEYS[secret_id])
    result = redact(BEFORE + disguised + AFTER)
    expected = {marker(secret_id)}
    if disguise == "json_string":  # the quotes around a JSON string are not the secret
        expected = {f'"{marker(secret_id)}"'}
    if disguise == "fragment_with_prefix":  # a public prefix is not the secret: it may stay
        expected.add(public_prefix(KEYS[secret_id]) + marker(secret_id))
    assert result.content in {BEFORE + e + AFTER for e in expected}, (disguised, result.content)


def test_the_table_covers_every_disguise_and_every_promise() -> None:
    grouped = [name for names in CONTRACT.values() for name in names]
    assert len(grouped) == len(set(grouped)), "a disguise is listed under two promises"
    assert set(grouped) == set(DISGUISES), {
        "in DISGUISES but under no promise": sorted(set(DISGUISES) - set(grouped)),
        "under a promise but not in DISGUISES": sorted(set(grouped) - set(DISGUISES)),
    }
    assert all(CONTRACT.values()), "a promise of the contract has no disguise"
    assert set(TABLE) == set(DISGUISES)
    assert CASE_DISGUISES.issubset(DISGUISES)
    # Every key is long enough to be used, and long enough for a fragment that counts.
    for value in KEYS.values():
        assert len(value) >= MIN_SECRET_CHARS
        assert alnum_count(value[len(public_prefix(value)) :]) >= MIN_FRAGMENT_ALNUM + 4


def test_text_without_a_secret_is_returned_unchanged() -> None:
    content = BEFORE + "nothing to see: c2VjcmV0 0xdeadbeef %41 &#65; \\u0041" + AFTER
    tags = (OTHER_TAG, "ключ", "sk-proj-", "a" * 256)
    result = redact(content, tags)
    assert (result.content, result.tags, result.findings) == (content, tags, ())
    assert not result.leaked


def test_several_secrets_and_disguises_in_one_entry() -> None:
    ids = sorted(KEYS)
    parts = [DISGUISES[d](KEYS[i]) for d, i in zip(TABLE, ids * len(TABLE), strict=False)]
    content = "\n参照 ".join(parts)
    result = redact(BEFORE + content + AFTER, (OTHER_TAG,))
    assert result.content.startswith(BEFORE) and result.content.endswith(AFTER)
    for value in KEYS.values():
        left = surviving_windows(
            value, [result.content], casefold=True, public=public_prefix(value)
        )
        assert not left, left
    for secret_id in ids:
        assert marker(secret_id) in result.content
    assert_idempotent(result)


# -- overlapping secrets ----------------------------------------------------------------------


def _token(rng: random.Random, n: int) -> str:
    return "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789", k=n))


@pytest.mark.parametrize("disguise", ["raw", "upper", "spaced", "fullwidth", "base64", "hex_lower"])
def test_overlapping_secrets_merge_and_the_longest_names_the_marker(disguise: str) -> None:
    rng = random.Random(7)
    shared = _token(rng, 6)
    short = _token(rng, 10) + shared  # 16 characters, ends with `shared`
    long = shared + _token(rng, 18)  # 24 characters, starts with `shared`
    # Registered shortest first, so registration order cannot be what decides.
    keyring = Keyring.compile({short: "short", long: "long"})
    joined = short + long[len(shared) :]  # both secrets, overlapping in `shared`
    result = redact(f"x 参照 {DISGUISES[disguise](joined)} 完了 y", (), keyring)
    assert result.content == "x 参照 [REDACTED:long] 完了 y"
    [finding] = secret_findings(result, "content")
    assert finding.secret_ids == {"short", "long"}
    assert_idempotent(result, keyring)


def test_a_secret_inside_a_longer_one_is_named_by_the_longer() -> None:
    rng = random.Random(8)
    inner = _token(rng, 16)
    outer = _token(rng, 6) + inner + _token(rng, 6)
    keyring = Keyring.compile({inner: "inner", outer: "outer"})
    result = redact(f"a 参照 {outer} 完了 b", (), keyring)
    assert result.content == "a 参照 [REDACTED:outer] 完了 b"


# -- split across fields ----------------------------------------------------------------------

SPLIT_KEYS = ["openai-1", "hex40-1", "passphrase-1", "nonascii-1"]


def _pieces_gone(content: str, tags: list[str], result: Redacted, secret_id: str) -> None:
    """Every field that carried a piece of the secret no longer holds it, the marker is
    there, no 8-character window of it is left, and the prose around it is intact."""
    secret = KEYS[secret_id]
    sent = [content, *tags]
    got = [result.content, *result.tags]
    assert not surviving_windows(secret, got), got
    assert any(marker(secret_id) in field for field in got), got
    for before, after in zip(sent, got, strict=True):
        if before in (BEFORE, ""):
            assert after == before, got
        else:
            assert after != before, f"a piece of the secret survived in {after!r}"
    assert got[0].startswith(BEFORE) and got[-1].endswith(AFTER), got


def _parts(secret: str, piece_chars: int | None) -> int:
    """How many pieces make pieces of at most ``piece_chars`` characters (2 if None)."""
    return 2 if piece_chars is None else -(-len(secret) // piece_chars)


@pytest.mark.parametrize("secret_id", SPLIT_KEYS)
# None: two long pieces (each a fragment that counts on its own); 11 and 6: pieces too short
# to count as fragments, so only reading the fields in order can reveal the secret.
@pytest.mark.parametrize("piece_chars", [None, MIN_FRAGMENT_ALNUM - 1, 6])
def test_a_secret_split_across_content_and_tags(secret_id: str, piece_chars: int | None) -> None:
    secret = KEYS[secret_id]
    content, tags = split_across_fields(
        secret, _parts(secret, piece_chars), before=BEFORE, after=AFTER
    )
    result = redact(content, tuple(tags))
    _pieces_gone(content, tags, result, secret_id)
    assert not result.leaked
    found = [f for f in result.findings if f.kind == "secret" and secret_id in f.secret_ids]
    assert found and all(f.disguised for f in found), result.findings
    assert_idempotent(result)


@pytest.mark.parametrize("secret_id", SPLIT_KEYS)
def test_a_secret_split_across_tags(secret_id: str) -> None:
    secret = KEYS[secret_id]
    content, tags = split_across_fields(
        secret, _parts(secret, MIN_FRAGMENT_ALNUM - 1), before=BEFORE, after=AFTER, in_content=False
    )
    result = redact(content, tuple(tags))
    _pieces_gone(content, tags, result, secret_id)
    found = [f for f in result.findings if f.kind == "secret" and secret_id in f.secret_ids]
    assert found and all(f.disguised and f.field.startswith("tags[") for f in found)
    assert_idempotent(result)


# -- fragments --------------------------------------------------------------------------------

FRAGMENT_KEYS = ["openai-1", "github-1", "anthropic-1", "hex40-1", "password-1"]


def _fenced(text: str) -> str:
    # CJK on both sides: a fragment must not be able to grow into its neighbours, not even
    # across fields (content and tags are read as one text, in order).
    return f"参照{text}完了"


def _alnum_pieces(secret: str, count: int) -> list[str]:
    """Verbatim pieces of ``secret`` holding ``count`` letters and digits beyond its public
    prefix, starting at a letter or digit: the first, a middle and the last one."""
    prefix = public_prefix(secret)
    starts = [
        i
        for i in range(len(prefix), len(secret))
        if secret[i].isalnum() and alnum_piece(secret, i, count)
    ]
    assert starts, f"{secret!r} has no piece of {count} letters and digits"
    return sorted(
        {alnum_piece(secret, i, count) for i in (starts[0], starts[len(starts) // 2], starts[-1])}
    )


@pytest.mark.parametrize("secret_id", FRAGMENT_KEYS)
def test_fragments_of_twelve_letters_and_digits_are_caught(secret_id: str) -> None:
    secret = KEYS[secret_id]
    prefix = public_prefix(secret)
    for count in (MIN_FRAGMENT_ALNUM, MIN_FRAGMENT_ALNUM + 2):
        for piece in _alnum_pieces(secret, count):
            result = redact_entry(KEYRING, _fenced(piece), (), patterns="off")
            assert result.content == _fenced(marker(secret_id)), (piece, result.content)
            [finding] = secret_findings(result, "content")
            assert not finding.disguised, finding  # a verbatim fragment, like the value
    if prefix:  # with its public prefix in front: the prefix does not count; it may stay
        piece = prefix + alnum_piece(secret, len(prefix), MIN_FRAGMENT_ALNUM)
        result = redact_entry(KEYRING, _fenced(piece), (), patterns="off")
        expected = {_fenced(marker(secret_id)), _fenced(prefix + marker(secret_id))}
        assert result.content in expected, (piece, result.content)


@pytest.mark.parametrize("secret_id", FRAGMENT_KEYS)
def test_fragments_of_eleven_letters_and_digits_are_left_alone(secret_id: str) -> None:
    secret = KEYS[secret_id]
    prefix = public_prefix(secret)
    count = MIN_FRAGMENT_ALNUM - 1
    # The public prefix does not count: prefix + 11 letters and digits is still too short.
    pieces = [*_alnum_pieces(secret, count), prefix + alnum_piece(secret, len(prefix), count)]
    for piece in pieces:
        text = _fenced(piece)
        result = redact_entry(KEYRING, text, (text,), patterns="off")
        assert (result.content, result.tags, result.findings) == (text, (text,), ()), piece


def test_a_public_prefix_alone_is_left_alone() -> None:
    for value in KEYS.values():
        if prefix := public_prefix(value):
            text = _fenced(prefix + "x")
            assert redact_entry(KEYRING, text, (), patterns="off").content == text


# -- registered secrets and credential patterns -----------------------------------------------


@pytest.mark.parametrize("secret_id", ["openai-1", "github-1", "slack-1"])
@pytest.mark.parametrize("patterns", ["rewrite", "reject"])
def test_a_registered_secret_of_a_known_format_is_reported_as_the_secret(
    secret_id: str, patterns: Literal["rewrite", "reject"]
) -> None:
    """A registered value that also has a well-known credential format is the registered
    secret: its own marker, and no ``pattern`` finding (which ``--credential-patterns
    reject`` would refuse, though the run registered the value)."""
    secret = KEYS[secret_id]
    result = redact_entry(KEYRING, f"key {secret} end", (secret,), patterns=patterns)
    assert result.content == f"key {marker(secret_id)} end"
    assert result.tags == (marker(secret_id),)
    assert result.findings == (
        Finding("content", "secret", frozenset({secret_id}), False),
        Finding("tags[0]", "secret", frozenset({secret_id}), False),
    )


def test_an_unregistered_credential_is_a_pattern_finding() -> None:
    token = "ghp_" + _token(random.Random(9), 36)
    result = redact_entry(KEYRING, f"key {token} end", (), patterns="rewrite")
    assert result.content.startswith("key [REDACTED:pattern:") and token not in result.content
    assert [f.kind for f in result.findings] == ["pattern"]
    assert all(i.startswith("pattern:") for i in result.findings[0].secret_ids)
    off = redact_entry(KEYRING, f"key {token} end", (), patterns="off")
    assert (off.content, off.findings) == (f"key {token} end", ())


# -- the disguised flag -----------------------------------------------------------------------


def test_disguised_is_false_for_the_verbatim_value() -> None:
    result = redact(f"key {KEYS['hex40-1']} and again {KEYS['hex40-1']}", (KEYS["uuid-1"],))
    assert result.content == "key [REDACTED:hex40-1] and again [REDACTED:hex40-1]"
    assert result.tags == ("[REDACTED:uuid-1]",)
    assert result.findings == (
        Finding("content", "secret", frozenset({"hex40-1"}), False),
        Finding("tags[0]", "secret", frozenset({"uuid-1"}), False),
    )


def test_disguised_is_false_for_a_verbatim_fragment() -> None:
    piece = alnum_piece(KEYS["hex40-1"], 10, MIN_FRAGMENT_ALNUM + 4)
    result = redact(f"frag 参照{piece}完了 end")
    assert result.content == "frag 参照[REDACTED:hex40-1]完了 end"
    assert result.findings == (Finding("content", "secret", frozenset({"hex40-1"}), False),)


def test_disguised_is_true_for_base64() -> None:
    encoded = base64.b64encode(KEYS["hex40-1"].encode()).decode()
    result = redact(f"key {encoded} end")
    assert result.content == "key [REDACTED:hex40-1] end"
    assert result.findings == (Finding("content", "secret", frozenset({"hex40-1"}), True),)


def test_disguised_is_true_when_one_hit_of_a_field_is_disguised() -> None:
    secret = KEYS["hex40-1"]
    result = redact(f"{secret} {secret.upper()}")
    assert result.content == "[REDACTED:hex40-1] [REDACTED:hex40-1]"
    assert result.findings == (Finding("content", "secret", frozenset({"hex40-1"}), True),)


def test_disguised_is_true_for_a_split_across_fields() -> None:
    content, tags = split_across_fields(KEYS["hex40-1"], 4, before="k: ")
    result = redact(content, tuple(tags))
    found = [f for f in result.findings if "hex40-1" in f.secret_ids]
    assert found and all(f.kind == "secret" and f.disguised for f in found), result.findings
