"""Newline-delimited JSON framing over one connection, with a size cap and pipelining.

Requests of one connection are handled concurrently and answered as they complete
(clients match responses by id). A line over the cap is answered with an error at once and
the rest of it is discarded up to its newline; the connection stays usable. A partial
line at end of stream is dropped.

What one connection may cost is bounded (:class:`ConnectionLimits`): while its unread
answers exceed ``max_unsent_answer_bytes`` no further request is read (reading resumes
once half of them are read), at most ``max_pipelined`` requests are in progress, a line
waiting for its newline longer than ``partial_line_timeout`` closes the connection without
an answer, and so does ``idle_timeout`` without a request in progress or a byte received.
Every line waits its turn at the shared :class:`~.fairness.FairGate`, so one connection's
flood cannot crowd the others out of the event loop.

The connection's I/O runs on an asyncio stream over the socket that anyio's listener
accepted, and each request is a plain asyncio task. Both choices are measured: anyio's
raw-socket stream re-registers the socket with epoll on every receive and yields to the
loop before every send and receive, and ``TaskGroup.start_soon`` costs about 70 µs more
than ``create_task``; together they tripled the latency of a small request.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import structlog

from ..service.stats import ConnectionStats
from .fairness import FairGate, Share, line_cost

LineHandler = Callable[[bytes, "AnswerPacer"], Awaitable[bytes | None]]
OversizedHandler = Callable[[], bytes]

log = structlog.get_logger("openwop_memory.connection")

_READ_SIZE = 65536


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold or take (seconds and bytes; see the module)."""

    max_line_bytes: int
    idle_timeout: float = 300.0
    partial_line_timeout: float = 30.0
    max_unsent_answer_bytes: int = 4 << 20
    max_pipelined: int = 128


class AnswerPacer:
    """When a request of one connection may start making its answer.

    Reading stops while the connection's unread answers exceed the budget, but requests
    already read would still each add an answer. So a request starts only once the unread
    answers fit the budget, and a request whose answer has no size bound (a list, a batch)
    also waits for the connection's previous such request to have written its answer:
    what a client that never reads can pile up is the budget, one unbounded answer, and
    the single-entry answers of requests already in progress.
    """

    def __init__(self, writer: asyncio.StreamWriter, budget: int) -> None:
        self._writer = writer
        self._budget = budget
        # Released when the answer is made; the connection writes it before any other task
        # runs, so the next holder sees it counted as unread.
        self.unbounded = asyncio.Lock()

    def fits(self) -> bool:
        """Whether the unread answers fit the budget now (:meth:`ready` would not wait)."""
        return self._writer.transport.get_write_buffer_size() <= self._budget

    async def ready(self) -> None:
        """Return once the unread answers fit the budget.

        :raises ConnectionResetError: the client left.
        """
        if self._writer.transport.get_write_buffer_size() > self._budget:
            await self._writer.drain()


class Connection:
    """One client connection. ``serve`` returns once the client left (or reading stopped)
    and every request already read has been answered."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handle_line: LineHandler,
        oversized: OversizedHandler,
        limits: ConnectionLimits,
        *,
        gate: FairGate | None = None,
        stats: ConnectionStats | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handle_line = handle_line
        self._oversized = oversized
        self._limits = limits
        self._gate = gate if gate is not None else FairGate()
        self._share = Share()
        self._stats = stats if stats is not None else ConnectionStats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        self._reading = anyio.CancelScope()
        self._loop = asyncio.get_running_loop()
        self._last_activity = self._loop.time()
        self._line_started: float | None = None  # when the unfinished line's first byte came
        self._paused = False  # waiting for the client to read its answers
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        budget = limits.max_unsent_answer_bytes
        writer.transport.set_write_buffer_limits(high=budget, low=budget // 2)
        self._pacer = AnswerPacer(writer, budget)

    def stop_reading(self) -> None:
        """Take no further requests; those already read are still answered."""
        self._reading.cancel()

    async def serve(self) -> None:
        """Read and answer until end of stream or :meth:`stop_reading`.

        If cancelled from outside, the requests in flight are cancelled too.
        """
        try:
            self._arm(self._last_activity + self._limits.idle_timeout)
            with self._reading:
                await self._read_loop()
            self._disarm()
            while self._tasks:
                await asyncio.wait(set(self._tasks))
        finally:
            self._disarm()
            for task in self._tasks:
                task.cancel()

    async def _read_loop(self) -> None:
        unsent_budget = self._limits.max_unsent_answer_bytes
        max_pipelined = self._limits.max_pipelined
        buffer = bytearray()
        discarding = False  # inside the tail of an oversized line
        while True:
            try:
                if self._writer.transport.get_write_buffer_size() > unsent_budget:
                    await self._wait_for_unsent_to_fit()
                chunk = await self._reader.read(_READ_SIZE)
            except OSError:  # ConnectionResetError included: the client left
                return
            if not chunk:
                return
            now = self._loop.time()
            self._last_activity = now
            complete = b"\n" in chunk
            if complete:
                self._line_started = None
            data: bytes | bytearray
            if buffer:
                start = len(buffer)
                buffer += chunk
                data = buffer
            else:  # the usual case: lines are cut from the chunk itself, a copy fewer
                start = 0
                data = chunk
            line_start = 0
            while (newline := data.find(b"\n", start)) != -1:
                line = bytes(data[line_start:newline])  # no copy when data is the chunk
                start = line_start = newline + 1
                if discarding:
                    discarding = False
                elif len(line) > self._limits.max_line_bytes:
                    await self._admit(len(line))
                    self._send(self._oversized())
                elif line.strip():
                    # The awaits below rarely wait; their conditions are checked here first
                    # so that a line that need not wait makes no coroutine for them.
                    if self._writer.transport.get_write_buffer_size() > unsent_budget:
                        try:
                            await self._wait_for_unsent_to_fit()
                        except OSError:
                            return
                    if len(self._tasks) >= max_pipelined:
                        await self._wait_for_slot()
                    alone = not self._tasks and data.find(b"\n", start) == -1
                    waiter = self._gate.admit(self._share, line_cost(len(line)), alone=alone)
                    if waiter is not None:
                        await waiter
                    self._spawn(line)
            if data is buffer:
                del buffer[:line_start]
            elif line_start < len(chunk):
                buffer += memoryview(chunk)[line_start:]
            if not discarding and len(buffer) > self._limits.max_line_bytes:
                discarding = True
                await self._admit(len(buffer))
                self._send(self._oversized())
            if discarding:
                buffer.clear()
            if buffer or discarding:
                if complete or self._line_started is None:
                    # From now, not from the chunk's arrival: while the lines before it
                    # waited for their turn, the sidecar was not reading.
                    self._start_line_clock(self._loop.time())
            else:
                self._line_started = None

    async def _admit(self, size: int, *, alone: bool = False) -> None:
        waiter = self._gate.admit(self._share, line_cost(size), alone=alone)
        if waiter is not None:
            await waiter

    async def _wait_for_unsent_to_fit(self) -> None:
        """Back-pressure: return once the unread answers fit the budget.

        :raises ConnectionResetError: the client left while we waited.
        """
        if self._writer.transport.get_write_buffer_size() <= self._limits.max_unsent_answer_bytes:
            return
        self._stats.read_pauses += 1
        self._paused = True
        try:
            # The transport's low-water mark (half the budget) wakes this.
            await self._writer.drain()
        finally:
            self._paused = False
            if self._line_started is not None:
                # The line stood still because we did not read it: its clock starts over.
                self._start_line_clock(self._loop.time())

    async def _wait_for_slot(self) -> None:
        while len(self._tasks) >= self._limits.max_pipelined:
            self._slot_free.clear()
            await self._slot_free.wait()

    def _spawn(self, line: bytes) -> None:
        task = self._loop.create_task(self._answer(line))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slot_free.set()
        self._last_activity = self._loop.time()

    async def _answer(self, line: bytes) -> None:
        try:
            response = await self._handle_line(line, self._pacer)
        except OSError:  # the client left while the request waited for its answers to go
            return
        if response is not None:
            self._send(response)

    def _send(self, data: bytes) -> None:
        # A transport write never blocks and keeps order; if the client left, the answer
        # has nowhere to go and is dropped. What piles up unread is bounded by the reading
        # side (``_wait_for_unsent_to_fit``), not here: an answer, once made, is kept.
        # The transport itself: StreamWriter.write and is_closing only forward to it.
        transport = self._writer.transport
        if not transport.is_closing():
            transport.write(data)

    # -- timeouts: one timer per connection, moved only when a deadline comes earlier ----

    def _start_line_clock(self, now: float) -> None:
        self._line_started = now
        self._arm(now + self._limits.partial_line_timeout)

    def _arm(self, at: float) -> None:
        if at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._on_timer)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        now = self._loop.time()
        limits = self._limits
        line_deadline = math.inf
        if self._line_started is not None and not self._paused:
            line_deadline = self._line_started + limits.partial_line_timeout
            if now >= line_deadline:
                self._expire("partial_line")
                return
        idle_deadline = self._last_activity + limits.idle_timeout
        if self._tasks:
            idle_deadline = max(idle_deadline, now + limits.idle_timeout)
        elif now >= idle_deadline:
            self._expire("idle")
            return
        self._arm(min(idle_deadline, line_deadline))

    def _expire(self, reason: str) -> None:
        if self._reading.cancel_called:
            return
        if reason == "idle":
            self._stats.closed_idle += 1
        else:
            self._stats.closed_partial_line += 1
        log.info("connection_closed", reason=reason, requests_in_progress=len(self._tasks))
        self.stop_reading()
