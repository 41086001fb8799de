"""Well-known credential formats, found even when no run registered them as secrets.

Contract: :func:`find_credentials` returns ``(start, end, format)`` for every credential in
a text, in code-point offsets, sorted and non-overlapping (on overlap the longer span wins,
then the format listed first in :data:`PATTERNS`). It is pure and never raises. The
redactor replaces each span with ``[REDACTED:pattern:<format>]``. A span never covers
characters outside the credential; formats recognised only by their context (a key name
before the value) report just the value, the regex group named ``secret``.

The formats are :data:`PATTERNS`, one entry each: the name the marker shows, the literal
anchors (one of them occurs in every match) and the regex of the whole shape, with a
comment where a vendor's format needs one. A new format is a new entry there, and cases
for it in ``tests/unit/test_credential_patterns.py``.

Cost: every text costs one Aho-Corasick pass (two SIMD-prefiltered automata, for anchors
of at least four characters and for shorter ones) over the literal ``anchors`` of all
formats; a format's regex runs only where one of its anchors occurs, so a text without
anchors is never touched by a regex. Keep the long anchors at 64 or fewer: beyond that
the prefilter is off and the pass is several times slower.

False positives: each shape is as narrow as the vendor's public description allows (prefix,
alphabet, length), and a fixed-length shape must not sit inside a longer run of its own
alphabet, so ordinary identifiers, hex or base64 blobs, and decoys sharing a public prefix
but not the length or alphabet do not match. Guards are on the side(s) where a longer
token could continue: a prefix could be the tail of an identifier (left guard), a
fixed-length body could be the head of a longer run (right guard); a variable-length body
is greedy and needs no right guard.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

import ahocorasick_rs

__all__ = [
    "PATTERNS",
    "CredentialPattern",
    "credential_attempts",
    "find_credentials",
    "may_hold_credentials",
]


@dataclass(frozen=True)
class CredentialPattern:
    """One credential format.

    ``regex`` is tried with ``match`` at every offset from ``lookback`` characters before an
    anchor hit up to the hit itself; the first match that covers the anchor counts. Guards
    are lookarounds inside ``regex``, which ``match`` evaluates against the whole text.
    """

    name: str  # kebab-case format name used in the marker
    anchors: tuple[str, ...]  # literal strings, at least one occurs in every match
    regex: re.Pattern[str]  # the full shape; a group named "secret" is the part replaced
    lookback: int = 0  # how far before an anchor a match may start


# Left guards: the credential must not continue an identifier or a blob of its alphabet.
_L_ALNUM = r"(?<![A-Za-z0-9])"
_L_WORD = r"(?<![A-Za-z0-9_])"
_L_B64URL = r"(?<![A-Za-z0-9_-])"
# Right guards, for fixed-length bodies: the body must not be the head of a longer run.
_R_ALNUM = r"(?![A-Za-z0-9])"
_R_WORD = r"(?![A-Za-z0-9_])"
_R_B64URL = r"(?![A-Za-z0-9_-])"

_B64URL = "[A-Za-z0-9_-]"
_JWT = rf"eyJ{_B64URL}{{7,}}\.eyJ{_B64URL}{{7,}}\.{_B64URL}{{16,}}"

# PEM: the type line names the key kind, and END must repeat it.
_PEM_BEGIN = (
    r"-----BEGIN[ ](?P<kind>(?:(?:RSA|EC|DSA|OPENSSH|ENCRYPTED|PGP)[ ])?"
    r"PRIVATE[ ]KEY(?:[ ]BLOCK)?)-----"
)
# A block's body: base64, line breaks (real, or escaped once or more as in JSON) and the
# punctuation of RFC 1421 / OpenPGP armor headers. Lazy, so it stops at the first END; it
# never runs into another BEGIN, so a text of many unterminated headers costs linear time.
_PEM_BODY = r"(?:[A-Za-z0-9+/=\s\\:,.()_@<>]|-(?!----BEGIN[ ])){16,}?"
_PEM_END = r"-----END[ ](?P=kind)-----"
# Without END (a truncated text) only what is surely key material is taken: armor headers,
# then base64 lines separated by line breaks alone, each at least 16 characters long so the
# prose after the key stays; a shorter piece only where the text or a quoted string ends.
_PEM_BREAK = r"[ \t]*(?:\r?\n|(?:\\+r)?\\+n)+[ \t]*"
_PEM_HEADER = rf"(?:{_PEM_BREAK}[A-Za-z][A-Za-z-]{{1,30}}:[ ][^\r\n\\]*)*"
_PEM_LINES = (
    rf"(?={_PEM_BREAK}[A-Za-z0-9+/=]{{32}})(?:{_PEM_BREAK}[A-Za-z0-9+/=]{{16,}})+"
    rf"(?:{_PEM_BREAK}[A-Za-z0-9+/=]{{1,15}}(?=\s*\Z|[\"'`\\]))?"
)

# RFC 3986 userinfo characters (unreserved, pct-encoded, sub-delims); the quote is left
# out so that a URL inside quotes cannot take the quote along.
_USERINFO = r"[A-Za-z0-9._~!$&()*+,;=%-]"


def _pattern(
    name: str, anchors: tuple[str, ...], regex: str, lookback: int = 0
) -> CredentialPattern:
    return CredentialPattern(name, anchors, re.compile(regex), lookback)


# Order matters only for ties (equal spans): a specific format beats a context format.
PATTERNS: tuple[CredentialPattern, ...] = (
    _pattern(
        "aws-access-key-id",
        ("AKIA", "ASIA", "ABIA", "ACCA"),
        rf"{_L_ALNUM}(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{{16}}{_R_ALNUM}",
    ),
    _pattern(
        "github-token",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
        # GitHub asks integrators to accept longer tokens than today's 40 characters, so
        # the body is open-ended; the stateless installation token embeds a JWT.
        rf"{_L_WORD}(?:ghs_[0-9]+_{_JWT}|gh[pousr]_[A-Za-z0-9]{{36,}})",
    ),
    _pattern(
        "github-fine-grained-token",
        ("github_pat_",),
        rf"{_L_WORD}github_pat_[A-Za-z0-9]{{22}}_[A-Za-z0-9]{{59}}{_R_WORD}",
    ),
    _pattern(
        "gitlab-token",
        (
            "glpat-",
            "gldt-",
            "glrt-",
            "glptt-",
            "glft-",
            "glimt-",
            "glagent-",
            "gloas-",
            "glcbt-",
            "glsoat-",
            "glffct-",
        ),
        rf"{_L_B64URL}gl(?:pat|dt|rt|ptt|ft|imt|agent|oas|cbt|soat|ffct)-{_B64URL}{{20,}}"
        r"(?:\.[0-9a-z]{2}\.[0-9a-z]{7,12})?",
    ),
    _pattern(
        "openai-api-key",
        ("sk-proj-", "sk-svcacct-", "sk-admin-", "sk-None-", "T3BlbkFJ"),
        # Legacy keys are found by their fixed infix (base64 of "OpenAI"), 23 characters in.
        rf"{_L_B64URL}sk-(?:(?:proj|svcacct|admin|None)-{_B64URL}{{40,}}"
        rf"|[A-Za-z0-9]{{20}}T3BlbkFJ[A-Za-z0-9]{{20}}{_R_B64URL})",
        lookback=23,
    ),
    _pattern(
        "anthropic-api-key",
        ("sk-ant-",),
        rf"{_L_B64URL}sk-ant-[a-z]+[0-9]{{2}}-{_B64URL}{{80,}}",
    ),
    _pattern(
        "slack-token",
        ("xox", "xapp-"),
        rf"{_L_B64URL}(?:xox[abcprs]|xoxe(?:\.xox[bp])?|xapp)-[0-9]+-"
        r"[0-9A-Za-z][0-9A-Za-z-]{18,}[0-9A-Za-z]",
    ),
    _pattern(
        "slack-webhook-url",
        ("hooks.slack.com/",),
        r"(?<![A-Za-z0-9.-])(?:https?://)?hooks\.slack\.com/(?:services|workflows|triggers)"
        r"/T[A-Z0-9]{6,}(?:/[A-Za-z0-9]+){1,2}/[A-Za-z0-9]{20,}",
        lookback=len("https://"),
    ),
    _pattern(
        "stripe-secret-key",
        ("k_live_", "k_test_"),
        rf"{_L_WORD}[sr]k_(?:live|test)_[A-Za-z0-9]{{24,}}{_R_WORD}",
        lookback=1,
    ),
    _pattern(
        "stripe-webhook-secret",
        ("whsec_",),
        rf"{_L_WORD}whsec_[A-Za-z0-9+/]{{32,}}={{0,2}}",
    ),
    _pattern(
        "private-key",
        ("-----BEGIN ",),
        rf"{_PEM_BEGIN}(?:{_PEM_BODY}{_PEM_END}|{_PEM_HEADER}{_PEM_LINES})",
    ),
    _pattern("jwt", ("eyJ",), rf"{_L_B64URL}{_JWT}"),
    _pattern("google-api-key", ("AIza",), rf"{_L_B64URL}AIza{_B64URL}{{35}}{_R_B64URL}"),
    _pattern(
        "google-oauth-client-secret",
        ("GOCSPX-",),
        rf"{_L_B64URL}GOCSPX-{_B64URL}{{28}}{_R_B64URL}",
    ),
    _pattern(
        "azure-storage-account-key",
        ("AccountKey=",),
        r"AccountKey=(?P<secret>[A-Za-z0-9+/]{86}==)(?![A-Za-z0-9+/=])",
    ),
    _pattern(
        "twilio-api-key",
        ("SK",),
        rf"{_L_WORD}SK[0-9a-f]{{32}}{_R_ALNUM}",
    ),
    _pattern(
        "sendgrid-api-key",
        ("SG.",),
        rf"{_L_B64URL}SG\.{_B64URL}{{22}}\.{_B64URL}{{43}}{_R_B64URL}",
    ),
    _pattern("npm-token", ("npm_",), rf"{_L_WORD}npm_[A-Za-z0-9]{{36}}{_R_WORD}"),
    _pattern(
        "pypi-token",
        # The fixed head is the macaroon's location, "pypi.org" or "test.pypi.org".
        ("pypi-AgE",),
        rf"{_L_B64URL}pypi-(?:AgEIcHlwaS5vcmc|AgENdGVzdC5weXBpLm9yZw){_B64URL}{{50,}}",
    ),
    _pattern("huggingface-token", ("hf_",), rf"{_L_WORD}hf_[A-Za-z0-9]{{34}}{_R_WORD}"),
    _pattern(
        "digitalocean-token",
        ("_v1_",),
        rf"{_L_WORD}do[opr]_v1_[a-f0-9]{{64}}{_R_ALNUM}",
        lookback=3,
    ),
    _pattern(
        "shopify-token",
        ("shp",),
        rf"{_L_WORD}shp(?:at|ca|pa|ss)_[a-fA-F0-9]{{32}}{_R_ALNUM}",
    ),
    _pattern(
        "databricks-token",
        ("dapi",),
        rf"{_L_WORD}dapi[a-f0-9]{{32}}(?:-[0-9]+)?{_R_ALNUM}",
    ),
    _pattern(
        "docker-hub-token",
        ("dckr_",),
        rf"{_L_B64URL}dckr_(?:pat|oat)_{_B64URL}{{24,}}",
    ),
    _pattern(
        "linear-api-key",
        ("lin_api_",),
        rf"{_L_WORD}lin_api_[A-Za-z0-9]{{40}}{_R_WORD}",
    ),
    _pattern(
        "hashicorp-vault-token",
        ("hvs.", "hvb."),
        # "." in the guard: "obj.hvs.<long attribute>" must not look like a token.
        rf"(?<![A-Za-z0-9_.-])hv[sb]\.{_B64URL}{{90,}}",
    ),
    _pattern(
        "telegram-bot-token",
        (":AA",),
        # Only digits are excluded on the left: the Bot API puts "bot" right before it.
        rf"(?<![0-9])[0-9]{{8,10}}:AA{_B64URL}{{33}}{_R_B64URL}",
        lookback=10,
    ),
    _pattern(
        "aws-secret-access-key",
        ("secret_access_key", "SECRET_ACCESS_KEY", "SecretAccessKey", "secretAccessKey"),
        # Quotes may be escaped (JSON inside a JSON string).
        r"(?:secret_access_key|SECRET_ACCESS_KEY|[Ss]ecretAccessKey)(?:\\*[\"'])?[ \t]*"
        r"(?::=|=>|=|:)[ \t]*(?:\\*[\"'])?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    ),
    _pattern(
        "url-credentials",
        ("://",),
        # An unescaped "@" in the password is a common slip: the last "@" ends it. The host
        # may be empty, as in libpq's "postgresql://user:pw@/db?host=/run/postgresql".
        rf"(?<=[A-Za-z0-9])://{_USERINFO}*:"
        rf"(?P<secret>(?:{_USERINFO}|:|@(?=(?:{_USERINFO}|:)*@))+)@(?=[A-Za-z0-9\[/])",
    ),
)


@dataclass(frozen=True)
class _Compiled:
    pattern: CredentialPattern
    # For a pattern with lookback: the regex behind a lazy prefix of up to `lookback` of any
    # characters, so one call finds the leftmost start instead of one call per offset.
    reach: re.Pattern[str] | None
    secret: bool  # report the "secret" group, not the whole match


def _compiled(pattern: CredentialPattern) -> _Compiled:
    reach = None
    if pattern.lookback:
        reach = re.compile(rf"(?s:.{{0,{pattern.lookback}}}?)(?P<_whole>{pattern.regex.pattern})")
    return _Compiled(pattern, reach, "secret" in pattern.regex.groupindex)


@dataclass(frozen=True)
class _Scanner:
    """One automaton over some anchors; ``users[i]``: the patterns of its anchor ``i``."""

    automaton: ahocorasick_rs.BytesAhoCorasick
    anchors: tuple[str, ...]
    users: tuple[tuple[_Compiled, ...], ...]
    # The scan reports non-overlapping hits only, so an anchor that can start inside (or at)
    # another's hit is looked for there explicitly: ``inside[i]`` = (offset, anchor) pairs.
    inside: tuple[tuple[tuple[int, int], ...], ...]


def _scanner(users_by_anchor: dict[str, list[_Compiled]]) -> _Scanner:
    anchors = tuple(users_by_anchor)
    if not all(a.isascii() for a in anchors):  # the scan runs on one byte per code point
        raise ValueError("credential pattern anchors must be ASCII")
    inside = []
    for i, a in enumerate(anchors):
        pairs = []
        for j, b in enumerate(anchors):
            for offset in range(len(a)):
                tail = a[offset:]
                if (offset or i != j) and (tail.startswith(b) or b.startswith(tail)):
                    pairs.append((offset, j))
        inside.append(tuple(pairs))
    # Leftmost-first without overlaps lets the automaton use its SIMD prefilter (Teddy).
    automaton = ahocorasick_rs.BytesAhoCorasick(
        [a.encode("ascii") for a in anchors], matchkind=ahocorasick_rs.MatchKind.LeftmostFirst
    )
    users = tuple(tuple(users_by_anchor[a]) for a in anchors)
    return _Scanner(automaton, anchors, users, tuple(inside))


def _scanners() -> tuple[_Scanner, ...]:
    # The prefilter keys on the first bytes of every anchor and gives up beyond 64 anchors;
    # a few short anchors among many long ones make every position a candidate. Split by
    # length, the two scan ordinary text many times faster than one over all anchors.
    long_: dict[str, list[_Compiled]] = {}
    short: dict[str, list[_Compiled]] = {}
    for pattern in PATTERNS:
        compiled = _compiled(pattern)
        for anchor in pattern.anchors:
            (long_ if len(anchor) >= 4 else short).setdefault(anchor, []).append(compiled)
    return tuple(_scanner(group) for group in (long_, short) if group)


_SCANNERS = _scanners()
_LONGEST_ANCHOR = max(len(a) for p in PATTERNS for a in p.anchors)
_PROBE_BYTES = 8192
_PRIORITY = {p.name: i for i, p in enumerate(PATTERNS)}


def _scanned(text: str) -> bytes:
    """``text`` as the anchor automata read it."""
    # One byte per code point, so byte offsets are code-point offsets: anchors are ASCII,
    # and every other character (including a lone surrogate) becomes "?".
    return text.encode("latin-1", "replace")


def may_hold_credentials(text: str) -> bool:
    """False only when :func:`find_credentials` finds nothing in ``text``: every format's
    regex runs only at an anchor the automata report, and this asks the same automata
    whether they report any. Costs their (prefiltered) passes alone. Never raises."""
    data = _scanned(text)
    if len(data) <= _PROBE_BYTES:
        # A loop, not any() over a generator: this runs on every put, and the loop is cheaper.
        for scanner in _SCANNERS:  # noqa: SIM110
            if scanner.automaton.find_matches_as_indexes(data):
                return True
        return False
    # In pieces, overlapping by an anchor's length: the automata list every hit, and a long
    # text of anchors would cost the list of all of them to learn that there is one.
    step = _PROBE_BYTES - _LONGEST_ANCHOR
    view = memoryview(data)
    for at in range(0, len(data), step):
        piece = view[at : at + _PROBE_BYTES]
        for scanner in _SCANNERS:
            if scanner.automaton.find_matches_as_indexes(piece):
                return True
    return False


def _anchor_positions(text: str) -> dict[_Compiled, list[tuple[int, int]]]:
    """(position, anchor length) of every occurrence of every anchor, grouped by the
    pattern that anchor belongs to.

    Grouped so that each pattern's regex is then tried in one tight loop: a text made of
    anchors (``"SK" * 32000``) has one hit every two characters, and the Python work per
    hit is what its redaction costs.
    """
    data = _scanned(text)
    by_pattern: dict[_Compiled, list[tuple[int, int]]] = {}
    for scanner in _SCANNERS:
        matches = scanner.automaton.find_matches_as_indexes(data)
        if not matches:
            continue
        by_anchor: list[list[int]] = [[] for _ in scanner.anchors]
        for index, start, _end in matches:
            by_anchor[index].append(start)
        for index, inside in enumerate(scanner.inside):
            starts = by_anchor[index]
            if not starts or not inside:
                continue
            for offset, other in inside:
                anchor = scanner.anchors[other]
                by_anchor[other].extend(
                    p + offset for p in starts if text.startswith(anchor, p + offset)
                )
        for index, starts in enumerate(by_anchor):
            if starts:
                size = len(scanner.anchors[index])
                at = [(p, size) for p in starts]
                for c in scanner.users[index]:
                    by_pattern.setdefault(c, []).extend(at)
    return by_pattern


def _span_at(c: _Compiled, text: str, pos: int, size: int) -> tuple[int, int] | None:
    """Span of the match of ``c`` (a pattern with lookback) that contains the anchor at
    ``pos``, if any: the leftmost start that covers it.

    Each call to the widened regex finds the next start a match begins at (in C), so the
    starts that do not match cost nothing here, however long the lookback.
    """
    assert c.reach is not None
    lo = max(0, pos - c.pattern.lookback)
    while lo <= pos:
        m = c.reach.match(text, lo)
        if m is None or m.start("_whole") > pos:
            return None
        if m.end() >= pos + size:
            return m.span("secret" if c.secret else "_whole")
        lo = m.start("_whole") + 1
    return None


def credential_attempts(text: str) -> int:
    """How many times :func:`find_credentials` tries a format's regex on ``text`` (at most
    one try per anchor occurrence and format, plus a few per match for formats with a
    lookback): the measure of its cost that does not depend on the machine."""
    return sum(len(set(hits)) for hits in _anchor_positions(text).values())


def find_credentials(text: str) -> list[tuple[int, int, str]]:
    """(start, end, format name) of every credential in text, sorted, non-overlapping
    (on overlap keep the longer span). Pure, never raises.

    Cost: the anchor passes, then one regex try per anchor occurrence and format (anchors
    are at least two characters, so at most about one try per character and format
    sharing an anchor), each a C call from one tight loop per format."""
    candidates: set[tuple[int, int, str]] = set()
    for c, hits in _anchor_positions(text).items():
        name = c.pattern.name
        if c.reach is not None:
            for pos, size in sorted(set(hits)):
                span = _span_at(c, text, pos, size)
                if span is not None:
                    candidates.add((span[0], span[1], name))
            continue
        match = c.pattern.regex.match
        group = "secret" if c.secret else 0
        for pos, size in set(hits) if len(hits) > 1 else hits:
            m = match(text, pos)
            if m is not None and m.end() >= pos + size:
                start, end = m.span(group)
                candidates.add((start, end, name))
    if not candidates:
        return []
    # Longest first; at equal length the earlier-listed format, then the leftmost.
    ordered = sorted(candidates, key=lambda c: (c[0] - c[1], _PRIORITY[c[2]], c[0]))
    starts: list[int] = []
    kept: list[tuple[int, int, str]] = []
    for start, end, name in ordered:
        i = bisect_right(starts, start)
        if i > 0 and kept[i - 1][1] > start:
            continue
        if i < len(kept) and kept[i][0] < end:
            continue
        starts.insert(i, start)
        kept.insert(i, (start, end, name))
    return kept
