"""structlog set-up: JSON lines (or console lines) to stderr, content-free by contract.

Callers log ids, counts, codes and durations only. :func:`drop_sensitive_keys` is a last
line of defence in the processor chain: it blanks any key that names content or a secret.
The per-request line has a renderer of its own (:mod:`.access_log`), which writes the same
JSON without structlog's chain; :func:`json_sink` tells it where, and from which level.

Dependencies log through the standard library's :mod:`logging` (asyncpg's pool, asyncio's
"exception was never retrieved", :mod:`warnings`): :func:`configure_logging` routes the root
logger through the same chain, so their records become lines of the same format, filtered
by the same level, with a ``logger`` key naming where they came from.

**Exceptions** become one ``error`` field, never a multi-line traceback (see
:func:`summarize_exception`): the class, and the message only where it cannot carry content.
An OS error's message is its ``strerror``; a PostgreSQL server error's is replaced by its
SQLSTATE, because the server quotes values in its messages (``Key (x)=(...) already
exists``; asyncpg's ``DataError``, SQLSTATE 22000, quotes the argument it could not encode);
asyncpg's client-side connection errors keep their fixed phrases; a message of any other
exception is dropped, since a dependency may put any data in it. A foreign record's message
is cut to its first line for the same reason (asyncio appends reprs to its own). A traceback
would add file names and source lines, no content, but it spreads one event over dozens of
lines that a log pipeline expecting JSON lines cannot parse.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, BinaryIO, Literal, NamedTuple

import orjson
import structlog

from .timefmt import format_us, now_us

# asyncpg's client-side errors about the connection itself (no SQLSTATE), whose messages
# are fixed phrases (released to the pool, another operation in progress).
_FIXED_MESSAGE_ERRORS = frozenset(
    {"InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"}
)
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


def describe_exception(exc: BaseException) -> str:
    """``Class: message`` where the message cannot carry content, else ``Class`` (see the
    module): an OS error's ``strerror``, a database server error's SQLSTATE, and the fixed
    phrases of asyncpg's connection errors; nothing else."""
    name = type(exc).__name__
    if isinstance(exc, OSError):
        return f"{name}: {exc.strerror}" if exc.strerror else name
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return f"{name} ({sqlstate})"
    if name in _FIXED_MESSAGE_ERRORS and type(exc).__module__.startswith("asyncpg") and str(exc):
        return f"{name}: {str(exc).splitlines()[0]}"
    return name


def first_line_only(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A foreign record's message cut to its first line: asyncio's "Task exception was never
    retrieved" appends the task's and the exception's repr on further lines, which may
    quote a value."""
    message = event.get("event")
    if isinstance(message, str) and "\n" in message:
        event["event"] = message.partition("\n")[0]
    return event


def summarize_exception(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace ``exc_info`` (an exception, a ``sys.exc_info()`` triple or ``True``) by an
    ``error`` field of one line (:func:`describe_exception`); drop ``stack_info``."""
    info = event.pop("exc_info", None)
    event.pop("stack_info", None)
    if info is True:
        info = sys.exc_info()
    if isinstance(info, tuple):
        info = info[1]
    if isinstance(info, BaseException):
        event.setdefault("error", describe_exception(info))
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


def _json_text(obj: Any, **_kw: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def configure_logging(fmt: Literal["json", "console"], level: str) -> None:
    """Route structlog, and the standard library's root logger, to stderr in ``fmt``
    (one line per event, see the module), dropping events below ``level``."""
    global _json_sink  # one logging set-up per process, as structlog has
    _json_sink = JsonSink(sys.stderr.buffer, _LEVELS[level]) if fmt == "json" else None
    chain: list[Any] = [
        structlog.processors.add_log_level,
        add_timestamp,
        summarize_exception,
        drop_sensitive_keys,
    ]
    if fmt == "json":
        renderer: Any = structlog.processors.JSONRenderer(serializer=orjson.dumps)
        factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
        text_renderer: Any = structlog.processors.JSONRenderer(serializer=_json_text)
    else:
        renderer = text_renderer = structlog.dev.ConsoleRenderer(colors=False)
        factory = structlog.PrintLoggerFactory(sys.stderr)
    processors = [*chain, renderer]
    _route_standard_logging(chain, text_renderer, _LEVELS[level])
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def _route_standard_logging(chain: list[Any], renderer: Any, level: int) -> None:
    """The root logger's one handler: ``chain`` then ``renderer``, to stderr, from ``level``.

    Replaces any handler already there (and :data:`logging.lastResort`'s role, which prints
    warnings with their tracebacks); warnings of :mod:`warnings` go through it too.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, first_line_only, *chain],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
