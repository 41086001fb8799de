"""``MemoryEntry``: an entry as the client returns it, and ``EntryDict``, the dict form a
caller may write.

The wire spells entries in camelCase with RFC 3339 strings (``wire.MemoryEntry``); Python
callers get a frozen object with snake_case attributes and aware ``datetime`` values. The
conversion is exact both ways: the sidecar writes times in UTC with six fractional digits,
which is what :meth:`MemoryEntry.to_wire` writes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, Required, TypedDict

from ._errors import InternalError

__all__ = ["EntryDict", "MemoryEntry", "format_time", "parse_entry_object"]

_ENTRY_KEYS = frozenset({"id", "content", "tags", "createdAt", "expiresAt"})


class EntryDict(TypedDict, total=False):
    """The dict form of an entry to write: ``{"content": ..., "tags"?: ..., "expiresAt"?: ...}``.

    ``expiresAt`` is an aware ``datetime`` or an RFC 3339 string with an offset. A type
    checker flags a misspelled key; at run time an unknown key is a
    :class:`MemoryValidationError` naming it.
    """

    content: Required[str]
    tags: NotRequired[Sequence[str]]
    expiresAt: NotRequired[datetime | str]


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    """One stored entry (RFC 0004 ``MemoryEntry``), as ``list``, ``get`` and ``put`` return it.

    ``content`` is as stored: registered secrets already replaced by ``[REDACTED:<id>]``.
    ``created_at`` and ``expires_at`` are aware UTC datetimes; ``expires_at`` is ``None`` for
    an entry that never expires. Entries compare equal when every field is equal.
    """

    id: str
    content: str
    tags: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None = None

    def to_wire(self) -> dict[str, Any]:
        """The entry as the protocol spells it (camelCase keys, RFC 3339 strings)."""
        wire: dict[str, Any] = {
            "id": self.id,
            "content": self.content,
            "tags": list(self.tags),
            "createdAt": format_time(self.created_at),
        }
        if self.expires_at is not None:
            wire["expiresAt"] = format_time(self.expires_at)
        return wire


@dataclass(frozen=True, slots=True)
class KeyedEntry:
    """*(extension)* A revision of a key, as a keyed put and ``get_key`` return it: the
    entry, its key, its revision number (1, 2, ... per key and scope), and for a put that
    ended the key's previous revision, that revision's id (``superseded``)."""

    entry: MemoryEntry
    key: str
    revision: int
    superseded: str | None = None


@dataclass(frozen=True, slots=True)
class Revision:
    """*(extension)* One stored revision of a key, as ``history`` returns it; ``state`` is
    ``"current"``, ``"superseded"`` or ``"deleted"``."""

    revision: int
    state: str
    entry: MemoryEntry


@dataclass(frozen=True, slots=True)
class Page:
    """*(extension)* A page of a run's snapshot, as ``page`` returns it; ``next_cursor``
    (``None`` on the last page) asks for the next one."""

    entries: tuple[MemoryEntry, ...]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """*(extension)* A change feed record: the entry's id, the operation (``put``,
    ``supersede``, ``delete``, ``expire``, ``forget``), when it committed, and its scope:
    ``memory_ref`` for an issued scope, else ``scope`` (the stored digest of a plain ref)."""

    id: str
    operation: str
    at: datetime
    memory_ref: str | None = None
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class ChangePage:
    """*(extension)* Records of the change feed in commit order, and the cursor that
    resumes after them."""

    changes: tuple[Change, ...]
    next_cursor: str


def format_time(value: datetime) -> str:
    """``2026-11-29T15:21:51.123456Z``: the wire's spelling of an aware datetime.

    :raises ValueError: ``value`` is naive (its instant is unknown).
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a naive datetime names no instant; give it a tzinfo (e.g. UTC)")
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError
    return parsed.astimezone(UTC)


def parse_entry_object(value: Any) -> MemoryEntry:
    """The :class:`MemoryEntry` of a wire entry object.

    :raises InternalError: ``value`` is not a well-formed entry (the message quotes none
        of it: it may hold entry content).
    """
    try:
        if not isinstance(value, dict) or not value.keys() <= _ENTRY_KEYS:
            raise ValueError
        entry_id, content, tags = value["id"], value["content"], value["tags"]
        if not (
            isinstance(entry_id, str)
            and isinstance(content, str)
            and isinstance(tags, list)
            and all(isinstance(tag, str) for tag in tags)
        ):
            raise ValueError
        expires = value.get("expiresAt")
        return MemoryEntry(
            entry_id,
            content,
            tuple(tags),
            _time(value["createdAt"]),
            None if expires is None else _time(expires),
        )
    except (KeyError, ValueError):
        raise InternalError("the sidecar answered a malformed entry") from None
