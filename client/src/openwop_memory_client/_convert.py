"""Caller arguments to wire params, checked before anything is sent; wire results to objects.

Params are checked against the same wire models the sidecar validates with, so a malformed
call fails here as a :class:`MemoryValidationError` naming the field the way the sidecar
would (``entry.tags[1]``), and never as a ``TypeError`` from the JSON encoder or a pydantic
error. Checks that need the sidecar's configuration (entry size) or its clock (``expiresAt``
in the future) stay with the sidecar. Results are parsed into typed objects; a result that
does not parse becomes an :class:`InternalError` that quotes nothing of it.
"""

from __future__ import annotations

import math
import numbers
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias

import pydantic

from ._entry import (
    Change,
    ChangePage,
    EntryDict,
    KeyedEntry,
    MemoryEntry,
    Page,
    Revision,
    format_time,
    parse_entry_object,
)
from ._errors import InternalError, MemoryValidationError
from .wire import (
    VENDOR_FILTER,
    VENDOR_KEY,
    ChangesParams,
    CountParams,
    EntryInput,
    GetKeyParams,
    GetParams,
    HistoryParams,
    IssueRefParams,
    ListParams,
    MemoryListOptions,
    PageParams,
    PutParams,
    RunAddSecretsParams,
    RunBeginParams,
    RunBeginResult,
    SecretSpec,
)

__all__ = [
    "ContentArg",
    "OptionsArg",
    "Rank",
    "SecretsArg",
    "TtlArg",
    "begin_params",
    "field_path",
    "id_params",
    "issue_ref_params",
    "list_params",
    "parse_begin",
    "parse_entries",
    "parse_entry",
    "parse_optional_entry",
    "put_params",
    "secrets_to_wire",
    "validation_error_from",
]

SecretsArg: TypeAlias = Mapping[str, str] | Iterable[SecretSpec] | None
# What ``put`` takes as its second argument: the content itself, or a whole entry.
ContentArg: TypeAlias = str | EntryDict | EntryInput
OptionsArg: TypeAlias = MemoryListOptions | Mapping[str, Any] | None
TtlArg: TypeAlias = timedelta | float | None
# ``memory.list``'s orders: newest first, or by relevance to ``query``.
Rank: TypeAlias = Literal["recency", "relevance"]

_BEGIN = pydantic.TypeAdapter(RunBeginResult)


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("entry", "tags", 1)`` → ``entry.tags[1]``: the sidecar's spelling of a field."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path[:200] or "params"


def validation_error_from(exc: pydantic.ValidationError) -> MemoryValidationError:
    """The library's error for a pydantic failure: the field's path and the constraint.

    Pydantic's ``msg`` describes the constraint, never the input, so no value leaks; the
    ``Value error, `` prefix it puts before a validator's own message is dropped.
    """
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    field = field_path(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return MemoryValidationError(f"{field}: {message}", {"field": field})


def _checked(model: type[pydantic.BaseModel], params: dict[str, Any]) -> dict[str, Any]:
    """``params`` unchanged if ``model`` accepts them.

    :raises MemoryValidationError: they are malformed (``details.field`` names where).
    """
    try:
        model.model_validate(params)
    except pydantic.ValidationError as exc:
        raise validation_error_from(exc) from None
    return params


def _invalid(field: str, message: str) -> MemoryValidationError:
    return MemoryValidationError(f"{field}: {message}", {"field": field})


def secrets_to_wire(secrets: SecretsArg) -> list[dict[str, Any]]:
    """``[{id, value}, ...]`` from a mapping id -> value or an iterable of :class:`SecretSpec`.

    :raises MemoryValidationError: ``secrets`` is neither (the message names types only,
        never a value).
    """
    if secrets is None:
        return []
    if isinstance(secrets, Mapping):
        return [{"id": k, "value": v} for k, v in secrets.items()]
    given: object = secrets  # the annotation is a promise the caller may not have kept
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise _invalid(
            "secrets",
            "must be a mapping of id to value or an iterable of SecretSpec,"
            f" not {type(secrets).__name__}",
        )
    wire: list[dict[str, Any]] = []
    for i, spec in enumerate(secrets):
        if not isinstance(spec, SecretSpec):
            raise _invalid(
                f"secrets[{i}]",
                "must be a mapping of id to value or an iterable of SecretSpec,"
                f" not of {type(spec).__name__}",
            )
        wire.append({"id": spec.id, "value": spec.value})
    return wire


def begin_params(
    run_id: str,
    tenant: str,
    secrets: list[dict[str, Any]],
    *,
    replay: bool,
    as_of: datetime | None = None,
) -> dict[str, Any]:
    """``run.begin`` params. :raises MemoryValidationError: one is malformed."""
    params: dict[str, Any] = {"runId": run_id, "tenant": tenant}
    if secrets:
        params["secrets"] = secrets
    if replay:
        params["replay"] = True
    if as_of is not None:
        given: object = as_of  # the annotation is a promise the caller may not have kept
        if not isinstance(given, datetime):
            raise _invalid("asOf", f"as_of must be a datetime, not {type(as_of).__name__}")
        params["asOf"] = _format(as_of, "asOf")
    return _checked(RunBeginParams, params)


def add_secrets_params(run_id: str, secrets: list[dict[str, Any]]) -> dict[str, Any]:
    """``run.addSecrets`` params. :raises MemoryValidationError: one is malformed."""
    return _checked(RunAddSecretsParams, {"runId": run_id, "secrets": secrets})


def issue_ref_params(tenant: str, agent: str, namespace: str) -> dict[str, Any]:
    """``memory.issueRef`` params. :raises MemoryValidationError: a name is malformed."""
    return _checked(IssueRefParams, {"tenant": tenant, "agent": agent, "namespace": namespace})


def id_params(run_id: str, memory_ref: str, entry_id: str) -> dict[str, Any]:
    """``memory.get``/``memory.delete`` params. :raises MemoryValidationError: malformed."""
    return _checked(GetParams, {"runId": run_id, "memoryRef": memory_ref, "id": entry_id})


def list_params(
    run_id: str,
    memory_ref: str,
    options: OptionsArg,
    *,
    limit: int | None = None,
    tag: str | None = None,
    query: str | None = None,
    rank: Rank | None = None,
    token_budget: int | None = None,
    tags_any: Sequence[str] | None = None,
    tags_all: Sequence[str] | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> dict[str, Any]:
    """``memory.list`` params from an options object or mapping, or the keyword options.

    The keywords are the v2 options in snake_case (``token_budget`` is ``tokenBudget``)
    and the filter extension's members, sent under ``options["vendor.openwop-memory.filter"]``
    with times as RFC 3339 strings.

    :raises MemoryValidationError: both forms were given; an option is malformed; ``rank``
        is ``relevance`` without a query (in either form, as the sidecar would answer); or,
        as keywords, a ``query`` without ``rank="relevance"``, which the sidecar would
        silently ignore.
    """
    params: dict[str, Any] = {"runId": run_id, "memoryRef": memory_ref}
    keywords = _list_keywords(
        limit=limit,
        tag=tag,
        query=query,
        rank=rank,
        token_budget=token_budget,
        tags_any=tags_any,
        tags_all=tags_all,
        created_after=created_after,
        created_before=created_before,
    )
    if options is not None and keywords:
        raise _invalid("options", "give the options as a mapping or as keywords, not both")
    if isinstance(options, MemoryListOptions):
        wire = options.model_dump(exclude_none=True)
    elif isinstance(options, Mapping):
        wire = dict(options)
    elif options is None:
        wire = keywords
    else:
        raise _invalid(
            "options", f"must be a MemoryListOptions or a mapping, not {type(options).__name__}"
        )
    if wire:
        params["options"] = wire
    _checked(ListParams, params)
    relevance = wire.get("rank") == "relevance"
    if relevance and "query" not in wire:
        raise _invalid("options.query", "rank 'relevance' requires a query")
    if "query" in keywords and not relevance:
        raise _invalid(
            "options.query",
            "a query is ignored under rank 'recency' (the default):"
            " give rank='relevance', or call search()",
        )
    return params


def _list_keywords(
    *,
    limit: int | None,
    tag: str | None,
    query: str | None,
    rank: Rank | None,
    token_budget: int | None,
    tags_any: Sequence[str] | None,
    tags_all: Sequence[str] | None,
    created_after: datetime | None,
    created_before: datetime | None,
) -> dict[str, Any]:
    """The wire options of ``list``'s keywords (not yet checked by the model), omitting
    every keyword left at ``None``."""
    named = (("limit", limit), ("tag", tag), ("query", query), ("rank", rank))
    wire: dict[str, Any] = {key: value for key, value in named if value is not None}
    if token_budget is not None:
        wire["tokenBudget"] = token_budget
    where: dict[str, Any] = {}
    for key, tags in (("tagsAny", tags_any), ("tagsAll", tags_all)):
        if tags is not None:
            _check_tag_sequence(f"options.{VENDOR_FILTER}.{key}", tags)
            where[key] = list(tags)
    for key, when in (("createdAfter", created_after), ("createdBefore", created_before)):
        if when is not None:
            field = f"options.{VENDOR_FILTER}.{key}"
            given: object = when  # the annotation is a promise the caller may not have kept
            if not isinstance(given, datetime):
                name = key.replace("created", "created_").lower()
                raise _invalid(field, f"{name} must be a datetime, not {type(when).__name__}")
            where[key] = _format(when, field)
    if where:
        wire[VENDOR_FILTER] = where
    return wire


def _expiry(ttl: TtlArg, expires_at: datetime | None) -> str | None:
    """The wire ``expiresAt`` of ``ttl`` (from now) or ``expires_at``; None for neither."""
    if ttl is not None and expires_at is not None:
        raise _invalid("entry.expiresAt", "give ttl or expires_at, not both")
    if expires_at is not None:
        if not isinstance(expires_at, datetime):
            raise _invalid(
                "entry.expiresAt", f"expires_at must be a datetime, not {type(expires_at).__name__}"
            )
        return _format(expires_at)
    if ttl is None:
        return None
    given: object = ttl  # the annotation is a promise the caller may not have kept
    if isinstance(given, timedelta):
        seconds = given.total_seconds()
    elif not isinstance(given, bool) and isinstance(given, numbers.Real):
        try:
            seconds = float(given)
        except OverflowError:  # an int past float's range
            raise _invalid("entry.expiresAt", "ttl reaches past the year 9999") from None
    else:
        raise _invalid(
            "entry.expiresAt",
            f"ttl must be a timedelta or a number of seconds, not {type(ttl).__name__}",
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise _invalid("entry.expiresAt", "ttl must be a positive duration")
    try:
        return format_time(datetime.now(UTC) + timedelta(seconds=seconds))
    except OverflowError:
        raise _invalid("entry.expiresAt", "ttl reaches past the year 9999") from None


def _format(value: datetime, field: str = "entry.expiresAt") -> str:
    """The wire spelling of an aware datetime.

    :raises MemoryValidationError: it is naive, or its instant is outside the years
        1 to 9999 once in UTC.
    """
    try:
        return format_time(value)
    except ValueError as exc:
        raise _invalid(field, str(exc)) from None
    except OverflowError:
        raise _invalid(field, "out of range once converted to UTC") from None


def _check_tag_sequence(field: str, tags: object) -> None:
    """:raises MemoryValidationError: ``tags`` is one string, a mapping, or not iterable
    (each tag's own type is the wire model's to check)."""
    if isinstance(tags, str | bytes):
        raise _invalid(field, "must be a sequence of strings, not one string")
    if isinstance(tags, Mapping) or not isinstance(tags, Iterable):
        raise _invalid(field, f"must be a sequence of strings, not {type(tags).__name__}")


def _entry(
    content: ContentArg, tags: Sequence[str], ttl: TtlArg, expires_at: datetime | None
) -> dict[str, Any]:
    """The wire ``entry`` object of ``put``'s arguments (not yet checked by the model)."""
    given: object = tags  # None is not in the annotation, but it always meant "no tags"
    if given is None:
        tags = ()
    _check_tag_sequence("entry.tags", tags)
    expiry = _expiry(ttl, expires_at)
    if isinstance(content, str):
        entry: dict[str, Any] = {"content": content}
        if tags:
            entry["tags"] = list(tags)
        if expiry is not None:
            entry["expiresAt"] = expiry
        return entry
    if isinstance(content, EntryInput):
        entry = content.model_dump(exclude_none=True)
    elif isinstance(content, Mapping):
        entry = dict(content)
    else:
        raise _invalid(
            "entry",
            f"content must be a string, an EntryInput or a mapping, not {type(content).__name__}",
        )
    if tags:
        if "tags" in entry:
            raise _invalid("entry.tags", "given both in the entry and as tags=")
        entry["tags"] = list(tags)
    elif isinstance(entry.get("tags"), tuple):
        entry["tags"] = list(entry["tags"])
    if expiry is not None:
        if "expiresAt" in entry:
            raise _invalid("entry.expiresAt", "given both in the entry and as ttl= or expires_at=")
        entry["expiresAt"] = expiry
    elif isinstance(entry.get("expiresAt"), datetime):
        entry["expiresAt"] = _format(entry["expiresAt"])
    return entry


def put_params(
    run_id: str,
    memory_ref: str,
    content: ContentArg,
    *,
    tags: Sequence[str],
    ttl: TtlArg,
    expires_at: datetime | None,
    idempotency_key: str | None,
    key: str | None = None,
    expected_revision: int | None = None,
) -> dict[str, Any]:
    """``memory.put`` params, with a fresh idempotency key when none is given; with
    ``key``, a keyed put (*(extension)*, ``expected_revision`` its compare-and-set).

    :raises MemoryValidationError: an argument is malformed or two of them conflict.
    """
    params: dict[str, Any] = {
        "runId": run_id,
        "memoryRef": memory_ref,
        "entry": _entry(content, tags, ttl, expires_at),
        "idempotencyKey": idempotency_key if idempotency_key is not None else str(uuid.uuid4()),
    }
    if key is not None:
        keyed: dict[str, Any] = {"key": key}
        if expected_revision is not None:
            keyed["expectedRevision"] = expected_revision
        params[VENDOR_KEY] = keyed
    elif expected_revision is not None:
        raise MemoryValidationError(
            "expected_revision needs a key", {"field": f"{VENDOR_KEY}.expectedRevision"}
        )
    return _checked(PutParams, params)


def key_params(run_id: str, memory_ref: str, key: str) -> dict[str, Any]:
    """:raises MemoryValidationError: an argument is malformed."""
    return _checked(GetKeyParams, {"runId": run_id, "memoryRef": memory_ref, "key": key})


def history_params(
    run_id: str, memory_ref: str, key: str, limit: int | None, before: int | None
) -> dict[str, Any]:
    """:raises MemoryValidationError: an argument is malformed."""
    params: dict[str, Any] = {"runId": run_id, "memoryRef": memory_ref, "key": key}
    if limit is not None:
        params["limit"] = limit
    if before is not None:
        params["before"] = before
    return _checked(HistoryParams, params)


def parse_keyed(value: Any) -> KeyedEntry:
    """:raises InternalError: ``value`` is not a keyed answer ``{entry, key, revision}``."""
    if not isinstance(value, dict):
        raise InternalError("the sidecar answered a malformed keyed entry")
    revision, key, superseded = value.get("revision"), value.get("key"), value.get("superseded")
    if (
        not isinstance(revision, int)
        or isinstance(revision, bool)
        or not isinstance(key, str)
        or not (superseded is None or isinstance(superseded, str))
    ):
        raise InternalError("the sidecar answered a malformed keyed entry")
    return KeyedEntry(parse_entry_object(value.get("entry")), key, revision, superseded)


def parse_optional_keyed(value: Any) -> KeyedEntry | None:
    """:raises InternalError: ``value`` is neither a keyed answer nor null."""
    return None if value is None else parse_keyed(value)


def parse_history(value: Any) -> list[Revision]:
    """:raises InternalError: ``value`` is not a ``memory.history`` answer."""
    revisions = value.get("revisions") if isinstance(value, dict) else None
    if not isinstance(revisions, list):
        raise InternalError("the sidecar answered a malformed history")
    parsed = []
    for item in revisions:
        number = item.get("revision") if isinstance(item, dict) else None
        state = item.get("state") if isinstance(item, dict) else None
        if not isinstance(number, int) or state not in ("current", "superseded", "deleted"):
            raise InternalError("the sidecar answered a malformed history")
        parsed.append(Revision(number, state, parse_entry_object(item.get("entry"))))
    return parsed


def parse_entry(value: Any) -> MemoryEntry:
    """:raises InternalError: ``value`` is not a ``MemoryEntry``."""
    return parse_entry_object(value)


def parse_optional_entry(value: Any) -> MemoryEntry | None:
    """:raises InternalError: ``value`` is neither a ``MemoryEntry`` nor null."""
    return None if value is None else parse_entry_object(value)


def parse_entries(value: Any) -> list[MemoryEntry]:
    """:raises InternalError: ``value`` is not a list of ``MemoryEntry``."""
    if not isinstance(value, list):
        raise InternalError("the sidecar answered a malformed entry list")
    return [parse_entry_object(item) for item in value]


def parse_begin(value: Any) -> RunBeginResult:
    """:raises InternalError: ``value`` is not a ``run.begin`` result."""
    try:
        return _BEGIN.validate_python(value)
    except pydantic.ValidationError:
        raise InternalError("the sidecar answered a malformed run.begin result") from None


def page_params(
    run_id: str, memory_ref: str, limit: int | None, tag: str | None, cursor: str | None
) -> dict[str, Any]:
    """:raises MemoryValidationError: an argument is malformed."""
    params: dict[str, Any] = {"runId": run_id, "memoryRef": memory_ref}
    for name, value in (("limit", limit), ("tag", tag), ("cursor", cursor)):
        if value is not None:
            params[name] = value
    return _checked(PageParams, params)


def count_params(run_id: str, memory_ref: str, tag: str | None) -> dict[str, Any]:
    """:raises MemoryValidationError: an argument is malformed."""
    params: dict[str, Any] = {"runId": run_id, "memoryRef": memory_ref}
    if tag is not None:
        params["tag"] = tag
    return _checked(CountParams, params)


def parse_page(value: Any) -> Page:
    """:raises InternalError: ``value`` is not a ``memory.page`` answer."""
    cursor = value.get("nextCursor") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not (cursor is None or isinstance(cursor, str)):
        raise InternalError("the sidecar answered a malformed page")
    return Page(tuple(parse_entries(value.get("entries"))), cursor)


def parse_count(value: Any) -> int:
    """:raises InternalError: ``value`` is not a ``memory.count`` answer."""
    count = value.get("count") if isinstance(value, dict) else None
    if not isinstance(count, int) or isinstance(count, bool):
        raise InternalError("the sidecar answered a malformed count")
    return count


def changes_params(tenant: str, cursor: str | None, limit: int | None) -> dict[str, Any]:
    """:raises MemoryValidationError: an argument is malformed."""
    params: dict[str, Any] = {"tenant": tenant}
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = limit
    return _checked(ChangesParams, params)


def parse_changes(value: Any) -> ChangePage:
    """:raises InternalError: ``value`` is not a ``memory.changes`` answer."""
    if not isinstance(value, dict):
        raise InternalError("the sidecar answered a malformed change feed")
    records, cursor = value.get("changes"), value.get("nextCursor")
    if not isinstance(records, list) or not isinstance(cursor, str):
        raise InternalError("the sidecar answered a malformed change feed")
    parsed = []
    for r in records:
        try:
            at = datetime.fromisoformat(r["at"])
            ref, scope = r.get("memoryRef"), r.get("scope")
            if not isinstance(r["id"], str) or not isinstance(r["operation"], str):
                raise TypeError
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InternalError("the sidecar answered a malformed change record") from None
        parsed.append(Change(r["id"], r["operation"], at, ref, scope))
    return ChangePage(tuple(parsed), cursor)
