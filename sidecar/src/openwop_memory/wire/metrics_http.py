"""The optional HTTP listener for Prometheus: ``GET /metrics`` and nothing else.

It answers one request per connection (``Connection: close``), ``GET`` or ``HEAD`` of
``/metrics`` (a query string is ignored), 404 for any other path, 405 for any other method,
400 for a request head that is malformed, over 8 KiB, or not complete within 5 seconds. It
never reads a body. The page is made on the event loop, where the counters live, so a
scrape sees them consistent; a scrape is rare enough for that to cost nothing that matters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import structlog

from ..service.metrics import CONTENT_TYPE

log = structlog.get_logger("openwop_memory.metrics")

_MAX_HEAD = 8192
_HEAD_SECONDS = 5.0

Page = Callable[[], Awaitable[bytes]]
MetricsListener = anyio.abc.Listener[anyio.abc.SocketStream]


async def listen(host: str, port: int) -> MetricsListener:
    """The metrics listener on ``host``:``port`` (port 0: one the system chooses).

    :raises OSError: the address cannot be bound.
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 - not Django
    log.info("metrics_listening", address=f"{host}:{bound}")
    return listener


async def serve_metrics(listener: MetricsListener, page: Page) -> None:
    """Answer scrapes on ``listener`` until cancelled; closes it then."""
    async with listener:
        await listener.serve(lambda stream: _answer(stream, page))


async def _answer(stream: anyio.abc.SocketStream, page: Page) -> None:
    async with stream:
        head = b""
        with anyio.move_on_after(_HEAD_SECONDS):
            while b"\r\n\r\n" not in head and len(head) <= _MAX_HEAD:
                try:
                    head += await stream.receive(4096)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
        status, body, head_only = await _respond(head, page)
        reply = (
            f"HTTP/1.1 {status}\r\nContent-Type: "
            f"{CONTENT_TYPE if status.startswith('200') else 'text/plain; charset=utf-8'}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + (b"" if head_only else body)
        try:
            await stream.send(reply)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return


async def _respond(head: bytes, page: Page) -> tuple[str, bytes, bool]:
    if b"\r\n\r\n" not in head:
        return "400 Bad Request", b"bad request\n", False
    request_line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/"):
        return "400 Bad Request", b"bad request\n", False
    method, target = request_line[0], request_line[1].split(b"?", 1)[0]
    if target != b"/metrics":
        return "404 Not Found", b"not found: the only path is /metrics\n", False
    if method not in (b"GET", b"HEAD"):
        return "405 Method Not Allowed", b"method not allowed\n", False
    return "200 OK", await page(), method == b"HEAD"
