"""Caller arguments to wire params, and wire results to models.

The sidecar is the one validation authority: mappings are sent as given and the sidecar
answers a ``validation_error`` naming the field. Results are parsed into models; a result
that does not parse becomes an :class:`InternalError` that quotes nothing of it (it may
hold entry content).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import pydantic

from ._errors import InternalError
from .wire import EntryInput, MemoryEntry, MemoryListOptions, RunBeginResult, SecretSpec

__all__ = [
    "EntryArg",
    "OptionsArg",
    "SecretsArg",
    "entry_to_wire",
    "options_to_wire",
    "parse_begin",
    "parse_entries",
    "parse_entry",
    "parse_optional_entry",
    "secrets_to_wire",
]

SecretsArg: TypeAlias = Mapping[str, str] | Iterable[SecretSpec] | None
EntryArg: TypeAlias = EntryInput | Mapping[str, Any]
OptionsArg: TypeAlias = MemoryListOptions | Mapping[str, Any] | None

_ENTRY = pydantic.TypeAdapter(MemoryEntry)
_OPTIONAL_ENTRY = pydantic.TypeAdapter(MemoryEntry | None)
_ENTRIES = pydantic.TypeAdapter(list[MemoryEntry])
_BEGIN = pydantic.TypeAdapter(RunBeginResult)


def secrets_to_wire(secrets: SecretsArg) -> list[dict[str, Any]]:
    """``[{id, value}, ...]`` from a mapping id -> value or an iterable of :class:`SecretSpec`.

    :raises TypeError: an item of the iterable is not a :class:`SecretSpec` (the message
        names its type only, never its value).
    """
    if secrets is None:
        return []
    if isinstance(secrets, Mapping):
        return [{"id": k, "value": v} for k, v in secrets.items()]
    wire: list[dict[str, Any]] = []
    for spec in secrets:
        if not isinstance(spec, SecretSpec):
            raise TypeError(
                "secrets must be a mapping of id to value or an iterable of SecretSpec,"
                f" not of {type(spec).__name__}"
            )
        wire.append({"id": spec.id, "value": spec.value})
    return wire


def entry_to_wire(entry: EntryArg) -> dict[str, Any]:
    """The wire ``entry`` object: an :class:`EntryInput` without unset fields, or the mapping."""
    if isinstance(entry, EntryInput):
        return entry.model_dump(exclude_none=True)
    return dict(entry)


def options_to_wire(options: OptionsArg) -> dict[str, Any] | None:
    """The wire ``options`` object, or ``None`` to leave it out."""
    if options is None:
        return None
    if isinstance(options, MemoryListOptions):
        return options.model_dump(exclude_none=True)
    return dict(options)


def _parse(adapter: pydantic.TypeAdapter[Any], value: Any, what: str) -> Any:
    try:
        return adapter.validate_python(value)
    except pydantic.ValidationError:
        raise InternalError(f"the sidecar answered a malformed {what}") from None


def parse_entry(value: Any) -> MemoryEntry:
    """:raises InternalError: ``value`` is not a ``MemoryEntry``."""
    entry: MemoryEntry = _parse(_ENTRY, value, "entry")
    return entry


def parse_optional_entry(value: Any) -> MemoryEntry | None:
    """:raises InternalError: ``value`` is neither a ``MemoryEntry`` nor null."""
    entry: MemoryEntry | None = _parse(_OPTIONAL_ENTRY, value, "entry")
    return entry


def parse_entries(value: Any) -> list[MemoryEntry]:
    """:raises InternalError: ``value`` is not a list of ``MemoryEntry``."""
    entries: list[MemoryEntry] = _parse(_ENTRIES, value, "entry list")
    return entries


def parse_begin(value: Any) -> RunBeginResult:
    """:raises InternalError: ``value`` is not a ``run.begin`` result."""
    result: RunBeginResult = _parse(_BEGIN, value, "run.begin result")
    return result
