"""Relevance lists on one big scope, through the SQLite storage API (not part of ``make
bench`` yet): ``.venv/bin/python bench/relevance_bench.py --entries 100000``.

Fills a scope with entries of 40 words drawn from the vocabulary of Python's reference
documentation with a Zipf-like skew (a few words are in most entries, most words in few),
then times ``Storage.search`` (limit 100) for queries of rare, middling and common words,
and a token-budgeted recency list. A report, not a gate: it prints p50 and p99 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import re
import tempfile
import time
from pathlib import Path
from pydoc_data.topics import topics

from openwop_memory.storage.base import PutRequest, Scope
from openwop_memory.storage.sqlite import SqliteStorage
from openwop_memory.timefmt import now_us

SCOPE = Scope("bench", "big")


def _vocabulary() -> tuple[list[str], list[float]]:
    words = sorted(set(re.findall(r"[a-z]{3,}", " ".join(topics.values()).lower())))
    random.Random(7).shuffle(words)
    return words, [1.0 / (rank + 1) for rank in range(len(words))]


def _ms(sorted_seconds: list[float], q: float) -> float:
    index = min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))
    return round(sorted_seconds[index] * 1e3, 2)


async def run(entries: int, samples: int, directory: Path) -> None:
    words, weights = _vocabulary()
    rng = random.Random(11)
    store = SqliteStorage(str(directory / "relevance.db"))
    await store.open()
    try:

        async def put() -> None:
            content = " ".join(rng.choices(words, weights, k=40))
            digest = hashlib.sha256(content.encode()).digest()
            request = PutRequest(SCOPE, content, (), None, None, digest)
            await store.put(request=request, now_us=now_us())

        began = time.monotonic()
        for start in range(0, entries, 500):
            await asyncio.gather(*(put() for _ in range(min(500, entries - start))))
        print(f"loaded {entries} entries in {time.monotonic() - began:.1f} s")
        now = now_us()
        begun = await store.begin_run(
            run_id="reader", tenant=SCOPE.tenant, replay=False, now_us=now, retention_cutoff_us=0
        )
        assert begun.run is not None
        snapshot = begun.run.snapshot
        queries = {
            "2 rare words": [words[-1], words[-7]],
            "2 middling words": [words[300], words[800]],
            "2 common words": [words[0], words[1]],
        }
        for name, terms in queries.items():
            timings = []
            for _ in range(samples):
                started = time.perf_counter()
                await store.search(
                    scope=SCOPE,
                    snapshot=snapshot,
                    now_us=now_us(),
                    terms=terms,
                    limit=100,
                    tag=None,
                )
                timings.append(time.perf_counter() - started)
            timings.sort()
            print(f"relevance, {name}: p50 {_ms(timings, 0.5)} ms, p99 {_ms(timings, 0.99)} ms")
        timings = []
        for _ in range(samples):
            started = time.perf_counter()
            await store.list(
                scope=SCOPE, snapshot=snapshot, now_us=now_us(), limit=100, tag=None, max_tokens=60
            )
            timings.append(time.perf_counter() - started)
        timings.sort()
        print(f"recency, max_tokens 60: p50 {_ms(timings, 0.5)} ms, p99 {_ms(timings, 0.99)} ms")
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="owm-relevance-") as directory:
        asyncio.run(run(args.entries, args.samples, Path(directory)))


if __name__ == "__main__":
    main()
