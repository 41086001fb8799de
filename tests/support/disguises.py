"""Ways a worker (or a prompt-injected model) may disguise a secret before writing it to memory.

:data:`DISGUISES` maps a name to a function ``secret -> disguised text``. Every function is
deterministic given the secret: where a disguise needs a random choice (which characters get
a zero-width space, the random bytes around a secret embedded in a base64 blob, ...) it draws
it from a :class:`random.Random` seeded with the secret and the disguise's name, so a failing
case can be rebuilt from its name and secret alone.

The redactor promises to replace every one of these by ``[REDACTED:<id>]`` (see
``redaction/redact.py``); the tests in ``test_redaction_disguises*.py`` and
``test_redaction_properties.py`` hold it to that. :func:`encoded_forms` lists the forms a
stored or logged copy of a secret could take, for scanning files byte by byte.

A convention every disguise keeps, so that a test can check that prose around it survives:
separators, invisible characters and combining marks are only inserted *between* the
characters of the secret, never before its first or after its last, so the span a
redactor must replace is well defined. (``json_string`` alone adds something around the
value: the two quotes of a JSON string literal.)
"""

from __future__ import annotations

import base64
import codecs
import gzip
import hashlib
import json
import random
from collections.abc import Callable
from urllib.parse import quote

Disguise = Callable[[str], str]

# Public prefixes of well-known key formats. They are not secret (they name the format), so a
# fragment only counts from the first character after one of them.
PUBLIC_PREFIXES = ("sk-ant-api03-", "sk-proj-", "github_pat_", "ghp_", "gho_", "xoxb-", "sk-")

# A fragment of a secret the redactor must catch holds at least this many letters and digits
# beyond the public prefix (docs/security.md); separators inside it do not count.
MIN_FRAGMENT_ALNUM = 12


def _rng(secret: str, salt: str) -> random.Random:
    """A generator seeded by ``salt`` and ``secret`` only: same inputs, same choices."""
    return random.Random(hashlib.sha256(f"{salt}\x00{secret}".encode()).digest())


def _utf8(secret: str) -> bytes:
    return secret.encode("utf-8")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _interleave(secret: str, escape: Callable[[str], str]) -> str:
    """Every other character escaped (the 2nd, 4th, ...), the rest left as it is: an escape
    applied to part of the value, so that no run of more than one raw character remains."""
    return "".join(escape(ch) if i % 2 else ch for i, ch in enumerate(secret))


def _head(secret: str, escape: Callable[[str], str]) -> str:
    """The first half escaped, the second half raw: an escape applied to part of the value."""
    half = len(secret) // 2
    return "".join(map(escape, secret[:half])) + secret[half:]


def _between(secret: str, pick: Callable[[int], str]) -> str:
    """``pick(i)`` inserted after character ``i`` for every interior gap (never at the ends)."""
    out: list[str] = []
    for i, ch in enumerate(secret):
        out.append(ch)
        if i < len(secret) - 1:
            out.append(pick(i))
    return "".join(out)


# -- escapes of one character -------------------------------------------------------------


def _backslash_u(ch: str) -> str:
    """``\\uXXXX`` as JSON, JavaScript and Python write it (a surrogate pair above U+FFFF)."""
    return json.dumps(ch, ensure_ascii=True)[1:-1] if ord(ch) > 0xFFFF else f"\\u{ord(ch):04x}"


def _backslash_x(ch: str) -> str:
    return "".join(f"\\x{b:02x}" for b in _utf8(ch))


def _octal(ch: str) -> str:
    return "".join(f"\\{b:03o}" for b in _utf8(ch))


def _quoted_printable(ch: str) -> str:
    return "".join(f"={b:02X}" for b in _utf8(ch))


def _percent(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in _utf8(ch))


def _html_decimal(ch: str) -> str:
    return f"&#{ord(ch)};"


def _html_hex(ch: str) -> str:
    return f"&#x{ord(ch):x};"


# -- character-level disguises ------------------------------------------------------------


def alternating_case(secret: str) -> str:
    """Upper and lower case, alternating by position."""
    return "".join(ch.upper() if i % 2 else ch.lower() for i, ch in enumerate(secret))


def rot13(secret: str) -> str:
    """ROT13 of the ASCII letters; everything else as it is."""
    return codecs.encode(secret, "rot13")


def fullwidth(secret: str) -> str:
    """Printable ASCII as its fullwidth compatibility form (U+FF01..U+FF5E; NFKC undoes it)."""
    return "".join(chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch for ch in secret)


def math_bold(secret: str) -> str:
    """ASCII letters and digits as MATHEMATICAL BOLD compatibility characters (NFKC undoes it)."""
    out = []
    for ch in secret:
        if "A" <= ch <= "Z":
            out.append(chr(0x1D400 + ord(ch) - ord("A")))
        elif "a" <= ch <= "z":
            out.append(chr(0x1D41A + ord(ch) - ord("a")))
        elif "0" <= ch <= "9":
            out.append(chr(0x1D7CE + ord(ch) - ord("0")))
        else:
            out.append(ch)
    return "".join(out)


ZERO_WIDTH_SPACE = "\u200b"
ZERO_WIDTH_JOINER = "\u200d"
SOFT_HYPHEN = "\u00ad"
BOM = "\ufeff"  # ZERO WIDTH NO-BREAK SPACE
INVISIBLES = (ZERO_WIDTH_SPACE, "\u200c", ZERO_WIDTH_JOINER, "\u2060", SOFT_HYPHEN, BOM)


def invisible_mix(secret: str) -> str:
    """One to three invisible or format characters in about half of the interior gaps."""
    rng = _rng(secret, "invisible_mix")
    return _between(
        secret,
        lambda _: (
            "".join(rng.choices(INVISIBLES, k=rng.randint(1, 3))) if rng.random() < 0.5 else ""
        ),
    )


COMBINING_MARKS = ("\u0301", "\u0300", "\u0308", "\u0327", "\u0335", "\u0336", "\u20d7")


def combining_marks(secret: str) -> str:
    """A combining mark after about two thirds of the characters (never after the last one)."""
    rng = _rng(secret, "combining_marks")
    return _between(secret, lambda _: rng.choice(COMBINING_MARKS) if rng.random() < 0.67 else "")


# Written as escapes: the look-alikes are indistinguishable in an editor, which is the point.
HOMOGLYPHS_CYRILLIC = {
    "a": "\u0430",  # CYRILLIC SMALL LETTER A
    "e": "\u0435",  # CYRILLIC SMALL LETTER IE
    "o": "\u043e",  # CYRILLIC SMALL LETTER O
    "p": "\u0440",  # CYRILLIC SMALL LETTER ER
    "c": "\u0441",  # CYRILLIC SMALL LETTER ES
    "x": "\u0445",  # CYRILLIC SMALL LETTER HA
    "i": "\u0456",  # CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I
}
HOMOGLYPHS_CYRILLIC_UPPER = {
    "A": "\u0410",  # CYRILLIC CAPITAL LETTER A
    "B": "\u0412",  # CYRILLIC CAPITAL LETTER VE
    "E": "\u0415",  # CYRILLIC CAPITAL LETTER IE
    "K": "\u041a",  # CYRILLIC CAPITAL LETTER KA
    "M": "\u041c",  # CYRILLIC CAPITAL LETTER EM
    "H": "\u041d",  # CYRILLIC CAPITAL LETTER EN
    "O": "\u041e",  # CYRILLIC CAPITAL LETTER O
    "P": "\u0420",  # CYRILLIC CAPITAL LETTER ER
    "C": "\u0421",  # CYRILLIC CAPITAL LETTER ES
    "T": "\u0422",  # CYRILLIC CAPITAL LETTER TE
    "X": "\u0425",  # CYRILLIC CAPITAL LETTER HA
}
HOMOGLYPHS_GREEK = {
    "o": "\u03bf",  # GREEK SMALL LETTER OMICRON
    "a": "\u03b1",  # GREEK SMALL LETTER ALPHA
}


def _homoglyphs(table: dict[str, str]) -> Disguise:
    def disguise(secret: str) -> str:
        return "".join(table.get(ch, ch) for ch in secret)

    return disguise


def homoglyph_mixed(secret: str) -> str:
    """About half of the letters that have a Cyrillic or Greek look-alike replaced by it."""
    rng = _rng(secret, "homoglyph_mixed")
    out = []
    for ch in secret:
        choices = [
            t[ch]
            for t in (HOMOGLYPHS_CYRILLIC, HOMOGLYPHS_CYRILLIC_UPPER, HOMOGLYPHS_GREEK)
            if ch in t
        ]
        out.append(rng.choice(choices) if choices and rng.random() < 0.5 else ch)
    return "".join(out)


def _groups(secret: str, size: int) -> list[str]:
    return [secret[i : i + size] for i in range(0, len(secret), size)]


MIXED_SEPARATORS = (" ", ".", "-", "_", ",", "/", ":", ";", "\n", "\t", "  ", ". ")


def mixed_separators(secret: str) -> str:
    """A separator (space, punctuation, newline or tab) in most interior gaps."""
    rng = _rng(secret, "mixed_separators")
    return _between(secret, lambda _: rng.choice(MIXED_SEPARATORS) if rng.random() < 0.8 else "")


# -- encodings ------------------------------------------------------------------------------


def embedded_base64(
    secret: str, align: int, *, urlsafe: bool = False, wrap: int | None = None
) -> str:
    """The secret's UTF-8 bytes inside random bytes, base64-encoded as one blob.

    The secret starts at a byte offset ``≡ align (mod 3)``, so for ``align`` 1 and 2 the
    base64 of the secret on its own appears nowhere in the blob. ``wrap`` breaks the blob
    into lines of that many characters (MIME uses 76, PEM 64), joined by ``\\n``.
    """
    rng = _rng(secret, f"embedded_base64/{align}/{urlsafe}/{wrap}")
    raw = rng.randbytes(24 + align) + _utf8(secret) + rng.randbytes(29)
    text = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode("ascii")
    if wrap:
        text = "\n".join(text[i : i + wrap] for i in range(0, len(text), wrap))
    return text


def embedded_base32(secret: str, align: int) -> str:
    """Like :func:`embedded_base64` for base32 (RFC 4648), whose groups are 5 bytes:
    ``align`` 0 to 4."""
    rng = _rng(secret, f"embedded_base32/{align}")
    raw = rng.randbytes(20 + align) + _utf8(secret) + rng.randbytes(17)
    return base64.b32encode(raw).decode("ascii")


def gzip_base64(secret: str) -> str:
    """gzip (mtime 0, so deterministic) of the UTF-8 bytes, then base64."""
    return _b64(gzip.compress(_utf8(secret), mtime=0))


# -- fragments ------------------------------------------------------------------------------


def public_prefix(secret: str) -> str:
    """The longest of :data:`PUBLIC_PREFIXES` the secret starts with, or ``""``."""
    return max((p for p in PUBLIC_PREFIXES if secret.startswith(p)), key=len, default="")


def alnum_count(text: str) -> int:
    """How many letters and digits ``text`` holds: what a fragment's length is counted in."""
    return sum(ch.isalnum() for ch in text)


def alnum_piece(secret: str, start: int, count: int) -> str:
    """The shortest piece of ``secret`` that starts at ``start`` and holds ``count`` letters
    and digits, or ``""`` if the secret ends first."""
    seen = 0
    for end in range(start, len(secret)):
        seen += secret[end].isalnum()
        if seen == count:
            return secret[start : end + 1]
    return ""


def _first_alnum(secret: str, start: int) -> int:
    while start < len(secret) and not secret[start].isalnum():
        start += 1
    return start


def fragment(secret: str, count: int = MIN_FRAGMENT_ALNUM + 2, offset: int = 2) -> str:
    """A verbatim piece of the secret holding ``count`` letters and digits, from the first
    letter or digit ``offset`` characters after its public prefix; the whole secret when it
    is too short for that."""
    start = _first_alnum(secret, len(public_prefix(secret)) + offset)
    return alnum_piece(secret, start, count) or secret


def fragment_with_prefix(secret: str) -> str:
    """The public prefix (if any) and what follows it up to :data:`MIN_FRAGMENT_ALNUM` letters
    and digits: exactly the shortest fragment that counts, with the prefix in front."""
    prefix = public_prefix(secret)
    piece = alnum_piece(secret, len(prefix), MIN_FRAGMENT_ALNUM)
    return prefix + piece if piece and len(prefix + piece) < len(secret) else secret


def fragment_tail(secret: str) -> str:
    """The shortest tail of the secret holding 14 letters and digits and starting with one,
    when that leaves out more than the public prefix."""
    prefix = len(public_prefix(secret))
    for start in range(len(secret) - 1, prefix, -1):
        tail = secret[start:]
        if alnum_count(tail) == MIN_FRAGMENT_ALNUM + 2 and tail[0].isalnum():
            return tail
    return secret


# -- the table ------------------------------------------------------------------------------

CASE_DISGUISES = frozenset({"upper", "lower", "swapcase", "alternating_case"})
"""Disguises that only change letter case: a test must compare case-insensitively."""

FRAGMENT_DISGUISES = frozenset({"fragment_middle", "fragment_with_prefix", "fragment_tail"})
"""Disguises that write a verbatim piece of the secret: like the value written as is, they
are not *disguised* in the sense of ``Finding.disguised`` (docs/security.md, "Policies")."""


def expect_disguised(name: str, secret: str, text: str) -> bool:
    """What ``Finding.disguised`` must say of ``text`` = ``DISGUISES[name](secret)``: False
    when it holds the value or a fragment of it verbatim, True when seeing the secret took
    decoding, unfolding or joining."""
    return secret not in text and name not in FRAGMENT_DISGUISES


DISGUISES: dict[str, Disguise] = {
    # Identity: the raw value, the baseline every other row is compared with.
    "raw": lambda s: s,
    # Case.
    "upper": str.upper,
    "lower": str.lower,
    "swapcase": str.swapcase,
    "alternating_case": alternating_case,
    # Order and simple ciphers.
    "reversed": lambda s: s[::-1],
    "rot13": rot13,
    # NFKC compatibility forms.
    "fullwidth": fullwidth,
    "math_bold": math_bold,
    # Invisible and format characters.
    "zero_width_space": lambda s: _between(s, lambda _: ZERO_WIDTH_SPACE),
    "zero_width_joiner": lambda s: _between(s, lambda _: ZERO_WIDTH_JOINER),
    "soft_hyphen": lambda s: _between(s, lambda _: SOFT_HYPHEN),
    "bom": lambda s: _between(s, lambda _: BOM),
    "invisible_mix": invisible_mix,
    # Combining marks.
    "combining_marks": combining_marks,
    # Look-alike letters.
    "homoglyph_cyrillic": _homoglyphs(HOMOGLYPHS_CYRILLIC),
    "homoglyph_cyrillic_upper": _homoglyphs(HOMOGLYPHS_CYRILLIC_UPPER),
    "homoglyph_greek": _homoglyphs(HOMOGLYPHS_GREEK),
    "homoglyph_mixed": homoglyph_mixed,
    # Separators between characters.
    "spaced": lambda s: " ".join(s),
    "dotted": lambda s: ".".join(s),
    "dashed_groups": lambda s: " - ".join(_groups(s, 4)),
    "newline_groups": lambda s: "\n".join(_groups(s, 5)),
    "mixed_separators": mixed_separators,
    # Base64 of the value.
    "base64": lambda s: _b64(_utf8(s)),
    "base64_nopad": lambda s: _b64(_utf8(s)).rstrip("="),
    "base64url": lambda s: base64.urlsafe_b64encode(_utf8(s)).decode("ascii"),
    "base64url_nopad": lambda s: base64.urlsafe_b64encode(_utf8(s)).decode("ascii").rstrip("="),
    # The value inside a larger blob, at every byte alignment.
    "base64_blob_align0": lambda s: embedded_base64(s, 0),
    "base64_blob_align1": lambda s: embedded_base64(s, 1),
    "base64_blob_align2": lambda s: embedded_base64(s, 2),
    "base64url_blob_align1": lambda s: embedded_base64(s, 1, urlsafe=True),
    "base64_blob_wrap76": lambda s: embedded_base64(s, 2, wrap=76),
    "base64_blob_wrap64": lambda s: embedded_base64(s, 1, wrap=64),
    "base32_blob_align0": lambda s: embedded_base32(s, 0),
    "base32_blob_align1": lambda s: embedded_base32(s, 1),
    "base32_blob_align2": lambda s: embedded_base32(s, 2),
    "base32_blob_align3": lambda s: embedded_base32(s, 3),
    "base32_blob_align4": lambda s: embedded_base32(s, 4),
    # Hex, percent-encoding, JSON, digest.
    "hex_lower": lambda s: _utf8(s).hex(),
    "hex_upper": lambda s: _utf8(s).hex().upper(),
    "percent": lambda s: "".join(map(_percent, s)),
    "percent_interleaved": lambda s: _interleave(s, _percent),
    "json_string": lambda s: json.dumps(s, ensure_ascii=True),
    "sha256_hex": lambda s: hashlib.sha256(_utf8(s)).hexdigest(),
    # HTML entities and escape sequences, on all or part of the value.
    "html_decimal": lambda s: "".join(map(_html_decimal, s)),
    "html_hex": lambda s: "".join(map(_html_hex, s)),
    "html_interleaved": lambda s: _interleave(s, _html_decimal),
    "backslash_u": lambda s: "".join(map(_backslash_u, s)),
    "backslash_u_interleaved": lambda s: _interleave(s, _backslash_u),
    "backslash_u_head": lambda s: _head(s, _backslash_u),
    "backslash_x": lambda s: "".join(map(_backslash_x, s)),
    "backslash_x_interleaved": lambda s: _interleave(s, _backslash_x),
    "octal": lambda s: "".join(map(_octal, s)),
    "octal_interleaved": lambda s: _interleave(s, _octal),
    "quoted_printable": lambda s: "".join(map(_quoted_printable, s)),
    "quoted_printable_interleaved": lambda s: _interleave(s, _quoted_printable),
    # UTF-16 bytes, then hex or base64.
    "utf16le_hex": lambda s: s.encode("utf-16-le").hex(),
    "utf16be_hex": lambda s: s.encode("utf-16-be").hex(),
    "utf16le_base64": lambda s: _b64(s.encode("utf-16-le")),
    "utf16be_base64": lambda s: _b64(s.encode("utf-16-be")),
    # Nested encodings, up to depth 3.
    "base64_of_base64": lambda s: _b64(_b64(_utf8(s)).encode("ascii")),
    "hex_of_base64": lambda s: _b64(_utf8(s)).encode("ascii").hex(),
    "base64_of_hex": lambda s: _b64(_utf8(s).hex().encode("ascii")),
    "hex_of_hex": lambda s: _utf8(s).hex().encode("ascii").hex(),
    "base64_triple": lambda s: _b64(_b64(_b64(_utf8(s)).encode("ascii")).encode("ascii")),
    "gzip_base64": gzip_base64,
    # Verbatim fragments of MIN_FRAGMENT_ALNUM letters and digits or more, prefix not counted.
    "fragment_middle": fragment,
    "fragment_with_prefix": fragment_with_prefix,
    "fragment_tail": fragment_tail,
}


def split_evenly(secret: str, parts: int) -> list[str]:
    """``secret`` cut into ``parts`` consecutive non-empty pieces whose lengths differ by at
    most one."""
    if not 1 <= parts <= len(secret):
        raise ValueError(f"cannot cut {len(secret)} characters into {parts} pieces")
    size, extra = divmod(len(secret), parts)
    pieces, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        pieces.append(secret[start:end])
        start = end
    return pieces


def split_across_fields(
    secret: str, parts: int, *, before: str = "", after: str = "", in_content: bool = True
) -> tuple[str, list[str]]:
    """The secret cut into ``parts`` pieces spread over an entry's fields, in order.

    With ``in_content`` the content is ``before`` followed by the first piece and each further
    piece is a tag; without it the content is just ``before`` and every piece is a tag. The
    last tag carries ``after`` behind its piece. Returns ``(content, tags)``; the pieces read
    in the order sent (content first, then tags by index) spell the secret.
    """
    pieces = split_evenly(secret, parts)
    if in_content:
        content, tagged = before + pieces[0], pieces[1:]
    else:
        content, tagged = before, pieces
    if not tagged:
        raise ValueError("at least one piece must go into a tag")
    return content, [*tagged[:-1], tagged[-1] + after]


# -- what a stored or logged copy of a secret could look like -------------------------------


def encoded_forms(secret: str) -> dict[str, bytes]:
    """Every form in which the bytes of a file could hold ``secret``, by name.

    The raw value (UTF-8 and UTF-16 both byte orders), base64 standard and URL-safe with and
    without padding, hex in both cases, percent-encoded (every byte, and :func:`quote` with
    nothing safe), JSON-escaped (``\\uXXXX`` for every character, and ``json.dumps``), the
    SHA-256 hex digest in both cases, and UTF-16 bytes as hex and base64.
    """
    raw = _utf8(secret)
    forms: dict[str, bytes] = {"raw": raw}
    for name, data in (
        ("", raw),
        ("utf16le ", secret.encode("utf-16-le")),
        ("utf16be ", secret.encode("utf-16-be")),
    ):
        if name:
            forms[f"{name}raw"] = data
        std, url = base64.b64encode(data), base64.urlsafe_b64encode(data)
        forms[f"{name}base64"] = std
        forms[f"{name}base64 unpadded"] = std.rstrip(b"=")
        forms[f"{name}base64url"] = url
        forms[f"{name}base64url unpadded"] = url.rstrip(b"=")
        forms[f"{name}hex"] = data.hex().encode()
        forms[f"{name}HEX"] = data.hex().upper().encode()
    forms["percent every byte"] = "".join(map(_percent, secret)).encode()
    forms["percent every byte, lower"] = "".join(map(_percent, secret)).lower().encode()
    forms["percent quote()"] = quote(secret, safe="").encode()
    forms["json \\u every character"] = "".join(map(_backslash_u, secret)).encode()
    forms["json.dumps"] = json.dumps(secret, ensure_ascii=True)[1:-1].encode()
    digest = hashlib.sha256(raw).hexdigest()
    forms["sha256 hex"] = digest.encode()
    forms["SHA256 HEX"] = digest.upper().encode()
    return forms


def windows(text: str, size: int) -> set[str]:
    """Every substring of ``text`` of ``size`` characters (none if ``text`` is shorter)."""
    return {text[i : i + size] for i in range(len(text) - size + 1)}


def surviving_windows(
    secret: str,
    texts: list[str] | tuple[str, ...],
    size: int = 8,
    *,
    casefold: bool = False,
    public: str = "",
) -> list[str]:
    """The ``size``-character substrings of ``secret`` that occur in any of ``texts``
    (compared case-insensitively with ``casefold``); empty means nothing of it survived.

    Substrings that lie wholly inside ``public`` (a public prefix the secret starts with,
    e.g. from :func:`public_prefix`) are not counted: they name a key format, not a key.
    """
    if not secret.startswith(public):
        raise ValueError("public must be a prefix of the secret")
    if casefold:
        secret, public, texts = secret.casefold(), public.casefold(), [t.casefold() for t in texts]
    needles = {
        secret[i : i + size] for i in range(max(0, len(public) - size + 1), len(secret) - size + 1)
    }
    return sorted(w for w in needles if any(w in t for t in texts))


# -- realistic, randomly generated keys -----------------------------------------------------

_URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_ALNUM = _URLSAFE[:62]
_PUNCTUATION = "!#$%&()*+,-./:;<=>?@[]^_{|}~"
# Uncommon words, so that no fragment of a passphrase occurs in ordinary prose or code.
_WORDS = [
    "quokka",
    "zephyr",
    "marmalade",
    "obsidian",
    "kumquat",
    "fjord",
    "wombat",
    "nebula",
    "tundra",
    "saffron",
    "glacier",
    "pelican",
    "origami",
    "juniper",
    "basalt",
    "lantern",
    "mistral",
    "cobalt",
    "tamarind",
    "yodel",
]
KEY_KINDS = (
    "openai",
    "github",
    "anthropic",
    "hex40",
    "base64",
    "uuid",
    "passphrase",
    "nonascii",
    "slack",
    "password",
)


def fake_key(rng: random.Random, kind: str) -> str:
    """A random value shaped like a real key of ``kind`` (one of :data:`KEY_KINDS`).

    Generated, never copied from anywhere: these are not and never were credentials.
    """

    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choices(alphabet, k=n))

    match kind:
        case "openai":
            return "sk-proj-" + pick(_URLSAFE, 48)
        case "github":
            return "ghp_" + pick(_ALNUM, 36)
        case "anthropic":
            return "sk-ant-api03-" + pick(_URLSAFE, 40)
        case "hex40":
            return pick("0123456789abcdef", 40)
        case "base64":
            return _b64(rng.randbytes(24))
        case "uuid":
            h = rng.randbytes(16).hex()
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        case "passphrase":
            return " ".join(rng.sample(_WORDS, 4)) + f" {rng.randint(10, 99)}"
        case "nonascii":
            first = rng.choice(("pässwörd", "geheimnis", "schlüssel", "contraseña"))
            second = rng.choice(("ключ", "пароль", "секрет", "κλειδί"))
            return f"{first}-{second}-{rng.randint(1000, 9999)}{rng.choice('!?#')}"
        case "slack":
            return f"xoxb-{pick('0123456789', 12)}-{pick('0123456789', 13)}-{pick(_ALNUM, 24)}"
        case "password":
            while True:  # realistic passwords have letters, digits and punctuation
                value = pick(_ALNUM + _PUNCTUATION, 20)
                if len(set(value)) >= 10 and alnum_count(value) >= 16:
                    return value
        case _:
            raise ValueError(f"unknown key kind {kind!r}")


def fake_keys(rng: random.Random, count: int) -> dict[str, str]:
    """``count`` distinct keys cycling through :data:`KEY_KINDS`, by id (``<kind>-<n>``)."""
    keys: dict[str, str] = {}
    for n in range(count):
        kind = KEY_KINDS[n % len(KEY_KINDS)]
        keys[f"{kind}-{n // len(KEY_KINDS) + 1}"] = fake_key(rng, kind)
    if len(set(keys.values())) != count:
        raise AssertionError("fake_keys drew the same value twice")  # never, at these sizes
    return keys
