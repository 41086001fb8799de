"""The needles one secret is searched for, each already folded to a skeleton.

A needle is a form the secret may take in a text (the value, its hex, its base64 at each
byte alignment, its digest, its reversal...) folded by :func:`~.fold.fold`, so
that one search of a text's skeleton finds every form under every disguise the fold
removes. :func:`form_needles` promises only needles of at least :data:`MIN_NEEDLE_CHARS`
skeleton characters, so short forms never shred ordinary text. Fragments are searched
differently (``keyring.py``); this module only says how long they are and which
public prefix they skip.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import re
from collections.abc import Callable, Iterator
from enum import Enum
from typing import NamedTuple

from .fold import fold, folded

MIN_NEEDLE_CHARS = 8
FRAGMENT_CHARS = 12
# Fragments are found by keys this long, one every FRAGMENT_CHARS - KEY_CHARS + 1
# characters, so that every FRAGMENT_CHARS-long piece of a value holds a whole key; a key's
# match counts once grown to FRAGMENT_CHARS. Windows of FRAGMENT_CHARS at every offset
# found the same pieces with 7 times the automaton: 16 MiB for 256 values of 64.
KEY_CHARS = 8
# Bounds that keep a keyring of long values (PEM keys) cheap to compile. An encoded form of
# a value's first ENCODED_PREFIX_BYTES is as good as the whole: a hit is widened over the
# encoding's alphabet to the whole encoded run. Fragments of a long value are sampled.
ENCODED_PREFIX_BYTES = 48
MAX_FRAGMENTS = 64
# Needle lengths bound the automaton's size; 40 folded characters never occur by chance.
HEAD_CHARS = 40
# How much of a value's private part its escaped-form needles spell (12, like a fragment).
ESCAPED_CHARS = 12

# Prefixes that say which service a key is for, not which key; a fragment must have
# FRAGMENT_CHARS letters or digits beyond them. Longest first, so the first hit is the longest.
PUBLIC_PREFIXES = tuple(
    sorted(
        (
            "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-ant-api03-", "sk-ant-admin01-", "sk-",
            "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "glptt-",
            "xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxe-", "sk_live_", "sk_test_",
            "rk_live_", "rk_test_", "whsec_", "AKIA", "ASIA", "AIza", "GOCSPX-", "SG.",
            "npm_", "pypi-AgEIcHlwaS5vcmc", "hf_", "dop_v1_", "doo_v1_", "shpat_", "shpca_",
            "shppa_", "shpss_", "dapi", "dckr_pat_", "lin_api_", "hvs.", "hvb.",
            "Bearer ", "Basic ",
        ),
        key=len,
        reverse=True,
    )
)  # fmt: skip

# A JWT's header segment is shared by every token of the same issuer and algorithm.
_JWT_HEADER = re.compile(r"eyJ[A-Za-z0-9_-]+\.")


class Kind(Enum):
    """How a needle relates to the value; says how far a hit's span is widened."""

    RAW = "raw"  # the value itself, in any disguise the fold removes
    ENCODED = "encoded"  # hex, base64, base32 or a digest: the whole encoded run is replaced
    TRANSFORMED = "transformed"  # reversed or rot13
    # Fragments are not needles: see keyring.py.


class Needle(NamedTuple):
    folded: str
    kind: Kind
    alphabet: str = ""  # characters an ENCODED hit's span is widened over
    pad_left: str = ""  # the value's punctuation a folded hit may take in on its left
    pad_right: str = ""
    # ENCODED: the least length of the whole value so encoded. A shorter run holds only part
    # of the value, and the rest may stand next to it in another form.
    whole: int = 0


# Percent-encoding and quoted-printable of every byte read as hex with "%" or "=" between.
HEX = "0123456789abcdefABCDEF%="
BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-="
BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567="
UNICODE_ESCAPES = "\\u0123456789abcdefABCDEF"
BYTE_ESCAPES = "\\x0123456789abcdefABCDEF"
DECIMAL_ENTITIES = "&#;0123456789"
HEX_ENTITIES = "&#;xX0123456789abcdefABCDEF"


def key_starts(private_chars: int) -> range:
    """Where the fragment keys of a private part of ``private_chars`` folded characters
    start: any FRAGMENT_CHARS + stride - KEY_CHARS of its characters hold a whole key, so
    every FRAGMENT_CHARS of a value up to MAX_FRAGMENTS keys long, and on longer values
    every fragment as long as before sampling (with windows of FRAGMENT_CHARS)."""
    starts = private_chars - FRAGMENT_CHARS + 1
    if starts <= 0:
        return range(0)
    stride = FRAGMENT_CHARS - KEY_CHARS + -(-starts // MAX_FRAGMENTS)
    return range(0, private_chars - KEY_CHARS + 1, stride)


def public_prefix(value: str) -> str:
    """The public prefix ``value`` starts with, or ``""``."""
    jwt = _JWT_HEADER.match(value)
    if jwt:
        return jwt.group(0)
    return next((p for p in PUBLIC_PREFIXES if value.startswith(p)), "")


def _shifted(
    data: bytes, encode: Callable[[bytes], bytes], group_bytes: int, bits: int
) -> Iterator[str]:
    """The encoding of ``data`` at every byte alignment inside a larger blob.

    Only the characters that depend on ``data`` alone are kept, so the needle matches
    whatever bytes surround the secret in the blob.
    """
    for shift in range(group_bytes):
        encoded = encode(b"\0" * shift + data).decode().rstrip("=")
        start = -(-shift * 8 // bits)
        end = (shift + len(data)) * 8 // bits
        yield encoded[start:end]


# How many digits a byte's code point takes in decimal and in hex (ASCII values only).
_DECIMAL_DIGITS = bytes(len(str(b)) for b in range(256))
_HEX_DIGITS = bytes(len(f"{b:x}") for b in range(256))


def _escaped_forms(value: str) -> Iterator[tuple[str, str, int]]:
    """The value's part beyond its public prefix written wholly as escapes, so that the
    common whole-value escapes are found in the text itself (escapes of only part of it are
    left to the decoded views); each with the least length of the whole value so written."""
    private = value[len(public_prefix(value)) :][:ESCAPED_CHARS]
    raw = value.encode()
    if value.isascii() or all(ord(c) <= 0xFFFF for c in value):
        form = "".join(f"\\u{ord(c):04x}" for c in private)
        yield form, UNICODE_ESCAPES, 6 * len(value)
    yield "".join(f"\\x{b:02x}" for b in private.encode()), BYTE_ESCAPES, 4 * len(raw)
    if value.isascii():  # per-byte widths summed at C speed: a 4 KiB key is common
        decimal = 2 * len(raw) + sum(raw.translate(_DECIMAL_DIGITS))  # the ";" is optional
        hexadecimal = 3 * len(raw) + sum(raw.translate(_HEX_DIGITS))
    else:
        decimal = sum(2 + len(str(ord(c))) for c in value)
        hexadecimal = sum(3 + len(f"{ord(c):x}") for c in value)
    yield "".join(f"&#{ord(c)};" for c in private), DECIMAL_ENTITIES, decimal
    yield "".join(f"&#x{ord(c):x};" for c in private), HEX_ENTITIES, hexadecimal


def _encoded_forms(value: str) -> Iterator[tuple[str, str, int]]:
    """The value's encodings (of its first :data:`ENCODED_PREFIX_BYTES`), each with the
    least length of the whole value so encoded."""
    raw = value.encode()
    yield hashlib.sha256(raw).hexdigest(), HEX, 64
    for data in (raw, value.encode("utf-16-le"), value.encode("utf-16-be")):
        yield data[:ENCODED_PREFIX_BYTES].hex(), HEX, 2 * len(data)
        for form in _shifted(data[:ENCODED_PREFIX_BYTES], base64.b64encode, 3, 6):
            yield form, BASE64, 4 * len(data) // 3 - 2
    # Base32 of UTF-16 is left out: no tool writes it, and b32encode is slow pure Python.
    for form in _shifted(raw[:ENCODED_PREFIX_BYTES], base64.b32encode, 5, 5):
        yield form, BASE32, 8 * len(raw) // 5 - 2


def form_needles(value: str) -> list[Needle]:
    """The needles of ``value``'s forms, none shorter than :data:`MIN_NEEDLE_CHARS`; may be
    empty. The first needle is the value's own (kind RAW) when it folds to enough characters.

    Each is cut to its first :data:`HEAD_CHARS`: that is enough to find an occurrence, which
    the keyring then grows to its whole length from the fragment windows.
    """
    out: list[Needle] = []
    own = folded(value)
    if len(own.text) >= MIN_NEEDLE_CHARS:
        lead, trail = own.before(0), own.after(-1)
        for text, kind, pads in (
            (own.text, Kind.RAW, (lead, trail)),
            (fold(value[::-1]), Kind.TRANSFORMED, (trail[::-1], lead[::-1])),
            (fold(codecs.encode(value, "rot13")), Kind.TRANSFORMED, (lead, trail)),
        ):
            complete = len(text) <= HEAD_CHARS
            right = pads[1] if complete else ""
            out.append(Needle(text[:HEAD_CHARS], kind, "", pads[0], right))
    for form, alphabet, least in _encoded_forms(value):
        encoded = fold(form)[:HEAD_CHARS]
        if len(encoded) >= MIN_NEEDLE_CHARS:
            out.append(Needle(encoded, Kind.ENCODED, alphabet, whole=least))
    for form, alphabet, least in _escaped_forms(value):
        escaped = fold(form)
        if len(escaped) >= MIN_NEEDLE_CHARS * 2:  # mostly the escapes' own digits
            out.append(Needle(escaped, Kind.ENCODED, alphabet, whole=least))
    return out
