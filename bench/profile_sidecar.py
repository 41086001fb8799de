"""Run ``openwop-memory`` under cProfile: ``profile_sidecar.py OUT wall|cpu ARGS...``.

Only the event-loop thread is profiled (the writer's and aiosqlite's threads are not).
``wall`` charges a function for the time that passed, including time the process was not on
a CPU, which shows waiting (on other threads, on the socket) but is inflated on a busy host;
``cpu`` charges only the thread's own CPU time, which is robust to a shared host but hides
waiting, and each sample costs a system call, so the sidecar runs several times slower.

Phases: each SIGUSR1 writes the stats gathered since the previous one to ``OUT.N`` (N = 1,
2, ...) and starts afresh, so a benchmark can cut the profile at its phase boundaries. The
rest is written to ``OUT`` when the sidecar returns, i.e. after a graceful SIGTERM.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("wall", "cpu"):
        print(__doc__, file=sys.stderr)
        return 2
    out, clock, rest = argv[0], argv[1], list(argv[2:])
    from openwop_memory.cli.main import main as sidecar_main

    profiler = cProfile.Profile(time.thread_time if clock == "cpu" else time.perf_counter)
    cuts = 0

    def cut(signum: int, frame: FrameType | None) -> None:
        nonlocal cuts
        profiler.disable()
        cuts += 1
        profiler.dump_stats(f"{out}.{cuts}")
        profiler.clear()
        profiler.enable()

    signal.signal(signal.SIGUSR1, cut)
    try:
        code: int = profiler.runcall(sidecar_main, rest)
    finally:
        profiler.dump_stats(out)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
