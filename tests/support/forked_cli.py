"""``openwop-memory ARGS`` in a forked child of the test process: the command's own code, its
exit code and its output, without starting an interpreter and importing the package again.

A fresh ``openwop-memory`` process costs about a second of CPU before it does anything
(more under coverage), and the operator commands' tests (export, import, inspect, backup,
forget) run dozens of them. The child is still a process of its own (its own file
descriptors, environment, locks and exit), so what these tests check is what the command
does; how it starts (the import graph, ``python -m``, the console script) is tested on real
``subprocess`` starts (:func:`support.sidecar.run_cli`).

Under ``make test`` the child measures its own coverage (``patch = ["fork"]`` in
pyproject.toml) and saves it when it ends, by ``os._exit`` (``patch = ["_exit"]``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping

# A child's exit status when the command raised instead of returning one (a bug: a
# command turns every failure into a message and an exit code of its own).
CRASHED = 99


def run_cli_forked(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``openwop-memory ARGS`` run to its end in a forked child, with ``env`` over this
    process's environment; its exit code and text output, as :func:`subprocess.run` gives
    them. The child is killed after ``timeout`` seconds (:class:`subprocess.TimeoutExpired`).

    Only for commands that end by themselves (not ``serve`` of a sidecar that starts, nor
    ``mcp``): the child would otherwise run the server inside a copy of the test process.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; it never returns
            _child(list(args), env or {}, out.fileno(), err.fileno())
        status = _wait(pid, timeout, args)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            ["openwop-memory", *args],
            status,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


def _child(argv: list[str], env: Mapping[str, str], out: int, err: int) -> None:
    """Run the command with fd 1 and 2 on ``out`` and ``err``; ends the process."""
    code = CRASHED
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the child's
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        os.environ.update(env)
        sys.argv = ["openwop-memory", *argv]  # argparse's prog, as the console script's
        from openwop_memory.cli.main import main

        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _wait(pid: int, timeout: float, args: tuple[str, ...]) -> int:
    """The child's exit code (``-N`` for a signal N, as :mod:`subprocess` says it)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise subprocess.TimeoutExpired(["openwop-memory", *args], timeout)
        time.sleep(0.005)
