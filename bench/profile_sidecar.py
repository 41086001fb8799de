"""Run ``openwop-memory`` under cProfile: ``profile_sidecar.py OUT wall|cpu ARGS...``.

Only the event-loop thread is profiled (aiosqlite's connection threads are not). ``wall``
charges a function for the time that passed, including time the process was not on a CPU,
which shows waiting (on aiosqlite's threads, on the socket) but is inflated on a busy host;
``cpu`` charges only the thread's own CPU time, which is robust to a shared host but hides
waiting, and each sample costs a system call, so the sidecar runs several times slower.
The stats are written when the sidecar returns, i.e. after a graceful SIGTERM.
"""

from __future__ import annotations

import cProfile
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("wall", "cpu"):
        print(__doc__, file=sys.stderr)
        return 2
    out, clock, rest = argv[0], argv[1], list(argv[2:])
    from openwop_memory.cli import main as sidecar_main

    profiler = cProfile.Profile(time.thread_time if clock == "cpu" else time.perf_counter)
    try:
        code: int = profiler.runcall(sidecar_main, rest)
    finally:
        profiler.dump_stats(out)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
