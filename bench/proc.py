"""A server under test in a subprocess: start, time to ready, memory and CPU, SIGTERM stop."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")


_NS = 1e-9


class ServerFailed(Exception):
    """The server exited, or did not become ready in time; the message quotes its log tail."""


@dataclass(frozen=True)
class Memory:
    rss_kib: int
    peak_kib: int  # VmHWM: the resident high-water mark since the process started


@dataclass(frozen=True)
class Stopped:
    exit_code: int | None  # None: it ignored SIGTERM and was killed
    seconds: float


class ServerProcess:
    """One server process whose stdout and stderr go to ``log_path``; with ``nofile``, it
    starts with that soft descriptor limit (as under a shell's or systemd's default of 1024,
    whatever this process's own limit is)."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        nofile: int | None = None,
    ):
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.started_at = time.perf_counter()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=self.env,
                preexec_fn=None if self.nofile is None else self._limit_descriptors,
            )

    def _limit_descriptors(self) -> None:
        assert self.nofile is not None
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        soft = self.nofile if hard == resource.RLIM_INFINITY else min(self.nofile, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def wait_ready(self, probe: Callable[[], Awaitable[bool]], *, within: float) -> float:
        """Seconds from process start to the first probe that succeeds.

        :raises ServerFailed: the process exited first, or ``timeout`` passed.
        """
        assert self.proc is not None, "not started"
        deadline = self.started_at + within
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                ok = await asyncio.wait_for(probe(), timeout=2.0)
            except (OSError, TimeoutError, ValueError, EOFError):
                ok = False
            if ok:
                return time.perf_counter() - self.started_at
            await asyncio.sleep(0.005)
        raise ServerFailed(f"not ready within {within:g}s:\n{self.log_tail()}")

    def check_alive(self) -> None:
        """:raises ServerFailed: the process is gone."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerFailed(f"exited with {self.proc.returncode}:\n{self.log_tail()}")

    def memory(self) -> Memory:
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])  # always reported in kB
        return Memory(fields["VmRSS"], fields["VmHWM"])

    def memory_if_alive(self) -> Memory | None:
        """:meth:`memory`, or None once the process has exited (or was never started)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            return self.memory()
        except (OSError, KeyError, ValueError):
            return None

    def reset_peak(self) -> bool:
        """Start :meth:`memory`'s ``peak_kib`` (VmHWM) again from the present RSS, so that it
        is the peak of what follows; False where the kernel does not allow it."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process, all its threads included."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        # The command name (field 2) may hold spaces; the fields after it are positional.
        rest = stat[stat.rindex(")") + 2 :].split()
        return (int(rest[11]) + int(rest[12])) / _CLK_TCK

    def thread_cpu(self) -> dict[int, ThreadCpu]:
        """CPU seconds so far of each live thread of the process, by thread id."""
        return threads_cpu(self.pid)

    def stop(self, timeout: float) -> Stopped:
        """SIGTERM, wait up to ``timeout``, then SIGKILL."""
        assert self.proc is not None, "not started"
        started = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        return Stopped(code, time.perf_counter() - started)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return "(no log)"

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0


@dataclass(frozen=True)
class ThreadCpu:
    name: str  # the thread's comm (Python 3.11 threads inherit the process's)
    seconds: float


def _task_seconds(task: Path) -> float:
    """One thread's CPU time: ``schedstat`` (nanoseconds) where the kernel has it, else
    ``stat`` (clock ticks, 10 ms on most kernels: too coarse for short phases)."""
    try:
        return int((task / "schedstat").read_text().split()[0]) * _NS
    except (OSError, ValueError, IndexError):
        stat = (task / "stat").read_text()
        rest = stat[stat.rindex(")") + 2 :].split()
        return (int(rest[11]) + int(rest[12])) / _CLK_TCK


def threads_cpu(pid: int) -> dict[int, ThreadCpu]:
    """CPU seconds of each live thread of process ``pid`` (threads that exit in between two
    readings take their last slice with them: the sidecar's threads live as long as it)."""
    found: dict[int, ThreadCpu] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[int(task.name)] = ThreadCpu(
                (task / "comm").read_text().strip(), _task_seconds(task)
            )
        except (OSError, ValueError):
            continue  # it exited while we looked
    return found


def cpu_by_thread(
    pid: int, before: dict[int, ThreadCpu], after: dict[int, ThreadCpu]
) -> dict[str, float]:
    """CPU seconds between two :func:`threads_cpu` readings, grouped by thread: the main
    thread (the event loop) as ``event loop``, the others by name when they have names of
    their own, else together as ``other threads``."""
    main_name = after[pid].name if pid in after else ""
    grouped: dict[str, float] = {}
    for tid, now in after.items():
        spent = now.seconds - (before[tid].seconds if tid in before else 0.0)
        if tid == pid:
            label = "event loop"
        elif now.name and now.name != main_name:
            label = now.name
        else:
            label = "other threads"
        grouped[label] = grouped.get(label, 0.0) + spent
    return grouped


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Set the affinity of every live thread of ``pid`` to ``cpus``, and so of the threads
    they start later (``os.sched_setaffinity`` on a pid moves only the thread of that id)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue  # it exited while we looked


@contextmanager
def pinned(placement: dict[int, set[int]]) -> Iterator[None]:
    """Processes (by pid) pinned to CPUs for the duration, then free to run on every CPU
    they could run on before (each process's main-thread mask, given to all its threads)."""
    before = {pid: os.sched_getaffinity(pid) for pid in placement}
    try:
        for pid, cpus in placement.items():
            set_affinity(pid, cpus)
        yield
    finally:
        for pid, cpus in before.items():
            with suppress(ProcessLookupError, FileNotFoundError):
                set_affinity(pid, cpus)


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of process ``pid`` so far."""
    return sum(thread.seconds for thread in threads_cpu(pid).values())


async def wait_for_socket(path: Path, server: ServerProcess) -> None:
    """Return once ``path`` accepts a connection; AssertionError if ``server`` exits or
    30 s pass first."""
    deadline = time.monotonic() + 30
    while True:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                pass
        assert server.proc is not None
        assert server.proc.poll() is None, server.log_path.read_text()
        assert time.monotonic() < deadline, f"{path} never listened"
        await asyncio.sleep(0.05)


@asynccontextmanager
async def sqlite_sidecar(
    exe: str, workdir: Path, database: str | None = None
) -> AsyncIterator[tuple[Path, ServerProcess]]:
    """``openwop-memory serve`` (``exe``, or the one beside this Python) on ``database`` (by
    default a SQLite database in ``workdir``), once its socket accepts: the socket and the
    process; stopped on the way out."""
    exe = exe or os.path.join(os.path.dirname(sys.executable), "openwop-memory")
    sock = workdir / "memory.sock"
    url = database or f"sqlite:///{workdir}/memory.db"
    sidecar = ServerProcess(
        [exe, "serve", "--socket", str(sock), "--database", url], workdir / "sidecar.log"
    )
    sidecar.start()
    try:
        await wait_for_socket(sock, sidecar)
        yield sock, sidecar
    finally:
        sidecar.stop(timeout=10)
