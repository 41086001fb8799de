"""Decoded views of a text, for secrets that are only visible after decoding.

Two kinds, both found with one regex pass and both mapping back to the original text:

- *escape regions*: stretches around escape sequences (percent-encoding, HTML entities,
  ``\\u``/``\\x``/octal escapes, quoted-printable), decoded in place. A hit inside maps back
  to the smallest original span covering it, escapes included.
- *blobs*: runs that look like base64, base32 or hex (line-wrapped too), decoded at every
  alignment and gunzipped when they hold gzip. Only decodings that look like text are
  searched; a hit inside covers the whole run.

Decoding is bounded by a :class:`Budget` of decoded bytes shared by one redaction, so a
decompression bomb or a wall of base64 costs a fixed amount of work.
"""

from __future__ import annotations

import base64
import binascii
import functools
import html
import re
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

MAX_GZIP_OUTPUT = 256 * 1024

# Escapes, one regex per leading character so that each scans at C speed for its literal
# (one alternation of them all tries every branch at every "=" of ordinary code), and a run
# of escapes is one token. Each is its leading character and what follows it, so that no
# escape can start with anything else (may_hold_escapes relies on it).
_ESCAPE = (
    ("%", r"[0-9A-Fa-f]{2}"),
    ("&", r"(?:#[0-9]{1,7};?|#[xX][0-9A-Fa-f]{1,6};?|[A-Za-z][A-Za-z0-9]{1,31};)"),
    ("\\", r"(?:u\{[0-9A-Fa-f]{1,6}\}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|x[0-9A-Fa-f]{2}|[0-7]{1,3})"),
    ("=", r"(?:[0-9A-F]{2}|\r?\n)"),
)
_ESCAPE_STARTS = tuple(lead for lead, _ in _ESCAPE)
_ESCAPE_RUNS = tuple(
    re.compile(f"{one}(?:{one})*") for one in (re.escape(lead) + rest for lead, rest in _ESCAPE)
)
_LEAD_RUNS = tuple(zip(_ESCAPE_STARTS, _ESCAPE_RUNS, strict=True))
# Backslash escapes that put a letter into the raw skeleton (JSON's \n of a PEM key):
# decoded inside a view, but they do not open one.
_LETTER_ESCAPES = re.compile(r"\\[nrtbf](?:\\[nrtbf])*")
_BACKSLASH = re.compile(
    r"\\(?:u\{(?P<u1>[0-9A-Fa-f]{1,6})\}|u(?P<u2>[0-9A-Fa-f]{4})|U(?P<u3>[0-9A-Fa-f]{8})"
    r"|x(?P<x>[0-9A-Fa-f]{2})|(?P<o>[0-7]{1,3})|(?P<c>[nrtbf]))"
)
_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}
# A run of escapes that stands for control characters only (checked without decoding).
_CONTROL_RUN = re.compile(
    r"(?:%[01][0-9A-Fa-f]|%7[Ff])+"
    r"|(?:\\(?:x[01][0-9A-Fa-f]|x7[Ff]|0?[0-3]?[0-7](?![0-7])|u00[01][0-9A-Fa-f]|u007[Ff]))+"
    r"|(?:=[01][0-9A-F]|=7F|=\r?\n)+"
)
_BLOB_NOISE = re.compile(r"\\r|\\n|[\r\n=]")
_HEX_ONLY = re.compile(r"[0-9A-Fa-f]+")
_BASE32_ONLY = re.compile(r"[A-Z2-7]+")
_PUNCTUATION = str.maketrans("", "", "+/_-")
_PRINTABLE = bytes(range(0x20, 0x7F)) + b"\t\n\r"


class Budget:
    """Decoded bytes one redaction may still produce."""

    def __init__(self, limit: int) -> None:
        self.remaining = limit

    def take(self, size: int) -> bool:
        """Charge ``size`` bytes; False (and nothing charged) when that would overdraw."""
        if size > self.remaining:
            return False
        self.remaining -= size
        return True


def bytes_text(data: bytes) -> str:
    """Decoded bytes as text: UTF-8 if valid, else Latin-1 (so ASCII inside binary shows)."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return data.decode("latin-1")


_DECIMAL_ENTITIES = re.compile(r"(?:&#[1-9][0-9]{1,5};)+")
_DIGITS = re.compile(r"[0-9]+")
_SOFT_BREAK = re.compile(r"=\r?\n")
# At most two \\u escapes: too little of a value to matter if it stays in the cache.
_CACHED_RUN_CHARS = 12
_ONLY_UNITS = re.compile(r"(?:\\u[0-9A-Fa-f]{4})+")
_ONLY_BYTES = re.compile(r"(?:\\x[0-9A-Fa-f]{2})+")


def _backslash_text(run: str) -> str:
    """A run of backslash escapes decoded: byte escapes (``\\x``, octal) as UTF-8 where
    valid, ``\\u`` pairs as UTF-16 (a lone surrogate becomes U+FFFD, never reaching the
    matcher)."""
    # The common runs, all \\u or all \\x, decode in C.
    if _ONLY_UNITS.fullmatch(run):
        units_text = run.encode().decode("unicode_escape")
        return units_text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if _ONLY_BYTES.fullmatch(run):
        return bytes_text(bytes.fromhex(run.replace("\\x", "")))
    out: list[str] = []
    data = bytearray()
    units: list[int] = []

    def flush() -> None:
        if data:
            out.append(bytes_text(bytes(data)))
            data.clear()
        if units:
            chars = "".join(chr(u) if u <= 0x10FFFF else "\ufffd" for u in units)
            out.append(chars.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))
            units.clear()

    for m in _BACKSLASH.finditer(run):
        unit = m["u1"] or m["u2"] or m["u3"]
        if unit:
            if data:
                flush()
            units.append(int(unit, 16))
            continue
        if units:
            flush()
        if m["x"]:
            data.append(int(m["x"], 16))
        elif m["o"]:
            data.append(int(m["o"], 8) & 0xFF)
        else:
            flush()
            out.append(_SIMPLE[m["c"]])
    flush()
    return "".join(out)


def _entity_char(number: str) -> str:
    """A decimal character reference's character; U+FFFD for a surrogate or out of range,
    as html.unescape gives (a lone surrogate must not reach the matcher)."""
    code = int(number)
    return "\ufffd" if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF else chr(code)


def _decode(kind: int, run: str) -> str:
    """A run of escapes of one kind (an index into :data:`_ESCAPE`, or -1 for the letter
    escapes) decoded. Short runs (a few characters, never a secret's worth) are cached:
    source code repeats the same escapes over and over."""
    if len(run) <= _CACHED_RUN_CHARS:
        return _decode_short(kind, run)
    return _decode_run(kind, run)


@functools.lru_cache(maxsize=4096)
def _decode_short(kind: int, run: str) -> str:
    return _decode_run(kind, run)


def _decode_run(kind: int, run: str) -> str:
    if kind == 0:
        return bytes_text(bytes.fromhex(run.replace("%", "")))
    if kind == 1:
        decimal = _DECIMAL_ENTITIES.fullmatch(run)
        if decimal:  # the common run, without html.unescape's per-entity callback
            return "".join(map(_entity_char, _DIGITS.findall(run)))
        return html.unescape(run)
    if kind == 3:
        return bytes_text(bytes.fromhex(_SOFT_BREAK.sub("", run).replace("=", "")))
    return _backslash_text(run)


class _Token(NamedTuple):
    start: int
    end: int
    kind: int  # an index into _ESCAPE, or -1 for letter escapes
    opens: bool  # whether it opens a region: it could hide a letter or a digit


def _tokens(text: str) -> list[_Token]:
    """Every escape run of ``text``, in order, none overlapping (decoded only when a view
    needs it)."""
    found = [(m.start(), m.end(), kind) for kind, regex in enumerate(_ESCAPE_RUNS)
             for m in regex.finditer(text)]  # fmt: skip
    found += [(m.start(), m.end(), -1) for m in _LETTER_ESCAPES.finditer(text)]
    tokens: list[_Token] = []
    for start, end, kind in sorted(found):
        if tokens and start < tokens[-1].end:
            continue
        # Control characters are no part of a secret (the %02 of a format string, \0).
        opens = kind >= 0 and not _CONTROL_RUN.fullmatch(text, start, end)
        tokens.append(_Token(start, end, kind, opens))
    return tokens


@dataclass(frozen=True)
class View:
    """A decoded stretch of a text and the way back to the text's offsets."""

    text: str
    offset: int  # where the decoded stretch starts in the original text
    _view_starts: list[int]
    _spans: list[tuple[int, int, bool]]  # per segment: original start, end, is a token

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The smallest original span covering view ``[start, end)``; tokens count whole."""
        return self._locate(start, first=True), self._locate(end - 1, first=False)

    def decoded_within(self, start: int, end: int) -> bool:
        """Whether view ``[start, end)`` holds anything decoded (else the original has it
        as is, and it was searched there)."""
        i = bisect_right(self._view_starts, start) - 1
        while i < len(self._spans) and self._view_starts[i] < end:
            if self._spans[i][2]:
                return True
            i += 1
        return False

    def _locate(self, position: int, *, first: bool) -> int:
        i = bisect_right(self._view_starts, position) - 1
        o_start, o_end, token = self._spans[i]
        if token:
            return self.offset + (o_start if first else o_end)
        at = o_start + position - self._view_starts[i]
        return self.offset + (at if first else at + 1)


def _view(text: str, lo: int, hi: int, tokens: list[_Token]) -> View:
    """``text[lo:hi]`` with ``tokens`` (those inside it) decoded."""
    pieces: list[str] = []
    view_starts: list[int] = []
    spans: list[tuple[int, int, bool]] = []
    length, at = 0, lo
    for token in tokens:
        if token.start > at:
            pieces.append(text[at : token.start])
            view_starts.append(length)
            spans.append((at - lo, token.start - lo, False))
            length += token.start - at
        decoded = _decode(token.kind, text[token.start : token.end])
        if decoded:
            pieces.append(decoded)
            view_starts.append(length)
            spans.append((token.start - lo, token.end - lo, True))
            length += len(decoded)
        at = token.end
    if at < hi or not pieces:
        pieces.append(text[at:hi])
        view_starts.append(length)
        spans.append((at - lo, hi - lo, False))
    return View("".join(pieces), lo, view_starts, spans)


Keep = Callable[[int, int], bool]
Room = Callable[[int, int], tuple[int, int]]
# Regions this close are one view. Each view is searched on its own (every search has a
# fixed cost of its own, tens of µs), so a text of escapes each standing apart
# ("\\x41 " * 13000) would cost that 13,000 times; joined, at most one view per this
# many characters. A wider view only adds text, searched as it is in the original.
_VIEW_GAP = 256


def may_hold_escapes(text: str) -> bool:
    """False only when :func:`escape_views` yields nothing for ``text``, whatever its other
    arguments: a view is only opened by a token of one of :data:`_ESCAPE_RUNS` (the letter
    escapes never open one), so a text none of them matches has none. Costs a substring
    test per escape's leading character, and a regex search only where one occurs."""
    # A loop, not any() over a generator: this runs on every put, and the loop is cheaper.
    for lead, regex in _LEAD_RUNS:  # noqa: SIM110
        if lead in text and regex.search(text) is not None:
            return True
    return False


def escape_views(text: str, margin: int, keep: Keep, room: Room) -> Iterator[View]:
    """Decoded views of the stretches of ``text`` within ``margin`` of an escape that could
    hide a letter or digit and that ``keep(start, end)`` accepts, each inside the
    ``room(start, end)`` it has."""
    if not may_hold_escapes(text):
        return
    tokens = _tokens(text)
    regions: list[list[int]] = []
    for token in tokens:
        if not token.opens or not keep(token.start, token.end):
            continue
        floor, ceiling = room(token.start, token.end)
        lo = max(0, token.start - margin, floor)
        hi = min(len(text), token.end + margin, ceiling)
        if regions and lo <= regions[-1][1] + _VIEW_GAP:
            regions[-1][1] = max(regions[-1][1], hi)
        else:
            regions.append([lo, hi])
    starts = [t.start for t in tokens]
    for lo, hi in regions:
        inside = tokens[bisect_left(starts, lo) : bisect_left(starts, hi)]
        # A token cut by the region's edge is left out (read as is).
        yield _view(text, lo, hi, [t for t in inside if t.end <= hi])


@dataclass(frozen=True)
class Blob:
    start: int
    end: int
    texts: list[str]  # the decodings that look like text


def _looks_textual(data: bytes) -> bool:
    return len(data.translate(None, _PRINTABLE)) * 10 <= len(data)


def _as_text(data: bytes) -> str | None:
    """``data`` as text if it looks like text (ASCII, UTF-16 or UTF-8), else None."""
    if _looks_textual(data):
        return data.decode("latin-1")
    if data.count(0) * 3 >= len(data):
        codec = "utf-16-le" if data[1::2].count(0) >= data[0::2].count(0) else "utf-16-be"
        return data[: len(data) // 2 * 2].decode(codec, "replace")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    return text if sum(c.isprintable() for c in text) * 10 >= len(text) * 9 else None


def _pad(part: str, group: int, complete: tuple[int, ...]) -> str:
    """``part`` cut to a length that ends a whole character and padded to ``group``; the
    tail of a run is kept, as it may hold the end of the secret."""
    while len(part) % group not in complete:
        part = part[:-1]
    return part + "=" * (-len(part) % group)


# RFC 4648 base32 digits as int()'s base-32 digits ("base32hex").
_TO_BASE32HEX = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", "0123456789ABCDEFGHIJKLMNOPQRSTUV"
)


def _b32decode(padded: str) -> bytes:
    """``base64.b32decode`` of a padded run of :data:`_BASE32_ONLY` characters, the same
    bytes in linear time at C speed. The standard one is a Python loop over every 8
    characters: a 64 KiB run of capital letters (``"SK" * 32000``) took it 65 ms."""
    digits = padded.rstrip("=").translate(_TO_BASE32HEX)
    if not digits:
        return b""
    bits = 5 * len(digits)
    # int() parses a power-of-two base in linear time, without the digit-count limit.
    return (int(digits, 32) >> (bits % 8)).to_bytes(bits // 8, "big")


def _decodings(compact: str) -> Iterator[bytes]:
    if len(compact) >= 32 and _HEX_ONLY.fullmatch(compact):
        for shift in (0, 1):
            part = compact[shift:]
            yield bytes.fromhex(part[: len(part) // 2 * 2])
    if _BASE32_ONLY.fullmatch(compact):
        for shift in range(8):
            part = compact[shift:]
            yield _b32decode(_pad(part, 8, (0, 2, 4, 5, 7)))
    letters = compact.translate(_PUNCTUATION)
    if letters.isdigit() or (letters.isalpha() and (letters.islower() or letters.isupper())):
        return  # words, identifiers and numbers, not base64
    normal = compact.replace("-", "+").replace("_", "/")
    for shift in range(4):
        part = normal[shift:]
        try:
            yield base64.b64decode(_pad(part, 4, (0, 2, 3)))
        except binascii.Error:
            continue


def _gunzip(data: bytes, budget: Budget) -> bytes | None:
    limit = min(MAX_GZIP_OUTPUT, budget.remaining)
    try:
        out = zlib.decompressobj(wbits=31).decompress(data, limit)
    except zlib.error:
        return None
    return out if budget.take(len(out)) else None


_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-"
_RUN_MAP = bytes(0x61 if c in _ALPHABET else 0x20 for c in range(256))
_CLASS_MAP = bytes(
    b"u"[0] if chr(c).isupper() and c < 128 else
    b"l"[0] if chr(c).islower() and c < 128 else
    b"d"[0] if chr(c).isdigit() and c < 128 else
    b"p"[0] if chr(c) in "+/_-" else 0x20
    for c in range(256)
)  # fmt: skip
_MIN_RUN = 16
_RUN_SEED = b"a" * _MIN_RUN
_WRAP = re.compile(r"={0,2}(?:\r?\n|\\r\\n|\\n)(?=[A-Za-z0-9+/_-])")
_WRAP_START = ("=", "\r", "\n", "\\")
_NOISY = re.compile(r"[=\r\n\\]")
_TAIL = re.compile(r"={0,2}(?:(?:\r?\n|\\r\\n|\\n)[A-Za-z0-9+/_-]{1,15}={0,2})?")


def _runs(text: str, mapped: bytes) -> Iterator[tuple[int, int]]:
    """Runs of at least 16 base64 characters, line-wrapped ones joined, end padding included.

    ``mapped`` is ``text`` as :data:`_RUN_MAP` maps it: finding runs there is one C-level
    pass, several times faster than a regex.
    """
    at = mapped.find(_RUN_SEED)
    while at >= 0:
        start = at
        while True:
            end = mapped.find(b" ", at)
            end = len(mapped) if end < 0 else end
            wrap = _WRAP.match(text, end) if text[end : end + 1] in _WRAP_START else None
            if wrap is None or not mapped.startswith(_RUN_SEED, wrap.end()):
                break
            at = wrap.end()
        if text[end : end + 1] in _WRAP_START:
            end = _TAIL.match(text, end).end()  # type: ignore[union-attr]
        yield start, end
        at = mapped.find(_RUN_SEED, end)


def _plausible(classes: bytes, start: int, end: int) -> bool:
    """Cheap test (counts over a class map) that a run could be an encoding rather than an
    identifier, a word or a number."""
    upper, lower = classes.count(b"u", start, end), classes.count(b"l", start, end)
    digits, punctuation = classes.count(b"d", start, end), classes.count(b"p", start, end)
    if upper and lower:
        return digits > 0 or upper + lower >= 32
    # Single-case or no letters: only hex (32+) or base32 (upper case), neither with + / _ -.
    return not punctuation and (upper > 0 or lower + digits >= 32)


def _candidate_runs(text: str, latin: bytes, mapped: bytes) -> Iterator[tuple[int, int]]:
    """The runs of ``text`` that could be an encoding (:func:`_runs`, :func:`_plausible`),
    given :func:`_run_map` of it."""
    if mapped.find(_RUN_SEED) < 0:  # _runs would find none: spare the class map
        return
    classes = latin.translate(_CLASS_MAP)
    for start, end in _runs(text, mapped):
        if _plausible(classes, start, end):
            yield start, end


def _run_map(text: str) -> tuple[bytes, bytes]:
    """``text`` as one byte per character (Latin-1, "?" beyond), and that mapped by
    :data:`_RUN_MAP`."""
    latin = text.encode("latin-1", "replace")
    return latin, latin.translate(_RUN_MAP)


def may_hold_blobs(text: str) -> bool:
    """False only when :func:`blobs` yields nothing for ``text``, whatever its other
    arguments: every blob is one of the same candidate runs. For text without a run of
    :data:`_MIN_RUN` characters of an encoding's alphabet, this costs one byte map."""
    latin, mapped = _run_map(text)
    if mapped.find(_RUN_SEED) < 0:
        return False
    return next(_candidate_runs(text, latin, mapped), None) is not None


def blobs(text: str, budget: Budget, keep: Keep) -> Iterator[Blob]:
    """The runs of ``text`` that ``keep(start, end)`` accepts and that decode to something
    textual, with those decodings."""
    for start, end in _candidate_runs(text, *_run_map(text)):
        if not keep(start, end):
            continue
        run = text[start:end]
        compact = _BLOB_NOISE.sub("", run) if _NOISY.search(run) else run
        texts = []
        for data in _decodings(compact):
            if not budget.take(len(data)):
                return
            if data[:2] == b"\x1f\x8b":
                unzipped = _gunzip(data, budget)
                data = unzipped if unzipped is not None else b""
            text_form = _as_text(data) if data else None
            if text_form:
                texts.append(text_form)
        if texts:
            yield Blob(start, end, texts)
