"""The writer thread: one thread, fed through one queue, running blocking SQLite work in order.

A job is a plain function; its outcome comes back to the event loop with a single
``call_soon_threadsafe``, so a job costs one queue put and one loop wake-up. That is all
the hand-off a group commit needs; :class:`concurrent.futures.ThreadPoolExecutor` plus
``run_in_executor`` costs several times more (a future on each side, a work item, a
semaphore, and done-callbacks that wake the loop again).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

Done = Callable[[Any, BaseException | None], None]  # (result, error), called on the loop
_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, Done]


class WriterThread:
    """A daemon thread that runs submitted jobs one at a time, in submission order."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    @property
    def ident(self) -> int | None:
        """The thread's identifier once started (to tell it apart from the loop's thread)."""
        return self._thread.ident

    def start(self) -> None:
        """Start the thread (once; jobs submitted before wait for it)."""
        self._thread.start()

    def submit(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        done: Done,
    ) -> None:
        """Run ``fn(*args)`` on the thread after the jobs already queued, then call
        ``done(result, error)`` on ``loop``: exactly once, unless the loop is closed by then."""
        self._jobs.put((fn, args, loop, done))

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread, after whatever is already queued there.

        :raises BaseException: whatever ``fn`` raised.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():  # the caller was cancelled; the job ran all the same
                return
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

        self.submit(loop, fn, args, settle)
        return await future

    def stop(self) -> None:
        """Let the thread end once the jobs already queued have run; does not wait for it."""
        self._jobs.put(None)

    def _main(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, loop, done = job
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - it is the job's outcome, handed over
                error = exc
            # RuntimeError: the loop is closed, and nobody waits for this outcome any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, result, error)
