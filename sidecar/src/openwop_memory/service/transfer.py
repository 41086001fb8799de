"""Export and import of a whole memory as NDJSON, over the storage interface: how an operator
moves it between databases (SQLite and PostgreSQL, either way).

The file is one JSON object a line:

1. the header: ``{"format": "openwop-memory-export", "version": 1, "exportedAt": TIME,
   "refKey": BASE64}``. ``refKey`` is the database's memoryRef key: scopes are stored under
   keys derived from it, and issued refs are verified with it, so the database imported
   into takes it over and the refs workers hold keep reaching their scopes there.
2. one line per live entry (neither deleted nor expired at the export), in commit order:
   ``{"tenant", "scope", "id", "content", "tags", "createdAt", "expiresAt"?}``, content as
   stored (already redacted), ``scope`` the stored scope key (it names no agent).
3. the trailer: ``{"end": true, "entries": N}``, so a cut-off file is refused.

Runs, their snapshots, tombstones and idempotency keys are not exported: a run begun on the
new database takes a new snapshot. The file holds every tenant's memory and the key refs
are signed with: it is written ``0600``, and deserves the care of the database itself.

An import reads the whole file once to check it (a bad line, or no trailer, imports
nothing), then stores it in batches; an entry whose id the database already holds is
skipped, so an interrupted import can be run again. Vectors for relevance by meaning are
not in the file: the import computes each entry's from its content with the ``search``
extra's model where it is installed, as a put does.

A file may have been edited or crafted, so each entry gets what a put gets in the
database imported into (:class:`ImportRules`, from its settings), in the check as in the
store: at most ``max_entry_size_bytes`` of content plus tags; redaction with the tenant's
host keyring (``secrets_dir``) and the credential patterns, under the ``redaction`` and
``credential_patterns`` policies (a refused entry refuses the file); empty and repeated
tags dropped. A ``createdAt`` later than the import's start is clamped to it (counted in
the result): a clock ahead of this host's, or an edit, must not date the entry, and every
later put of a SQLite database, in the future. A refusal names the line, never content.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Annotated, Any, Protocol, TypeVar

import orjson
from openwop_memory_client import RateLimitedError, SecretLeakageError
from openwop_memory_client import ValidationError as WireValidationError
from openwop_memory_client.wire import MAX_TAGS, EntryInput, Name, Tag
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic import ValidationError as PydanticValidationError

from ..redaction import EMPTY_KEYRING, Keyring, PatternPolicy
from ..storage.base import EntryRow, Lifecycle, OperatorAccess, Scope, StoredEntry
from ..timefmt import format_us, now_us, parse_rfc3339
from .embedding import EmbeddingModel
from .keyring_cache import HostSecrets
from .keyring_memory import HostKeyringCache, KeyringBudget, KeyringCompiler
from .put_policy import PutPolicy, RedactionPolicy
from .refs import RefCodec
from .stats import Stats

FORMAT = "openwop-memory-export"
VERSION = 1
BATCH = 500


class TransferError(Exception):
    """The export cannot be written or the file cannot be imported; the message says why
    (never with content)."""


@dataclass(frozen=True, slots=True)
class Exported:
    entries: int
    tenants: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Imported:
    entries: int  # stored now
    skipped: int  # already in the database
    seconds: float
    redactions: int = 0  # secrets and credentials rewritten in the entries stored now
    clamped: int = 0  # createdAt later than the import's start, set to it


@dataclass(frozen=True, slots=True)
class ImportRules:
    """What a put into the database imported into applies, from its settings."""

    max_entry_size_bytes: int
    redaction: RedactionPolicy
    credential_patterns: PatternPolicy
    host_secrets: HostSecrets | None = None  # ``secrets_dir``'s, loaded
    max_keyring_memory_bytes: int = 256 << 20


class _Admission:
    """The put's own checks and redaction (``service/put_policy.py``), applied to lines."""

    def __init__(self, rules: ImportRules, key: bytes, now: int) -> None:
        self.stats = Stats()
        self._policy = PutPolicy(
            max_entry_size_bytes=rules.max_entry_size_bytes,
            redaction=rules.redaction,
            credential_patterns=rules.credential_patterns,
            refs=RefCodec(key),
            clock=lambda: now,
            stats=self.stats,
        )
        self._rules = rules
        self._host = rules.host_secrets
        self._keyrings = HostKeyringCache(
            KeyringCompiler(KeyringBudget(rules.max_keyring_memory_bytes))
        )
        self.now = now
        self.clamped = 0

    async def admit(self, item: StoredEntry, number: int) -> StoredEntry:
        """``item`` as a put would store it, its ``createdAt`` at most the import's start.

        :raises TransferError: a put would refuse it (the message names the line and why).
        """
        row = item.entry
        entry = EntryInput.model_construct(content=row.content, tags=list(row.tags))
        policy = self._policy
        try:
            policy.check_entry(entry)
            keyring = await self._keyring(item.scope.tenant)
            content, tags = await policy.redacted_entry(keyring, item.scope.tenant, entry)
        except WireValidationError as exc:
            raise TransferError(f"line {number}: {exc.message} ({_setting(exc)})") from None
        except SecretLeakageError as exc:
            where = exc.details.get("field", "entry")
            raise TransferError(
                f"line {number}: {where}: {exc.message}, which the policies refuse "
                f"(redaction = {self._rules.redaction!r}, credential_patterns = "
                f"{self._rules.credential_patterns!r}); secret ids "
                f"{exc.details.get('secretIds', [])}"
            ) from None
        except RateLimitedError:
            raise TransferError(
                f"line {number}: tenant {item.scope.tenant!r}'s host secrets need more keyring "
                "memory than max_keyring_memory_bytes"
            ) from None
        created = row.created_us
        if created > self.now:
            created = self.now
            self.clamped += 1
        return dataclasses.replace(
            item,
            entry=row._replace(content=content, tags=tags, created_us=created),
        )

    async def _keyring(self, tenant: str) -> Keyring:
        host = self._host
        if host is None:
            return EMPTY_KEYRING
        values = host.values_for(tenant)
        if not values:
            return EMPTY_KEYRING
        return await self._keyrings.get(tenant, host.generation, values)


def _setting(exc: WireValidationError) -> str:
    if "maxEntrySizeBytes" in exc.details:
        return "max_entry_size_bytes"
    return str(exc.details.get("field", "entry"))


class _Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


_M = TypeVar("_M", bound=_Line)


class _Header(_Line):
    format: str
    version: int
    exportedAt: str
    refKey: str


class _Entry(_Line):
    tenant: Name
    scope: Annotated[str, StringConstraints(pattern=r"^(issued|plain):[0-9a-f]{1,128}$")]
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    content: str
    tags: list[Tag] = Field(max_length=MAX_TAGS)
    createdAt: str
    expiresAt: str | None = None


class _Trailer(_Line):
    end: bool
    entries: int


class Transferable(Lifecycle, OperatorAccess, Protocol):
    """What an export or an import asks of a store: its ref key and the operator's bulk
    reads and writes, nothing of the worker path."""


async def export_to(storage: Transferable, out: IO[bytes]) -> Exported:
    """Write the whole memory of ``storage`` to ``out`` (see the module).

    :raises UpstreamUnavailableError: the database failed.
    :raises OSError: ``out`` could not be written.
    """
    started = time.monotonic()
    now = now_us()
    key = await storage.ref_key()
    header = {
        "format": FORMAT,
        "version": VERSION,
        "exportedAt": format_us(now),
        "refKey": base64.b64encode(key).decode(),
    }
    out.write(orjson.dumps(header) + b"\n")
    count = 0
    tenants: set[str] = set()
    # Closed at once if writing fails: the read it holds open must not outlive the export.
    async with contextlib.aclosing(storage.export_entries(now_us=now, batch_size=BATCH)) as read:
        async for batch in read:
            out.write(b"".join(orjson.dumps(_entry_line(item)) + b"\n" for item in batch))
            count += len(batch)
            tenants.update(item.scope.tenant for item in batch)
    out.write(orjson.dumps({"end": True, "entries": count}) + b"\n")
    return Exported(count, len(tenants), round(time.monotonic() - started, 3))


def _entry_line(item: StoredEntry) -> dict[str, Any]:
    row = item.entry
    line: dict[str, Any] = {
        "tenant": item.scope.tenant,
        "scope": item.scope.key,
        "id": row.id,
        "content": row.content,
        "tags": list(row.tags),
        "createdAt": format_us(row.created_us),
    }
    if row.expires_us is not None:
        line["expiresAt"] = format_us(row.expires_us)
    return line


def read_key(source: IO[bytes]) -> tuple[bytes, int]:
    """Check the whole file from its start: the ref key of its header and its number of
    entries.

    :raises TransferError: the file is not a complete export of this format (the message
        names the line).
    """
    source.seek(0)
    key = _header(source.readline())
    number = 1
    for number, line in enumerate(source, start=2):
        if line.startswith(b'{"end"'):
            trailer = _parse(_Trailer, line, number)
            count = number - 2  # the lines between the header and the trailer
            if trailer.entries != count:
                raise TransferError(
                    f"line {number}: the trailer counts {trailer.entries} entries, "
                    f"the file holds {count}"
                )
            if source.readline():
                raise TransferError(f"line {number + 1}: a line after the trailer")
            return key, count
        _stored(line, number)
    raise TransferError(f"line {number + 1}: the file ends without its trailer (cut off?)")


def entries_of(source: IO[bytes]) -> Iterator[StoredEntry]:
    """The entries of a file :func:`read_key` accepted, in its order."""
    source.seek(0)
    source.readline()
    for number, line in enumerate(source, start=2):
        if line.startswith(b'{"end"'):
            return
        yield _stored(line, number)


async def import_from(
    storage: Transferable,
    source: IO[bytes],
    rules: ImportRules,
    embedding: EmbeddingModel | None = None,
) -> Imported:
    """Check ``source`` whole, each entry under ``rules`` as a put (see the module), take
    over its ref key, and store its entries as a put would store them, each with the vector
    ``embedding`` gives its content (none without the model).

    :raises TransferError: the file is not a complete export, a put would refuse one of its
        entries, or the database already holds memory under another ref key (nothing is
        imported then).
    :raises UpstreamUnavailableError: the database failed (the batches stored before stay;
        importing the same file again completes it).
    """
    started = time.monotonic()
    key, total = read_key(source)
    # Both passes judge by the same time, so the store admits exactly what the check did.
    admission = _Admission(rules, key, now_us())
    for number, item in enumerate(entries_of(source), start=2):
        await admission.admit(item, number)
    admission = _Admission(rules, key, admission.now)
    if not await storage.adopt_ref_key(key=key):
        raise TransferError(
            "the database already holds memory under another ref key: import into a new "
            "database, or into the one this file was already imported into"
        )
    stored = 0
    batch: list[StoredEntry] = []
    for number, item in enumerate(entries_of(source), start=2):
        item = await admission.admit(item, number)
        if embedding is not None and embedding.installed:
            vector = await embedding.vector(item.entry.content)
            item = dataclasses.replace(item, embedding=vector)
        batch.append(item)
        if len(batch) == BATCH:
            stored += await storage.import_entries(entries=batch)
            batch = []
    stored += await storage.import_entries(entries=batch)
    return Imported(
        stored,
        total - stored,
        round(time.monotonic() - started, 3),
        admission.stats.redactions_applied,
        admission.clamped,
    )


def _header(line: bytes) -> bytes:
    header = _parse(_Header, line, 1)
    if header.format != FORMAT or header.version != VERSION:
        raise TransferError(
            f"line 1: not an {FORMAT} file of version {VERSION} "
            f"(format {header.format!r}, version {header.version})"
        )
    try:
        key = base64.b64decode(header.refKey, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise TransferError("line 1: refKey is not 32 bytes of base64")
    return key


def _stored(line: bytes, number: int) -> StoredEntry:
    entry = _parse(_Entry, line, number)
    try:
        created = parse_rfc3339(entry.createdAt)
        expires = None if entry.expiresAt is None else parse_rfc3339(entry.expiresAt)
    except ValueError as exc:
        raise TransferError(f"line {number}: a time is not RFC 3339: {exc}") from None
    row = EntryRow(entry.id, entry.content, tuple(entry.tags), created, expires, 0)
    return StoredEntry(Scope(entry.tenant, entry.scope), row)


def _parse(model: type[_M], line: bytes, number: int) -> _M:
    try:
        return model.model_validate(orjson.loads(line))
    except orjson.JSONDecodeError:
        raise TransferError(f"line {number}: not JSON") from None
    except PydanticValidationError as exc:
        # pydantic's message describes the constraint, never the input: no content leaks.
        first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "line"
        raise TransferError(f"line {number}: {where}: {first['msg']}") from None
