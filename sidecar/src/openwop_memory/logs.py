"""structlog set-up: JSON lines (or console lines) to stderr, content-free by contract.

Callers log ids, counts, codes and durations only. :func:`drop_sensitive_keys` is a last
line of defence in the processor chain: it blanks any key that names content or a secret.
The per-request line has a renderer of its own (:mod:`.access_log`), which writes the same
JSON without structlog's chain; :func:`json_sink` tells it where, and from which level.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, BinaryIO, Literal, NamedTuple

import orjson
import structlog

from .timefmt import format_us, now_us

SENSITIVE_KEYS = frozenset(
    {"content", "tags", "entry", "secret", "secrets", "value", "params", "request", "response"}
)
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def drop_sensitive_keys(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace the value of any key that could carry content or a secret."""
    for key in SENSITIVE_KEYS.intersection(event):
        event[key] = "[omitted]"
    return event


def add_timestamp(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """``timestamp`` in the wire's own time format (a quarter of TimeStamper's cost)."""
    event["timestamp"] = format_us(now_us())
    return event


class JsonSink(NamedTuple):
    """Where JSON log lines go (the buffered stream structlog writes to) and from which
    level on (a ``logging`` level number)."""

    stream: BinaryIO
    min_level: int


_json_sink: JsonSink | None = None


def json_sink() -> JsonSink | None:
    """The JSON destination :func:`configure_logging` set up; ``None`` before it ran or when
    the format is ``console`` (log through structlog then)."""
    return _json_sink


def configure_logging(fmt: Literal["json", "console"], level: str) -> None:
    """Route structlog to stderr in ``fmt``, dropping events below ``level``."""
    global _json_sink  # one logging set-up per process, as structlog has
    _json_sink = JsonSink(sys.stderr.buffer, _LEVELS[level]) if fmt == "json" else None
    processors: list[Any] = [
        structlog.processors.add_log_level,
        add_timestamp,
        drop_sensitive_keys,
    ]
    if fmt == "json":
        processors.append(structlog.processors.JSONRenderer(serializer=orjson.dumps))
        factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
