"""The per-request log line: which requests get one, and writing it cheaply.

Every request is counted for ``sidecar.stats`` whatever this module decides. A line
(``event: request``) is written for

* every request, when ``access_log`` is on (``info``);
* a request that took ``slow_request_threshold`` or longer (``warning``, ``slow: true``);
* a request the sidecar failed: ``internal_error`` or ``upstream_unavailable`` (``warning``);
* a request refused for the client's part (any other error code, a malformed or oversized
  line included; ``info``), at most :data:`CLIENT_ERROR_LINES_PER_SECOND` a second: a storm
  of malformed frames must not cost more in log lines than in answers. The first line
  written after some were left out says how many in ``suppressed``.

A successful request below the threshold, or one its client left (``cancelled``), gets no
line unless ``access_log`` is on. The line holds ``method``, ``outcome`` (``ok`` or the
error code), ``duration_ms``, the JSON-RPC ``id`` when the request had one (a string id cut
to :data:`MAX_LOGGED_ID_CHARS` characters), ``rpc_code`` for a request refused before its
method ran, and what ties it to its run: ``run_id`` and ``tenant`` where the request names
them (the tenant of an open run otherwise), ``secret_ids`` of a refused leak. Ids only:
never other params, content or secret values.

With JSON logs the line is rendered here with one ``orjson.dumps`` into the stream structlog
writes to (so the two stay in order), and the stream is flushed once per event-loop
iteration rather than per line: structlog's processor chain and a flush per line cost
a large share of a ``get`` (measured). Console logs go through structlog.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import orjson
import structlog

from ..logs import JsonSink, json_sink
from ..timefmt import format_us, now_us

CLIENT_ERROR_LINES_PER_SECOND = 10
MAX_LOGGED_ID_CHARS = 64
# Outcomes that are the sidecar's fault, not the client's: always logged.
SERVER_ERRORS = frozenset({"internal_error", "upstream_unavailable"})
_NOT_ERRORS = frozenset({"ok", "cancelled"})

_log = structlog.get_logger("openwop_memory.request")


class AccessLog:
    """Decides and writes the per-request lines of one sidecar (see the module).

    :param every_request: ``access_log``: a line for every request.
    :param slow_after: ``slow_request_threshold`` in seconds; 0 logs no request for being slow.
    :param sink: where JSON lines go; by default the one :func:`~..logs.configure_logging`
        set up, and structlog's console output when there is none.
    """

    def __init__(
        self,
        *,
        every_request: bool = False,
        slow_after: float = 0.5,
        sink: JsonSink | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.every_request = every_request
        # inf: never slow, so the hot path's one comparison needs no special case.
        self.slow_after = slow_after if slow_after > 0 else math.inf
        self._sink = sink if sink is not None else json_sink()
        self._clock = clock
        self._window = -math.inf  # start of the current second of client-error lines
        self._in_window = 0
        self.suppressed = 0  # client-error lines left out since the last line written
        self._flush_pending = False

    def wants(self, outcome: str, seconds: float) -> bool:
        """Whether a request that ended in ``outcome`` after ``seconds`` may get a line
        (before the client-error rate limit, which :meth:`write` applies)."""
        return self.every_request or outcome not in _NOT_ERRORS or seconds >= self.slow_after

    def write(
        self,
        method: str,
        outcome: str,
        seconds: float,
        rpc_id: object = None,
        rpc_code: int | None = None,
        *,
        context: dict[str, Any] | None = None,
    ) -> None:
        """Write the line of one request that :meth:`wants` a line (see the module);
        ``context`` adds the fields that tie it to its run (``run_id``, ``tenant``,
        ``secret_ids``), which the caller has cut to size."""
        slow = seconds >= self.slow_after
        server_error = outcome in SERVER_ERRORS
        if not (self.every_request or slow or server_error or outcome in _NOT_ERRORS):
            now = self._clock()
            if now - self._window >= 1.0:
                self._window, self._in_window = now, 0
            if self._in_window >= CLIENT_ERROR_LINES_PER_SECOND:
                self.suppressed += 1
                return
            self._in_window += 1
        level = logging.WARNING if slow or server_error else logging.INFO
        fields: dict[str, Any] = {
            "method": method,
            "outcome": outcome,
            "duration_ms": round(seconds * 1000, 3),
        }
        if isinstance(rpc_id, str):
            fields["id"] = rpc_id[:MAX_LOGGED_ID_CHARS]
        elif isinstance(rpc_id, int):
            fields["id"] = rpc_id
        if rpc_code is not None:
            fields["rpc_code"] = rpc_code
        if context:
            fields.update(context)
        if slow:
            fields["slow"] = True
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        sink = self._sink
        if sink is None:
            if level == logging.WARNING:
                _log.warning("request", **fields)
            else:
                _log.info("request", **fields)
            return
        if level < sink.min_level:
            return
        fields["event"] = "request"
        fields["level"] = "warning" if level == logging.WARNING else "info"
        fields["timestamp"] = format_us(now_us())
        sink.stream.write(orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE))
        self._flush_soon(sink)

    def _flush_soon(self, sink: JsonSink) -> None:
        if self._flush_pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop: nothing batches the lines
            sink.stream.flush()
            return
        self._flush_pending = True
        loop.call_soon(self._flush, sink)

    def _flush(self, sink: JsonSink) -> None:
        self._flush_pending = False
        sink.stream.flush()
