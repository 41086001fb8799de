"""SR-1 write-time redaction: the one entry point is :func:`redact_entry`.

What counts as a registered secret (marker ``[REDACTED:<secretId>]``):

- the value, and the value under every disguise the fold of ``redaction_fold.py`` removes
  (case, compatibility forms, invisible characters, combining marks, look-alike letters,
  separators between characters);
- its encodings (``redaction_needles.py``): hex, base64 and base32 at every alignment inside
  a larger blob, of its UTF-8 and UTF-16 bytes, its SHA-256 digest, its reversal and rot13,
  and any fragment of :data:`~.redaction_needles.FRAGMENT_CHARS` letters or digits beyond a
  public prefix;
- anything decoded (``redaction_decode.py``): escapes applied to all or part of it, and
  nested or gzipped encodings, up to :data:`MAX_DEPTH` decodings within :data:`DECODE_BUDGET`;
- the same across fields: content and tags are searched as one text, in the order sent.

Well-known credential formats (``credential_patterns.py``) are found too, as
``[REDACTED:pattern:<format>]``. Overlapping hits merge into one marker, named by the longest
secret involved. The smallest original span covering a hit is replaced; a hit that needed
decoding replaces its whole encoded run. Markers already in a text are transparent, so a
secret cannot be hidden by splitting it around one, and redacting twice changes nothing.

After rewriting, the entry is searched again (and rewritten once more if a new hit formed
across a marker); a hit that survives that is reported as ``leaked`` and never stored.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import ahocorasick_rs

from .credential_patterns import find_credentials
from .redaction_decode import Budget, blobs, escape_views
from .redaction_fold import Skeleton, skeleton
from .redaction_needles import CHUNK_CHARS, MIN_NEEDLE_CHARS, Kind, Needle, needles_for

MIN_SECRET_CHARS = 8
MAX_DEPTH = 3
DECODE_BUDGET = 1 << 20
_REWRITE_PASSES = 2

PatternPolicy = Literal["off", "rewrite", "reject"]
_MARKER = re.compile(r"\[REDACTED:[^\]\x00-\x1f]{1,160}\]")
_FIELD_SEPARATOR = "\0"


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


class _Secret(NamedTuple):
    value: str
    id: str


class _Hit(NamedTuple):
    start: int
    end: int
    secret: int  # index into the keyring's secrets, or -1 for a credential pattern
    pattern: str
    disguised: bool


class Keyring:
    """A compiled keyring (value → secret id). Compile once per keyring change; immutable."""

    def __init__(self, ids_by_value: Mapping[str, str]) -> None:
        self.ids_by_value: Mapping[str, str] = {
            v: i for v, i in ids_by_value.items() if len(v) >= MIN_SECRET_CHARS
        }
        self._secrets = tuple(_Secret(v, i) for v, i in sorted(self.ids_by_value.items()))
        table: dict[str, list[tuple[int, Needle]]] = {}
        self._literal: list[int] = []  # values too short once folded: matched verbatim
        for index, secret in enumerate(self._secrets):
            needles = needles_for(secret.value)
            if not needles or needles[0].kind is not Kind.RAW:
                self._literal.append(index)
            for needle in needles:
                table.setdefault(needle.folded, []).append((index, needle))
        self._needles = list(table.values())
        # One automaton over UTF-8 needles serves both skeleton kinds (see _matches).
        self._keys = list(table)
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(
                [k.encode() for k in self._keys],
                # Builds in a fifth of the DFA's time and scans fast enough (~150 MB/s).
                implementation=ahocorasick_rs.Implementation.ContiguousNFA,
            )
            if table
            else None
        )
        # A secret may be spread with separators; look this far around an escape for it.
        self.margin = 4 * max((len(s.value) for s in self._secrets), default=0)

    @classmethod
    def compile(cls, ids_by_value: Mapping[str, str]) -> Keyring:
        return cls(ids_by_value)

    def __len__(self) -> int:
        return len(self.ids_by_value)

    def secret(self, index: int) -> _Secret:
        return self._secrets[index]

    def _matches(self, skel: Skeleton) -> list[tuple[int, int, int]]:
        """(needle index, start, end) in skeleton characters."""
        if self._automaton is None:
            return []
        if isinstance(skel.data, bytes):
            return self._automaton.find_matches_as_indexes(skel.data, overlapping=True)
        data = skel.data.encode()
        found = self._automaton.find_matches_as_indexes(data, overlapping=True)
        # Byte offsets to characters; needles are whole characters, so both ends are boundaries.
        return [(k, len(data[:s].decode()), len(data[:e].decode())) for k, s, e in found]

    def scan(self, text: str) -> list[_Hit]:
        """Hits of registered secrets in ``text`` itself (no decoding)."""
        if not self._secrets:
            return []
        skel = skeleton(text)
        hits = []
        for key, s_start, s_end in self._matches(skel):
            start, end = skel.origin(s_start), skel.origin(s_end - 1) + 1
            if not isinstance(skel.data, bytes):
                end = _past_marks(text, end)
            for index, needle in self._needles[key]:
                hits.append(self._widen(text, start, end, index, needle))
        if len(hits) > 1:
            hits.extend(self._bridges(hits))
        for index in self._literal:
            value = self._secrets[index].value
            at = text.find(value)
            while at >= 0:
                hits.append(_Hit(at, at + len(value), index, "", False))
                at = text.find(value, at + 1)
        return hits

    def _bridges(self, hits: list[_Hit]) -> Iterator[_Hit]:
        """Spans joining hits of one long value's chunks, which may leave gaps between them."""
        by_secret: dict[int, list[_Hit]] = {}
        for hit in hits:
            by_secret.setdefault(hit.secret, []).append(hit)
        for index, mine in by_secret.items():
            value = self._secrets[index].value
            if len(mine) < 2 or len(value) <= CHUNK_CHARS:
                continue
            start, end = min(h.start for h in mine), max(h.end for h in mine)
            if end - start <= 4 * len(value):
                yield _Hit(start, end, index, "", any(h.disguised for h in mine))

    def _widen(self, text: str, start: int, end: int, index: int, needle: Needle) -> _Hit:
        if needle.kind is Kind.RAW:
            value = self._secrets[index].value
            at = text.find(value, max(0, start - len(value)), end + len(value))
            if 0 <= at <= start and at + len(value) >= end:
                return _Hit(at, at + len(value), index, "", False)
        elif needle.kind is Kind.ENCODED:
            while start > 0 and text[start - 1] in needle.alphabet:
                start -= 1
            while end < len(text) and text[end] in needle.alphabet:
                end += 1
        elif needle.kind is Kind.FRAGMENT and text[start:end] in self._secrets[index].value:
            return _Hit(start, end, index, "", False)
        return _Hit(start, end, index, "", True)


EMPTY_KEYRING = Keyring.compile({})


def _past_marks(text: str, end: int) -> int:
    """``end`` moved past combining marks and format characters that belong to the hit."""
    while end < len(text) and unicodedata.category(text[end]) in ("Mn", "Me", "Cf"):
        end += 1
    return end


def _detect(keyring: Keyring, text: str, patterns: bool, depth: int, budget: Budget) -> list[_Hit]:
    """Every hit in ``text``, in ``text``'s offsets, decoding up to ``MAX_DEPTH`` levels."""
    hits = keyring.scan(text)
    if patterns:
        hits.extend(_Hit(s, e, -1, name, False) for s, e, name in find_credentials(text))
    if depth >= MAX_DEPTH:
        return hits
    for view in escape_views(text, keyring.margin):
        for hit in _detect(keyring, view.text, patterns, depth + 1, budget):
            start, end = view.original_span(hit.start, hit.end)
            hits.append(_Hit(start, end, hit.secret, hit.pattern, True))
    for blob in blobs(text, budget):
        inner = {
            (h.secret, h.pattern)
            for decoded in blob.texts
            for h in _detect(keyring, decoded, patterns, depth + 1, budget)
        }
        hits.extend(_Hit(blob.start, blob.end, s, p, True) for s, p in inner)
    return hits


class _Span(NamedTuple):
    start: int
    end: int
    label: str
    secret_ids: frozenset[str]
    pattern_ids: frozenset[str]
    disguised: bool


def _merged(keyring: Keyring, hits: list[_Hit]) -> list[_Span]:
    """Overlapping hits as one span each, named by the longest secret (else a pattern)."""
    spans: list[_Span] = []
    group: list[_Hit] = []
    end = -1
    for hit in sorted(hits):
        if group and hit.start >= end:
            spans.append(_span(keyring, group))
            group = []
        group.append(hit)
        end = max(end, hit.end) if len(group) > 1 else hit.end
    if group:
        spans.append(_span(keyring, group))
    return spans


def _span(keyring: Keyring, group: list[_Hit]) -> _Span:
    secrets = [keyring.secret(h.secret) for h in group if h.secret >= 0]
    patterns = sorted({"pattern:" + h.pattern for h in group if h.secret < 0})
    label = min(secrets, key=lambda s: (-len(s.value), s.id)).id if secrets else patterns[0]
    return _Span(
        group[0].start,
        max(h.end for h in group),
        marker(label),
        frozenset(s.id for s in secrets),
        frozenset(patterns),
        any(h.disguised for h in group if h.secret >= 0),
    )


@dataclass(frozen=True)
class Finding:
    """What was found in one field (``content`` or ``tags[i]``).

    ``kind`` is ``secret`` (registered secrets; ``secret_ids`` are their ids) or ``pattern``
    (credential formats; ids are ``pattern:<format>``). ``disguised`` is False only when
    every secret hit in the field was the value written verbatim (or a verbatim fragment).
    """

    field: str
    kind: Literal["secret", "pattern"]
    secret_ids: frozenset[str]
    disguised: bool


@dataclass(frozen=True)
class Redacted:
    """The entry with every secret replaced, what was found where, and whether any survived."""

    content: str
    tags: tuple[str, ...]
    findings: tuple[Finding, ...]
    leaked: bool


class _Fields:
    """Content and tags searched as one text, so a secret split across them is found."""

    def __init__(self, fields: list[str]) -> None:
        self.fields = fields
        self.bounds: list[tuple[int, int]] = []
        at = 0
        for text in fields:
            self.bounds.append((at, at + len(text)))
            at += len(text) + len(_FIELD_SEPARATOR)
        joined = _FIELD_SEPARATOR.join(fields)
        # Markers are transparent: blanked (same length) so offsets stay the same.
        self.text = _MARKER.sub(lambda m: "\0" * len(m.group()), joined)

    def rewrite(self, spans: list[_Span]) -> list[tuple[int, _Span, bool]]:
        """Replace ``spans``; return (field index, span, crosses fields) per piece."""
        pieces: list[tuple[int, _Span, bool]] = []
        for i, (lo, hi) in enumerate(self.bounds):
            inside = [s for s in spans if s.start < hi and s.end > lo]
            if not inside:
                continue
            out, at = [], lo
            for span in inside:
                start, end = max(span.start, lo), min(span.end, hi)
                out.append(self.fields[i][at - lo : start - lo])
                out.append(span.label)
                at = end
                pieces.append((i, span, span.start < lo or span.end > hi))
            out.append(self.fields[i][at - lo :])
            self.fields[i] = "".join(out)
        return pieces


def _field_name(index: int) -> str:
    return "content" if index == 0 else f"tags[{index - 1}]"


def _findings(pieces: Iterable[tuple[int, _Span, bool]]) -> tuple[Finding, ...]:
    found: dict[tuple[int, str], tuple[set[str], bool]] = {}
    for index, span, crosses in pieces:
        if span.secret_ids:
            ids, disguised = found.setdefault((index, "secret"), (set(), False))
            ids |= span.secret_ids
            found[(index, "secret")] = (ids, disguised or span.disguised or crosses)
        if span.pattern_ids:
            ids, _ = found.setdefault((index, "pattern"), (set(), False))
            ids |= span.pattern_ids
    return tuple(
        Finding(_field_name(index), "secret" if kind == "secret" else "pattern", frozenset(ids), d)
        for (index, kind), (ids, d) in sorted(found.items())
    )


def redact_entry(
    keyring: Keyring,
    content: str,
    tags: tuple[str, ...],
    *,
    patterns: PatternPolicy = "rewrite",
) -> Redacted:
    """Redact ``content`` and every tag with ``keyring`` (and credential formats unless
    ``patterns`` is ``off``). Pure; never raises. Text without a secret is returned as is."""
    fields = _Fields([content, *tags])
    pieces: list[tuple[int, _Span, bool]] = []
    use_patterns = patterns != "off"
    for _ in range(_REWRITE_PASSES):
        hits = _detect(keyring, fields.text, use_patterns, 0, Budget(DECODE_BUDGET))
        if not hits:
            break
        pieces.extend(fields.rewrite(_merged(keyring, hits)))
        fields = _Fields(fields.fields)
    else:
        leaked = bool(_detect(keyring, fields.text, use_patterns, 0, Budget(DECODE_BUDGET)))
        return Redacted(fields.fields[0], tuple(fields.fields[1:]), _findings(pieces), leaked)
    return Redacted(fields.fields[0], tuple(fields.fields[1:]), _findings(pieces), False)


__all__ = [
    "EMPTY_KEYRING",
    "MIN_NEEDLE_CHARS",
    "MIN_SECRET_CHARS",
    "Finding",
    "Keyring",
    "Redacted",
    "marker",
    "redact_entry",
]
