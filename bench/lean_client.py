"""A deliberately thin asyncio JSON-RPC client over a Unix socket, for measuring servers.

It is not the project's client package on purpose: that one validates and models results,
and those costs would be charged to the sidecar. Here a call is one ``orjson.dumps``, one
write, one line read and one ``orjson.loads``.

Two modes on one connection:

* sequential (``pipelined=False``): ``call`` writes and then reads the very next line itself.
  No reader task and no future sit between the socket and the caller, so the round trip
  measured is as close to the server's as a Python client gets. One call at a time.
* pipelined (``pipelined=True``): a reader task matches response ids to waiting futures, so
  many calls may be in flight at once and answers may come back in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson

# A list of 100 entries of a few hundred bytes is ~50 KB; asyncio's 64 KiB default line
# limit would be too close for larger entries or limits.
LINE_LIMIT = 16 << 20


class RpcError(Exception):
    """An error response; ``error`` is the JSON-RPC error object as received."""

    def __init__(self, error: Any) -> None:
        super().__init__(orjson.dumps(error).decode(errors="replace")[:500])
        self.error = error

    @property
    def code(self) -> str:
        """The OpenWOP envelope's ``data.error``, or the JSON-RPC code when there is none."""
        if isinstance(self.error, dict):
            data = self.error.get("data")
            if isinstance(data, dict) and "error" in data:
                return str(data["error"])
            return str(self.error.get("code"))
        return "malformed_error"


class ProtocolFailure(Exception):
    """The server broke framing: closed the connection, or answered with a foreign id."""


class LeanClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, pipelined: bool
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._next_id = 0
        self._pipelined = pipelined
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader_task: asyncio.Task[None] | None = None
        self._busy = False
        if pipelined:
            self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(cls, path: str, *, pipelined: bool = False) -> LeanClient:
        reader, writer = await asyncio.open_unix_connection(path, limit=LINE_LIMIT)
        return cls(reader, writer, pipelined=pipelined)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """The call's ``result``; raises :class:`RpcError` on an error response."""
        message = await self.request(method, params)
        if "error" in message:
            raise RpcError(message["error"])
        return message.get("result")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The whole response object of one request."""
        self._next_id += 1
        rid = self._next_id
        line = (
            orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
            + b"\n"
        )
        if self._pipelined:
            return await self._request_pipelined(rid, line)
        return await self._request_sequential(rid, line)

    async def _request_sequential(self, rid: int, line: bytes) -> dict[str, Any]:
        if self._busy:
            raise RuntimeError("a sequential LeanClient takes one call at a time")
        self._busy = True
        try:
            # No drain: the previous answer has been read, so the send buffer is empty and a
            # single small line cannot hit the high-water mark.
            self._writer.write(line)
            answer = await self._reader.readline()
        finally:
            self._busy = False
        if not answer.endswith(b"\n"):
            raise ProtocolFailure("the server closed the connection")
        message = orjson.loads(answer)
        if not isinstance(message, dict) or message.get("id") != rid:
            raise ProtocolFailure(f"expected the answer to id {rid}, got {answer[:200]!r}")
        return message

    async def _request_pipelined(self, rid: int, line: bytes) -> dict[str, Any]:
        if self._reader_task is None or self._reader_task.done():
            raise ProtocolFailure("the connection is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            self._writer.write(line)
            await self._writer.drain()
            message: dict[str, Any] = await future
        finally:
            self._pending.pop(rid, None)
        return message

    async def _read_loop(self) -> None:
        failure: Exception = ProtocolFailure("the server closed the connection")
        try:
            while True:
                answer = await self._reader.readline()
                if not answer.endswith(b"\n"):
                    break
                message = orjson.loads(answer)
                rid = message.get("id") if isinstance(message, dict) else None
                future = self._pending.get(rid) if isinstance(rid, int) else None
                if future is None:
                    failure = ProtocolFailure(f"an answer to no pending id: {answer[:200]!r}")
                    break
                if not future.done():
                    future.set_result(message)
        except (OSError, ValueError) as exc:
            failure = ProtocolFailure(f"reading failed: {type(exc).__name__}: {exc}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(failure)
