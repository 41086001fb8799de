"""SR-1 write-time redaction: the one entry point is :func:`redact_entry`.

Every occurrence of a keyring value in the content and in each tag is replaced by
``[REDACTED:<secretId>]``. Matching is leftmost, and at each position the longest value
wins, so a secret that contains another is replaced whole. Values shorter than
:data:`MIN_SECRET_CHARS` are never used (they would shred ordinary text). The result is
scanned again; a surviving value is a bug and is reported as a leak, never stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MIN_SECRET_CHARS = 8


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


@dataclass(frozen=True)
class Keyring:
    """A compiled keyring: secret value → secret id. Compile once per keyring change."""

    ids_by_value: Mapping[str, str]
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)

    @classmethod
    def compile(cls, ids_by_value: Mapping[str, str]) -> Keyring:
        usable = {v: i for v, i in ids_by_value.items() if len(v) >= MIN_SECRET_CHARS}
        if not usable:
            return cls(usable, None)
        # Alternation is tried in order, so longest-first makes the longest value win.
        ordered = sorted(usable, key=len, reverse=True)
        return cls(usable, re.compile("|".join(map(re.escape, ordered))))

    def __len__(self) -> int:
        return len(self.ids_by_value)


EMPTY_KEYRING = Keyring.compile({})


@dataclass(frozen=True)
class Finding:
    """Which secret ids were found in which field (``content`` or ``tags[i]``)."""

    field: str
    secret_ids: frozenset[str]


@dataclass(frozen=True)
class Redacted:
    """The entry with every keyring value replaced, and what was found where."""

    content: str
    tags: tuple[str, ...]
    findings: tuple[Finding, ...]
    leaked: bool


def _redact_text(keyring: Keyring, text: str) -> tuple[str, frozenset[str], bool]:
    pattern = keyring._pattern
    if pattern is None:
        return text, frozenset(), False
    found: set[str] = set()

    def replace(m: re.Match[str]) -> str:
        secret_id = keyring.ids_by_value[m.group(0)]
        found.add(secret_id)
        return marker(secret_id)

    out = pattern.sub(replace, text)
    return out, frozenset(found), bool(found) and pattern.search(out) is not None


def redact_entry(keyring: Keyring, content: str, tags: tuple[str, ...]) -> Redacted:
    """Redact ``content`` and every tag with ``keyring``. Pure; never raises."""
    new_content, ids, leaked = _redact_text(keyring, content)
    findings = [Finding("content", ids)] if ids else []
    new_tags = []
    for i, tag in enumerate(tags):
        new_tag, tag_ids, tag_leaked = _redact_text(keyring, tag)
        new_tags.append(new_tag)
        leaked = leaked or tag_leaked
        if tag_ids:
            findings.append(Finding(f"tags[{i}]", tag_ids))
    return Redacted(new_content, tuple(new_tags), tuple(findings), leaked)
