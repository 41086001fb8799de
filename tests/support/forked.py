"""``openwop-memory ARGS`` in a forked child of the test process: the command's own code,
its signals, exit code and output, without starting an interpreter and importing the
package again.

A fresh ``openwop-memory`` process costs about a second of CPU before it does anything
(more under coverage), and the suite starts well over a thousand. The child is a process
of its own, made to look like a fresh one where the command could tell: only fds 0-2 open
(stdin on /dev/null, stdout and stderr where asked), the environment given, ``argv[0]``
the console script's, the signal dispositions of a new interpreter, no signal wakeup fd.
What it cannot look like is a fresh interpreter: it has the test process's modules and
memory (so a test of how a command starts, of what it imports, or of a process's absolute
memory starts a real one: ``fresh=True`` in :mod:`support.sidecar`).

Under ``make test`` the child measures its own coverage (``patch = ["fork"]`` in
pyproject.toml) and saves it when it ends (:func:`_save_coverage`).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import posix
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence

# A child's exit status when the command raised instead of returning one (a bug: a
# command turns every failure into a message and an exit code of its own).
CRASHED = 99
_REPLACED: list[object] = []


class ForkedProcess:
    """The parent's handle on a forked child: the part of :class:`subprocess.Popen`'s
    interface the tests use (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
    ``terminate``, ``kill``)."""

    def __init__(self, pid: int, argv: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (``-N`` for signal N) once the child has ended, else ``None``."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting up to ``timeout`` seconds for it.

        :raises subprocess.TimeoutExpired: the child is still running after ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_command(
    args: Sequence[str], env: Mapping[str, str], stdout: int, stderr: int
) -> ForkedProcess:
    """``openwop-memory ARGS`` started in a forked child with exactly ``env`` as its
    environment and fds ``stdout`` and ``stderr`` as its 1 and 2."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; it never returns
        _child(list(args), env, stdout, stderr)
    return ForkedProcess(pid, ["openwop-memory", *args])


def run_cli_forked(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``openwop-memory ARGS`` run to its end in a forked child, with ``env`` over this
    process's environment; its exit code and text output, as :func:`subprocess.run` gives
    them. The child is killed after ``timeout`` seconds.

    :raises subprocess.TimeoutExpired: it had not ended after ``timeout`` seconds.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = fork_command(args, {**os.environ, **(env or {})}, out.fileno(), err.fileno())
        try:
            code = child.wait(timeout)
        finally:
            child.kill()
            child.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            child.args,
            code,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def _child(argv: list[str], env: Mapping[str, str], out: int, err: int) -> None:
    """Run the command as a fresh process would run it; ends the process."""
    code = CRASHED
    try:
        _as_a_fresh_process(env, out, err)
        sys.argv = ["openwop-memory", *argv]  # argparse's prog, as the console script's
        from openwop_memory.cli.main import main

        try:
            # Outside the test's context and event loop (an async test forks from inside
            # its loop): the command starts its own, as in a new process.
            asyncio.events._set_running_loop(None)
            code = contextvars.Context().run(main, argv)
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except KeyboardInterrupt:  # as the interpreter ends on one
            code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            _save_coverage()
        finally:
            posix._exit(code)  # not os._exit: coverage's patch of it saves the parent's too


def _save_coverage() -> None:
    """Save what the child measured, under ``make test`` (``patch = ["fork"]`` started a
    measurement of the child's own). ``os._exit``, patched by ``patch = ["_exit"]`` in the
    parent, would then also write all the parent measured before the fork, once more per
    child: a tenth of a second each."""
    if "coverage" not in sys.modules:
        return
    import coverage

    measuring = coverage.Coverage.current()
    if measuring is not None:
        measuring.stop()
        measuring.save()


def _as_a_fresh_process(env: Mapping[str, str], out: int, err: int) -> None:
    """File descriptors, signals and environment as a new ``openwop-memory`` has them."""
    # The test process's objects stay as they are: none may be finalized here, where its fd
    # number may by then be a file of the command's (the fds are closed below). Frozen, the
    # collector never finalizes them; the streams replaced below are kept referenced.
    gc.freeze()
    _REPLACED.extend([sys.stdin, sys.stdout, sys.stderr])
    signal.set_wakeup_fd(-1)  # an event loop of the test's set one; the command sets its own
    for signum in signal.valid_signals():
        handler = signal.getsignal(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(signum, signal.SIG_DFL)  # a handler of the test process's
    os.dup2(out, 1)
    os.dup2(err, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # No fd of the test process's stays open in the child: a client socket the test closes
    # must close, a listener must not be shared.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's for good
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
