"""Unit tests of the pure building blocks: wire times, refs, redaction, log scrubbing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from openwop_memory.logs import drop_sensitive_keys
from openwop_memory.redaction import Keyring, redact_entry
from openwop_memory.service.refs import ISSUED_PREFIX, RefCodec, is_malformed
from openwop_memory.storage.base import as_of_position
from openwop_memory.timefmt import format_us, parse_rfc3339
from openwop_memory_client import ForbiddenError

pytestmark = pytest.mark.backend_independent

WIRE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
# A marker as the redactor writes it. It stands for what it replaced, so a value's text
# inside one (a secret "[REDACTE") is not the value: markers are blanked before searching.
_MARKER = re.compile(r"\[REDACTED:[^\]\x00-\x1f]{1,160}\]")


# -- times -------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=253_402_300_799_999_999))
def test_format_parse_round_trip(us: int) -> None:
    text = format_us(us)
    assert WIRE_TIME.match(text)
    assert parse_rfc3339(text) == us


@given(st.integers(min_value=0, max_value=10**17), st.integers(min_value=0, max_value=10**17))
def test_wire_text_sorts_in_time_order(a: int, b: int) -> None:
    assert (format_us(a) < format_us(b)) == (a < b)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T15:21:51Z", "2026-11-29T15:21:51.000000Z"),
        ("2026-11-29T15:21:51.1234569Z", "2026-11-29T15:21:51.123456Z"),  # truncated, not rounded
        ("2026-11-29t20:51:51.5+05:30", "2026-11-29T15:21:51.500000Z"),
        ("2026-11-29T10:21:51-05:00", "2026-11-29T15:21:51.000000Z"),
    ],
)
def test_parse_normalises_to_utc_micros(text: str, expected: str) -> None:
    assert format_us(parse_rfc3339(text)) == expected


NOT_RFC3339 = r"^not an RFC 3339 date-time with an offset$"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2026-11-29T15:21:51", NOT_RFC3339),  # no offset
        ("2026-11-29 15:21:51Z", NOT_RFC3339),
        ("tomorrow", NOT_RFC3339),
        ("\uff12\uff10\uff12\uff16-11-29T15:21:51Z", NOT_RFC3339),  # fullwidth digits
        ("2026-11-29T15:21:51+24:00", r"^offset out of range$"),
        ("2026-11-29T15:21:51+00:60", r"^offset out of range$"),  # one hour, written wrong
        # The calendar's own reasons (datetime's words, which name the field):
        ("2026-02-30T00:00:00Z", r"\bday\b"),
        ("2026-11-29T24:00:00Z", r"\bhour\b"),
        ("2026-11-29T23:59:60Z", r"\bsecond\b"),  # leap second
    ],
)
def test_parse_rejects_saying_why(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_rfc3339(text)


def test_format_matches_datetime() -> None:
    dt = datetime(2026, 11, 29, 15, 21, 51, 123456, tzinfo=UTC)
    assert format_us(int(dt.timestamp() * 1_000_000)) == "2026-11-29T15:21:51.123456Z"


def test_format_matches_datetime_across_cache_refills() -> None:
    """Past the caches' size (seconds and days), in both directions: still the same text."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    steps = [1, 999_999, 1_000_001, 86_399_999_999, 86_400_000_001, 31_536_000_000_007]
    for step in steps:
        for us in range(0, 4200 * step, step):
            for t in (us, 253_402_300_799_999_999 - us):
                expected = (epoch + timedelta(microseconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                assert format_us(t) == expected


# -- refs --------------------------------------------------------------------------------

KEY = b"k" * 32


def test_issued_refs_are_deterministic_short_and_scoped() -> None:
    codec = RefCodec(KEY)
    ref = codec.issue("t1", "agent", "default")
    assert ref == codec.issue("t1", "agent", "default")
    assert ref.startswith(ISSUED_PREFIX)
    assert len(ref) <= 512
    assert "t1" not in ref
    assert "agent" not in ref
    long_ref = codec.issue("ж" * 128, "ж" * 128, "ж" * 128)
    assert len(long_ref) == len(ref)  # fixed length whatever the names
    others = {
        codec.issue("t1", "agent", "other"),
        codec.issue("t1", "b", "default"),
        codec.issue("t2", "agent", "default"),
    }
    assert ref not in others
    assert len(others) == 3
    scope = codec.resolve(ref, "t1")
    assert scope is not None
    assert scope.tenant == "t1"
    assert codec.resolve(codec.issue("t1", "agent", "other"), "t1") != scope


def test_issued_ref_of_another_tenant_is_forbidden() -> None:
    codec = RefCodec(KEY)
    with pytest.raises(ForbiddenError):
        codec.resolve(codec.issue("t1", "a", "default"), "t2")


def test_a_ref_from_another_key_is_tampered() -> None:
    assert RefCodec(b"x" * 32).resolve(RefCodec(KEY).issue("t1", "a", "default"), "t1") is None


def test_every_single_character_change_of_an_issued_ref_resolves_to_nothing() -> None:
    codec = RefCodec(KEY)
    ref = codec.issue("t1", "a", "default")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=!"
    for i in range(len(ISSUED_PREFIX), len(ref)):
        for c in alphabet:
            if c != ref[i]:
                assert codec.resolve(ref[:i] + c + ref[i + 1 :], "t1") is None, (i, c)
    assert codec.resolve(ref[:-1], "t1") is None
    assert codec.resolve(ref + "A", "t1") is None


def test_plain_refs_are_scoped_to_the_run_tenant() -> None:
    codec = RefCodec(KEY)
    a, b = codec.resolve("notes", "t1"), codec.resolve("notes", "t2")
    assert a is not None
    assert b is not None
    assert a.tenant == "t1"
    assert b.tenant == "t2"
    assert a.key == b.key
    assert "notes" not in a.key  # stored as a keyed digest, not as sent


@pytest.mark.parametrize(
    "ref", ["", "x" * 513, "a\nb", "a\x7fb", "a/../b", "..\\x", "..", "a\\..", "\x85"]
)
def test_malformed_refs(ref: str) -> None:
    assert is_malformed(ref)
    assert RefCodec(KEY).resolve(ref, "t1") is None


@pytest.mark.parametrize("ref", ["x" * 512, "a/b..c/d", "...", "team/notes", "ж"])
def test_well_formed_plain_refs(ref: str) -> None:
    assert not is_malformed(ref)


# -- redaction ---------------------------------------------------------------------------


def test_longest_value_wins_and_short_values_are_ignored() -> None:
    ring = Keyring.compile({"abcdefgh": "short", "abcdefgh12345678": "long", "tiny123": "tiny"})
    out = redact_entry(ring, "abcdefgh12345678 abcdefgh tiny123", ("x abcdefgh",))
    assert out.content == "[REDACTED:long] [REDACTED:short] tiny123"
    assert out.tags == ("x [REDACTED:short]",)
    assert [(f.field, set(f.secret_ids)) for f in out.findings] == [
        ("content", {"long", "short"}),
        ("tags[0]", {"short"}),
    ]
    assert not out.leaked
    assert len(ring) == 2


def test_regex_metacharacters_in_secrets_are_literal() -> None:
    ring = Keyring.compile({"a.b*c+d?(e)": "meta"})
    assert redact_entry(ring, "aXbbbcdde a.b*c+d?(e)", ()).content == "aXbbbcdde [REDACTED:meta]"


@given(
    st.text(min_size=0, max_size=200),
    st.lists(st.text(min_size=8, max_size=30), min_size=1, max_size=5, unique=True),
)
@example(text="", values=["[REDACTE"])  # a value the marker that replaces it spells
@example(text=" ", values=["ab[REDACTED:", "cdefghij"])
def test_no_registered_value_survives(text: str, values: list[str]) -> None:
    ring = Keyring.compile({v: f"id{i}" for i, v in enumerate(values)})
    mixed = values[0] + text + "".join(values)
    out = redact_entry(ring, mixed, (mixed,))
    assert not out.leaked  # plain values are rewritten in one pass: nothing is left to refuse
    assert {f.field for f in out.findings} == {"content", "tags[0]"}
    for v in values:
        for field in (out.content, *out.tags):
            assert v not in _MARKER.sub("\0", field), (v, field)


@given(st.text(max_size=300))
def test_text_without_secrets_is_unchanged(text: str) -> None:
    ring = Keyring.compile({"\x00never-in-generated-text\x00": "k"})
    out = redact_entry(ring, text.replace("\x00", ""), ("t",))
    assert out.content == text.replace("\x00", "")
    assert out.findings == ()


# -- logs --------------------------------------------------------------------------------


def test_log_scrubber_blanks_content_bearing_keys() -> None:
    event = {"event": "request", "method": "memory.put", "content": "x", "secrets": ["y"]}
    out = drop_sensitive_keys(None, "info", event)
    assert out == {
        "event": "request",
        "method": "memory.put",
        "content": "[omitted]",
        "secrets": "[omitted]",
    }


# -- runs as of a time ---------------------------------------------------------------------


@given(
    st.lists(st.integers(min_value=1, max_value=5), min_size=0, max_size=30),
    st.integers(min_value=0, max_value=200),
)
def test_as_of_position_names_a_snapshot_of_the_writes_at_or_before_the_time(
    gaps: list[int], as_of: int
) -> None:
    """Writes at increasing positions and non-decreasing times (a write's time is its
    position here, give or take ties): whatever the feed still holds of them, the position
    chosen shows exactly the writes at or before the time."""
    positions = [sum(gaps[: n + 1]) for n in range(len(gaps))]
    times = [p // 2 for p in positions]  # ties: several writes in one microsecond
    clock = (positions[-1] if positions else 0) + 3
    for purged in range(len(positions) + 1):  # the oldest records past retention
        held = [(p, t) for p, t in zip(positions, times, strict=True)][purged:]
        if purged and as_of < times[purged - 1]:
            continue  # a time older than what the feed holds: refused before this
        at_or_before = max((p for p, t in held if t <= as_of), default=None)
        first_after = min((p for p, t in held if t > as_of), default=None)
        chosen = as_of_position(at_or_before=at_or_before, first_after=first_after, clock=clock)
        inside = {p for p in positions if p <= chosen}
        assert inside == {p for p, t in zip(positions, times, strict=True) if t <= as_of}
