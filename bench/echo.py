"""The floor: a bare asyncio JSON-RPC echo server over a Unix socket.

It does the least any Python asyncio line-JSON server must do (read a line, parse it, write
one JSON line back with the same id), so a sidecar round trip divided by this one says how
much the sidecar adds above the transport, the event loop and the JSON codec. It runs as its
own process, like the sidecar, so it never shares the measuring client's event loop or CPU
time slice.

Run as ``python bench/echo.py --socket PATH``; it answers until SIGTERM. Standard library and
orjson only, so the file runs without the ``bench`` package being importable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

import orjson


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                return
            try:
                request = orjson.loads(line)
            except orjson.JSONDecodeError:
                writer.write(
                    b'{"jsonrpc":"2.0","error":{"code":-32700,"message":"parse"},"id":null}\n'
                )
                continue
            rid = request.get("id") if isinstance(request, dict) else None
            params = request.get("params") if isinstance(request, dict) else None
            writer.write(orjson.dumps({"jsonrpc": "2.0", "result": params, "id": rid}) + b"\n")
            await writer.drain()
    except (ConnectionError, ValueError):
        return  # ValueError: a line over the reader's limit; the bench never sends one
    finally:
        writer.close()


async def serve(path: str) -> None:
    """Answer on ``path`` until SIGTERM or SIGINT; removes the socket file on the way out."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await asyncio.start_unix_server(_serve_connection, path, limit=16 << 20)
    try:
        await stop.wait()
    finally:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.socket))
    return 0


if __name__ == "__main__":
    sys.exit(main())
