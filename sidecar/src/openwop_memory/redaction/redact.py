"""SR-1 write-time redaction: the one entry point is :func:`redact_entry`.

What counts as a registered secret (marker ``[REDACTED:<secretId>]``):

- the value, and the value under every disguise the fold of ``fold.py`` removes
  (case, compatibility forms, invisible characters, combining marks, look-alike letters,
  separators between characters);
- its encodings (``needles.py``): hex, base64 and base32 at every alignment inside
  a larger blob, of its UTF-8 and UTF-16 bytes, its SHA-256 digest, its reversal and rot13;
- any fragment of :data:`~.needles.FRAGMENT_CHARS` letters or digits beyond a
  public prefix (``keyring.py``, which searches one text for all of the above);
- anything decoded (``decode.py``): escapes applied to all or part of it, and
  nested or gzipped encodings, up to :data:`MAX_DEPTH` decodings within :data:`DECODE_BUDGET`;
- the same across fields: content and tags are searched as one text, in the order sent.

Well-known credential formats (``credential_patterns.py``) are found too, as
``[REDACTED:pattern:<format>]``. Overlapping hits merge into one marker, named by the longest
secret involved. The smallest original span covering a hit is replaced; a hit that needed
decoding replaces its whole encoded run. Markers already in a text are transparent, so a
secret cannot be hidden by splitting it around one, and redacting twice changes nothing.

After rewriting, the entry is searched again (and rewritten once more if a new hit formed
across a marker); a hit that survives that is reported as ``leaked`` and never stored.

Most entries hold nothing to find: :func:`nothing_to_find` shows it with a few of the full
search's own first steps (a few microseconds for a short note), and the entry is returned
as it is without the rest.
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from openwop_memory_client.wire import MIN_SECRET_CHARS

from .credential_patterns import find_credentials, may_hold_credentials
from .decode import Budget, View, blobs, escape_views, may_hold_blobs, may_hold_escapes
from .keyring import FIELD_SEPARATOR, Hit, Keyring

MAX_DEPTH = 3
DECODE_BUDGET = 256 << 10  # four entries of the default maximum size
_REWRITE_PASSES = 2
_ROOM_OVERLAP = 16
# Up to this many characters, nothing_to_find decodes a text's candidate blobs itself (a
# digest or an identifier in a note); when one decodes to text, the full search decodes it
# again, which only a short text can afford.
_PROBE_CHARS = 4096

PatternPolicy = Literal["off", "rewrite", "reject"]
_MARKER_LEAD = "[REDACTED:"
_MARKER = re.compile(re.escape(_MARKER_LEAD) + r"[^\]\x00-\x1f]{1,160}\]")
EMPTY_KEYRING = Keyring.compile({})


def marker(secret_id: str) -> str:
    return f"{_MARKER_LEAD}{secret_id}]"


def _detect(
    keyring: Keyring,
    text: str,
    patterns: bool,
    depth: int,
    budget: Budget,
    view: View | None = None,
) -> list[Hit]:
    """Every hit in ``text``, in ``text``'s offsets, decoding up to ``MAX_DEPTH`` levels.

    ``text`` is ``view``'s text when it is an escape-decoded view; then only what decoding
    changed is decoded further, the rest having been decoded in the original already.
    """
    hits = keyring.scan(text)
    if patterns:
        hits.extend(Hit(s, e, -1, name, False) for s, e, name in find_credentials(text))
    if depth >= MAX_DEPTH:
        return hits
    covered = _Covered(hits)
    # An encoded run holding only part of a value does not settle the escapes in it: the
    # rest of the value may follow in plain text, and only a view joins the two.
    whole = _Covered([h for h in hits if h.complete])

    def keep(start: int, end: int) -> bool:
        # Inside a hit it is replaced anyway: decoding it again would only cost time.
        return not covered(start, end) and (view is None or view.decoded_within(start, end))

    def keep_escape(start: int, end: int) -> bool:
        return not whole(start, end) and (view is None or view.decoded_within(start, end))

    for inner in escape_views(text, keyring.margin, keep_escape, whole.room):
        for hit in _detect(keyring, inner.text, patterns, depth + 1, budget, inner):
            start, end = inner.original_span(hit.start, hit.end)
            hits.append(Hit(start, end, hit.secret, hit.pattern, True))
    found = list(blobs(text, budget, keep))
    if found:
        # All decodings searched as one text (a call per decoding costs more than the search);
        # a hit inside the decodings of a run stands for the whole run.
        decodings = [(blob, decoded) for blob in found for decoded in blob.texts]
        starts = list(itertools.accumulate((len(d) + 1 for _, d in decodings), initial=0))
        joined = FIELD_SEPARATOR.join(d for _, d in decodings)
        for hit in _detect(keyring, joined, patterns, depth + 1, budget):
            first = bisect_right(starts, hit.start) - 1
            last = bisect_right(starts, hit.end - 1) - 1
            for blob, _ in decodings[first : last + 1]:
                hits.append(Hit(blob.start, blob.end, hit.secret, hit.pattern, True))
    return hits


class _Covered:
    """Whether a span lies inside one of the hits' spans (merged)."""

    def __init__(self, hits: list[Hit]) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for hit in sorted(hits):
            if self._ends and hit.start <= self._ends[-1]:
                self._ends[-1] = max(self._ends[-1], hit.end)
            else:
                self._starts.append(hit.start)
                self._ends.append(hit.end)

    def __call__(self, start: int, end: int) -> bool:
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def room(self, start: int, end: int) -> tuple[int, int]:
        """The gap between hits around ``[start, end)``. A view need not reach past it: what
        lies inside a hit is replaced with it anyway, and a dense text stays cheap."""
        i = bisect_right(self._starts, start) - 1
        floor = self._ends[i] if i >= 0 else 0
        ceiling = self._starts[i + 1] if i + 1 < len(self._starts) else 1 << 62
        # A little way into the hits, so an escape a hit ends inside is still read whole.
        return floor - _ROOM_OVERLAP, ceiling + _ROOM_OVERLAP


class _Span(NamedTuple):
    start: int
    end: int
    label: str
    secret_ids: frozenset[str]
    pattern_ids: frozenset[str]
    disguised: bool


def _merged(keyring: Keyring, hits: list[Hit]) -> list[_Span]:
    """Overlapping hits as one span each, named by the longest secret (else a pattern).

    Touching hits of one secret are one span too when one is disguised (the escaped head of
    a secret and its plain tail); other touching hits stay apart.
    """
    spans: list[_Span] = []
    group: list[Hit] = []
    end = -1
    for hit in sorted(hits):
        touching_same = hit.start == end and any(
            h.secret == hit.secret and (h.disguised or hit.disguised) for h in group
        )
        if group and hit.start >= end and not touching_same:
            spans.append(_span(keyring, group))
            group = []
        group.append(hit)
        end = max(end, hit.end) if len(group) > 1 else hit.end
    if group:
        spans.append(_span(keyring, group))
    return spans


def _span(keyring: Keyring, group: list[Hit]) -> _Span:
    secrets = [keyring.secret(h.secret) for h in group if h.secret >= 0]
    patterns = sorted({"pattern:" + h.pattern for h in group if h.secret < 0})
    label = min(secrets, key=lambda s: (-len(s.value), s.id)).id if secrets else patterns[0]
    return _Span(
        group[0].start,
        max(h.end for h in group),
        marker(label),
        frozenset(s.id for s in secrets),
        # A registered secret that also has a credential's shape is the secret: it is
        # rewritten under its own id, and the credentials policy does not apply to it.
        frozenset() if secrets else frozenset(patterns),
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


class Redacted(NamedTuple):
    """The entry with every secret replaced, what was found where, and whether any survived.

    Immutable; a named tuple rather than a frozen dataclass because every put builds one,
    and a named tuple is built in C (a frozen dataclass sets each field through
    ``object.__setattr__``)."""

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
            at += len(text) + len(FIELD_SEPARATOR)
        joined = FIELD_SEPARATOR.join(fields)
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


def nothing_to_find(keyring: Keyring, text: str, patterns: bool) -> bool:
    """True only when the full search of ``text`` (content and tags joined by
    :data:`FIELD_SEPARATOR`) with ``keyring``, credential formats too if ``patterns``, finds
    nothing, so that :func:`redact_entry` may return the entry as it is. Never raises.

    Why that is sound. The full search, :func:`_detect` at depth 0 on the text with its
    markers blanked, returns the hits of :meth:`Keyring.scan`, of :func:`find_credentials`
    (with patterns), of its escape views and of its blobs; nothing else.

    - A keyring without secrets scans to nothing in any text, and without patterns no
      credential is looked for: no search at any depth can find anything.
    - Otherwise, where :data:`_MARKER` matches nowhere, blanking leaves the text as it is:
      the tests below read the very text the full search reads.
    - :func:`may_hold_escapes` False: :func:`escape_views` yields no view (it is its own
      first test), so no escape is decoded and the decode budget is untouched.
    - :meth:`Keyring.may_match` False: :meth:`Keyring.scan` finds nothing (the same
      automata over the same skeleton, the same verbatim values).
    - :func:`find_credentials` finds nothing (asked only where :func:`may_hold_credentials`
      sees an anchor: with none, it finds nothing; a text longer than :data:`_PROBE_CHARS`
      with an anchor is left to the full search).
    - Then no hit covers anything and the budget is whole, so the full search's call of
      :func:`blobs` is the one made here (a text without a candidate run,
      :func:`may_hold_blobs` False, skips it): no blob means nothing decoded is searched.
      A text longer than :data:`_PROBE_CHARS` with a candidate run is left to the full
      search instead, so that no long text is decoded twice.

    Nothing at depth 0 and nothing decoded: the full search returns no hit. Each test is the
    full search's own function (or its first step), so the two cannot drift apart.
    """
    if not (patterns or len(keyring)):
        return True
    if _MARKER_LEAD in text and _MARKER.search(text) is not None:
        return False
    if may_hold_escapes(text) or keyring.may_match(text):
        return False
    # A long text with an anchor is searched once, by the full search: a text of anchors
    # costs that search milliseconds, which the shortcut would pay twice.
    if (
        patterns
        and may_hold_credentials(text)
        and (len(text) > _PROBE_CHARS or find_credentials(text))
    ):
        return False
    if may_hold_blobs(text):
        if len(text) > _PROBE_CHARS:
            return False
        return next(blobs(text, Budget(DECODE_BUDGET), _everywhere), None) is None
    return True


def _everywhere(start: int, end: int) -> bool:
    return True


def redact_entry(
    keyring: Keyring,
    content: str,
    tags: tuple[str, ...],
    *,
    patterns: PatternPolicy = "rewrite",
) -> Redacted:
    """Redact ``content`` and every tag with ``keyring`` (and credential formats unless
    ``patterns`` is ``off``). Pure; never raises. Text without a secret is returned as is.

    An entry in which :func:`nothing_to_find` shows there is nothing to find costs a few
    microseconds; any other gets :func:`redact_in_full`."""
    if nothing_to_find(keyring, FIELD_SEPARATOR.join((content, *tags)), patterns != "off"):
        return Redacted(content, tuple(tags), (), False)
    return redact_in_full(keyring, content, tags, patterns=patterns)


def redact_in_full(
    keyring: Keyring,
    content: str,
    tags: tuple[str, ...],
    *,
    patterns: PatternPolicy = "rewrite",
) -> Redacted:
    """:func:`redact_entry` without its shortcut: the full search however plain the entry,
    with the same result. Pure; never raises."""
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
    "MIN_SECRET_CHARS",
    "Finding",
    "Keyring",
    "Redacted",
    "marker",
    "nothing_to_find",
    "redact_entry",
    "redact_in_full",
]
