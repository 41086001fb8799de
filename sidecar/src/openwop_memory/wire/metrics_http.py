"""The optional HTTP listener for Prometheus: ``GET /metrics`` and nothing else.

It answers one request per connection (``Connection: close``), ``GET`` or ``HEAD`` of
``/metrics`` (a query string is ignored), 404 for any other path, 405 for any other method,
400 for a request head that is malformed, over 8 KiB, or not complete within 5 seconds. It
never reads a body.

Whoever reaches the port must not be able to take the sidecar down or make it work: it
holds at most ``metrics_max_connections`` connections (one more is answered ``503`` with
``Retry-After`` and closed at once, unread), it survives running out of descriptors as the
other listeners do (:mod:`.accepting`), and the page is made at most once per
``metrics_render_interval`` (:class:`CachedPage`): scrapes in between get the same bytes,
so a flood of scrapes costs a copy each, not a page each. The page is made on the event
loop, where the counters live, so a scrape sees them consistent.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc
import structlog
from anyio.streams.stapled import MultiListener

from ..service.metrics import CONTENT_TYPE
from ..service.stats import ConnectionStats
from .accepting import accept_forever
from .slots import Slots

log = structlog.get_logger("openwop_memory.metrics")

_MAX_HEAD = 8192
_HEAD_SECONDS = 5.0
_REFUSAL_SECONDS = 1.0

Page = Callable[[], Awaitable[bytes]]
MetricsListener = anyio.abc.Listener[anyio.abc.SocketStream]

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n"
)


@dataclass(frozen=True)
class MetricsLimits:
    """What the metrics listener may hold and do (see the module)."""

    max_connections: int = 16
    render_interval: float = 1.0


class CachedPage:
    """``page``, made at most once per ``interval`` seconds (0: for every call).

    Calls while the page is being made wait for it and get it, so concurrent scrapes make
    it once. ``renders`` counts the pages made.
    """

    def __init__(self, page: Page, interval: float) -> None:
        self._page = page
        self._interval = interval
        self._made_at = -math.inf
        self._bytes = b""
        self._lock = anyio.Lock()
        self.renders = 0

    async def __call__(self) -> bytes:
        async with self._lock:
            if anyio.current_time() - self._made_at >= self._interval or not self.renders:
                self._bytes = await self._page()
                self._made_at = anyio.current_time()
                self.renders += 1
            return self._bytes


async def listen(host: str, port: int) -> MetricsListener:
    """The metrics listener on ``host``:``port`` (port 0: one the system chooses).

    :raises OSError: the address cannot be bound.
    """
    listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 - not Django
    log.info("metrics_listening", address=f"{host}:{bound}")
    return listener


async def serve_metrics(
    listener: MetricsListener,
    page: Page,
    limits: MetricsLimits | None = None,
    stats: ConnectionStats | None = None,
) -> None:
    """Answer scrapes on ``listener`` within ``limits`` until cancelled; closes it then.

    Failed accepts for want of descriptors are counted in ``stats``, which is the workers'
    :class:`ConnectionStats` (not the open connections: those count the workers' alone).
    """
    limits = limits or MetricsLimits()
    stats = stats if stats is not None else ConnectionStats()
    cached = CachedPage(page, limits.render_interval)
    slots = Slots(limits.max_connections)
    refusing = False  # between the first refusal and the next accepted connection

    async with listener, anyio.create_task_group() as tg:

        async def answer_in_slot(stream: anyio.abc.SocketStream) -> None:
            try:
                await _answer(stream, cached)
            finally:
                slots.give_back(None)

        async def handle(stream: anyio.abc.SocketStream) -> None:
            nonlocal refusing
            if slots.take(None) is not None:
                if not refusing:
                    refusing = True  # one line per episode: a storm must not flood the log
                    log.warning("metrics_connections_refused", max_connections=slots.total)
                await _refuse(stream)
                return
            refusing = False
            tg.start_soon(answer_in_slot, stream)

        for one in _each(listener):
            tg.start_soon(accept_forever, one, handle, stats, "metrics")


def _each(listener: MetricsListener) -> list[anyio.abc.SocketListener]:
    """The listeners to accept on: a name that resolves to several addresses (v4 and v6)
    gives anyio's ``MultiListener`` of one per address."""
    listeners = listener.listeners if isinstance(listener, MultiListener) else [listener]
    sockets = [one for one in listeners if isinstance(one, anyio.abc.SocketListener)]
    if len(sockets) != len(listeners):
        raise TypeError("the metrics listener accepts on sockets only")
    return sockets


async def _refuse(stream: anyio.abc.SocketStream) -> None:
    """Answer 503 on a connection past the cap and close it, reading nothing from it."""
    # A fresh socket's send buffer takes the short answer at once; a client that cannot
    # take it is gone or broken and gets the bare close.
    with (
        anyio.move_on_after(_REFUSAL_SECONDS),
        contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError),
    ):
        await stream.send(_BUSY)
    await stream.aclose()


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
