"""The one connection a LangGraph store keeps to its sidecar, on an event loop of its own.

A store is called from its callers' threads and loops: a sync node's thread, an async
graph's loop, a script's ``asyncio.run`` per call. A connection belongs to the loop that
opened it, so the store keeps a loop of its own, on a daemon thread started at its first
call, where one :class:`AsyncMemoryClient` lives as long as the store (reconnecting by
itself after the sidecar restarts). A call hops to that loop and back instead of
connecting anew each time.

The scope refs are not kept across calls: a connection made after a loss may reach another
sidecar, on another database, where the old refs would resolve to nothing, and a call
cannot tell before it has used them. Issued with the run's begin, they cost no round trip.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ._async_client import AsyncMemoryClient

T = TypeVar("T")


class Channel:
    """A private event loop thread with one client of ``socket_path`` on it."""

    def __init__(self, socket_path: str | None) -> None:
        self._socket = socket_path
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: asyncio.Future[AsyncMemoryClient] | None = None  # on the loop
        self._closing: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None

    def run(self, work: Callable[[AsyncMemoryClient], Awaitable[T]]) -> T:
        """``work(client)`` on the channel's loop, waited for in this thread.

        :raises RuntimeError: called from the channel's own thread (it would wait forever).
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("a store call from inside the store's own loop")
        return self.submit(work).result()

    async def arun(self, work: Callable[[AsyncMemoryClient], Awaitable[T]]) -> T:
        """``work(client)`` on the channel's loop, awaited on the caller's asyncio loop
        (cancelling the caller cancels the work)."""
        return await asyncio.wrap_future(self.submit(work))

    def submit(
        self, work: Callable[[AsyncMemoryClient], Awaitable[T]]
    ) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(self._with_client(work), self._started())

    def close(self) -> None:
        """Close the connection and stop the thread (a later call starts them again)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shut(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="openwop-memory-store", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _with_client(self, work: Callable[[AsyncMemoryClient], Awaitable[T]]) -> T:
        return await work(await self._opened())

    async def _opened(self) -> AsyncMemoryClient:
        """The client, opened by a task of its own that holds it until :meth:`close` (a
        client is entered and left in one task). A failed open is raised to the callers
        waiting for it and tried again by the next call.

        :raises SidecarUnavailableError: no sidecar answered.
        """
        if self._client is None or (self._client.done() and self._client.exception()):
            loop = asyncio.get_running_loop()
            self._client = loop.create_future()
            self._closing = asyncio.Event()
            self._holder = loop.create_task(self._hold(self._client, self._closing))
        return await asyncio.shield(self._client)

    async def _hold(
        self, opened: asyncio.Future[AsyncMemoryClient], closing: asyncio.Event
    ) -> None:
        try:
            async with AsyncMemoryClient(self._socket) as client:
                opened.set_result(client)
                await closing.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the callers waiting for it
            if not opened.done():
                opened.set_exception(exc)

    async def _shut(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._holder is not None:
            await self._holder  # it leaves the client's block: the connection closes
        self._client = self._holder = None
