"""One Unix-socket connection to the sidecar, shared by many concurrent requests.

Requests are newline-delimited JSON lines written under a lock; a reader task reads
response lines and hands each to the caller waiting on its JSON-RPC ``id`` (the sidecar
may answer out of order). When the stream ends, every waiter learns the connection is lost
and whether its request may have reached the sidecar, so the caller can decide to retry.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc

from ._errors import RequestTimeoutError

__all__ = ["ConnectionLost", "MultiplexedConnection"]

_READ_SIZE = 65536
# How long a request whose write failed waits for the reader to deliver what the sidecar
# wrote before it closed; the reader needs one pass over data already received.
_BROKEN_STREAM_GRACE = 1.0
_STREAM_ERRORS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


class ConnectionLost(Exception):
    """The connection closed before the answer came.

    ``sent`` is False when the request certainly never reached the sidecar, True when it
    may have been (fully) written and therefore may have taken effect.
    """

    def __init__(self, *, sent: bool) -> None:
        super().__init__("connection lost")
        self.sent = sent


class _Waiter:
    __slots__ = ("event", "response", "size")

    def __init__(self, size: int) -> None:
        self.event = anyio.Event()
        self.response: dict[str, Any] | None = None  # None once set: the connection was lost
        self.size = size


class MultiplexedConnection:
    """A connected stream plus the table of requests waiting for their answer.

    ``read_forever`` must run in a task for answers to arrive; it returns (never raises)
    when the stream ends, after which :attr:`closed` is True and every call of
    :meth:`request` raises :class:`ConnectionLost`.
    """

    def __init__(self, stream: anyio.abc.ByteStream, *, answer_timeout: float) -> None:
        self._stream = stream
        self._answer_timeout = answer_timeout
        self._send_lock = anyio.Lock()
        self._pending: dict[int, _Waiter] = {}
        self._refusal: dict[str, Any] | None = None  # the sidecar refused this connection
        self.closed = False

    async def request(self, request_id: int, line: bytes) -> dict[str, Any]:
        """Send ``line`` (one request ending in a newline) and return the response object.

        :raises ConnectionLost: the connection closed before the answer came.
        :raises RequestTimeoutError: no answer within ``answer_timeout`` seconds (the
            connection stays usable; a late answer is discarded).
        """
        if self.closed:
            if self._refusal is not None:
                return self._refusal
            raise ConnectionLost(sent=False)
        waiter = _Waiter(len(line))
        self._pending[request_id] = waiter
        sent = False
        try:
            with anyio.move_on_after(self._answer_timeout) as scope:
                sent = await self._send(line)
                if not sent:
                    # The sidecar may have written why before it closed (a refusal at its
                    # connection limit): the reader delivers it as it winds up.
                    with anyio.move_on_after(_BROKEN_STREAM_GRACE):
                        await waiter.event.wait()
                    await self.aclose()
                await waiter.event.wait()
            if waiter.response is not None:
                return waiter.response  # even if the deadline passed as it arrived
            if scope.cancelled_caught:
                raise RequestTimeoutError(f"no answer within {self._answer_timeout:g} s")
            raise ConnectionLost(sent=sent)
        finally:
            del self._pending[request_id]

    async def _send(self, line: bytes) -> bool:
        """Write ``line``: True once written, False if the stream broke (nothing was sent).

        :raises ConnectionLost: the connection was already closed.
        """
        async with self._send_lock:
            if self.closed:
                raise ConnectionLost(sent=False)
            try:
                await self._stream.send(line)
            except _STREAM_ERRORS:
                return False
            except BaseException:
                # Cancelled inside send: part of the line may be on the wire, and a request
                # written after it would be garbled. Start over on a fresh stream.
                await self.aclose()
                raise
        return True

    async def read_forever(self) -> None:
        """Deliver answers to their waiters until the stream ends; then fail the rest."""
        buffer = bytearray()
        try:
            while True:
                try:
                    chunk = await self._stream.receive(_READ_SIZE)
                except _STREAM_ERRORS:
                    return
                start = len(buffer)
                buffer += chunk
                line_start = 0
                while (newline := buffer.find(b"\n", start)) != -1:
                    line = bytes(buffer[line_start:newline])
                    start = line_start = newline + 1
                    if line.strip() and not self._deliver(line):
                        # Not JSON-RPC: the stream cannot be trusted to be in step any more.
                        return
                del buffer[:line_start]
        finally:
            with anyio.CancelScope(shield=True):
                await self.aclose()

    def _deliver(self, line: bytes) -> bool:
        try:
            response = json.loads(line)
        except ValueError:
            return False
        if not isinstance(response, dict):
            return isinstance(response, list)  # a batch answer: this client sends none
        request_id = response.get("id")
        if request_id is None:
            self._deliver_unaddressed(response)
            return True
        waiter = self._pending.get(request_id) if isinstance(request_id, int) else None
        if waiter is not None and not waiter.event.is_set():
            waiter.response = response
            waiter.event.set()
        return True

    def _deliver_unaddressed(self, response: dict[str, Any]) -> None:
        """Route an ``id: null`` answer to the requests it concerns.

        ``rate_limited`` is the sidecar refusing the whole connection (it is at its
        connection limit and closes it without reading a request): every waiting request
        gets it, so callers see the typed error and its ``retryAfterMs`` rather than a lost
        connection. An answer to an over-long line goes to the request it refused: the
        sidecar cannot read the id of such a line, its answer names the cap, and the
        earliest waiting request longer than the cap is the one refused.
        """
        error = response.get("error")
        data = error.get("data") if isinstance(error, dict) else None
        if isinstance(data, dict) and data.get("error") == "rate_limited":
            self._refusal = response
            for waiter in self._pending.values():
                if not waiter.event.is_set():
                    waiter.response = response
                    waiter.event.set()
            return
        details = data.get("details") if isinstance(data, dict) else None
        cap = details.get("maxRequestBytes") if isinstance(details, dict) else None
        if not isinstance(cap, int):
            return
        for waiter in self._pending.values():
            # The cap counts the line without its newline.
            if waiter.size - 1 > cap and not waiter.event.is_set():
                waiter.response = response
                waiter.event.set()
                return

    async def aclose(self) -> None:
        """Close the stream and wake every waiter with "connection lost". Idempotent."""
        if self.closed:
            return
        self.closed = True
        for waiter in self._pending.values():
            waiter.event.set()
        with anyio.CancelScope(shield=True):
            await self._stream.aclose()
