"""Wire models and codes of the openwop-memory protocol (PROTOCOL.md), shared by client and
sidecar (the sidecar imports them from here; this package never imports the sidecar).

Params models are strict (a string is never coerced to an integer) and reject unknown
fields. Limits that depend on the sidecar's configuration (entry size) or on the clock
(``expiresAt`` in the future) are checked by the sidecar, not here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = [
    "CONTROL_FREE",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "DeleteParams",
    "EmptyParams",
    "EntryId",
    "EntryInput",
    "GetParams",
    "IssueRefParams",
    "ListFilterOptions",
    "ListParams",
    "MemoryEntry",
    "MemoryListOptions",
    "PutParams",
    "RunAddSecretsParams",
    "RunBeginParams",
    "RunBeginResult",
    "RunEndParams",
    "SecretSpec",
]

# JSON-RPC 2.0 reserved codes used for protocol-level validation failures.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

# No C0/C1 control characters and no DEL: these names end up in log lines and markers.
CONTROL_FREE = r"^[^\x00-\x1f\x7f-\x9f]*$"

MAX_SECRETS = 256
# Shorter values would shred ordinary text when redacted.
MIN_SECRET_CHARS = 8
MAX_NAME_CHARS = 128
# A secret id is written into [REDACTED:<id>], so it may not hold "]" either.
SECRET_ID_FREE = r"^[^\]\x00-\x1f\x7f-\x9f]*$"  # noqa: S105 - a pattern, not a password
MAX_TAGS = 64
MAX_TAG_CHARS = 256
MAX_QUERY_CHARS = 4096

Name = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=CONTROL_FREE)
]
RunId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=CONTROL_FREE)]
SecretId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS, pattern=SECRET_ID_FREE)
]
SecretValue = Annotated[str, StringConstraints(min_length=MIN_SECRET_CHARS, max_length=4096)]
Tag = Annotated[str, StringConstraints(max_length=MAX_TAG_CHARS, pattern=CONTROL_FREE)]
# Strings that reach the database as text (PostgreSQL's cannot hold U+0000) and that a
# client never needs control characters in: refused here, on both backends alike, rather
# than failing in the database as if it were down.
IdempotencyKey = Annotated[
    str, StringConstraints(min_length=1, max_length=256, pattern=CONTROL_FREE)
]
EntryId = Annotated[str, StringConstraints(pattern=CONTROL_FREE)]


def _no_items() -> list[Any]:
    # The default factory of list fields. Not ``list`` itself: pydantic inspects a default
    # factory's signature when it builds a model, and a builtin's signature is parsed from
    # text with tokenize, whose first use compiles a large regular expression: 1 % of the
    # sidecar's start-up (instructions counted); a Python function's signature is free.
    return []


class _Params(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # The published schemas allow no null anywhere: an optional field is omitted.
        if value is None:
            raise ValueError("null is not allowed; omit the field instead")
        return value


class EmptyParams(_Params):
    """``host.capabilities``, ``sidecar.health``, ``sidecar.stats``: no params."""


class SecretSpec(_Params):
    """One BYOK secret of a run's keyring. The value is never logged or echoed."""

    id: SecretId
    value: SecretValue = Field(repr=False)


class IssueRefParams(_Params):
    tenant: Name
    agent: Name
    namespace: Name = "default"


class RunBeginParams(_Params):
    runId: RunId
    tenant: Name
    secrets: list[SecretSpec] = Field(default_factory=_no_items, max_length=MAX_SECRETS)
    replay: bool = False
    # *(extension)* A read-only run whose snapshot is the one a run begun at this RFC 3339
    # time took (checked by the sidecar).
    asOf: str | None = Field(default=None, max_length=64)


class RunAddSecretsParams(_Params):
    runId: RunId
    secrets: list[SecretSpec] = Field(max_length=MAX_SECRETS)


class RunEndParams(_Params):
    runId: RunId


FilterTag = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_TAG_CHARS, pattern=CONTROL_FREE)
]
VENDOR_FILTER = "vendor.openwop-memory.filter"


class ListFilterOptions(_Params):
    """*(extension)* ``options["vendor.openwop-memory.filter"]`` of ``memory.list``: every
    condition given must hold (and ``tag`` too). ``tagsAny``: at least one of these tags;
    ``tagsAll``: all of them; ``createdAfter`` / ``createdBefore``: ``createdAt`` strictly
    after / before this RFC 3339 time (checked by the sidecar)."""

    tagsAny: list[FilterTag] | None = Field(default=None, min_length=1, max_length=MAX_TAGS)
    tagsAll: list[FilterTag] | None = Field(default=None, min_length=1, max_length=MAX_TAGS)
    createdAfter: str | None = None
    createdBefore: str | None = None


class MemoryListOptions(_Params):
    """``memory-list-options.schema.json`` (v2): ``limit`` 0 or omitted means the host
    default; ``rank`` is ``recency`` (the default) or ``relevance``, which needs ``query``
    (ignored under ``recency``; the sidecar refuses ``relevance`` without it, naming
    ``options.query``); ``tokenBudget`` bounds the tokens of what is returned."""

    # Dumped (as the client sends options) under the wire name of the filter.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, serialize_by_alias=True)

    limit: int | None = Field(default=None, ge=0)
    tag: FilterTag | None = None
    tokenBudget: int | None = Field(default=None, ge=1)
    rank: Literal["recency", "relevance"] | None = None
    query: Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)] | None = None
    vendor_filter: ListFilterOptions | None = Field(
        default=None, alias="vendor.openwop-memory.filter"
    )


class EntryInput(_Params):
    """The entry a worker writes; ``id`` and ``createdAt`` are the host's to assign."""

    content: str
    tags: list[Tag] = Field(default_factory=_no_items, max_length=MAX_TAGS)
    expiresAt: str | None = None


class ListParams(_Params):
    runId: RunId
    memoryRef: str
    options: MemoryListOptions | None = None


class GetParams(_Params):
    runId: RunId
    memoryRef: str
    id: EntryId


class DeleteParams(GetParams):
    pass


VENDOR_KEY = "vendor.openwop-memory.key"
# An entry key: as an idempotency key (1-256 characters, no control characters).
EntryKey = IdempotencyKey


class KeyedPutOptions(_Params):
    """*(extension)* ``params["vendor.openwop-memory.key"]`` of ``memory.put``: store the
    entry as the next revision of ``key`` in its scope, superseding the current one.
    ``expectedRevision``: the put is refused with ``conflict`` unless the key's current
    revision is this one (0: the key must have no current revision)."""

    key: EntryKey
    expectedRevision: int | None = Field(default=None, ge=0, le=2**53)


class PutParams(_Params):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, serialize_by_alias=True)

    runId: RunId
    memoryRef: str
    entry: EntryInput
    idempotencyKey: IdempotencyKey | None = None
    vendor_key: KeyedPutOptions | None = Field(default=None, alias="vendor.openwop-memory.key")


class PageParams(_Params):
    """*(extension)* ``memory.page``: a page of what ``memory.list`` (recency) shows,
    from ``cursor`` (the previous page's ``nextCursor``) on."""

    runId: RunId
    memoryRef: str
    limit: int | None = Field(default=None, ge=0)
    tag: FilterTag | None = None
    cursor: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None


class CountParams(_Params):
    """*(extension)* ``memory.count``: how many entries ``memory.list`` would consider."""

    runId: RunId
    memoryRef: str
    tag: FilterTag | None = None


class SearchParams(_Params):
    """*(extension)* ``memory.search``: what ``memory.list`` with ``rank: "relevance"``
    finds for ``query``, each hit with its score, less those below ``minScore``."""

    runId: RunId
    memoryRef: str
    query: Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
    limit: int | None = Field(default=None, ge=0)
    tag: FilterTag | None = None
    tokenBudget: int | None = Field(default=None, ge=1)
    minScore: float | None = Field(default=None, ge=0, le=1)


class ChangesParams(_Params):
    """*(extension)* ``memory.changes``: the tenant's change feed from ``cursor`` on."""

    tenant: Name
    cursor: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None
    limit: int | None = Field(default=None, ge=0)


class GetKeyParams(_Params):
    """*(extension)* ``memory.getKey``: the key's revision the run's snapshot sees."""

    runId: RunId
    memoryRef: str
    key: EntryKey


class HistoryParams(_Params):
    """*(extension)* ``memory.history``: the key's stored revisions, newest first; with
    ``before``, those numbered below it (the next page)."""

    runId: RunId
    memoryRef: str
    key: EntryKey
    limit: int | None = Field(default=None, ge=0)
    before: int | None = Field(default=None, ge=1, le=2**53)


class MemoryEntry(BaseModel):
    """``memory-entry.schema.json``: what ``list``, ``get`` and ``put`` return."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    content: str
    tags: list[str]
    createdAt: str
    expiresAt: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class RunBeginResult(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    runId: str
    tenant: str
    snapshotAt: str
    resumed: bool
    readOnly: bool = False  # *(extension)* begun with asOf
