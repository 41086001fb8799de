"""A storm of malformed frames: ``python bench/flood.py SOCKET CONNECTIONS``.

Opens CONNECTIONS connections to the sidecar at SOCKET and, on each, writes lines that
are not JSON as fast as the sidecar takes them while reading and discarding its answers,
until it is terminated (SIGTERM or SIGINT). Prints ``ready`` once every connection is open
and has had an answer, and on exit one line ``answers N`` (bytes of answers read / 100).
Standard library only, so tests and the benchmark can both run it in a process of its
own (the storm must not share an interpreter with the client being measured).
"""

from __future__ import annotations

import asyncio
import signal
import sys

_BLOCK = b"not json\n" * 2048  # 18 KiB of malformed lines per write


async def _flood(path: str, answered: list[int], first: asyncio.Event) -> None:
    reader, writer = await asyncio.open_unix_connection(path)

    async def drain_answers() -> None:
        while chunk := await reader.read(65536):
            answered[0] += len(chunk)
            first.set()

    reading = asyncio.create_task(drain_answers())
    try:
        while not reading.done():
            writer.write(_BLOCK)
            await writer.drain()
    finally:
        reading.cancel()
        writer.close()


async def main(path: str, connections: int) -> None:
    answered = [0]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    firsts = [asyncio.Event() for _ in range(connections)]
    tasks = [asyncio.create_task(_flood(path, answered, first)) for first in firsts]
    await asyncio.gather(*(first.wait() for first in firsts))
    print("ready", flush=True)
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"answers {answered[0] // 100}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
