"""The sidecar under systemd's service protocol, spoken by the test as systemd speaks it.

A real ``openwop-memory serve`` gets a listening socket the test bound as descriptor 3
(``LISTEN_FDS``, ``LISTEN_PID`` set to the child's own pid by ``exec`` from a shell), a
``NOTIFY_SOCKET`` datagram socket the test reads, and a ``WATCHDOG_USEC``. The watchdog's
refusal to ping over a stuck writer is shown in process, on a real SQLite store whose
commit the test holds.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from openwop_memory.app import open_app
from openwop_memory.config import Settings
from openwop_memory.errors import StartupError
from openwop_memory.server import Server
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.storage.sqlite.writer import Txn
from openwop_memory.systemd import (
    PassedDescriptor,
    SystemdEnvironment,
    choose_listener,
    socket_path,
)
from support.postgres import PostgresServer
from support.sidecar import EXE, RawClient

# Nothing here depends on the storage backend: one pass is enough.
pytestmark = [
    pytest.mark.backend_independent,
]

WATCHDOG_USEC = 200_000
# The shell's own pid is the one exec hands to the sidecar: that is how LISTEN_PID can name
# the child before it exists, as systemd does between fork and exec.
_AS_SYSTEMD_STARTS_IT = 'export LISTEN_PID=$$; exec "$@"'


class NotifyListener:
    """The datagram socket systemd reads notifications on; collects every message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[tuple[float, str]] = []

    def close(self) -> None:
        self.sock.close()

    def wait_for(self, message: str, timeout: float = 20.0) -> float:
        """The time (``time.monotonic``) at which ``message`` arrived, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for at, seen in self.messages:
                if message in seen.split("\n"):
                    return at
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {message!r} within {timeout}s: {self.messages}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def drain(self, seconds: float) -> None:
        """Collect whatever arrives during ``seconds``."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                break
            self.messages.append((time.monotonic(), data.decode()))

    def times_of(self, message: str) -> list[float]:
        return [at for at, seen in self.messages if message in seen.split("\n")]


def bound_listener(path: Path) -> socket.socket:
    """A listening Unix stream socket at ``path``, as a ``.socket`` unit makes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    return sock


def start_activated(
    workdir: Path,
    listener: socket.socket,
    notify: NotifyListener,
    *,
    log_name: str,
    passed: list[tuple[socket.socket, str]] | None = None,
    socket_setting: str | None = None,
) -> subprocess.Popen[bytes]:
    """``openwop-memory serve`` with ``listener`` as its descriptor 3, the way systemd
    passes a socket unit's socket; or with each of ``passed`` (socket, FileDescriptorName)
    in turn from descriptor 3 on."""
    passed = passed or [(listener, "openwop-memory.socket")]
    fds = [sock.fileno() for sock, _ in passed]

    def as_descriptors_from_3() -> None:
        # Out of the way first, so that no dup2 overwrites a descriptor still to be moved.
        moved = [os.dup(fd) for fd in fds]
        for offset, fd in enumerate(moved):
            os.dup2(fd, 3 + offset)
            os.set_inheritable(3 + offset, True)  # dup2 onto itself keeps close-on-exec

    env = {
        **os.environ,
        "LISTEN_FDS": str(len(passed)),
        "LISTEN_FDNAMES": ":".join(name for _, name in passed),
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": str(WATCHDOG_USEC),
    }
    argv = [
        EXE,
        "serve",
        "--socket",
        socket_setting or socket_path(listener),
        "--database",
        f"sqlite:///{workdir / 'memory.db'}",
    ]
    with open(workdir / log_name, "wb") as log:
        return subprocess.Popen(
            ["/bin/sh", "-c", _AS_SYSTEMD_STARTS_IT, "sh", *argv],
            stdout=log,
            stderr=log,
            env=env,
            close_fds=False,  # only the passed ones are inheritable: Python's own are not
            preexec_fn=as_descriptors_from_3,
        )


@contextmanager
def activated(
    workdir: Path, listener: socket.socket, notify: NotifyListener, log_name: str
) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_activated(workdir, listener, notify, log_name=log_name)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_socket_activated_sidecar_serves_pings_and_leaves_the_socket(workdir: Path) -> None:
    path = workdir / "memory.sock"
    notify = NotifyListener(workdir / "notify.sock")
    listener = bound_listener(path)
    inode = path.stat().st_ino
    try:
        with activated(workdir, listener, notify, "first.log") as proc:
            ready = notify.wait_for("READY=1")
            # A quick succession of pings at about half the interval.
            notify.drain(1.0)
            pings = [t for t in notify.times_of("WATCHDOG=1") if t >= ready]
            assert len(pings) >= 3, notify.messages
            gaps = [b - a for a, b in itertools.pairwise(pings)]
            assert max(gaps) < WATCHDOG_USEC / 1e6, gaps
            with RawClient(path) as client:
                assert client.call("sidecar.health")["status"] == "ok"
                run = client.call("run.begin", runId="activated-1", tenant="t-activation")
                assert run["resumed"] is False
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, (workdir / "first.log").read_text()
            notify.wait_for("STOPPING=1")
        log = (workdir / "first.log").read_text()
        assert '"socket_activation":true' in log.replace(" ", ""), log
        assert "stale_socket_removed" not in log
        # The socket is systemd's: it outlives the service, and is the same file.
        assert path.is_socket() and path.stat().st_ino == inode

        # Between two runs a client's connection waits in the backlog, as under systemd,
        # and the next sidecar on the same socket answers it.
        with RawClient(path, timeout=30) as waiting:
            waiting.send_line(b'{"jsonrpc":"2.0","id":7,"method":"sidecar.health"}')
            notify.messages.clear()
            with activated(workdir, listener, notify, "second.log") as proc:
                notify.wait_for("READY=1")
                answer = waiting.read()
                assert answer["id"] == 7 and answer["result"]["status"] == "ok", answer
                with RawClient(path) as client:
                    run = client.call("run.begin", runId="activated-1", tenant="t-activation")
                    assert run["resumed"] is True  # the same database, served again
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(20) == 0, (workdir / "second.log").read_text()
        assert path.is_socket() and path.stat().st_ino == inode
    finally:
        listener.close()
        notify.close()


def test_a_sidecar_that_made_its_socket_removes_it_but_not_a_successor_s(workdir: Path) -> None:
    """Without activation the sidecar removes the sockets it created (the workers' and
    the admin socket); if another process has put a socket of its own at either path
    meanwhile, that one stays."""
    path = workdir / "memory.sock"
    admin = workdir / "admin.sock"
    argv = [
        EXE,
        "serve",
        "--socket",
        str(path),
        "--admin-socket",
        str(admin),
        "--database",
        f"sqlite:///{workdir / 'm.db'}",
    ]
    notify = NotifyListener(workdir / "notify.sock")
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path)}
    try:
        with open(workdir / "own.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        try:
            notify.wait_for("READY=1")
            with RawClient(path) as client:
                client.send_line(b'{"jsonrpc":"2.0","id":1,"method":"sidecar.health"}')
                # The successors: sockets of another process where ours were.
                successors = []
                for replaced in (path, admin):
                    replaced.unlink()
                    successors.append(bound_listener(replaced))
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(20) == 0
            for replaced, successor in zip((path, admin), successors, strict=True):
                assert replaced.is_socket(), f"the sidecar removed {replaced.name}, not its own"
                successor.close()
                replaced.unlink()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        notify.messages.clear()
        with open(workdir / "own.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        notify.wait_for("READY=1")
        assert path.is_socket() and admin.is_socket()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not path.exists(), "the sidecar left its own socket behind"
        assert not admin.exists(), "the sidecar left its own admin socket behind"
    finally:
        notify.close()


def test_of_two_passed_sockets_the_one_named_memory_is_served(workdir: Path) -> None:
    """``LISTEN_FDNAMES`` decides between passed sockets: the one named ``memory`` is
    served even though the ``socket`` setting names neither, and the other is left alone,
    listening, with nothing accepted from it."""
    notify = NotifyListener(workdir / "notify.sock")
    other = bound_listener(workdir / "other.sock")
    memory = bound_listener(workdir / "memory.sock")
    other.settimeout(0)
    try:
        proc = start_activated(
            workdir,
            memory,
            notify,
            log_name="named.log",
            passed=[(other, "other"), (memory, "memory")],
            socket_setting=str(workdir / "elsewhere.sock"),
        )
        try:
            notify.wait_for("READY=1")
            with RawClient(workdir / "memory.sock") as client:
                assert client.call("sidecar.health")["status"] == "ok"
            waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            waiting.connect(str(workdir / "other.sock"))  # queued, never accepted by it
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, (workdir / "named.log").read_text()
            accepted, _ = other.accept()  # still the test's: the connection waited for it
            accepted.close()
            waiting.close()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        log = (workdir / "named.log").read_text()
        assert "socket_setting_differs" in log, log
        assert (workdir / "other.sock").is_socket() and (workdir / "memory.sock").is_socket()
    finally:
        for sock in (other, memory):
            sock.close()
        notify.close()


# -- the environment, read once and removed -------------------------------------------------


def test_variables_for_this_process_are_taken_and_removed() -> None:
    environ = {
        "LISTEN_PID": str(os.getpid()),
        "LISTEN_FDS": "2",
        "LISTEN_FDNAMES": "memory:other",
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": str(os.getpid()),
        "NOTIFY_SOCKET": "@notify",
        "PATH": "/usr/bin",
    }
    taken = SystemdEnvironment.take(environ)
    assert environ == {"PATH": "/usr/bin"}  # nothing left for a child to act on
    assert taken.passed == (PassedDescriptor(3, "memory"), PassedDescriptor(4, "other"))
    assert taken.watchdog_interval == 30.0
    assert taken.notify_address == "@notify"
    assert taken.ignored == ()


def test_variables_for_another_process_are_removed_and_ignored() -> None:
    other = str(os.getpid() + 1)
    environ = {
        "LISTEN_PID": other,
        "LISTEN_FDS": "1",
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": other,
    }
    taken = SystemdEnvironment.take(environ)
    assert environ == {}
    assert taken.passed == () and taken.watchdog_interval is None
    assert len(taken.ignored) == 2


def test_malformed_activation_variables_stop_the_start() -> None:
    with pytest.raises(StartupError, match="LISTEN_FDS"):
        SystemdEnvironment.take({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "one"})


def test_a_negative_listen_fds_stops_the_start_and_is_removed() -> None:
    environ = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "-1"}
    with pytest.raises(StartupError) as refused:
        SystemdEnvironment.take(environ)
    assert str(refused.value) == "socket activation: LISTEN_FDS=-1 is negative"
    assert environ == {}


@pytest.mark.parametrize("names", ["memory", "memory:other:extra", ""])
def test_names_that_do_not_match_the_count_are_all_unknown(names: str) -> None:
    """As libsystemd does: no descriptor is taken for ``memory`` on a miscounted list."""
    environ = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2", "LISTEN_FDNAMES": names}
    taken = SystemdEnvironment.take(environ)
    assert taken.passed == (PassedDescriptor(3, "unknown"), PassedDescriptor(4, "unknown"))
    assert taken.ignored == ()


@pytest.mark.parametrize(
    ("usec", "why"),
    [
        ("30s", "WATCHDOG_USEC='30s' is not a number"),
        ("", "WATCHDOG_USEC='' is not a number"),
        ("0", "WATCHDOG_USEC=0 is not positive"),
        ("-5000000", "WATCHDOG_USEC=-5000000 is not positive"),
    ],
)
def test_a_bad_watchdog_interval_is_ignored_saying_why(usec: str, why: str) -> None:
    environ = {"WATCHDOG_USEC": usec, "WATCHDOG_PID": str(os.getpid())}
    taken = SystemdEnvironment.take(environ)
    assert (taken.watchdog_interval, taken.ignored, environ) == (None, (why,), {})


def test_a_watchdog_without_its_pid_is_this_process_s() -> None:
    taken = SystemdEnvironment.take({"WATCHDOG_USEC": "1500000"})
    assert (taken.watchdog_interval, taken.ignored) == (1.5, ())


def test_the_listening_unix_stream_socket_is_chosen(workdir: Path) -> None:
    datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    datagram.bind(str(workdir / "d.sock"))
    unlistened = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unlistened.bind(str(workdir / "u.sock"))
    stream = bound_listener(workdir / "s.sock")
    others = [datagram, unlistened]
    try:
        named = [(datagram, "d"), (unlistened, "u"), (stream, "s")]
        passed = [PassedDescriptor(s.fileno(), n) for s, n in named]
        chosen = choose_listener(passed, "anywhere")
        assert chosen is not None and chosen.fileno() == stream.fileno()
        assert chosen.getblocking() is False  # an inherited socket must not block the loop
        chosen.detach()
        # The others were left open, untouched.
        assert all(s.fileno() >= 0 and s.getsockname() for s in others)
        with pytest.raises(StartupError, match="none is a listening Unix stream socket"):
            choose_listener([PassedDescriptor(s.fileno(), "x") for s in others], "anywhere")
        second = bound_listener(workdir / "t.sock")
        try:
            both = [PassedDescriptor(stream.fileno(), "s"), PassedDescriptor(second.fileno(), "t")]
            chosen = choose_listener(both, str(workdir / "t.sock"))
            assert chosen is not None and chosen.fileno() == second.fileno()
            chosen.detach()
            with pytest.raises(StartupError, match="several"):
                choose_listener(both, str(workdir / "elsewhere.sock"))
            # Named: the name decides, wherever the setting points.
            for name in ("memory", "openwop-memory.socket"):
                by_name = [
                    PassedDescriptor(stream.fileno(), "s"),
                    PassedDescriptor(second.fileno(), name),
                ]
                chosen = choose_listener(by_name, str(workdir / "s.sock"))
                assert chosen is not None and chosen.fileno() == second.fileno()
                chosen.detach()
            # Both named so (two ListenStream= of one unit): the setting decides between them.
            alike = [
                PassedDescriptor(s.fileno(), "openwop-memory.socket") for s in (stream, second)
            ]
            chosen = choose_listener(alike, str(workdir / "s.sock"))
            assert chosen is not None and chosen.fileno() == stream.fileno()
            chosen.detach()
            with pytest.raises(StartupError, match="FileDescriptorName=memory"):
                choose_listener(alike, str(workdir / "elsewhere.sock"))
        finally:
            second.close()
    finally:
        for sock in [*others, stream]:
            sock.close()


# -- the watchdog over a stuck writer -------------------------------------------------------


@pytest.mark.anyio
async def test_a_stuck_writer_stops_the_watchdog_pings_until_it_ends(workdir: Path) -> None:
    notify = NotifyListener(workdir / "notify.sock")
    notify.sock.setblocking(False)
    settings = Settings.model_validate(
        {"database": f"sqlite:///{workdir / 'memory.db'}", "socket": str(workdir / "m.sock")}
    )
    app = await open_app(settings)
    store = app.storage
    assert isinstance(store, SqliteStorage)
    store.stuck_after = 0.3
    server = Server(settings, app, SystemdEnvironment(notify_address=str(notify.path)))
    release = threading.Event()

    def blocked(txn: Txn) -> None:
        release.wait(20)

    def received() -> list[str]:
        found = []
        while True:
            try:
                found.append(notify.sock.recv(4096).decode())
            except BlockingIOError:
                return found

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server._watchdog, 0.2)
            await anyio.sleep(0.5)
            assert received().count("WATCHDOG=1") >= 3
            tg.start_soon(store._writer.write, blocked)
            await anyio.sleep(0.6)  # past stuck_after: the pings stop
            assert "STATUS=watchdog withheld: writer_stuck" in received()
            await anyio.sleep(0.5)
            silent = received()
            assert "WATCHDOG=1" not in silent, silent
            release.set()
            await anyio.sleep(0.5)
            resumed = received()
            assert "WATCHDOG=1" in resumed and "STATUS=serving" in resumed, resumed
            tg.cancel_scope.cancel()
    finally:
        release.set()
        await app.aclose()
        notify.close()


@pytest.mark.anyio
async def test_a_hung_postgresql_withholds_the_pings_and_a_refusing_one_does_not(
    workdir: Path,
) -> None:
    """A server that hangs (every process of it stopped) withholds the pings once a health
    check takes longer than a quarter of the interval, and pings again once it answers; one
    that refuses connections (shut down) does not: a restart would not repair it."""
    notify = NotifyListener(workdir / "notify.sock")
    notify.sock.setblocking(False)

    def received() -> list[str]:
        found = []
        while True:
            try:
                found.append(notify.sock.recv(4096).decode())
            except BlockingIOError:
                return found

    with PostgresServer() as pg:
        settings = Settings.model_validate(
            {
                "database": pg.create_database("watchdog"),
                "socket": str(workdir / "m.sock"),
                "postgresql": {"connect_timeout": "1s", "command_timeout": "2s"},
            }
        )
        app = await open_app(settings)
        server = Server(settings, app, SystemdEnvironment(notify_address=str(notify.path)))
        interval = 2.0  # a ping every second, after a check given half a second
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(server._watchdog, interval)
                await anyio.sleep(1.5)
                assert received().count("WATCHDOG=1") >= 2
                pg.pause()
                try:
                    await anyio.sleep(1.5)
                    withheld = received()
                    assert "STATUS=watchdog withheld: health_check_timeout" in withheld, withheld
                    await anyio.sleep(2.0)
                    silent = received()
                    assert "WATCHDOG=1" not in silent, silent
                finally:
                    pg.resume()
                await anyio.sleep(2.5)
                resumed = received()
                assert "WATCHDOG=1" in resumed and "STATUS=serving" in resumed, resumed
                await anyio.to_thread.run_sync(pg.stop)
                await anyio.sleep(0.5)
                received()  # whatever the check in flight during the stop decided
                await anyio.sleep(2.5)
                refused = received()
                assert refused.count("WATCHDOG=1") >= 2, refused
                assert not any(m.startswith("STATUS=watchdog withheld") for m in refused)
                tg.cancel_scope.cancel()
        finally:
            await app.aclose()
            notify.close()
