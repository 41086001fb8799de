"""Relevance (``rank: "relevance"``), through the SQLite storage API in process: what ``make
bench`` reports in its relevance rows; ``python bench/relevance_bench.py --entries 100000``
runs it alone.

- **Latency on a big scope.** Fills one scope with entries of 40 words drawn from the
  vocabulary of Python's reference documentation with a Zipf-like skew (a few words are in
  most entries, most words in few), each with its vector, then times ``Search.search``
  (limit 100) with the query's vector, as ``memory.list`` calls it: hybrid (keywords and
  meaning), meaning only and keywords only, for a query of two specific words and one
  holding a common word (the keyword side weighs every match). The first keyword search
  after the load (which waits for the full-text index, built after the puts' commits) and
  then the first search by meaning (which loads the vectors into the cache, as the first
  one after a start does) are reported on their own. Then another
  tenant's empty scope searches (keywords) the big scope's most common word and a word
  nobody wrote: the same cost, as a search reads only its own scope's index.
- **Cost per put.** CPU per put of 1 KiB entries (every thread of the process: the writer's
  too), in three stores side by side: without the full-text index (never indexed), with it
  (the batches after the puts counted in), and with it and the embedding (computed from
  the content as the service does, and stored). The differences are what indexing and
  embedding add.
- **Disk.** The database file of the big scope once checkpointed, scaled to 100k entries,
  and the shares of the full-text index and of the vectors.
- **Recall@10** (and the hybrid's @5) on the labelled set ``bench/data/relevance_set.json``
  (106 entries, 34 queries with their relevant entries; the first 20 share no word with
  what they look for): keyword-only, meaning-only and hybrid. And how many of its 20
  unrelated queries (nothing relevant, no word shared) a hybrid search answers with nothing.
- **The stronger model** (all-MiniLM-L6-v2, where installed): the labelled set's recall@5,
  a new query's embedding CPU, and list(100) on a scope of as many entries (vectors of 256
  of its texts, each copy moved by noise) with the query's vector kept, as the service
  keeps a query asked again.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openwop_memory.logs import configure_logging
from openwop_memory.retrieval.encoders import STRONG_MODEL, load_encoder, model_installed
from openwop_memory.retrieval.encoders import wordllama as semantic
from openwop_memory.retrieval.fusion import LIGHT_WEIGHTS, Weights, weights_for
from openwop_memory.retrieval.nearest import row_bytes
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.retrieval.time_cues import asks_when
from openwop_memory.storage.base import EntryRow, PutRequest, Scope, Snapshot
from openwop_memory.storage.sqlite.backend import SqliteStorage
from openwop_memory.timefmt import now_us

from bench.report import Metric, SuiteResult, Target

SCOPE = Scope("bench", "big")
OTHER = Scope("bench-other-tenant", "empty")  # a tenant of its own, which wrote nothing
LABELLED = Path(__file__).resolve().parent / "data" / "relevance_set.json"
_PER_100K = 100_000


@dataclass(frozen=True)
class RelevanceBenchConfig:
    entries: int = 100_000
    samples: int = 200
    puts: int = 2000

    @classmethod
    def quick(cls) -> RelevanceBenchConfig:
        return cls(entries=2000, samples=30, puts=300)


def _vocabulary() -> tuple[list[str], list[float]]:
    words = sorted(set(re.findall(r"[a-z]{3,}", " ".join(topics.values()).lower())))
    random.Random(7).shuffle(words)
    return words, [1.0 / (rank + 1) for rank in range(len(words))]


def _ms(sorted_seconds: list[float], q: float) -> float:
    index = min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))
    return round(sorted_seconds[index] * 1e3, 2)


def _request(content: str, vector: bytes | None, scope: Scope = SCOPE) -> PutRequest:
    digest = hashlib.sha256(content.encode()).digest()
    return PutRequest(scope, content, (), None, None, digest, vector)


async def _snapshot(store: SqliteStorage, run_id: str, tenant: str = SCOPE.tenant) -> Snapshot:
    begun = await store.begin_run(
        run_id=run_id, tenant=tenant, replay=False, now_us=now_us(), retention_cutoff_us=0
    )
    assert begun.run is not None
    return begun.run.snapshot


async def _latency(
    config: RelevanceBenchConfig, embedder: semantic.Embedder, directory: Path
) -> list[Metric]:
    words, weights = _vocabulary()
    rng = random.Random(11)
    store = SqliteStorage(str(directory / "relevance.db"))
    await store.open()
    try:

        async def put() -> None:
            content = " ".join(rng.choices(words, weights, k=40))
            await store.put(request=_request(content, embedder.vector(content)), now_us=now_us())

        for start in range(0, config.entries, 500):
            await asyncio.gather(*(put() for _ in range(min(500, config.entries - start))))
        snapshot = await _snapshot(store, "reader")
        other_snapshot = await _snapshot(store, "other-reader", OTHER.tenant)
        searcher = Search(store)  # one, as the sidecar has: its vectors stay loaded

        async def search(
            text: str, *, keywords: bool = True, meaning: bool = True, scope: Scope = SCOPE
        ) -> float:
            terms, vector = query_terms(text), embedder.vector(text)
            started = time.perf_counter()
            await searcher.search(
                scope=scope,
                snapshot=snapshot if scope == SCOPE else other_snapshot,
                now_us=now_us(),
                terms=terms if keywords else [],
                limit=100,
                tag=None,
                vector=vector if meaning else None,
            )
            return time.perf_counter() - started

        async def timings(text: str, scope: Scope = SCOPE, **kw: bool) -> list[float]:
            return sorted([await search(text, scope=scope, **kw) for _ in range(config.samples)])

        # Two specific words (each stem in about 0.2 % of the entries), and two of which
        # one is in about 9 % (stemming folds many words of the vocabulary into it).
        specific, common = f"{words[2000]} {words[3000]}", f"{words[300]} {words[800]}"
        # The keyword index is built after the puts' commits: the first search after a
        # bulk load waits for it. Timed on its own, so that the next row is the vectors'
        # load alone, as the first search after a start pays it (the index is on disk).
        catch_up = await search(specific, meaning=False)
        first = await search(specific)
        hybrid = await timings(specific)
        hybrid_common = await timings(common)
        keyword = await timings(specific, meaning=False)
        keyword_common = await timings(common, meaning=False)
        meaning = await timings(specific, keywords=False)
        # Issue 20, row 12: another tenant's empty scope searching the big scope's most
        # common word (in nearly every entry) against a word nobody wrote.
        other_common = await timings(words[0], OTHER, meaning=False)
        other_absent = await timings("zzzunwrittenword", OTHER, meaning=False)
    finally:
        await store.close()
    size = (directory / "relevance.db").stat().st_size  # closing checkpointed the WAL
    with closing(sqlite3.connect(directory / "relevance.db")) as db:
        [(fts,)] = db.execute("SELECT sum(length(block)) FROM entries_fts_data").fetchall()
        [(vectors,)] = db.execute("SELECT sum(length(embedding)) FROM entries").fetchall()
    scale = _PER_100K / config.entries
    return [
        Metric("relevance: entries in the scope searched", config.entries, "entries"),
        Metric("relevance list(100) p50, hybrid", _ms(hybrid, 0.5), "ms", Target("<=", 5)),
        Metric("relevance list(100) p99, hybrid", _ms(hybrid, 0.99), "ms"),
        Metric("relevance list(100) p50, meaning only", _ms(meaning, 0.5), "ms"),
        Metric("relevance list(100) p50, keywords only", _ms(keyword, 0.5), "ms"),
        Metric("relevance list(100) p50, hybrid, a common word", _ms(hybrid_common, 0.5), "ms"),
        Metric(
            "relevance list(100) p50, keywords only, a common word",
            _ms(keyword_common, 0.5),
            "ms",
        ),
        Metric(
            "first keyword list after loading (waits for the full-text index)",
            catch_up * 1e3,
            "ms",
        ),
        Metric("first relevance list of the scope (loads its vectors)", first * 1e3, "ms"),
        Metric(
            "search cost p50, empty scope, a word common in another tenant",
            _ms(other_common, 0.5),
            "ms",
        ),
        Metric("search cost p50, empty scope, a word nobody wrote", _ms(other_absent, 0.5), "ms"),
        Metric("disk per 100k entries of 40 words (SQLite file)", size * scale / 2**20, "MiB"),
        Metric("disk per 100k entries: full-text index", fts * scale / 2**20, "MiB"),
        Metric("disk per 100k entries: vectors", vectors * scale / 2**20, "MiB"),
        Metric(
            "vector cache per 100k entries (memory)",
            _PER_100K * row_bytes(semantic.RANK_DIMENSIONS) / 2**20,
            "MiB",
        ),
    ]


def _kib_texts(count: int) -> list[str]:
    words, weights = _vocabulary()
    rng = random.Random(3)
    texts = []
    for _ in range(count):
        text = ""
        while len(text) < 1024:
            text += rng.choices(words, weights)[0] + " "
        texts.append(text[:1024])
    return texts


async def _put_cpu_us(
    directory: Path, name: str, texts: Sequence[str], embedder: semantic.Embedder | None
) -> float:
    """CPU µs per put of ``texts`` (32 at a time) into a fresh store, and the full-text
    indexing the puts leave to be done after them (in the background or before a search);
    ``name`` "plain" never indexes: the puts alone."""
    path = directory / f"{name}.db"
    store = SqliteStorage(str(path))
    await store.open()
    store.keywords.catch_up.enabled = name != "plain"
    try:
        scope = Scope("bench", name)

        async def put(text: str) -> None:
            vector = None if embedder is None else embedder.vector(text)
            await store.put(request=_request(text, vector, scope), now_us=now_us())

        for text in texts[:64]:  # warm up: the statement cache, the word cache
            await put(text)
        started = time.process_time()
        for start in range(64, len(texts), 32):
            await asyncio.gather(*(put(t) for t in texts[start : start + 32]))
        if name != "plain":
            await store.keywords.catch_up.everything()
        return (time.process_time() - started) / (len(texts) - 64) * 1e6
    finally:
        await store.close()


async def _put_costs(
    config: RelevanceBenchConfig, embedder: semantic.Embedder, directory: Path
) -> list[Metric]:
    texts = _kib_texts(config.puts + 64)
    # Alternating rounds, the least of each: the machine is shared.
    plain, indexed, embedded = [], [], []
    for round_ in range(3):
        plain.append(await _put_cpu_us(directory / f"p{round_}", "plain", texts, None))
        indexed.append(await _put_cpu_us(directory / f"i{round_}", "indexed", texts, None))
        embedded.append(await _put_cpu_us(directory / f"e{round_}", "embedded", texts, embedder))
    vector_only = []
    for _ in range(5):
        started = time.process_time()
        for text in texts:
            embedder.vector(text)
        vector_only.append((time.process_time() - started) / len(texts) * 1e6)
    base = min(plain)
    return [
        Metric("put CPU, 1 KiB entry, no full-text index", base, "us"),
        Metric(
            "full-text indexing CPU per 1 KiB entry (batched, after the put's commit)",
            min(indexed) - base,
            "us",
        ),
        Metric(
            "put CPU added by the embedding (computed and stored), 1 KiB",
            min(embedded) - min(indexed),
            "us",
        ),
        Metric(
            "put CPU added by index and embedding, 1 KiB",
            min(embedded) - base,
            "us",
            Target("<=", 50),
        ),
        Metric("embedding alone, 1 KiB (Embedder.vector)", min(vector_only), "us"),
    ]


async def recall(
    directory: Path,
    embed: Callable[[str], bytes | None],
    weights: Weights = LIGHT_WEIGHTS,
    name: str = "labelled",
) -> dict[str, float]:
    """Recall@10 and @5 of each ranking over the labelled set (mean over queries of the
    share of each query's relevant entries in its first 10, or 5), vectors by ``embed`` and
    fused with ``weights``: keys ``keyword``, ``semantic``, ``hybrid``, the same over the
    paraphrase queries alone (``...-paraphrase``), and each with ``@5`` after it; and
    ``unrelated-empty``, the share of the set's unrelated queries a hybrid search answers
    with nothing."""
    data = json.loads(LABELLED.read_text())
    store = SqliteStorage(str(directory / f"{name}.db"))
    await store.open()
    try:
        names = {}
        for entry in data["entries"]:
            content = entry["content"]
            result = await store.put(request=_request(content, embed(content)), now_us=now_us())
            assert result.entry is not None
            names[result.entry.id] = entry["id"]
        snapshot = await _snapshot(store, name)
        searcher = Search(store)
        shares: dict[str, list[float]] = {}

        async def searched(query: str, mode: str) -> list[EntryRow]:
            return await searcher.search(
                scope=SCOPE,
                snapshot=snapshot,
                now_us=now_us(),
                terms=[] if mode == "semantic" else query_terms(query),
                limit=10,
                tag=None,
                vector=None if mode == "keyword" else embed(query),
                weights=weights,
                when=asks_when(query),
            )

        for q in data["queries"]:
            for mode in ("keyword", "semantic", "hybrid"):
                rows = await searched(q["query"], mode)
                found = [names[r.id] for r in rows]
                for suffix, first in (("", found), ("@5", found[:5])):
                    share = len(set(first) & set(q["relevant"])) / len(q["relevant"])
                    shares.setdefault(mode + suffix, []).append(share)
                    if q["paraphrase"]:
                        shares.setdefault(f"{mode}-paraphrase{suffix}", []).append(share)
        for query in data["unrelated"]:
            rows = await searched(query, "hybrid")
            shares.setdefault("unrelated-empty", []).append(0.0 if rows else 1.0)
    finally:
        await store.close()
    return {mode: sum(values) / len(values) for mode, values in shares.items()}


async def _strong(config: RelevanceBenchConfig, directory: Path) -> list[Metric]:
    """all-MiniLM-L6-v2, where installed: the labelled set's recall@5, the CPU of a query's
    embedding, and list(100) on a scope of ``config.entries`` entries. Embedding that many
    entries would take the better part of an hour, so the scope's vectors are those of 256
    of its texts, each copy moved by a little noise (the product's cost does not depend on
    the values; the candidates' spread is that of real text)."""
    import numpy as np

    if not model_installed(STRONG_MODEL):
        return []
    encoder = load_encoder(STRONG_MODEL)

    def embed(text: str) -> bytes | None:
        row = encoder.embed([text])[0]
        return row.tobytes() if row.any() else None

    weights = weights_for(STRONG_MODEL)
    scores = await recall(directory, embed, weights, "labelled-strong")
    metrics = [
        Metric(f"recall@5, labelled set, {m}, all-minilm-l6-v2", scores[f"{m}@5"], "ratio")
        for m in ("hybrid", "semantic")
    ] + [
        Metric(
            "recall@5, paraphrase queries, hybrid, all-minilm-l6-v2",
            scores["hybrid-paraphrase@5"],
            "ratio",
            Target(">=", 0.75),
        ),
        Metric(
            "unrelated queries answered empty, hybrid, all-minilm-l6-v2",
            scores["unrelated-empty"],
            "ratio",
        ),
    ]
    words, weights_ = _vocabulary()
    rng = random.Random(13)
    texts = [" ".join(rng.choices(words, weights_, k=40)) for _ in range(config.entries)]
    base = encoder.embed(texts[:256]).astype(np.int16)
    noise = np.random.default_rng(13)
    store = SqliteStorage(str(directory / "strong.db"))
    await store.open()
    try:
        for start in range(0, config.entries, 500):
            batch = range(start, min(start + 500, config.entries))
            shape = (len(batch), encoder.dimensions)
            moved = base[[i % 256 for i in batch]] + noise.integers(-6, 7, shape)
            vectors = np.clip(moved, -127, 127).astype(np.int8)
            await asyncio.gather(
                *(
                    store.put(request=_request(texts[i], vectors[k].tobytes()), now_us=now_us())
                    for k, i in enumerate(batch)
                )
            )
        snapshot = await _snapshot(store, "strong-reader")
        searcher = Search(store)
        specific = f"{words[2000]} {words[3000]}"
        query = embed(specific)
        embedding: list[float] = []
        for _ in range(config.samples):
            started = time.process_time()
            encoder.embed([f"{specific} {len(embedding)}"])  # a new query each time
            embedding.append(time.process_time() - started)

        async def timed(vector: bytes | None = query) -> float:
            started = time.perf_counter()
            await searcher.search(
                scope=SCOPE,
                snapshot=snapshot,
                now_us=now_us(),
                terms=query_terms(specific),
                limit=100,
                tag=None,
                vector=vector,
                weights=weights,
            )
            return time.perf_counter() - started

        await timed(vector=None)  # the full-text index catches up (see _latency)
        first = await timed()
        hybrid = sorted([await timed() for _ in range(config.samples)])
    finally:
        await store.close()
    embedding.sort()
    return [
        *metrics,
        Metric(
            "relevance list(100) p50, hybrid, all-minilm-l6-v2 (the query's vector kept)",
            _ms(hybrid, 0.5),
            "ms",
            Target("<=", 10),
        ),
        Metric("the same, p99, all-minilm-l6-v2", _ms(hybrid, 0.99), "ms"),
        Metric("a new query's embedding CPU p50, all-minilm-l6-v2", _ms(embedding, 0.5), "ms"),
        Metric(
            "first relevance list of the scope (loads its vectors), all-minilm-l6-v2",
            first * 1e3,
            "ms",
            Target("<=", 1000),
        ),
        Metric(
            "vector cache per 100k entries (memory), all-minilm-l6-v2",
            _PER_100K * row_bytes(encoder.dimensions) / 2**20,
            "MiB",
        ),
    ]


_RSS_PROBE = """
import re
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
from openwop_memory.retrieval.encoders import wordllama as semantic
from openwop_memory.logs import configure_logging
before = rss()
semantic.load().vector("the staging deploy failed because the disk was full")
print((rss() - before) / 1024)
"""


def _model_rss_mib() -> float:
    """What loading the model and embedding once adds to a fresh interpreter's RSS."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    return float(done.stdout.split()[-1])


async def run(config: RelevanceBenchConfig, directory: Path) -> SuiteResult:
    # The stores opened here log as a sidecar would: to stderr, and only what matters, so
    # that stdout keeps the table alone.
    configure_logging("console", "warning")
    if not semantic.model_installed():
        return SuiteResult(notes=["relevance: not run (the search extra is not installed)"])
    started = time.perf_counter()
    embedder = semantic.load()
    load_ms = (time.perf_counter() - started) * 1e3
    metrics = [
        Metric("embedding model load (first put or relevance list)", load_ms, "ms"),
        Metric(
            "RSS added by the embedding model (numpy, tokenizer, weights)", _model_rss_mib(), "MiB"
        ),
    ]
    metrics += await _latency(config, embedder, directory)
    metrics += await _put_costs(config, embedder, directory)
    scores = await recall(directory, embedder.vector)
    for mode in ("hybrid", "keyword", "semantic"):
        metrics.append(Metric(f"recall@10, labelled set, {mode}", scores[mode], "ratio"))
    for mode in ("hybrid", "keyword", "semantic"):
        metrics.append(
            Metric(f"recall@10, paraphrase queries, {mode}", scores[f"{mode}-paraphrase"], "ratio")
        )
    metrics.append(Metric("recall@5, labelled set, hybrid", scores["hybrid@5"], "ratio"))
    metrics.append(
        Metric("recall@5, paraphrase queries, hybrid", scores["hybrid-paraphrase@5"], "ratio")
    )
    metrics.append(
        Metric("unrelated queries answered empty, hybrid", scores["unrelated-empty"], "ratio")
    )
    metrics += await _strong(config, directory)
    return SuiteResult(metrics=metrics)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=RelevanceBenchConfig.entries)
    parser.add_argument("--samples", type=int, default=RelevanceBenchConfig.samples)
    parser.add_argument("--puts", type=int, default=RelevanceBenchConfig.puts)
    args = parser.parse_args()
    config = RelevanceBenchConfig(args.entries, args.samples, args.puts)
    with tempfile.TemporaryDirectory(prefix="owm-relevance-") as directory:
        result = asyncio.run(run(config, Path(directory)))
    for metric in result.metrics:
        print(f"{metric.name}: {metric.value:.3f} {metric.unit}")
    for note in result.notes:
        print(note)


if __name__ == "__main__":
    main()
