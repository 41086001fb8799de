"""A real sidecar process on a real Unix socket and database, for tests and benchmarks.

The database is the selected backend's (:func:`support.backends.selected`, SQLite unless
``pytest --backend`` says otherwise); tests name it by a path in their work directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from support.backends import Backend, selected
from support.forked import ForkedProcess, fork_command, run_cli_forked

if TYPE_CHECKING:
    import pytest

EXE = shutil.which("openwop-memory", path=os.path.dirname(sys.executable)) or "openwop-memory"

# OPENWOP_TEST_FRESH=1 starts every sidecar and command as a new process, as before the
# forks (support.forked): to tell a failure of the code from one of the way tests start it.
ALWAYS_FRESH = os.environ.get("OPENWOP_TEST_FRESH") == "1"

# Linux's ``sun_path`` holds 108 bytes with the terminating NUL: a socket path of more is refused.
SOCKET_PATH_MAX = 107
# Room a work directory leaves for the socket names tests put in it (``var/openwop-memory.sock``).
SOCKET_NAME_ROOM = 32


def inherited_settings(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` a sidecar would read as its own: ``OPENWOP_MEMORY_*`` settings
    and systemd's ``NOTIFY_SOCKET``. Tests run without them unless they set one themselves."""
    return [n for n in environ if n.startswith("OPENWOP_MEMORY_") or n == "NOTIFY_SOCKET"]


def unmeasured(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables by which ``make test`` has every Python process it
    starts measure its coverage: for a process whose cost or imports a test measures."""
    return {k: v for k, v in environ.items() if not k.startswith("COVERAGE_PROCESS_")}


def check_socket_path(path: Path) -> Path:
    """``path``, if a Unix socket can be bound there; ValueError naming the limit otherwise."""
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_MAX:
        raise ValueError(
            f"the socket path {path} is {size} bytes, over the {SOCKET_PATH_MAX} bytes a Unix "
            "socket path may have; run pytest with a shorter --basetemp (or TMPDIR)"
        )
    return path


@contextmanager
def socket_workdir(preferred: Path, short_base: Path = Path("/tmp")) -> Iterator[Path]:
    """A work directory with room for a socket name of :data:`SOCKET_NAME_ROOM` bytes:
    ``preferred`` if it has that room, else a fresh directory in ``short_base``, removed on
    exit. ValueError if neither has room."""
    if len(os.fsencode(preferred)) + 1 + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX:
        yield preferred
        return
    short = Path(tempfile.mkdtemp(prefix="owm-", dir=short_base))
    try:
        check_socket_path(short / ("s" * SOCKET_NAME_ROOM))
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30, fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """``openwop-memory ARGS`` run to its end (``serve`` only where it must refuse to start),
    with ``env`` over this process's environment; its exit code and text output.

    In a forked child of this process (:mod:`support.forked`: the command's code without
    a second of interpreter start), unless ``fresh``: then the console script in a new
    process, for a test of how the command starts."""
    if not (fresh or ALWAYS_FRESH):
        return run_cli_forked(*args, env=env, timeout=timeout)
    return subprocess.run(
        [EXE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


class RpcError(Exception):
    """A JSON-RPC error response; ``.error`` is the whole error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(json.dumps(error))
        self.error = error

    @property
    def code(self) -> str:
        return str(self.error["data"]["error"])

    @property
    def rpc_code(self) -> int:
        return int(self.error["code"])

    @property
    def details(self) -> dict[str, Any]:
        return dict(self.error["data"].get("details", {}))


class RawClient:
    """A blocking line-oriented JSON-RPC client on one connection (standard library only)."""

    def __init__(self, path: str | Path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except BaseException:
            self.sock.close()
            raise
        self.reader = self.sock.makefile("rb")
        self.next_id = 0

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_line(self, line: bytes) -> None:
        self.sock.sendall(line + b"\n")

    def read(self) -> Any:
        line = self.reader.readline()
        if not line:
            raise EOFError("the sidecar closed the connection")
        return json.loads(line)

    def raw(self, line: bytes) -> Any:
        """Send one line and return the parsed answer line."""
        self.send_line(line)
        return self.read()

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request and return the whole response object."""
        self.next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        response = self.raw(json.dumps(msg).encode())
        assert response.get("id") == self.next_id, response
        return dict(response)

    def call(self, method: str, **params: Any) -> Any:
        """The result of ``method``; raises :class:`RpcError` on an error response."""
        response = self.request(method, params)
        if "error" in response:
            raise RpcError(response["error"])
        return response["result"]

    def error(self, method: str, **params: Any) -> RpcError:
        """The error ``method`` must fail with; AssertionError if it succeeded."""
        response = self.request(method, params)
        assert "error" in response, f"{method} should have failed: {response}"
        return RpcError(response["error"])


class Sidecar:
    """``openwop-memory serve`` in a process of its own; its stderr goes to ``log_path``. Its
    environment is this process's with ``env`` over it; ``measured=False`` leaves coverage
    measurement out of it (see :func:`unmeasured`).

    The process is a forked child of this one (:mod:`support.forked`: no second of
    interpreter start and imports) unless ``fresh`` or not ``measured``: then the console
    script in a new process, for a test of the sidecar's start, imports or absolute memory
    (a forked child holds the test process's modules and heap)."""

    def __init__(
        self,
        workdir: Path,
        *args: str,
        database: Path | None = None,
        socket_path: Path | None = None,
        env: dict[str, str] | None = None,
        backend: Backend | None = None,
        measured: bool = True,
        fresh: bool = False,
    ) -> None:
        self.workdir = workdir
        self.backend = backend or selected()
        self.socket = check_socket_path(socket_path or workdir / "memory.sock")
        self.database = database or workdir / "memory.db"
        self.log_path = workdir / f"sidecar-{os.getpid()}-{time.monotonic_ns()}.log"
        self.args = list(args)
        inherited = os.environ if measured else unmeasured(os.environ)
        self.env = {**inherited, **(env or {})}
        self.fresh = fresh or not measured or ALWAYS_FRESH
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None

    @property
    def argv(self) -> list[str]:
        return [
            EXE,
            "serve",
            "--socket",
            str(self.socket),
            "--database",
            self.backend.url_for(self.database),
            *self.args,
        ]

    def start(self, timeout: float = 20.0) -> Sidecar:
        with open(self.log_path, "ab") as log:
            argv = self.argv
            if self.fresh or argv[0] != EXE:  # a subclass's wrapper around the command
                self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=self.env)
            else:
                self.proc = fork_command(argv[1:], self.env, log.fileno(), log.fileno())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return self
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"sidecar not ready within {timeout}s:\n{self.log()}")

    def ready(self) -> bool:
        try:
            with RawClient(self.socket, timeout=2) as c:
                return bool(c.call("sidecar.health")["status"] == "ok")
        except (OSError, EOFError, RpcError, ValueError):
            return False

    def client(self, timeout: float = 10.0) -> RawClient:
        return RawClient(self.socket, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{")]

    def events(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        """The JSON log lines written so far whose ``event`` is ``name`` (``"request"``: the
        access log's) and that hold each of ``fields`` with its value."""
        return [
            line
            for line in self.log_lines()
            if line.get("event") == name and all(line.get(k) == v for k, v in fields.items())
        ]

    def signal(self, signum: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> Sidecar:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.stop()
        finally:
            self.kill()


@contextmanager
def running(workdir: Path, *args: str, **kwargs: Any) -> Iterator[Sidecar]:
    with Sidecar(workdir, *args, **kwargs) as sidecar:
        yield sidecar


@contextmanager
def module_sidecar(factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[Sidecar]:
    """A running sidecar (``serve`` with ``args``) in a fresh directory of ``factory`` named
    after ``name``, stopped on exit; for fixtures shared by a whole module.

    The socket is in a directory short enough for a Unix socket path (see :func:`socket_workdir`).
    """
    with socket_workdir(factory.mktemp(name)) as workdir, Sidecar(workdir, *args) as sidecar:
        yield sidecar


Pair = tuple[Sidecar, Sidecar, RawClient, RawClient]


@contextmanager
def sidecars_sharing_a_database(workdir: Path) -> Iterator[Pair]:
    """Two running sidecars, A at ``workdir/a.sock`` and B at ``workdir/b.sock``, on one
    SQLite file ``workdir/shared.db``; yields both and an open client of each (A's first)."""
    database = workdir / "shared.db"
    with (
        Sidecar(workdir, database=database, socket_path=workdir / "a.sock") as a,
        Sidecar(workdir, database=database, socket_path=workdir / "b.sock") as b,
        a.client() as ca,
        b.client() as cb,
    ):
        yield a, b, ca, cb
