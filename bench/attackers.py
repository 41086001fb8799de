"""The attacks of the "under attack" table, each run in a process of its own:
``python bench/attackers.py NAME PARAMS_JSON``.

A process of its own so that what the attack costs the attacker (opening a thousand
connections, encoding thousands of requests) is not charged to the bystander measured beside
it. It prints ``start`` when it is about to attack, ``ready`` once what it holds is in place
(connections open, requests sent), then one line of JSON, ``{"summary": TEXT, "counts":
{OUTCOME: N}}``, and exits, closing everything it opened.

Every attack is bounded in count and in time (``seconds``, plus ``grace`` for answers still
on their way), and takes a refusal (an error answer, a connection closed or refused) as an
outcome to count, never as a failure: it must measure today's sidecar and one hardened
against it alike. It connects to the Unix socket it is given and to loopback TCP only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from bench.keyring_stall import _keyring
from bench.lean_client import LINE_LIMIT, LeanClient, ProtocolFailure, RpcError

LOOPBACK = "127.0.0.1"
AT_ONCE = 64  # connections opened concurrently (the listen backlog takes them all)
_CODE = re.compile(rb'"error"\s*:\s*"([a-z_]+)"')
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Tally:
    """Outcomes by name (``ok``, an error code, ``closed``, ``held``...), summed up in words."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, outcome: str, n: int = 1) -> None:
        self.counts[outcome] += n

    def summary(self) -> str:
        """``ok 10%, rate_limited 90% of 500``; ``ok (500)`` when every outcome is ok."""
        total = sum(self.counts.values())
        if not total:
            return "nothing done"
        if len(self.counts) == 1:
            return f"{next(iter(self.counts))} ({total})"
        parts = ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in self.counts.most_common())
        return f"{parts} of {total}"


class Clock:
    """The attack's deadline: ``seconds`` from the start."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def over(self) -> bool:
        return time.monotonic() >= self.deadline


def ready() -> None:
    """Say the hold is in place; from here the attacker yields the CPU to the sidecar and
    the bystander (its setup ran at normal priority, so that a busy host does not starve
    the attack before it starts)."""
    os.nice(10)
    print("ready", flush=True)


def answer_kind(data: bytes) -> str:
    """What the first bytes of an answer say: an HTTP status, an error code, or ``answered``."""
    if data.startswith(b"HTTP/"):
        status = data.split(b" ", 2)
        return f"http {status[1].decode(errors='replace')}" if len(status) > 1 else "http"
    found = _CODE.search(data)
    return found.group(1).decode() if found else "answered"


async def state(reader: asyncio.StreamReader, wait: float) -> str:
    """``held`` (open, nothing said within ``wait`` seconds), ``closed`` (by the other end,
    nothing said), or what the first 64 KiB of its answer say (:func:`answer_kind`)."""
    try:
        data = await asyncio.wait_for(reader.read(65536), wait)
    except TimeoutError:
        return "held"
    except OSError:
        return "closed"
    return answer_kind(data) if data else "closed"


async def states(streams: list[Streams], wait: float) -> list[str]:
    return list(await asyncio.gather(*(state(r, wait) for r, _ in streams)))


def abort(streams: Sequence[Streams]) -> None:
    # Abort, not close: a close would wait to flush what the sidecar never read.
    for _, writer in streams:
        writer.transport.abort()


async def hang_up(streams: list[Streams], tally: Tally, *, also: Sequence[Streams] = ()) -> None:
    """Tally how each of ``streams`` ended up (:func:`state`), then abort them and ``also``."""
    for outcome in await states(streams, 0.05):
        tally.add(outcome)
    abort([*streams, *also])


async def open_many(
    connect: Callable[[], Awaitable[Streams]], count: int, clock: Clock, tally: Tally
) -> list[Streams]:
    """Up to ``count`` connections, :data:`AT_ONCE` at a time, until the deadline; a
    refused or slow connect is tallied as ``connect failed``."""

    async def one() -> Streams | None:
        try:
            return await asyncio.wait_for(connect(), min(2.0, clock.left() + 0.1))
        except (OSError, TimeoutError):
            tally.add("connect failed")
            return None

    opened: list[Streams] = []
    while len(opened) + tally.counts["connect failed"] < count and not clock.over():
        wave = min(AT_ONCE, count - len(opened) - tally.counts["connect failed"])
        opened += [s for s in await asyncio.gather(*(one() for _ in range(wave))) if s]
    return opened


async def leave(client: LeanClient) -> None:
    """Close ``client`` without waiting long: a close flushes first, and a sidecar that
    has stopped reading would keep it waiting."""
    with contextlib.suppress(TimeoutError, OSError):
        await asyncio.wait_for(client.close(), 2.0)


def unix(path: str) -> Callable[[], Awaitable[Streams]]:
    return lambda: asyncio.open_unix_connection(path, limit=LINE_LIMIT)


def more_descriptors() -> None:
    """The soft descriptor limit up to the hard one: the attacker's own limit is not what is
    measured."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def request_line(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + b"\n"


async def call(client: LeanClient, tally: Tally, method: str, params: dict[str, Any]) -> bool:
    """One call, its outcome tallied (``ok``, the error code, or ``closed``); True if ok.

    :raises ProtocolFailure: the connection is gone (after tallying ``closed``).
    """
    try:
        await client.call(method, params)
    except RpcError as exc:
        tally.add(exc.code)
        return False
    except (ProtocolFailure, OSError) as exc:
        tally.add("closed")
        raise ProtocolFailure(str(exc)) from exc
    tally.add("ok")
    return True


async def bounded(workers: list[Coroutine[Any, Any, None]], seconds: float, tally: Tally) -> None:
    """Run ``workers`` for at most ``seconds``; a worker still waiting for its answer then
    is cancelled and tallied as ``unanswered``."""
    tasks = [asyncio.ensure_future(w) for w in workers]
    _, pending = await asyncio.wait(tasks, timeout=seconds)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if pending:
        tally.add("unanswered", len(pending))


def median_seconds(times: list[float], what: str) -> str:
    return f"; {statistics.median(times):.2f} s {what}" if times else ""


# -- the attacks, by the row ---------------------------------------------------------


async def metrics_idle(p: dict[str, Any], tally: Tally) -> str:
    """1: idle TCP connections to the metrics listener, held until the deadline."""
    more_descriptors()
    clock = Clock(p["seconds"])
    port = int(p["port"])
    held = await open_many(
        lambda: asyncio.open_connection(LOOPBACK, port), p["connections"], clock, tally
    )
    ready()
    await asyncio.sleep(clock.left())
    await hang_up(held, tally)
    return tally.summary()


async def big_lists_unread(p: dict[str, Any], tally: Tally) -> str:
    """2: one batch of large lists, written and never read."""
    clock = Clock(p["seconds"])
    options = {"limit": p["limit"]}
    params = {"runId": p["runId"], "memoryRef": p["memoryRef"], "options": options}
    batch = [
        {"jsonrpc": "2.0", "id": i, "method": "memory.list", "params": params}
        for i in range(p["batch"])
    ]
    streams = await open_many(unix(p["socket"]), 1, clock, tally)
    if not streams:
        return tally.summary()
    reader, writer = streams[0]
    writer.write(orjson.dumps(batch) + b"\n")
    with contextlib.suppress(TimeoutError, OSError):
        await asyncio.wait_for(writer.drain(), clock.left())
    ready()
    await asyncio.sleep(clock.left())
    answer = await state(reader, 0.2)
    abort(streams)
    tally.add("sent", p["batch"])
    return f"{p['batch']} lists in one batch, never read; answer: {answer}"


async def anchor_puts(p: dict[str, Any], tally: Tally) -> str:
    """3: puts of ``unit * repeat`` (64 KiB of credential-pattern anchors), ``window`` at
    a time."""
    clock = Clock(p["seconds"])
    content = p["unit"] * p["repeat"]
    client = await LeanClient.connect(p["socket"], pipelined=True)
    run = f"attack-anchors-{os.getpid()}"
    times: list[float] = []
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < p["count"] and not clock.over():
            sent += 1
            started = time.perf_counter()
            params = {"runId": run, "memoryRef": "anchors", "entry": {"content": content}}
            if await call(client, tally, "memory.put", params):
                times.append(time.perf_counter() - started)

    try:
        if await call(client, Tally(), "run.begin", {"runId": run, "tenant": p["tenant"]}):
            ready()
            await bounded([worker() for _ in range(p["window"])], clock.left() + p["grace"], tally)
    except ProtocolFailure:
        pass  # tallied
    finally:
        await leave(client)
    return tally.summary() + median_seconds(times, "a put")


async def many_begins(p: dict[str, Any], tally: Tally) -> str:
    """5: one tenant begins many runs, pipelined, and leaves them open."""
    clock = Clock(p["seconds"])
    clients = [
        await LeanClient.connect(p["socket"], pipelined=True) for _ in range(p["connections"])
    ]
    begun = 0

    async def worker(client: LeanClient) -> None:
        nonlocal begun
        while begun < p["count"] and not clock.over():
            begun += 1
            params = {"runId": f"attack-begin-{os.getpid()}-{begun}", "tenant": p["tenant"]}
            await call(client, tally, "run.begin", params)

    ready()
    try:
        await bounded(
            [worker(c) for c in clients for _ in range(p["window"])],
            clock.left() + p["grace"],
            tally,
        )
    finally:
        await asyncio.gather(*(leave(c) for c in clients))
    return tally.summary()


async def trickle_idle(p: dict[str, Any], tally: Tally) -> str:
    """6: as many connections as the sidecar takes, each sending a blank line now and then
    (a byte that keeps it from being idle, and is no request)."""
    more_descriptors()
    clock = Clock(p["seconds"])
    opened = await open_many(unix(p["socket"]), p["connections"], clock, tally)
    live: list[Streams] = []
    # A connection past the cap is answered at once and closed; the rest stay silent.
    for streams, outcome in zip(opened, await states(opened, 0.2), strict=True):
        if outcome == "held":
            live.append(streams)
        else:
            tally.add(outcome)
    ready()
    while clock.left() > 0:
        await asyncio.sleep(min(p["interval"], clock.left()))
        for _, writer in live:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(b"\n")
    await hang_up(live, tally, also=opened)
    return tally.summary()


async def unread_health(p: dict[str, Any], tally: Tally) -> str:
    """7: many ``sidecar.health`` requests pipelined on one connection, never read."""
    clock = Clock(p["seconds"])
    streams = await open_many(unix(p["socket"]), 1, clock, tally)
    if not streams:
        return tally.summary()
    reader, writer = streams[0]
    lines = b"".join(request_line(i, "sidecar.health", {}) for i in range(p["count"]))
    writer.write(lines)
    with contextlib.suppress(TimeoutError, OSError):
        await asyncio.wait_for(writer.drain(), clock.left())
    ready()
    await asyncio.sleep(clock.left())
    taken = len(lines) - writer.transport.get_write_buffer_size()
    answer = await state(reader, 0.2)
    abort(streams)
    tally.add("sent", p["count"])
    return (
        f"{p['count']} sent, never read; sidecar took {taken / len(lines):.0%} of them"
        f"; answers: {answer}"
    )


async def partial_lines(p: dict[str, Any], tally: Tally) -> str:
    """7: many connections, each holding a large request line without its newline."""
    more_descriptors()
    clock = Clock(p["seconds"])
    opened = await open_many(unix(p["socket"]), p["connections"], clock, tally)
    chunk = b"x" * p["line_bytes"]
    for _, writer in opened:
        writer.write(chunk)

    async def drained(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(writer.drain(), clock.left())

    await asyncio.gather(*(drained(w) for _, w in opened))
    ready()
    await asyncio.sleep(clock.left())
    unsent = sum(w.transport.get_write_buffer_size() for _, w in opened)
    taken = len(opened) * len(chunk) - unsent
    await hang_up(opened, tally)
    return tally.summary() + f"; sidecar took {taken / (1 << 20):.0f} MiB"


async def malformed_frames(p: dict[str, Any], tally: Tally) -> str:
    """Fairness: many connections writing lines that are not JSON as fast as the sidecar
    takes them, reading their answers (what tests/e2e/test_fairness.py once timed; the figure
    is the bystander's gets in this row against the row of the bystander alone)."""
    clock = Clock(p["seconds"])
    opened = await open_many(unix(p["socket"]), p["connections"], clock, tally)
    block = b"not json\n" * 2048
    answered = [0]

    async def storm(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def drain_answers() -> None:
            while chunk := await reader.read(65536):
                answered[0] += chunk.count(b"\n")

        reading = asyncio.create_task(drain_answers())
        try:
            while not reading.done() and not clock.over():
                writer.write(block)
                await writer.drain()
        finally:
            reading.cancel()

    ready()
    with contextlib.suppress(TimeoutError, OSError):
        await asyncio.wait_for(
            asyncio.gather(*(storm(r, w) for r, w in opened)), clock.left() + 1.0
        )
    await hang_up(opened, tally)
    return tally.summary() + f"; {answered[0]:,} malformed lines refused"


async def keyring_compiles(p: dict[str, Any], tally: Tally) -> str:
    """8: begins with the largest keyring allowed, each followed by the put that compiles
    it; one run at a time."""
    clock = Clock(p["seconds"])
    times: list[float] = []
    ready()
    async with await LeanClient.connect(p["socket"]) as client:
        for n in range(p["count"]):
            if clock.over():
                break
            run = f"attack-keyring-{os.getpid()}-{n}"
            keyring = _keyring(p["secrets"], p["chars"])
            begin = {"runId": run, "tenant": p["tenant"], "secrets": keyring}
            put = {"runId": run, "memoryRef": "keyring", "entry": {"content": "compile me"}}
            started = time.perf_counter()
            try:
                # Tallied once per run: the begin's refusal, else the put's outcome.
                begun = Tally()
                if not await call(client, begun, "run.begin", begin):
                    tally.add(f"begin {next(iter(begun.counts))}")
                elif await call(client, tally, "memory.put", put):
                    times.append(time.perf_counter() - started)
            except ProtocolFailure:
                break
    return tally.summary() + median_seconds(times, "a begin and put")


async def keyword_oracle(p: dict[str, Any], tally: Tally) -> str:
    """12: from an empty scope, keyword searches for a word another tenant's scope is full
    of, alternating with a word no one wrote; reports each word's p50."""
    clock = Clock(p["seconds"])
    times: dict[str, list[float]] = {p["common"]: [], p["absent"]: []}
    run = f"attack-oracle-{os.getpid()}"
    async with await LeanClient.connect(p["socket"]) as client:
        try:
            if not await call(client, Tally(), "run.begin", {"runId": run, "tenant": p["tenant"]}):
                return "begin refused"
            ready()
            for n in range(p["count"]):
                if clock.over():
                    break
                word = p["common"] if n % 2 == 0 else p["absent"]
                options = {"rank": "relevance", "query": word, "limit": 10}
                started = time.perf_counter()
                params = {"runId": run, "memoryRef": "empty", "options": options}
                if await call(client, tally, "memory.list", params):
                    times[word].append(time.perf_counter() - started)
        except ProtocolFailure:
            pass  # tallied
    common, absent = (
        statistics.median(times[w]) * 1000 if times[w] else float("nan")
        for w in (p["common"], p["absent"])
    )
    outcome = "" if set(tally.counts) == {"ok"} else f" ({tally.summary()})"
    return (
        f"query p50 {common:.2f} ms for a word of theirs, {absent:.2f} ms for an absent one"
        + outcome
    )


ATTACKS: dict[str, Callable[[dict[str, Any], Tally], Awaitable[str]]] = {
    "metrics_idle": metrics_idle,
    "big_lists_unread": big_lists_unread,
    "anchor_puts": anchor_puts,
    "many_begins": many_begins,
    "trickle_idle": trickle_idle,
    "unread_health": unread_health,
    "partial_lines": partial_lines,
    "malformed_frames": malformed_frames,
    "keyring_compiles": keyring_compiles,
    "keyword_oracle": keyword_oracle,
}


async def main(name: str, params: dict[str, Any]) -> None:
    tally = Tally()
    print("start", flush=True)
    try:
        summary = await ATTACKS[name](params, tally)
    except (ProtocolFailure, OSError) as exc:
        # The sidecar went away under the attack (or refused its first connection).
        summary = f"{tally.summary()}; connection failed: {type(exc).__name__}"
    print(orjson.dumps({"summary": summary, "counts": dict(tally.counts)}).decode(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], orjson.loads(sys.argv[2])))
