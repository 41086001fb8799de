"""The MCP tools: their input schemas and annotations, and how a call becomes sidecar calls.

Contract of every tool: arguments are validated against the tool's input schema before
anything is sent; a failure is an MCP error result (``isError``) whose structured content is
``{"error": KIND, "message": ..., "field"?: ...}`` with a fixed message per kind, never an
entry's content, a secret or an argument's value. Another tenant's ref and an unknown
entry answer alike (``not_found`` for ``memory_get``/``memory_put``, ``[]`` for lists,
``{"deleted": false}`` for ``memory_delete``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jsonschema
import mcp_types as types
from openwop_memory_client import (
    ConflictError,
    ForbiddenError,
    MemoryEntry,
    MemoryServiceError,
    MemoryValidationError,
    OpenWopMemoryError,
    RateLimitedError,
    ReplaySnapshotUnavailableError,
    RunNotFoundError,
    SecretLeakageError,
    SidecarUnavailableError,
)

from .session import McpSession

_log = logging.getLogger("openwop_memory.mcp")

_REF = {"type": "string", "minLength": 1, "maxLength": 512, "description": "a scope's memoryRef"}
_ID = {"type": "string", "minLength": 1, "maxLength": 512, "description": "an entry's id"}
_TAGS = {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 64}
_TIME = {"type": "string", "format": "date-time", "description": "RFC 3339"}
_FILTERS: dict[str, Any] = {
    "tag": {"type": "string", "minLength": 1, "description": "only entries with this tag"},
    "tags": {**_TAGS, "description": "only entries carrying every one of these tags"},
    "tagsAny": {**_TAGS, "description": "only entries carrying at least one of these tags"},
    "createdAfter": {**_TIME, "description": "only entries created after this time"},
    "createdBefore": {**_TIME, "description": "only entries created before this time"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
}


def _schema(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": required,
        "additionalProperties": False,
    }


def _hints(
    *, read_only: bool, destructive: bool = False, idempotent: bool
) -> types.ToolAnnotations:
    return types.ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=False,
    )


TOOLS: dict[str, types.Tool] = {
    tool.name: tool
    for tool in [
        types.Tool(
            name="memory_scope",
            description="The memoryRef of this tenant's scope (agent, namespace): pass it to "
            "the other memory tools. The same inputs always give the same ref.",
            input_schema=_schema(
                {
                    "agent": {"type": "string", "minLength": 1, "maxLength": 256},
                    "namespace": {"type": "string", "minLength": 1, "maxLength": 256},
                },
                ["agent"],
            ),
            annotations=_hints(read_only=True, idempotent=True),
        ),
        types.Tool(
            name="memory_search",
            description="Entries relevant to a query, most relevant first, as this session's "
            "snapshot sees them; at most tokenBudget tokens of content in all.",
            input_schema=_schema(
                {
                    "memoryRef": _REF,
                    "query": {"type": "string", "minLength": 1, "maxLength": 4096},
                    "tokenBudget": {"type": "integer", "minimum": 1},
                    **_FILTERS,
                },
                ["memoryRef", "query"],
            ),
            annotations=_hints(read_only=True, idempotent=True),
        ),
        types.Tool(
            name="memory_list",
            description="Entries of a scope, newest first, as this session's snapshot sees them.",
            input_schema=_schema(
                {"memoryRef": _REF, "tokenBudget": {"type": "integer", "minimum": 1}, **_FILTERS},
                ["memoryRef"],
            ),
            annotations=_hints(read_only=True, idempotent=True),
        ),
        types.Tool(
            name="memory_get",
            description="One entry by id, as this session's snapshot sees it.",
            input_schema=_schema({"memoryRef": _REF, "id": _ID}, ["memoryRef", "id"]),
            annotations=_hints(read_only=True, idempotent=True),
        ),
        types.Tool(
            name="memory_put",
            description="Store an entry (secrets registered for the session are redacted "
            "before it is written). The same idempotencyKey with the same entry writes once. "
            "This session's reads do not see its own writes (they read its snapshot).",
            input_schema=_schema(
                {
                    "memoryRef": _REF,
                    "content": {"type": "string", "minLength": 1},
                    "tags": _TAGS,
                    "ttlSeconds": {"type": "integer", "minimum": 1},
                    "idempotencyKey": {"type": "string", "minLength": 1, "maxLength": 256},
                },
                ["memoryRef", "content"],
            ),
            annotations=_hints(read_only=False, idempotent=True),
        ),
        types.Tool(
            name="memory_delete",
            description="Delete an entry by id; deleted is false if there was none.",
            input_schema=_schema({"memoryRef": _REF, "id": _ID}, ["memoryRef", "id"]),
            annotations=_hints(read_only=False, destructive=True, idempotent=True),
        ),
        types.Tool(
            name="session_info",
            description="This MCP session's OpenWOP run: its runId (to replay it later), "
            "tenant and snapshot time.",
            input_schema=_schema({}, []),
            annotations=_hints(read_only=True, idempotent=True),
        ),
        types.Tool(
            name="session_replay",
            description="Read the snapshot of an earlier session's run (its runId from "
            "session_info) for the rest of this session.",
            input_schema=_schema(
                {"runId": {"type": "string", "minLength": 1, "maxLength": 256}}, ["runId"]
            ),
            annotations=_hints(read_only=False, idempotent=True),
        ),
        types.Tool(
            name="session_add_secrets",
            description="Register secrets (id -> value) for this session: any later write "
            "holding one stores [REDACTED:id] instead. Values are never returned.",
            input_schema=_schema(
                {
                    "secrets": {
                        "type": "object",
                        "additionalProperties": {"type": "string", "minLength": 1},
                        "minProperties": 1,
                    }
                },
                ["secrets"],
            ),
            annotations=_hints(read_only=False, idempotent=True),
        ),
    ]
}

_VALIDATORS = {
    name: jsonschema.Draft202012Validator(tool.input_schema, format_checker=None)
    for name, tool in TOOLS.items()
}

# One fixed message per kind: a sidecar message may name ids, but never content; these
# name neither, so nothing an argument held can come back in an error.
_MESSAGES = {
    "validation_error": "the arguments do not match the tool's input schema",
    "not_found": "no such entry, scope or run",
    "forbidden": "the sidecar's tenant binding does not let this user use the tenant",
    "secret_leakage": "the entry was refused: it holds a secret",
    "conflict": "the idempotencyKey was used for a different entry",
    "replay_memory_snapshot_unavailable": "that run's snapshot is no longer available",
    "rate_limited": "the memory service is busy; retry later",
    "upstream_unavailable": "the memory service is unavailable",
    "unknown_tool": "no such tool",
    "internal_error": "the memory service failed",
}


class ToolError(Exception):
    """A tool call's failure, answered as an MCP error result of ``kind``."""

    def __init__(self, kind: str, field: str | None = None) -> None:
        super().__init__(kind)
        self.kind = kind
        self.field = field


def error_result(kind: str, field: str | None = None) -> types.CallToolResult:
    """The MCP error result of ``kind`` (``isError``; structured and as text)."""
    body: dict[str, Any] = {
        "error": kind,
        "message": _MESSAGES.get(kind, _MESSAGES["internal_error"]),
    }
    if field is not None:
        body["field"] = field
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))],
        structured_content=body,
        is_error=True,
    )


def ok_result(body: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
        structured_content=body,
    )


def _kind_of(exc: OpenWopMemoryError) -> tuple[str, str | None]:
    """The tool error kind of a client error (a foreign ref is ``not_found``, as unknown is)."""
    if isinstance(exc, ForbiddenError) and exc.details.get("resource") == "tenant":
        # The sidecar's tenant binding refuses the user running this server its tenant: a
        # setup error, about no scope or entry, so it is told as it is.
        return "forbidden", None
    if isinstance(exc, ForbiddenError | RunNotFoundError):
        return "not_found", None
    if isinstance(exc, MemoryValidationError):
        field = exc.details.get("field")
        return "validation_error", field if isinstance(field, str) else None
    for cls in (
        SecretLeakageError,
        ConflictError,
        ReplaySnapshotUnavailableError,
        RateLimitedError,
    ):
        if isinstance(exc, cls):
            return cls.code, None
    if isinstance(exc, SidecarUnavailableError):
        return "upstream_unavailable", None
    if isinstance(exc, MemoryServiceError) and exc.code in _MESSAGES:
        return exc.code, None
    return "internal_error", None


def _time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ToolError("validation_error", field) from None
    if parsed.tzinfo is None:
        raise ToolError("validation_error", field)
    return parsed


def _entries(entries: list[MemoryEntry]) -> dict[str, Any]:
    return {"entries": [entry.to_wire() for entry in entries]}


async def call_tool(
    session: McpSession, name: str, arguments: Mapping[str, Any] | None
) -> types.CallToolResult:
    """Run tool ``name`` in ``session``; never raises (every failure is an error result)."""
    validator = _VALIDATORS.get(name)
    if validator is None:
        return error_result("unknown_tool")
    args = dict(arguments or {})
    error = next(iter(sorted(validator.iter_errors(args), key=lambda e: list(e.path))), None)
    if error is not None:
        # The field's path, or the missing property's name: names the schema chose, never a
        # value (an unexpected property's name is the caller's, so it is not echoed).
        path = ".".join(str(p) for p in error.path)
        if not path and error.validator == "required":
            missing = [name for name in error.validator_value if name not in args]
            path = missing[0] if missing else ""
        return error_result("validation_error", path or None)
    try:
        return ok_result(await _dispatch(session, name, args))
    except ToolError as exc:
        return error_result(exc.kind, exc.field)
    except OpenWopMemoryError as exc:
        return error_result(*_kind_of(exc))
    except Exception as exc:  # noqa: BLE001 - a fault here still answers a well-formed error
        # Anything else is a fault here; its message could quote an argument, so only its
        # type is logged (on stderr: stdout is the stdio transport) and the caller gets
        # the fixed internal_error.
        _log.error("tool %s failed: %s", name, type(exc).__name__)
        return error_result("internal_error")


async def _listing(session: McpSession, args: dict[str, Any], query: str | None) -> dict[str, Any]:
    run = await session.run()
    options: dict[str, Any] = {
        "limit": args.get("limit"),
        "tag": args.get("tag"),
        "token_budget": args.get("tokenBudget"),
        "tags_all": args.get("tags"),
        "tags_any": args.get("tagsAny"),
        "created_after": _time(args.get("createdAfter"), "createdAfter"),
        "created_before": _time(args.get("createdBefore"), "createdBefore"),
    }
    try:
        if query is None:
            found = await run.list(args["memoryRef"], **options)
        else:
            found = await run.search(args["memoryRef"], query, **options)
    except ForbiddenError:
        found = []  # another tenant's scope reads as an empty one, as an unknown one does
    return _entries(found)


async def _dispatch(session: McpSession, name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "memory_scope":
        ref = await session.client.issue_ref(
            session.tenant, args["agent"], args.get("namespace", "default")
        )
        return {"memoryRef": ref}
    if name == "memory_search":
        return await _listing(session, args, args["query"])
    if name == "memory_list":
        return await _listing(session, args, None)
    if name == "memory_get":
        run = await session.run()
        entry = await run.get(args["memoryRef"], args["id"])
        if entry is None:
            raise ToolError("not_found")
        return {"entry": entry.to_wire()}
    if name == "memory_put":
        run = await session.run()
        stored = await run.put(
            args["memoryRef"],
            args["content"],
            tags=args.get("tags", ()),
            ttl=args.get("ttlSeconds"),
            idempotency_key=args.get("idempotencyKey"),
        )
        return {"entry": stored.to_wire()}
    if name == "memory_delete":
        run = await session.run()
        try:
            deleted = await run.delete(args["memoryRef"], args["id"])
        except ForbiddenError:
            deleted = False
        return {"deleted": deleted}
    if name == "session_info":
        return await session.info()
    if name == "session_replay":
        await session.replay(args["runId"])
        return await session.info()
    if name == "session_add_secrets":
        count = await session.add_secrets(args["secrets"])
        return {"count": count}
    raise ToolError("unknown_tool")  # pragma: no cover - TOOLS and this dispatch agree
