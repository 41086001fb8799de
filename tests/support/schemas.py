"""The published OpenWOP JSON Schemas (a verbatim copy in tests/schemas, see NOTICE there)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


@cache
def _validator(name: str, pointer: tuple[str, ...] = ()) -> jsonschema.Draft202012Validator:
    schema: Any = json.loads((SCHEMA_DIR / name).read_text())
    for part in pointer:
        schema = schema[part]
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def check_entry(entry: Any) -> None:
    _validator("memory-entry.schema.json").validate(entry)


def check_list_options(options: Any) -> None:
    _validator("memory-list-options.schema.json").validate(options)


def check_envelope(error: Any) -> None:
    """``error`` is a JSON-RPC error object; its ``data`` must be an OpenWOP envelope."""
    assert isinstance(error["code"], int) and isinstance(error["message"], str), error
    _validator("error-envelope.schema.json").validate(error["data"])


def check_capabilities(result: Any) -> None:
    caps = result["capabilities"]
    _validator("capabilities.schema.json", ("properties", "agents")).validate(caps["agents"])
    _validator("capabilities.schema.json", ("properties", "memory")).validate(caps["memory"])


def check_mcp_capabilities(mcp: Any) -> None:
    """``mcp`` is a ``capabilities.mcp`` object (RFC 0020)."""
    _validator("capabilities.schema.json", ("properties", "mcp")).validate(mcp)
