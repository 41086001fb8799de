"""No party reaching a listener can take the sidecar down or lock the others out (issue 20,
rows 1, 6 and 11, and the metrics page's cost).

Each test runs the attack against a real sidecar (real sockets, a real child process of
another Unix user, the real ``openwop-memory inspect``) with small limits set by flag, and
asserts both that the attacker is refused or bounded and that a bystander is served within
a bound in seconds.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, suppress
from pathlib import Path
from typing import Any

import pytest
from openwop_memory.wire.slots import Refusal, Slots
from support.polling import wait_for
from support.protocol import begin, issue, put
from support.sidecar import EXE, RawClient, Sidecar, run_cli

# What this module tests sits above storage (connections, listeners, settings, keyrings,
# redaction): the PostgreSQL pass of `make test` would run it again for nothing.
pytestmark = pytest.mark.backend_independent

TENANT = "tenant-listeners"
NOBODY = 65534


def metrics_port(sidecar: Sidecar) -> int:
    (line,) = sidecar.events("metrics_listening")
    return int(str(line["address"]).rpartition(":")[2])


def http_get(port: int, timeout: float = 10.0) -> bytes:
    """The whole answer to ``GET /metrics``, head included, read until the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    received = b""
    with suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def body_of(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    return body


def alive(sidecar: Sidecar) -> bool:
    assert sidecar.proc is not None
    return sidecar.proc.poll() is None


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


# -- row 1: the metrics listener ---------------------------------------------------------------


def test_a_metrics_flood_past_the_descriptor_limit_leaves_the_sidecar_serving(
    workdir: Path, stack: ExitStack
) -> None:
    """Before: ``EMFILE`` out of the metrics accept loop ended the process (exit 1, every
    open run's keyring lost); ~1,100 idle connections did it at the default limit.

    Now, with the process's descriptor limit lowered (``prlimit``) to 8 more than it uses,
    the metrics cap set above that (so that descriptors, not the cap, run out) and 40 idle
    connections opened: the sidecar lives, logs the failing accepts once, answers a worker
    connection it already had, and once the flood leaves it serves metrics and new workers
    again.
    """
    sidecar = stack.enter_context(
        Sidecar(workdir, "--metrics-address", "127.0.0.1:0", "--metrics-max-connections", "1000")
    )
    port = metrics_port(sidecar)
    worker = stack.enter_context(sidecar.client(timeout=10))
    assert sidecar.proc is not None
    pid = sidecar.proc.pid
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 8
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    flood = [stack.enter_context(closing(socket.socket())) for _ in range(40)]
    for sock in flood:
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))  # the kernel completes it; the sidecar may not accept
    wait_for(lambda: bool(sidecar.events("accept_failing", listener="metrics")), 10, "EMFILE")
    time.sleep(0.3)  # failed accepts go on: still one log line, still alive
    assert alive(sidecar), sidecar.log()
    assert len(sidecar.events("accept_failing", listener="metrics")) == 1
    assert worker.call("sidecar.stats")["connections"]["acceptFailures"] >= 1
    for sock in flood:
        sock.close()
    # The flood's descriptors come back as the sidecar sees the closes (at the latest, at
    # the 5 s head timeout); then a scrape and a new worker are served.
    wait_for(lambda: sidecar.events("accept_resumed", listener="metrics") != [], 20, "resume")
    assert body_of(http_get(port)).startswith(b"# HELP")
    with sidecar.client() as late:
        assert late.call("sidecar.health")["status"] == "ok"
    assert alive(sidecar)


def test_a_connection_past_the_metrics_cap_is_answered_503_at_once(
    workdir: Path, stack: ExitStack
) -> None:
    """Before: no cap; every connection held a descriptor and a task for up to 5 s.

    Now, with ``--metrics-max-connections 4`` and four idle connections held: a fifth is
    answered ``503`` with ``Retry-After`` and closed at once (well before the 5 s head
    timeout of the held ones), a worker is served meanwhile, and once the held ones go a
    scrape gets the page.
    """
    sidecar = stack.enter_context(
        Sidecar(workdir, "--metrics-address", "127.0.0.1:0", "--metrics-max-connections", "4")
    )
    port = metrics_port(sidecar)
    held = [
        stack.enter_context(closing(socket.create_connection(("127.0.0.1", port))))
        for _ in range(4)
    ]
    time.sleep(0.3)  # the sidecar has accepted them (the cap counts accepted connections)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
        answer = read_to_close(extra)
    assert time.monotonic() - started < 4, "the fifth waited like the held ones"
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"\r\nRetry-After: 1\r\n" in answer
    assert len(sidecar.events("metrics_connections_refused")) == 1
    with sidecar.client() as worker:
        assert worker.call("sidecar.health")["status"] == "ok"
    for sock in held:
        sock.close()

    def scraped() -> bool:
        answer = http_get(port)
        return answer.startswith(b"HTTP/1.1 200 ")

    wait_for(scraped, 10, "a scrape once the held connections left")


def test_a_burst_of_scrapes_makes_the_page_once_per_render_interval(
    workdir: Path, stack: ExitStack
) -> None:
    """Before: every scrape made the page anew (~4 ms of the event loop each), so a scraper
    flood was a CPU flood.

    Now, with ``--metrics-render-interval 2s``: 40 scrapes, each after a worker request
    that moves a counter the page shows, get at most one page per 2 s elapsed (plus the
    first), identical bytes in between; after the interval the next scrape shows every
    request made meanwhile.
    """
    sidecar = stack.enter_context(
        Sidecar(workdir, "--metrics-address", "127.0.0.1:0", "--metrics-render-interval", "2s")
    )
    port = metrics_port(sidecar)
    worker = stack.enter_context(sidecar.client())
    started = time.monotonic()
    pages = []
    for _ in range(40):
        worker.call("sidecar.health")
        pages.append(body_of(http_get(port)))
    elapsed = time.monotonic() - started
    assert len(set(pages)) <= 1 + int(elapsed / 2) + 1, (len(set(pages)), elapsed)
    time.sleep(2.1)
    fresh = body_of(http_get(port)).decode()
    line = next(
        line
        for line in fresh.splitlines()
        if line.startswith("openwop_memory_requests_total{")
        and 'method="sidecar.health"' in line
        and 'outcome="ok"' in line
    )
    assert float(line.rpartition(" ")[2]) >= 40


# -- row 6: per-user slots, the admin socket's own, and trickling ------------------------------

REQUEST = b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health"}\n'


class Holder:
    """A forked process of another Unix user holding ``hold`` served connections to
    ``socket_path``, then opening one more; :meth:`answer` is what that one got. It holds
    them until :meth:`release`."""

    def __init__(self, uid: int, socket_path: Path, hold: int) -> None:
        report_r, report_w = os.pipe()
        release_r, self._release = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never back into pytest
            try:
                os.close(report_r)
                os.close(self._release)  # or the release pipe would never see its end
                os.setuid(uid)
                held = []
                for _ in range(hold):
                    held.append(RawClient(socket_path, timeout=10))
                    held[-1].send_line(REQUEST.strip())
                    assert "result" in held[-1].read()
                extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                extra.settimeout(10)
                extra.connect(str(socket_path))
                os.write(report_w, extra.makefile("rb").readline() or b"closed\n")
                os.read(release_r, 1)
            finally:
                os._exit(0)
        os.close(report_w)
        os.close(release_r)
        self._report = os.fdopen(report_r, "rb")

    def answer(self) -> Any:
        return json.loads(self._report.readline())

    def release(self) -> None:
        if self._release >= 0:
            os.close(self._release)
            self._release = -1
            os.waitpid(self.pid, 0)
            self._report.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_one_user_holding_its_share_is_refused_and_others_and_the_operator_are_served(
    workdir: Path, open_dir: Path, stack: ExitStack
) -> None:
    """Before: one shared cap; one process holding ``max_connections`` idle connections
    locked out every other worker and the operator on the admin socket.

    Now, with ``--max-connections 6 --max-connections-per-uid 3``: a process of user
    65534 holding 3 connections is answered ``rate_limited`` (``id: null``,
    ``retryAfterMs``) on its fourth; a process of another user (root, this test) is still
    served on the same socket, and so is ``openwop-memory inspect`` on the admin socket,
    even with every worker slot taken.
    """
    admin = open_dir / "admin.sock"
    sidecar = stack.enter_context(
        Sidecar(
            workdir,
            # World-writable is refused without tenant binding: bind both users.
            "--socket-mode", "0666",
            "--tenant-binding", f'{{"uid:0": ["*"], "uid:{NOBODY}": ["*"]}}',
            "--max-connections", "6",
            "--max-connections-per-uid", "3",
            "--admin-socket", str(admin),
            socket_path=open_dir / "w.sock",
        )
    )  # fmt: skip
    holder = Holder(NOBODY, sidecar.socket, 3)
    stack.callback(holder.release)
    refused = holder.answer()
    assert refused["id"] is None
    assert refused["error"]["data"]["error"] == "rate_limited"
    assert refused["error"]["data"]["details"]["retryAfterMs"] > 0
    assert sidecar.events("connections_refused", listener="workers", uid=NOBODY)
    # Another user fills the rest of the socket's slots, and is served on each.
    others = [stack.enter_context(sidecar.client(timeout=5)) for _ in range(3)]
    for client in others:
        assert client.call("sidecar.health")["status"] == "ok"
    # Every worker slot is taken; the operator still gets in on the admin socket.
    out = run_cli("inspect", "runs", "--admin-socket", str(admin), "--timeout", "5")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("runId")
    holder.release()
    # The sidecar frees the slots when it reads each closed connection's end: wait for that
    # (under load it can come after the next process connects) before holding them again.
    deadline = time.monotonic() + 10
    while others[0].call("sidecar.stats")["connections"]["open"] > len(others):
        assert time.monotonic() < deadline, "the holder's connections were never closed"
        time.sleep(0.01)
    # Its slots came back: the same user holds its share again (then is refused again).
    again = Holder(NOBODY, sidecar.socket, 3)
    stack.callback(again.release)
    assert again.answer()["error"]["data"]["error"] == "rate_limited"


def test_the_admin_socket_has_slots_of_its_own(workdir: Path, stack: ExitStack) -> None:
    """With ``--max-admin-connections 1`` and one admin connection held, a second admin
    connection is answered ``rate_limited`` and closed, while workers are served: neither
    socket's slots are the other's."""
    admin = workdir / "admin.sock"
    sidecar = stack.enter_context(
        Sidecar(workdir, "--admin-socket", str(admin), "--max-admin-connections", "1")
    )
    held = stack.enter_context(RawClient(admin))
    assert isinstance(held.call("admin.runs", limit=1), list)
    with RawClient(admin) as extra:
        answer = extra.read()
    assert answer["error"]["data"]["error"] == "rate_limited"
    assert sidecar.events("connections_refused", listener="admin")
    with sidecar.client() as worker:
        assert worker.call("sidecar.health")["status"] == "ok"


def test_blank_lines_trickled_in_do_not_keep_an_idle_connection_open(
    workdir: Path, stack: ExitStack
) -> None:
    """Before: any byte counted as activity, so a newline every few minutes held a slot
    for ever without a request.

    Now, with ``--idle-timeout 600ms``: a connection sending a blank line every 100 ms is
    closed as idle (within 5 s), and counted so; bytes of an unfinished line are bounded
    by ``partial_line_timeout`` already (tests/e2e/test_limits.py), so a connection without
    requests is kept at most ``idle_timeout`` + ``partial_line_timeout``.
    """
    sidecar = stack.enter_context(Sidecar(workdir, "--idle-timeout", "600ms"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(sidecar.socket))
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 5:
            try:
                sock.sendall(b"\n" if int(time.monotonic() * 10) % 2 else b" \n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.1)
            sock.setblocking(False)
            try:
                closed = sock.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed = True
            sock.setblocking(True)
        elapsed = time.monotonic() - started
    assert elapsed < 5, "the trickling connection was kept open"
    assert elapsed >= 0.6
    with sidecar.client() as c:
        assert c.call("sidecar.stats")["connections"]["closedIdle"] == 1


def test_slots_bound_each_peer_within_the_total() -> None:
    slots = Slots(total=3, per_peer=2)
    assert slots.take(1) is None and slots.take(1) is None
    assert slots.take(1) is Refusal.PEER
    assert slots.take(None) is None
    assert slots.take(2) is Refusal.FULL
    slots.give_back(1)
    assert slots.take(2) is None
    assert (slots.held, slots.held_by(1), slots.held_by(2)) == (3, 1, 1)
    slots.give_back(1)
    assert slots.held_by(1) == 0 and Slots(total=2, per_peer=5).per_peer == 2


# -- row 11: inspect escapes what it prints ----------------------------------------------------

HOSTILE = "\x1b]0;owned\x07\x1b[2J\rfake line\x9b31m\x7f"


def raw_controls(text: str) -> set[str]:
    """The control characters of ``text`` other than the newlines that lay it out."""
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F}


def test_inspect_escapes_control_characters_of_stored_content(workdir: Path) -> None:
    """Before: ``inspect`` wrote an entry's terminal escapes raw (the title set, the screen
    cleared, a carriage return faking a line).

    Now: ``inspect run`` and ``inspect entry`` print no control character but newlines,
    and show each as an escape (``\\x1b``, ``\\x07``, ``\\r``, ``\\x9b``); ``--json``
    carries DEL and C1 as ``\\u`` escapes, and parses back to the stored content.
    """
    admin = workdir / "admin.sock"
    with Sidecar(workdir, "--admin-socket", str(admin)) as sidecar, sidecar.client() as c:
        begin(c, "hostile", TENANT)
        entry = put(c, "hostile", issue(c, TENANT), HOSTILE)
        begin(c, "reader", TENANT)  # a snapshot that sees the entry

        def inspect(*args: str) -> str:
            out = subprocess.run(
                [EXE, "inspect", *args, "--admin-socket", str(admin)],
                capture_output=True,
                timeout=60,
                check=False,
            )
            assert out.returncode == 0, out.stderr
            return out.stdout.decode("utf-8")  # strict: a raw C1 byte pair is still UTF-8

        for table in (inspect("run", "reader"), inspect("entry", entry["id"])):
            assert raw_controls(table) == set(), table
            assert r"\x1b]0;owned\x07\x1b[2J\rfake line\x9b31m\x7f" in table
        as_json = inspect("entry", entry["id"], "--json")
        assert raw_controls(as_json) == set()
        assert "\\u009b" in as_json
        parsed: dict[str, Any] = json.loads(as_json)
        assert parsed["entry"]["content"] == HOSTILE
