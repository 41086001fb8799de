"""Connection-level limits of the real sidecar: a connection cap, idle and partial-line
timeouts, back-pressure on unread answers by bytes, and surviving a lack of descriptors.

Each test sets small limits by flag so it runs in seconds. Memory is read from
``/proc/<pid>/status``; waits poll with deadlines and no test asserts a speed.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import anyio
import orjson
import pytest
from openwop_memory_client import AsyncMemoryClient, MemoryClient, RateLimitedError
from support.polling import wait_for
from support.sidecar import RawClient, Sidecar

# What this module tests sits above storage (connections, listeners, settings, keyrings,
# redaction): the PostgreSQL pass of `make test` would run it again for nothing.
pytestmark = pytest.mark.backend_independent

TENANT = "tenant-limits"


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def pid_of(sidecar: Sidecar) -> int:
    assert sidecar.proc is not None
    return sidecar.proc.pid


def connection_stats(sidecar: Sidecar) -> dict[str, int]:
    with sidecar.client() as c:
        stats = c.call("sidecar.stats")["connections"]
    assert isinstance(stats, dict)
    return {k: int(v) for k, v in stats.items()}


def closed_by_peer(sock: socket.socket, timeout: float) -> bytes:
    """Everything the sidecar still sends until it closes; AssertionError if it does not
    close within ``timeout`` seconds."""
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        raise AssertionError(f"the sidecar kept the connection open for {timeout}s") from None
    except ConnectionResetError:
        pass
    return received


def served_client(sidecar: Sidecar) -> RawClient:
    """A connection the sidecar serves: with a small ``--max-connections``, the probes of
    start-up may still hold a slot for a moment after they closed."""
    deadline = time.monotonic() + 10
    while True:
        client = sidecar.client()
        try:
            response = client.raw(b'{"jsonrpc":"2.0","id":0,"method":"sidecar.health"}')
        except (EOFError, OSError) as exc:
            response = {"error": repr(exc)}
        if "result" in response:
            return client
        client.close()
        assert time.monotonic() < deadline, response
        time.sleep(0.02)


@pytest.fixture
def scratch(workdir: Path) -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


# -- connection cap -------------------------------------------------------------------------


def test_a_connection_beyond_max_connections_is_refused_politely(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: no cap at all; every connection was served until descriptors ran out.

    Now, with ``--max-connections 3`` and three open: the fourth gets one ``rate_limited``
    line with ``id: null`` and ``retryAfterMs``, then the close; the refusal is counted,
    and once one connection closes a new one is served.
    """
    sidecar = scratch.enter_context(Sidecar(workdir, "--max-connections", "3"))
    held = [scratch.enter_context(served_client(sidecar)) for _ in range(2)]
    third = served_client(sidecar)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
        extra.connect(str(sidecar.socket))
        with suppress(BrokenPipeError, ConnectionResetError):  # it may be closed already
            extra.sendall(b'{"jsonrpc":"2.0","id":7,"method":"sidecar.health"}\n')
        received = closed_by_peer(extra, 10)
    lines = received.splitlines()
    assert len(lines) == 1, received
    answer = orjson.loads(lines[0])
    assert answer["id"] is None
    assert answer["error"]["code"] == -32029
    assert answer["error"]["data"]["error"] == "rate_limited"
    assert answer["error"]["data"]["details"]["retryAfterMs"] > 0

    def stats() -> dict[str, int]:
        return {k: int(v) for k, v in held[0].call("sidecar.stats")["connections"].items()}

    assert stats()["refused"] == 1
    assert stats()["open"] == 3
    third.close()
    wait_for(lambda: stats()["open"] == 2, 10, "the third connection to close")
    with sidecar.client() as again:
        assert again.call("sidecar.health")["status"] == "ok"
    assert len(sidecar.events("connections_refused")) == 1


# -- timeouts -------------------------------------------------------------------------------


def test_an_idle_connection_is_closed_and_a_busy_one_is_not(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: a connection that sent nothing stayed open for ever (no idle timeout).

    Now, with ``--idle-timeout 400ms``: a connection silent for longer is closed, one that
    sends a request every 100 ms is kept for well over the timeout, and the close is counted.
    """
    sidecar = scratch.enter_context(Sidecar(workdir, "--idle-timeout", "400ms"))
    busy = scratch.enter_context(sidecar.client())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
        idle.connect(str(sidecar.socket))
        started = time.monotonic()
        for _ in range(15):
            assert busy.call("sidecar.health")["status"] == "ok"
            time.sleep(0.1)
        assert closed_by_peer(idle, 10) == b""
        assert time.monotonic() - started >= 0.4
    assert busy.call("sidecar.health")["status"] == "ok"  # 1.5 s, yet never idle for 0.4 s
    assert connection_stats(sidecar)["closedIdle"] >= 1


def test_a_request_line_left_unfinished_is_closed_without_an_answer(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: a connection holding part of a line (up to 1 MiB) was kept for ever.

    Now, with ``--partial-line-timeout 500ms``: bytes without their newline for longer close
    the connection without any answer, even when they trickle in (the clock runs from the
    line's first byte), and the close is counted; a complete request on the same
    connection before the partial one is still answered.
    """
    sidecar = scratch.enter_context(Sidecar(workdir, "--partial-line-timeout", "500ms"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(sidecar.socket))
        sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health"}\n{"jsonrpc":')
        started = time.monotonic()
        try:
            for _ in range(30):  # a byte every 50 ms: never quiet, never finished
                sock.sendall(b" ")
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = closed_by_peer(sock, 10)
        assert time.monotonic() - started < 5
    lines = received.splitlines()
    assert len(lines) == 1, received  # the health answer, nothing for the partial line
    assert orjson.loads(lines[0])["id"] == 1
    assert connection_stats(sidecar)["closedPartialLine"] == 1


# -- back-pressure by bytes -----------------------------------------------------------------


def _store_big_entries(client: RawClient, count: int, size: int) -> str:
    ref = str(client.call("memory.issueRef", tenant=TENANT, agent="bulky")["memoryRef"])
    client.call("run.begin", runId="bulk-writer", tenant=TENANT)
    for i in range(count):
        # Control characters: each is written as a six-byte \\u escape in every answer.
        content = f"{i:04d}" + "\x01" * (size - 4)
        client.call("memory.put", runId="bulk-writer", memoryRef=ref, entry={"content": content})
    client.call("run.begin", runId="bulk-reader", tenant=TENANT)
    # The indexer embeds the entries after their puts (loading the model first): let it
    # finish, so that what is measured next is the answers' memory alone.
    deadline = time.monotonic() + 30
    while client.call("sidecar.stats")["vectorsPending"] and time.monotonic() < deadline:
        time.sleep(0.02)
    return ref


def test_a_client_that_never_reads_costs_about_the_unsent_budget(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: up to 128 whole answers were buffered for a client that sends requests and
    never reads: 150 pipelined lists of 5 entries of 60 KB control characters (1.8 MB of
    escaped JSON each) grew the sidecar by about 230 MiB.

    Now, with ``--max-unsent-answer-bytes 1048576``: the sidecar stops reading that
    connection's requests once its unread answers exceed the budget, so its peak memory
    grows by less than ten such answers; other clients are served meanwhile, and the
    slow client still gets every answer once it reads (each holding what fits
    ``max_answer_bytes``, capped at half the budget: one entry here).
    """
    sidecar = scratch.enter_context(
        Sidecar(workdir, "--max-unsent-answer-bytes", "1048576", "--max-entry-size-bytes", "65536")
    )
    other = scratch.enter_context(sidecar.client())
    ref = _store_big_entries(other, count=5, size=60_000)
    pid = pid_of(sidecar)
    peak_before = status_kib(pid, "VmHWM")

    requests = 150
    slow = scratch.enter_context(sidecar.client(timeout=60))
    params = {"runId": "bulk-reader", "memoryRef": ref, "options": {"limit": 5}}
    lines = b"".join(
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "memory.list", "params": params}) + b"\n"
        for i in range(requests)
    )
    slow.sock.sendall(lines)
    # Lists wait for the unread answers to leave room for one more (their reading stops
    # once 128 wait): whatever was going to pile up has piled up after a second.
    time.sleep(1.5)
    for _ in range(5):
        assert other.call("sidecar.health")["status"] == "ok"
    grown_mib = (status_kib(pid, "VmHWM") - peak_before) / 1024
    # The budget, one list answer and its encoding's copies: about 10 MiB at most.
    assert grown_mib < 16, f"the sidecar grew by {grown_mib:.0f} MiB for one non-reader"

    seen: set[int] = set()
    for _ in range(requests):
        answer = orjson.loads(slow.reader.readline())
        # One 360 KB entry fills half the budget, which is all a list answer may hold.
        assert len(answer["result"]) == 1, str(answer)[:200]
        assert all(len(e["content"]) == 60_000 for e in answer["result"])
        seen.add(answer["id"])
    assert seen == set(range(requests))


# -- running out of file descriptors ---------------------------------------------------------


def test_running_out_of_descriptors_pauses_accepting_and_serving_goes_on(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: ``EMFILE`` from accept escaped ``serve()`` and the process exited
    (reproduced with ``ulimit -n 256`` and 300 connections).

    Now, with the running sidecar's descriptor limit lowered (``prlimit``) to a few more
    than it uses, and twice as many connections opened: it keeps running, the connections
    it had accepted keep being answered, the failure is logged once, and the connections
    left waiting are accepted and answered once the first ones close. The probe is
    ``sidecar.stats``: it needs no descriptor of the backend's (a PostgreSQL pool may want
    a new connection, and then health rightly says degraded).
    """
    sidecar = scratch.enter_context(Sidecar(workdir))
    pid = pid_of(sidecar)
    in_use = len(os.listdir(f"/proc/{pid}/fd"))
    spare = 8
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + spare, in_use + spare))
    first = [sidecar.client(timeout=10) for _ in range(spare)]
    waiting: list[RawClient] = []
    try:
        for c in first:
            c.send_line(b'{"jsonrpc":"2.0","id":1,"method":"sidecar.stats"}')
        waiting = [sidecar.client(timeout=20) for _ in range(spare)]
        for c in waiting:
            c.send_line(b'{"jsonrpc":"2.0","id":2,"method":"sidecar.stats"}')
        wait_for(lambda: bool(sidecar.events("accept_failing")), 20, "accept to fail")
        time.sleep(0.5)  # several failed attempts, still one log line
        assert sidecar.proc is not None
        assert sidecar.proc.poll() is None, sidecar.log()
        served = [c for c in first if c.sock.fileno() != -1]
        answered_first = 0
        for c in served:
            with suppress(EOFError, OSError):
                answered_first += "requests" in c.read()["result"]
        assert answered_first >= spare // 2
        for c in served:
            assert "requests" in c.call("sidecar.stats")
        assert len(sidecar.events("accept_failing")) == 1
        for c in first:
            c.close()
        for c in waiting:
            assert "requests" in c.read()["result"]
        assert sidecar.events("accept_resumed")
        # A new connection would wait in the backlog now: the waiting ones fill the limit.
        assert waiting[0].call("sidecar.stats")["connections"]["acceptFailures"] >= 1
    finally:
        for c in first + waiting:
            c.close()


# -- the Python client against these limits --------------------------------------------------


def test_the_clients_reconnect_after_the_sidecar_closed_an_idle_connection(
    workdir: Path, scratch: ExitStack
) -> None:
    """A worker keeps its connection open between calls; with ``--idle-timeout 300ms`` the
    sidecar closes it in a pause, and the next call of the blocking client (and of the
    async one under it) reconnects and succeeds instead of failing."""
    sidecar = scratch.enter_context(Sidecar(workdir, "--idle-timeout", "300ms"))
    client = scratch.enter_context(MemoryClient(sidecar.socket, reconnect_attempts=3))
    assert client.health()["status"] == "ok"
    ref = client.issue_ref(TENANT, "idler")
    with client.run("idle-run", TENANT) as run:
        run.put(ref, {"content": "before the pause"})
        wait_for(lambda: connection_stats(sidecar)["closedIdle"] >= 1, 10, "the idle close")
        assert client.health()["status"] == "ok"
        run.put(ref, {"content": "after the pause"})
    with client.run("idle-reader", TENANT) as reader:
        contents = {e.content for e in reader.list(ref)}
    assert contents == {"before the pause", "after the pause"}


async def _async_call_after_idle_close(sidecar: Sidecar) -> str:
    async with AsyncMemoryClient(sidecar.socket, reconnect_attempts=3) as client:
        await client.health()
        wait_for(lambda: connection_stats(sidecar)["closedIdle"] >= 1, 10, "the idle close")
        await anyio.sleep(0.05)  # let the reader task see the end of the stream
        return str((await client.health())["status"])


def test_the_async_client_reconnects_after_an_idle_close(workdir: Path, scratch: ExitStack) -> None:
    """As above, for :class:`AsyncMemoryClient` directly (``--idle-timeout 300ms``)."""
    sidecar = scratch.enter_context(Sidecar(workdir, "--idle-timeout", "300ms"))
    assert anyio.run(_async_call_after_idle_close, sidecar) == "ok"


def test_the_client_raises_rate_limited_when_the_sidecar_refuses_its_connection(
    workdir: Path, scratch: ExitStack
) -> None:
    """Before: a connection refused at the cap ended as a lost connection, sent again and
    again until ``SidecarUnavailableError``. Now (``--max-connections 1``, one held) the
    call raises :class:`RateLimitedError` carrying ``retryAfterMs``, and succeeds once the
    held connection closes."""
    sidecar = scratch.enter_context(Sidecar(workdir, "--max-connections", "1"))
    holder = served_client(sidecar)
    client = scratch.enter_context(MemoryClient(sidecar.socket, reconnect_attempts=2))
    with pytest.raises(RateLimitedError) as refused:
        client.health()
    assert refused.value.details["retryAfterMs"] > 0
    holder.close()
    wait_for(lambda: _health_ok(client), 10, "a call to be served once a slot is free")


def _health_ok(client: MemoryClient) -> bool:
    try:
        return bool(client.health()["status"] == "ok")
    except RateLimitedError:
        return False
