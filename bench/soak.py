"""``make soak``: a real sidecar under a mixed workload for a long while; does its memory stay flat?

The workload, at ``SOAK_RATE`` requests/s (800) for ``SOAK_SECONDS`` (600): runs begun with
two secrets each, doing puts (some holding a secret, some expiring in seconds), gets, lists
and deletes on their own and others' scopes; a new scope for every other run; and of every
ten runs three abandoned (begun, never ended). A run dropped by the sidecar (``not_found``
on put) is begun again, as the client library does.

Every 10 s it prints the sidecar's RSS and a few ``sidecar.stats`` gauges; at the end, a
verdict: the RSS at the end against the RSS after warm-up (the first 20 %, at least 10 s and
at most 60 s) must have grown by at most 10 %. A report, not a gate: exit 0 whatever the
verdict, 1 only when the soak could not run.

Environment: ``SOAK_SECONDS``, ``SOAK_RATE``, ``SOAK_KEYRING_MEMORY`` (the sidecar's
``max_keyring_memory_bytes``, 32 MiB, small so that its plateau is reached during warm-up;
empty for the sidecar's default),
``SOAK_RUN_IDLE_TIMEOUT`` (the sidecar's ``run_idle_timeout``, 5s, short so that the
abandoned runs' handles are given back during warm-up; empty for the sidecar's default),
``SOAK_NEW_SCOPES`` (the share of runs writing to a new scope, 0.5), ``SOAK_ARGS`` (more
``openwop-memory serve`` arguments, split on spaces).
"""

from __future__ import annotations

import asyncio
import os
import random
import string
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lean_client import LeanClient, RpcError
from bench.proc import ServerFailed
from bench.sidecar_bench import SidecarBenchConfig, SidecarUnderTest
from bench.workdir import bench_workdir

SAMPLE_SECONDS = 10.0
MAX_GROWTH = 0.10
CONNECTIONS = 4
WORKERS = 48
TENANTS = 20
NEW_SCOPES = float(os.environ.get("SOAK_NEW_SCOPES", "0.5"))
_ALPHABET = string.ascii_letters + string.digits


@dataclass
class Shared:
    """What the workers share: recently written (ref, entry id) per tenant, and counters."""

    written: dict[str, deque[tuple[str, str]]] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    runs: int = 0
    abandoned: int = 0

    def remember(self, tenant: str, ref: str, entry_id: str) -> None:
        self.written.setdefault(tenant, deque(maxlen=500)).append((ref, entry_id))

    def recent(self, tenant: str, rng: random.Random) -> tuple[str, str] | None:
        pool = self.written.get(tenant)
        return rng.choice(pool) if pool else None


class Pacer:
    """Spaces calls out to ``rate`` per second across all workers."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.next = time.perf_counter()

    async def wait(self) -> None:
        now = time.perf_counter()
        self.next = max(self.next + self.interval, now - 1.0)  # no burst after a stall
        if self.next > now:
            await asyncio.sleep(self.next - now)


def _random_text(rng: random.Random, words: int) -> str:
    return " ".join(
        "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(words)
    )


class Worker:
    def __init__(self, n: int, clients: list[LeanClient], pacer: Pacer, shared: Shared) -> None:
        self.rng = random.Random(n)
        self.clients = clients
        self.pacer = pacer
        self.shared = shared
        self.n = n

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        await self.pacer.wait()
        self.shared.requests += 1
        client = self.clients[self.rng.randrange(len(self.clients))]
        try:
            result = await client.call(method, params)
        except RpcError as exc:
            self.shared.outcomes[f"{method}:{exc.code}"] += 1
            raise
        self.shared.outcomes[f"{method}:ok"] += 1
        return result

    async def run_forever(self) -> None:
        while True:
            try:
                await self.one_run()
            except RpcError:
                await asyncio.sleep(0.05)  # counted; an unexpected refusal ends this run

    async def one_run(self) -> None:
        rng, shared = self.rng, self.shared
        shared.runs += 1
        tenant = f"tenant{rng.randrange(TENANTS)}"
        run_id = f"soak-{self.n}-{shared.runs}-{rng.getrandbits(32):08x}"
        # A share of the runs write to a scope never seen before.
        fresh = rng.random() < NEW_SCOPES
        agent = f"agent{rng.getrandbits(40):x}" if fresh else f"agent{rng.randrange(5)}"
        ref = (
            await self.call(
                "memory.issueRef",
                {"tenant": tenant, "agent": agent, "namespace": f"ns{rng.randrange(3)}"},
            )
        )["memoryRef"]
        keyring = [
            {"id": f"key{i}", "value": "".join(rng.choices(_ALPHABET, k=rng.randint(40, 120)))}
            for i in range(2)
        ]
        begin = {"runId": run_id, "tenant": tenant, "secrets": keyring}
        await self.begin(begin)
        mine: list[str] = []
        for _ in range(rng.randint(20, 60)):
            roll = rng.random()
            if roll < 0.40:
                entry_id = await self.put(begin, ref, keyring)
                mine.append(entry_id)
                shared.remember(tenant, ref, entry_id)
            elif roll < 0.65:
                target = shared.recent(tenant, rng)
                if target is not None:
                    await self.call(
                        "memory.get", {"runId": run_id, "memoryRef": target[0], "id": target[1]}
                    )
            elif roll < 0.85:
                target = shared.recent(tenant, rng)
                await self.call(
                    "memory.list",
                    {
                        "runId": run_id,
                        "memoryRef": target[0] if target else ref,
                        "options": {"limit": 20},
                    },
                )
            elif mine:
                entry_id = mine.pop(rng.randrange(len(mine)))
                await self.call(
                    "memory.delete", {"runId": run_id, "memoryRef": ref, "id": entry_id}
                )
        if rng.random() < 0.3:
            shared.abandoned += 1  # begun with secrets, never ended
        else:
            await self.call("run.end", {"runId": run_id})

    async def begin(self, params: dict[str, Any]) -> None:
        for _ in range(20):
            try:
                await self.call("run.begin", params)
                return
            except RpcError as exc:
                if exc.code != "rate_limited":
                    raise
                await asyncio.sleep(0.1)

    async def put(self, begin: dict[str, Any], ref: str, keyring: list[dict[str, str]]) -> str:
        rng = self.rng
        content = _random_text(rng, rng.randint(5, 80))
        if rng.random() < 0.1:
            content += f" token={keyring[rng.randrange(2)]['value']}"
        entry: dict[str, Any] = {"content": content, "tags": [f"t{rng.randrange(10)}"]}
        if rng.random() < 0.2:
            expires = datetime.now(UTC) + timedelta(seconds=rng.uniform(2, 20))
            entry["expiresAt"] = expires.isoformat()
        params = {"runId": begin["runId"], "memoryRef": ref, "entry": entry}
        for _ in range(3):
            try:
                return str((await self.call("memory.put", params))["id"])
            except RpcError as exc:
                if exc.code != "not_found":
                    raise
                await self.begin(begin)  # dropped by the sidecar: begin again, as clients do
        raise RuntimeError("a run dropped three times in a row")


def _verdict(samples: list[tuple[float, int]], warmup: float) -> tuple[bool, str]:
    after = [(t, rss) for t, rss in samples if t >= warmup]
    if len(after) < 3:
        return False, "FAIL: too few samples after warm-up (run longer)"
    baseline = after[0][1]
    end = sorted(rss for _, rss in after[-3:])[1]  # median of the last three
    growth = (end - baseline) / baseline
    # Least-squares slope after warm-up, in MiB per minute.
    ts = [t for t, _ in after]
    rs = [rss / 1024 for _, rss in after]
    mean_t, mean_r = sum(ts) / len(ts), sum(rs) / len(rs)
    var = sum((t - mean_t) ** 2 for t in ts)
    slope = sum((t - mean_t) * (r - mean_r) for t, r in zip(ts, rs, strict=True)) / var * 60
    passed = growth <= MAX_GROWTH
    return passed, (
        f"{'PASS' if passed else 'FAIL'}: RSS {baseline / 1024:.1f} MiB after warm-up "
        f"({warmup:.0f} s), {end / 1024:.1f} MiB at the end: {growth:+.1%} "
        f"(limit +{MAX_GROWTH:.0%}); trend {slope:+.2f} MiB/min, peak "
        f"{max(r for _, r in after) / 1024:.1f} MiB"
    )


async def soak(
    seconds: float, rate: float, keyring_memory: int, idle_timeout: str, extra: list[str]
) -> int:
    warmup = min(60.0, max(10.0, 0.2 * seconds))
    with bench_workdir("soak") as workdir:
        keyring_arg = ["--max-keyring-memory-bytes", str(keyring_memory)] if keyring_memory else []
        if idle_timeout:
            keyring_arg += ["--run-idle-timeout", idle_timeout]
        config = SidecarBenchConfig(
            workdir=workdir,
            sidecar_args=(
                "--log-level", "warning", "--sweep-interval", "5s", *keyring_arg, *extra
            ),
            startup_timeout=30,
            stop_timeout=30,
        )  # fmt: skip
        sidecar = SidecarUnderTest(config)
        async with sidecar:
            socket, server = sidecar.socket_path, sidecar.process
            print(
                f"soak: {seconds:.0f} s at {rate:.0f} requests/s, max_keyring_memory_bytes "
                f"{keyring_memory}, run_idle_timeout {idle_timeout or 'default'}, pid "
                f"{server.pid}, warm-up {warmup:.0f} s",
                flush=True,
            )
            shared = Shared()
            pacer = Pacer(rate)
            clients = [await LeanClient.connect(socket, pipelined=True) for _ in range(CONNECTIONS)]
            monitor = await LeanClient.connect(socket)
            workers = [
                asyncio.create_task(Worker(n, clients, pacer, shared).run_forever())
                for n in range(WORKERS)
            ]
            samples: list[tuple[float, int]] = []
            started = time.perf_counter()
            last_requests = 0
            try:
                while (elapsed := time.perf_counter() - started) < seconds:
                    await asyncio.sleep(min(SAMPLE_SECONDS, seconds - elapsed))
                    server.check_alive()
                    elapsed = time.perf_counter() - started
                    rss = server.memory().rss_kib
                    samples.append((elapsed, rss))
                    stats = await monitor.call("sidecar.stats")
                    done = shared.requests - last_requests
                    last_requests = shared.requests
                    print(
                        f"{elapsed:6.0f} s  RSS {rss / 1024:7.1f} MiB  "
                        f"{done / SAMPLE_SECONDS:5.0f} req/s  runs {shared.runs} "
                        f"(abandoned {shared.abandoned}), open {stats['activeRuns']}, "
                        f"evicted {stats.get('runsEvicted', '?')}, keyrings "
                        f"{stats.get('keyringMemoryBytes', 0) / 1048576:.1f} MiB, "
                        f"swept {stats['entriesSwept']}",
                        flush=True,
                    )
            finally:
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                for client in [*clients, monitor]:
                    await client.close()
        stopped = sidecar.stopped
        assert stopped is not None
        unexpected = {
            k: v
            for k, v in shared.outcomes.items()
            if not k.endswith(":ok") and k not in ("memory.put:not_found", "run.begin:rate_limited")
        }
        print(
            f"requests: {shared.requests}; refusals handled: "
            f"{shared.outcomes['memory.put:not_found']} put not_found (run begun again), "
            f"{shared.outcomes['run.begin:rate_limited']} begin rate_limited; "
            f"unexpected errors: {unexpected or 'none'}"
        )
        print(f"sidecar exit code after SIGTERM: {stopped.exit_code} in {stopped.seconds:.1f} s")
        _, line = _verdict(samples, warmup)
        print(line, flush=True)
    return 0


def main() -> int:
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    rate = float(os.environ.get("SOAK_RATE", "800"))
    # Empty: the sidecar's own default (and a sidecar older than the setting works too).
    keyring_memory = int(os.environ.get("SOAK_KEYRING_MEMORY", str(32 << 20)) or 0)
    idle_timeout = os.environ.get("SOAK_RUN_IDLE_TIMEOUT", "5s")
    extra = os.environ.get("SOAK_ARGS", "").split()
    try:
        return asyncio.run(soak(seconds, rate, keyring_memory, idle_timeout, extra))
    except (ServerFailed, OSError) as exc:
        print(f"soak: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
