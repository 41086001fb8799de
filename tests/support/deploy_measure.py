"""What the deployment pages' figures are measured from: the health probe's cost and the
sidecar's CPU and memory under a short mixed load. Shared by tests/deploy/test_deployment.py (its
memory checks, and the manifests' probes) and ``make bench``'s deployment suite (the CPU and
wall-time figures the pages quote, a report: no timing is gated in the test suite).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from support.sidecar import RawClient, Sidecar, unmeasured

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ProbeCost:
    wall: float
    cpu: float


@dataclass(frozen=True)
class LoadFigures:
    peak_rss_mib: float
    cpu_us_per_request: float
    requests: int
    other_threads_share: float
    """The part of the CPU time spent off the event loop's thread (SQLite's writer and
    readers): what the CPU limit's reasoning rests on."""


# The probe as installed: the system's interpreter running the sidecar's sources. The
# development install's own `openwop-memory` would add its interpreter's start-up and the
# import hooks of the editable install, which no deployment has.
INSTALLED_HEALTH = ["/usr/bin/python3", "-m", "openwop_memory", "health"]


def measure_probe(
    socket_path: Path | str,
    health: list[str] = INSTALLED_HEALTH,
    *,
    env: dict[str, str] | None = None,
    calls: int = 10,
) -> ProbeCost:
    """The cost of ``health`` (a command line ending in ``openwop-memory health``) against a
    sidecar that answers ``ok``: the quickest wall time of ``calls`` calls, and their median
    CPU (user + system, from the child's rusage). The quickest, because the wall time of a
    short process is mostly waiting for a CPU on a busy machine, which says nothing of the
    probe; its CPU time does not wait."""
    if env is None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "sidecar" / "src")}
    env = unmeasured(env)  # what it costs without coverage measurement (make test)
    walls, cpus = [], []
    for _ in range(calls):
        started = time.perf_counter()
        proc = subprocess.Popen(
            [*health, "--socket", str(socket_path), "--timeout", "3"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        walls.append(time.perf_counter() - started)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 0
        cpus.append(usage.ru_utime + usage.ru_stime)
    return ProbeCost(min(walls), statistics.median(cpus))


def _cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time (user + system) of process ``pid``, or of its thread ``thread`` alone."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1)) / 1024


def measure_load(sidecar: Sidecar, seconds: float = 3.0, clients: int = 8) -> LoadFigures:
    """Peak RSS and CPU per request of ``sidecar`` under ``clients`` connections doing, in
    turn, a put of a 1 KiB note redacted with the run's two secrets, a get and a list."""
    assert sidecar.proc is not None
    pid = sidecar.proc.pid
    counts = [0] * clients
    stop = threading.Event()
    errors: list[BaseException] = []

    def client(index: int) -> None:
        try:
            with RawClient(sidecar.socket) as c:
                run = f"load-{index}"
                secrets = [
                    {"id": "api", "value": f"sk-live-{index:04d}-4f9a8b7c6d5e"},
                    {"id": "db", "value": f"hunter2-{index:04d}-password"},
                ]
                c.call("run.begin", runId=run, tenant=f"t{index % 4}", secrets=secrets)
                ref = f"notes/{index}"
                note = f"a note of client {index}, mentioning sk-live-{index:04d}-4f9a8b7c6d5e "
                note = (note * (1024 // len(note) + 1))[:1024]
                n = 0
                while not stop.is_set():
                    entry = c.call("memory.put", runId=run, memoryRef=ref, entry={"content": note})
                    c.call("memory.get", runId=run, memoryRef=ref, id=entry["id"])
                    c.call("memory.list", runId=run, memoryRef=ref, options={"limit": 10})
                    n += 3
                    counts[index] = n
        except BaseException as exc:  # reported by the caller, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    cpu_before, loop_before = _cpu_seconds(pid), _cpu_seconds(pid, pid)
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    requests = sum(counts)
    cpu = _cpu_seconds(pid) - cpu_before
    loop = _cpu_seconds(pid, pid) - loop_before  # the main thread runs the event loop
    return LoadFigures(_peak_rss_mib(pid), cpu / requests * 1e6, requests, 1 - loop / cpu)
