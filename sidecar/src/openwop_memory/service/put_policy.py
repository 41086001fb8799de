"""What a put may store: the entry as received, and what redaction found in it.

Two steps, both raising before anything is written:

- :meth:`PutPolicy.check_entry`: the entry's size (content plus tags, in UTF-8) and its
  ``expiresAt`` (readable, spellable on the wire, in the future);
- :meth:`PutPolicy.redacted_request`: the entry redacted with the run's keyring, refused
  where the redaction and credential-pattern policies say so (or wherever a secret
  survived rewriting), its tags checked again after redaction, and made into the
  :class:`~openwop_memory.storage.base.PutRequest` storage stores.

Errors name the field, never the content or a secret's value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import partial
from typing import Literal

import orjson
from openwop_memory_client import SecretLeakageError, ValidationError
from openwop_memory_client.wire import MAX_TAG_CHARS, EntryInput, PutParams

from ..redaction import Finding, Keyring, PatternPolicy, Redacted, redact_entry
from ..storage.base import PutRequest, Scope
from ..timefmt import MAX_WIRE_US, parse_rfc3339
from .redaction_turns import RedactionTurns
from .refs import RefCodec
from .stats import Stats

RedactionPolicy = Literal["rewrite", "reject", "reject-disguised"]

# Below this size redaction costs less than the hop to a worker thread and back.
_INLINE_REDACTION_CHARS = 8192


def _unique_nonempty(tags: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t for t in tags if t))


class PutPolicy:
    """The checks and the redaction of a put, under one sidecar's settings.

    ``clock`` is storage's (``expiresAt`` is judged by the time storage judges expiry by);
    ``stats`` counts the redactions applied.
    """

    def __init__(
        self,
        *,
        max_entry_size_bytes: int,
        redaction: RedactionPolicy,
        credential_patterns: PatternPolicy,
        refs: RefCodec,
        clock: Callable[[], int],
        stats: Stats,
    ) -> None:
        self.max_entry_size_bytes = max_entry_size_bytes
        self.redaction = redaction
        self.credential_patterns = credential_patterns
        self._refs = refs
        self._clock = clock
        self._stats = stats
        self._turns = RedactionTurns()

    def check_entry(self, entry: EntryInput) -> int | None:
        """Check the entry as received; return its expiry in µs (``None`` if it has none).

        :raises ValidationError: too large, or ``expiresAt`` unreadable, unspellable or past.
        """
        size = len(entry.content.encode()) + sum(len(t.encode()) for t in entry.tags)
        if size > self.max_entry_size_bytes:
            raise ValidationError(
                f"content plus tags exceed {self.max_entry_size_bytes} bytes",
                {"field": "entry", "maxEntrySizeBytes": self.max_entry_size_bytes},
            )
        expires_us = None
        if entry.expiresAt is not None:
            try:
                expires_us = parse_rfc3339(entry.expiresAt)
            except ValueError:
                raise ValidationError(
                    "expiresAt is not an RFC 3339 time with an offset", {"field": "entry.expiresAt"}
                ) from None
            if expires_us > MAX_WIRE_US:
                raise ValidationError(
                    "expiresAt is after 9999-12-31T23:59:59.999999Z",
                    {"field": "entry.expiresAt"},
                )
            if expires_us <= self._clock():
                raise ValidationError(
                    "expiresAt is not in the future", {"field": "entry.expiresAt"}
                )
        return expires_us

    async def redacted_request(
        self,
        keyring: Keyring,
        scope: Scope,
        params: PutParams,
        expires_us: int | None,
        uid: int | None = None,
        vector: bytes | None = None,
    ) -> PutRequest:
        """The entry of ``params``, redacted with ``keyring``, as storage stores it in
        ``scope``: empty and repeated tags dropped, the digest over the redacted entry, the
        idempotency key as a keyed digest. ``uid``: the caller's Unix user, whose turn at
        the redaction thread a large entry waits for; ``vector``: the request's (see
        :class:`PutRequest`).

        :raises SecretLeakageError: the policies refuse what was found, or a secret
            survived rewriting (``details.field``, ``details.secretIds``).
        :raises ValidationError: a tag is longer than allowed once redacted.
        """
        content, tags = await self.redacted_entry(keyring, scope.tenant, params.entry, uid)
        # The digest is over the redacted entry, so no secret value enters it.
        # Keys are stored as keyed digests: a worker may well derive them from content.
        key = None if params.idempotencyKey is None else self._refs.keyed_id(params.idempotencyKey)
        keyed = params.vendor_key
        # An entry key is kept apart from idempotency keys of the same text ("entry:").
        entry_key = None if keyed is None else self._refs.keyed_id(f"entry:{keyed.key}")
        # The digest is over the redacted entry (and its entry key, so reusing an
        # idempotency key for another key conflicts), so no secret value enters it.
        parts: list[object] = [content, tags, expires_us]
        if entry_key is not None:
            parts.append(entry_key)
        digest = hashlib.sha256(orjson.dumps(parts)).digest()
        return PutRequest(
            scope,
            content,
            tags,
            expires_us,
            key,
            digest,
            vector=vector,
            entry_key=entry_key,
            expected_revision=None if keyed is None else keyed.expectedRevision,
        )

    async def redacted_entry(
        self, keyring: Keyring, tenant: str, entry: EntryInput, uid: int | None = None
    ) -> tuple[str, tuple[str, ...]]:
        """``entry``'s content and tags as a put of ``tenant`` stores them: redacted with
        ``keyring``, empty and repeated tags dropped. An import applies it to each line as
        well.

        :raises SecretLeakageError: the policies refuse what was found, or a secret
            survived rewriting (``details.field``, ``details.secretIds``).
        :raises ValidationError: a tag is longer than allowed once redacted.
        """
        # Tags are redacted as sent, so every field name below indexes the request's tags;
        # empty and repeated tags are dropped afterwards.
        redacted = await self._redact(keyring, tenant, entry, uid)
        refused = self._refused(redacted)
        if refused:
            self._stats.refusals["survived" if redacted.leaked else _kind(refused[0])] += 1
            raise SecretLeakageError(
                "the entry contains a registered secret"
                if refused[0].kind == "secret"
                else "the entry contains a credential",
                {
                    "field": "entry." + refused[0].field,
                    "secretIds": sorted(set().union(*(f.secret_ids for f in refused))),
                },
            )
        if redacted.findings:
            for finding in redacted.findings:
                self._stats.redactions[_kind(finding)] += len(finding.secret_ids)
            self._stats.redactions_applied += sum(len(f.secret_ids) for f in redacted.findings)
        for i, tag in enumerate(redacted.tags):
            if len(tag) > MAX_TAG_CHARS:
                raise ValidationError(
                    f"a tag is longer than {MAX_TAG_CHARS} characters after redaction",
                    {"field": f"entry.tags[{i}]"},
                )
        return redacted.content, _unique_nonempty(redacted.tags)

    async def _redact(
        self, keyring: Keyring, tenant: str, entry: EntryInput, uid: int | None
    ) -> Redacted:
        """Redact ``entry``; a large one in a worker thread, so small requests are not held
        up behind it (docs/benchmarks.md gives the cost by size), one at a
        time, users and then their tenants in turn (see ``redaction_turns.py``)."""
        args = (keyring, entry.content, tuple(entry.tags))
        patterns = self.credential_patterns
        if len(entry.content) + sum(map(len, entry.tags)) <= _INLINE_REDACTION_CHARS:
            return redact_entry(*args, patterns=patterns)
        work = partial(redact_entry, *args, patterns=patterns)
        return await self._turns.run(tenant, work, uid)

    def _refused(self, redacted: Redacted) -> tuple[Finding, ...]:
        """The findings the policies refuse to store rather than rewrite (first field first)."""
        if redacted.leaked:
            return redacted.findings or (Finding("content", "secret", frozenset(), True),)
        return tuple(
            f
            for f in redacted.findings
            if (f.kind == "pattern" and self.credential_patterns == "reject")
            or (
                f.kind == "secret"
                and (
                    self.redaction == "reject"
                    or (self.redaction == "reject-disguised" and f.disguised)
                )
            )
        )


def _kind(finding: Finding) -> str:
    """The metrics' kind of a finding: ``pattern``, ``disguised`` or ``secret``."""
    if finding.kind == "pattern":
        return "pattern"
    return "disguised" if finding.disguised else "secret"
