"""Newline-delimited JSON framing over one stream, with a size cap and pipelining.

Requests of one connection are handled concurrently and answered as they complete
(clients match responses by id). A line over the cap is answered with an error at once and
the rest of it is discarded up to its newline; the connection stays usable. A partial
line at end of stream is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import ByteStream

LineHandler = Callable[[bytes], Awaitable[bytes | None]]

_READ_SIZE = 65536


class Connection:
    """One client connection. ``serve`` returns when the client leaves or ``stop_reading``."""

    def __init__(
        self,
        stream: ByteStream,
        handle_line: LineHandler,
        oversized_answer: bytes,
        *,
        max_line_bytes: int,
        max_pipelined: int = 128,
    ) -> None:
        self._stream = stream
        self._handle_line = handle_line
        self._oversized = oversized_answer
        self._max = max_line_bytes
        self._send_lock = anyio.Lock()
        self._slots = anyio.Semaphore(max_pipelined)
        self._reading = anyio.CancelScope()

    def stop_reading(self) -> None:
        """Take no further requests; those already read are still answered."""
        self._reading.cancel()

    async def serve(self) -> None:
        async with anyio.create_task_group() as tg:
            with self._reading:
                await self._read_loop(tg)

    async def _read_loop(self, tg: anyio.abc.TaskGroup) -> None:
        buffer = bytearray()
        discarding = False  # inside the tail of an oversized line
        while True:
            try:
                chunk = await self._stream.receive(_READ_SIZE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                return
            start = len(buffer)
            buffer += chunk
            line_start = 0
            while (newline := buffer.find(b"\n", start)) != -1:
                line = bytes(buffer[line_start:newline])
                start = line_start = newline + 1
                if discarding:
                    discarding = False
                elif len(line) > self._max:
                    await self._send(self._oversized)
                elif line.strip():
                    await self._slots.acquire()
                    tg.start_soon(self._answer, line)
            del buffer[:line_start]
            if not discarding and len(buffer) > self._max:
                discarding = True
                await self._send(self._oversized)
            if discarding:
                buffer.clear()

    async def _answer(self, line: bytes) -> None:
        try:
            response = await self._handle_line(line)
            if response is not None:
                await self._send(response)
        finally:
            self._slots.release()

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            # If the client left, its answers have nowhere to go.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._stream.send(data)
