"""Newline-delimited JSON framing over one connection, with a size cap and pipelining.

Requests of one connection are handled concurrently and answered as they complete
(clients match responses by id). A line over the cap is answered with an error at once and
the rest of it is discarded up to its newline; the connection stays usable. A partial
line at end of stream is dropped.

What one connection may cost is bounded (:class:`ConnectionLimits`): while its unread
answers exceed ``max_unsent_answer_bytes`` no further request is read (reading resumes
once half of them are read), at most ``max_pipelined`` requests are in progress, a line
waiting for its newline longer than ``partial_line_timeout`` closes the connection without
an answer, and so does ``idle_timeout`` without a request in progress or a byte received
(blank lines and whitespace do not count).
Every line waits its turn at the shared :class:`~.fairness.FairGate`, so one connection's
flood cannot crowd the others out of the event loop. What all connections hold in their
read buffers (unfinished lines) is bounded together (:class:`LineBuffers`): the connection
whose line would pass ``max_partial_lines_bytes`` gets one ``rate_limited`` line and is
closed. Answers made while the transport is backed up wait in an outbox and go to it in
one write (see ``_COALESCE_ABOVE``); both buffers are freed when the connection closes.

The connection is an asyncio protocol on the socket that anyio's listener accepted: lines
are cut and started in ``data_received`` itself, and only a line that must wait (for its
turn, a free slot or the client to read its answers) makes a task to wait in, with reading
paused meanwhile. A request whose answer is ready without waiting (see
:class:`~.dispatch.Dispatcher`) is answered there too, without a task. Streams and a read
loop task would cost a future and a task wake-up per chunk, and anyio's socket streams more
(``make bench`` measures the request path against a bare echo server).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import structlog

from ..service.stats import ConnectionStats
from .dispatch import refusal_line
from .fairness import FairGate, Share, line_cost
from .memory_trim import BIG_ANSWER_BYTES, BIG_BUFFER_BYTES, after_big_answer

# A line's answer (None: it has none), or a coroutine that makes it (see Connection).
LineHandler = Callable[[bytes, "AnswerPacer"], "bytes | Coroutine[Any, Any, bytes | None] | None"]
OversizedHandler = Callable[[], bytes]

log = structlog.get_logger("openwop_memory.connection")

# While the transport holds at least this much unsent, answers wait in the connection's
# outbox and go to the transport together: uvloop keeps a write request of a few KiB for
# every write it cannot send at once, so 20,000 small answers to a client that does not
# read cost 85 MiB that way, for 4 MiB of answers.
_COALESCE_ABOVE = 16 << 10
# How often an outbox is offered to a transport that is still full: from the next loop
# turn, doubling up to this (a client that does not read costs a few wake-ups a second).
_MAX_FLUSH_DELAY = 0.064


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may hold or take (seconds and bytes; see the module)."""

    max_line_bytes: int
    idle_timeout: float = 300.0
    partial_line_timeout: float = 30.0
    max_unsent_answer_bytes: int = 4 << 20
    max_pipelined: int = 128
    # What all connections' read buffers (unfinished lines) may hold together.
    max_partial_lines_bytes: int = 64 << 20


class LineBuffers:
    """The bytes every connection of the process holds in its read buffer: unfinished
    request lines, and lines read behind one that waits. One count for the process, since
    the memory is the process's; each :class:`Connection` adds and takes back its own."""

    held = 0
    refusing = False  # a refusal was logged and the count has not fallen below half since


# A connection refused for the read buffers' total is told to come back after this.
_LINE_BUFFERS_RETRY_AFTER_MS = 1000


class AnswerPacer:
    """When a request of one connection may start making its answer.

    Reading stops while the connection's unread answers exceed the budget, but requests
    already read would still each add an answer. So a request starts only once the unread
    answers fit the budget, and a request whose answer has no size bound (a list, a batch)
    also waits for the connection's previous such request to have written its answer:
    what a client that never reads can pile up is the budget, one unbounded answer, and
    the single-entry answers of requests already in progress.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        # Released when the answer is made; the connection writes it before any other task
        # runs, so the next holder sees it counted as unread.
        self.unbounded = asyncio.Lock()

    def fits(self, reserve: int = 0) -> bool:
        """Whether the unread answers, and ``reserve`` bytes more, fit the budget now
        (:meth:`ready` would not wait)."""
        return self._connection.unsent_fits(reserve)

    async def ready(self, reserve: int = 0) -> None:
        """Return once the unread answers, and ``reserve`` bytes more, fit the budget
        (``reserve`` at most half of it: the transport wakes us at half).

        :raises ConnectionResetError: the client left.
        """
        while not self._connection.unsent_fits(reserve):
            await self._connection.drain()

    def room(self) -> int:
        """What the unread answers leave of the budget, in bytes (0 when over it)."""
        return self._connection.unsent_room()


class Connection(asyncio.Protocol):
    """One client connection, as the protocol of its transport. ``serve`` returns once the
    client left (or reading stopped) and every request already read has been answered.

    ``take_line`` is called with each request line once it may start. It returns the
    line's answer when that is ready at once (``None``: the line has none), else a
    coroutine making it, which runs in a task of its own.
    """

    def __init__(
        self,
        take_line: LineHandler,
        oversized: OversizedHandler,
        limits: ConnectionLimits,
        *,
        gate: FairGate | None = None,
        stats: ConnectionStats | None = None,
    ) -> None:
        self._take_line = take_line
        self._oversized = oversized
        self._limits = limits
        self._gate = gate if gate is not None else FairGate()
        self._share = Share()
        self._stats = stats if stats is not None else ConnectionStats()
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Requests started and not yet answered. Counted apart from ``_tasks``: a task
        # leaves that set only in a done callback, a loop turn after its answer went out,
        # and the client's next line can come before that; it must find the request over.
        self._unanswered = 0
        self._slot_free: asyncio.Future[None] | None = None
        self._buffer = bytearray()  # what is read and not yet taken: lines waiting, a part line
        self._buffer_counted = 0  # its length as LineBuffers counts it
        self._discarding = False  # inside the tail of an oversized line
        self._waiting: asyncio.Task[None] | None = None  # a line waits in it; reading paused
        self._reading_ended = self._loop.create_future()
        self._closed = self._loop.create_future()  # the transport is gone
        self._stopped = False
        self._outbox = bytearray()  # answers made while the transport was full (see _send)
        self._flush_delay = 0.0
        self._flush_timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._last_activity = self._loop.time()
        self._line_started: float | None = None  # when the unfinished line's first byte came
        self._paused = False  # waiting for the client to read its answers
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._pacer = AnswerPacer(self)

    # -- what the server calls ------------------------------------------------------------

    def stop_reading(self) -> None:
        """Take no further requests; those already read and started are still answered."""
        if self._stopped:
            return
        self._stopped = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        if self._waiting is not None:
            self._waiting.cancel()
        self._end_reading()

    async def serve(self) -> None:
        """Return at end of stream or after :meth:`stop_reading`, once every request
        started has been answered.

        If cancelled from outside, the requests in flight are cancelled too.
        """
        try:
            self._arm(self._last_activity + self._limits.idle_timeout)
            await self._reading_ended
            self._disarm()
            while self._tasks or (self._waiting is not None and not self._waiting.done()):
                pending: set[asyncio.Task[None]] = set(self._tasks)
                if self._waiting is not None and not self._waiting.done():
                    pending.add(self._waiting)
                await asyncio.wait(pending)
        finally:
            self._disarm()
            if self._waiting is not None:
                self._waiting.cancel()
            for task in self._tasks:
                task.cancel()

    async def close(self, grace: float) -> None:
        """Close the connection after flushing its buffered answers, waiting at most
        ``grace`` seconds for a client that does not read; what is left is dropped."""
        transport = self._transport
        if transport is None:
            return
        self._flush_outbox()
        transport.close()
        if not self._closed.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closed), grace)
        transport.abort()

    def unsent(self) -> int:
        """The bytes of answers made and not yet read by the client (that the kernel has
        not taken): the transport's buffer and the outbox."""
        transport = self._transport
        if transport is None:
            return 0
        return transport.get_write_buffer_size() + len(self._outbox)

    def unsent_fits(self, reserve: int = 0) -> bool:
        """Whether the answers the client has not read, and ``reserve`` bytes more, fit
        ``max_unsent_answer_bytes``."""
        return self.unsent() + reserve <= self._limits.max_unsent_answer_bytes

    def unsent_room(self) -> int:
        """What the answers the client has not read leave of ``max_unsent_answer_bytes``."""
        return max(0, self._limits.max_unsent_answer_bytes - self.unsent())

    async def drain(self) -> None:
        """Return once the unread answers are at most half the budget.

        :raises ConnectionResetError: the client left (before or while we waited).
        """
        if self._closed.done() or self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the client left")
        if self.unsent() <= self._limits.max_unsent_answer_bytes // 2:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have the methods without subclassing asyncio.Transport.
        self._transport = transport = cast(asyncio.Transport, transport)
        # One mark at half the budget: while writing is not paused the unread answers are
        # at most half of it, so a wait for room for an answer of up to that much (see
        # AnswerPacer.ready) always has a wake-up coming.
        half = self._limits.max_unsent_answer_bytes // 2
        transport.set_write_buffer_limits(high=half, low=half)
        if self._stopped:
            transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
        self._wake_drains(ConnectionResetError("the client left"))
        self._drop_outbox()
        self._release_buffer()
        if self._waiting is not None:
            self._waiting.cancel()
        self._end_reading()

    def eof_received(self) -> bool:
        # Keep the transport open: the answers to lines already read still go out.
        self._end_reading()
        return True

    def pause_writing(self) -> None:
        pass  # the unread answers are measured where they matter (unsent_fits)

    def resume_writing(self) -> None:
        self._flush_outbox()
        self._wake_drains_if_room()

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        # Blank lines are no request: a trickle of them must not keep an idle connection
        # open (the bytes of an unfinished line are bounded by partial_line_timeout).
        if not data.isspace():
            self._last_activity = self._loop.time()
        complete = b"\n" in data
        if complete:
            self._line_started = None
        if self._buffer or self._waiting is not None:
            self._buffer += data
            if self._waiting is None:
                self._take_lines(self._buffer, complete)
        else:  # the usual case: lines are cut from the chunk itself, a copy fewer
            self._take_lines(data, complete)
        if len(self._buffer) != self._buffer_counted:
            self._count_buffer()

    def _count_buffer(self) -> None:
        """Bring LineBuffers up to date with this connection's buffer; refuse the
        connection (one ``rate_limited`` line, then closed) if its growth takes the total
        past ``max_partial_lines_bytes``."""
        size = len(self._buffer)
        grown = size - self._buffer_counted
        LineBuffers.held += grown
        self._buffer_counted = size
        if LineBuffers.held <= self._limits.max_partial_lines_bytes // 2:
            LineBuffers.refusing = False
        if grown <= 0 or LineBuffers.held <= self._limits.max_partial_lines_bytes:
            return
        if not LineBuffers.refusing:
            LineBuffers.refusing = True  # one line per episode: a storm must not flood the log
            log.warning(
                "connection_refused",
                reason="partial_lines",
                max_partial_lines_bytes=self._limits.max_partial_lines_bytes,
            )
        self._release_buffer()
        self._send(
            refusal_line(
                "the sidecar holds too many unfinished request lines",
                _LINE_BUFFERS_RETRY_AFTER_MS,
            )
        )
        self.stop_reading()

    def _release_buffer(self) -> None:
        released = len(self._buffer)
        LineBuffers.held -= self._buffer_counted
        self._buffer_counted = 0
        self._buffer = bytearray()  # a new object: the old one's memory goes back now
        if released >= BIG_BUFFER_BYTES:
            # Once glibc has freed one such buffer it serves the next ones from its heap
            # (it raises its mmap threshold), which it then keeps unless trimmed.
            after_big_answer()

    # -- reading --------------------------------------------------------------------------

    def _take_lines(self, data: bytes | bytearray, complete: bool = True) -> None:
        """Start every complete line of ``data`` (a chunk, or the buffer with the chunk
        added), until one must wait; keep the rest in the buffer.

        A line that must wait gets a task (:meth:`_wait_and_go_on`) and reading pauses until
        it is started; the lines behind it stay in the buffer.
        """
        limits = self._limits
        start = 0
        while (newline := data.find(b"\n", start)) != -1:
            line = bytes(data[start:newline])
            start = newline + 1
            if self._discarding:
                self._discarding = False
                continue
            if len(line) > limits.max_line_bytes:
                waiter = self._gate.admit(self._share, line_cost(len(line)))
                if waiter is not None:
                    self._keep(data, start)
                    self._wait(self._send_oversized_after(waiter))
                    return
                self._send(self._oversized())
                continue
            if not line.strip():
                continue
            if self.unsent_fits() and self._unanswered < limits.max_pipelined:
                alone = not self._unanswered and data.find(b"\n", start) == -1
                waiter = self._gate.admit(self._share, line_cost(len(line)), alone=alone)
                if waiter is None:
                    self._start(line)
                    continue
            else:
                waiter = None
            self._keep(data, start)
            self._wait(self._start_when_admitted(line, waiter))
            return
        self._keep(data, start)
        buffer = self._buffer
        if not self._discarding and len(buffer) > limits.max_line_bytes:
            self._discarding = True
            cost = line_cost(len(buffer))
            buffer.clear()
            self._clock_part_line(complete)
            waiter = self._gate.admit(self._share, cost)
            if waiter is not None:
                self._wait(self._send_oversized_after(waiter))
                return
            self._send(self._oversized())
            return
        if self._discarding:
            buffer.clear()
        if buffer or self._discarding:
            self._clock_part_line(complete)
        else:
            self._line_started = None

    def _keep(self, data: bytes | bytearray, start: int) -> None:
        """Make the buffer what ``data`` holds from ``start`` on."""
        if data is self._buffer:
            del self._buffer[:start]
        elif start < len(data):
            self._buffer += memoryview(data)[start:]

    def _clock_part_line(self, complete: bool) -> None:
        if complete or self._line_started is None:
            # From now, not from the chunk's arrival: while the lines before it waited
            # for their turn, the sidecar was not reading.
            self._start_line_clock(self._loop.time())

    def _wait(self, waiting: Coroutine[Any, Any, None]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.pause_reading()
        self._waiting = self._loop.create_task(self._wait_and_go_on(waiting))

    async def _wait_and_go_on(self, waiting: Coroutine[Any, Any, None]) -> None:
        try:
            await waiting
        except OSError:  # ConnectionResetError included: the client left
            self._end_reading()
            return
        self._waiting = None
        if self._stopped or self._closed.done():
            return
        self._take_lines(self._buffer)
        self._count_buffer()
        transport = self._transport
        if (
            self._waiting is None
            and not self._stopped
            and transport is not None
            and not transport.is_closing()
        ):
            transport.resume_reading()

    async def _send_oversized_after(self, waiter: asyncio.Future[None]) -> None:
        await waiter
        self._send(self._oversized())

    async def _start_when_admitted(self, line: bytes, waiter: asyncio.Future[None] | None) -> None:
        """Wait for room (unread answers, pipelined requests), then for the line's turn.

        :raises ConnectionResetError: the client left while the line waited.
        """
        if waiter is None:
            if not self.unsent_fits():
                await self._wait_for_unsent_to_fit()
            while self._unanswered >= self._limits.max_pipelined:
                self._slot_free = self._loop.create_future()
                await self._slot_free
            alone = not self._unanswered and self._buffer.find(b"\n") == -1
            waiter = self._gate.admit(self._share, line_cost(len(line)), alone=alone)
        if waiter is not None:
            await waiter
        self._start(line)

    async def _wait_for_unsent_to_fit(self) -> None:
        """Back-pressure: return once the unread answers fit the budget.

        :raises ConnectionResetError: the client left while we waited.
        """
        self._stats.read_pauses += 1
        self._paused = True
        try:
            # The transport's low-water mark (half the budget) wakes this.
            while not self.unsent_fits():
                await self.drain()
        finally:
            self._paused = False
            if self._line_started is not None:
                # The line stood still because we did not read it: its clock starts over.
                self._start_line_clock(self._loop.time())

    def _end_reading(self) -> None:
        if not self._reading_ended.done():
            self._reading_ended.set_result(None)

    def _wake_drains(self, exc: Exception | None) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    # -- answering ------------------------------------------------------------------------

    def _start(self, line: bytes) -> None:
        answer = self._take_line(line, self._pacer)
        if answer is None or type(answer) is bytes:
            if answer is not None:
                self._send(answer)
            return
        assert not isinstance(answer, bytes)
        self._unanswered += 1
        task = self._loop.create_task(self._answer(answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, making: Coroutine[Any, Any, bytes | None]) -> None:
        try:
            response = await making
        except OSError:  # the client left while the request waited for its answers to go
            return
        else:
            if response is not None:
                self._send(response)
        finally:
            self._unanswered -= 1
            if self._slot_free is not None and not self._slot_free.done():
                self._slot_free.set_result(None)
            self._last_activity = self._loop.time()

    def _send(self, data: bytes) -> None:
        # A transport write never blocks and keeps order; if the client left, the answer
        # has nowhere to go and is dropped. What piles up unread is bounded by the reading
        # side (``_wait_for_unsent_to_fit``), not here: an answer, once made, is kept.
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if len(data) >= BIG_ANSWER_BYTES:
            after_big_answer()
        if not self._outbox and transport.get_write_buffer_size() < _COALESCE_ABOVE:
            transport.write(data)
            return
        self._outbox += data
        if self._flush_timer is None:
            self._flush_delay = 0.0
            self._flush_timer = self._loop.call_soon(self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_timer = None
        transport = self._transport
        if not self._outbox or transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() < _COALESCE_ABOVE:
            self._flush_outbox()
            self._wake_drains_if_room()
            return
        self._flush_delay = min(_MAX_FLUSH_DELAY, max(0.001, self._flush_delay * 2))
        self._flush_timer = self._loop.call_later(self._flush_delay, self._on_flush_timer)

    def _flush_outbox(self) -> None:
        """Hand the outbox to the transport in one write."""
        transport = self._transport
        if self._outbox and transport is not None and not transport.is_closing():
            outbox, self._outbox = self._outbox, bytearray()
            transport.write(outbox)

    def _drop_outbox(self) -> None:
        self._outbox = bytearray()  # a new object: the old one's memory goes back now
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def _wake_drains_if_room(self) -> None:
        if self.unsent() <= self._limits.max_unsent_answer_bytes // 2:
            self._wake_drains(None)

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
        if self._unanswered:
            idle_deadline = max(idle_deadline, now + limits.idle_timeout)
        elif now >= idle_deadline:
            self._expire("idle")
            return
        self._arm(min(idle_deadline, line_deadline))

    def _expire(self, reason: str) -> None:
        if self._stopped:
            return
        if reason == "idle":
            self._stats.closed_idle += 1
        else:
            self._stats.closed_partial_line += 1
        log.info("connection_closed", reason=reason, requests_in_progress=self._unanswered)
        self.stop_reading()
