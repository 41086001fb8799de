"""Recall on long conversations: does a relevance list find the turns that answer a question?

Two sets of :mod:`bench.conversation_data`, a table each: the made-up chats (11, about
5,100 turns, 704 questions worded apart from their evidence) and the written ones (10,
about 4,100 turns, 624 questions worded as an annotator words them), each question labelled
with its evidence turns. A set is loaded into a real ``openwop-memory
serve`` on a fresh SQLite file, one scope (issued memoryRef) per conversation, one entry per
turn whose content is ``"<session date> <speaker>: <text>"``. Every question is then asked
by ``memory.list`` with ``rank: "relevance"``, ``query: <question>``, ``limit: 10``.

Metric: evidence recall@k, the share of a question's evidence turns among the first k
entries, averaged over the questions (overall, and at 10 per kind of question). Rows:

- ``keyword``: a sidecar with ``--semantic-search false`` (full-text ranking alone);
- ``hybrid``: a sidecar as it starts by default (keywords fused with meaning, the search
  extra's light model); ``hybrid-<model>`` for every other installed model;
- ``fts5-bm25``: in process, SQLite's own FTS5 (Porter stemmer) over the same contents, the
  question's words less stop words OR'ed, ranked by ``bm25()``: the textbook floor;
- ``meaning-only``: in process, the model's vectors of the turns and the question, cosine
  top k (``meaning-only-<model>`` for the other installed models).

Each sidecar row also has the sidecar's CPU per put (every thread, from
``/proc/<pid>/task/*/schedstat``) and the p50 of one client's sequential relevance lists;
the in-process rows have the p50 of their query alone (no socket, no JSON).

Runs as ``python bench/conversations.py [--quick] [--json]`` or ``bench/run.py --only
conversations``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from openwop_memory.retrieval.encoders import (
    DEFAULT_MODEL,
    known_models,
    load_encoder,
    model_installed,
)
from openwop_memory.retrieval.text import STOP_WORDS, query_terms

from bench.conversation_data import KINDS, Conversation, Question, generate, written
from bench.lean_client import LeanClient
from bench.measure import BenchFailure, percentile
from bench.proc import threads_cpu
from bench.report import Metric, SuiteResult, Table, Target
from bench.sidecar_bench import SidecarBenchConfig, SidecarUnderTest

TENANT = "bench-conversations"
WRITER_RUN = "conversations-writer"
READER_RUN = "conversations-reader"
TITLE = "conversations: evidence recall of relevance lists (limit 10) on long chats"
WRITTEN_TITLE = "conversations: the same on the written chats"
COLUMNS = (
    ("mode", "mode"),
    ("recall@5", "recall5"),
    ("recall@10", "recall10"),
    *((f"@10 {kind}", f"recall10{kind.title().replace('-', '')}") for kind in KINDS),
    ("put CPU us", "putCpuUs"),
    ("put p50 ms", "putP50Ms"),
    ("list p50 ms", "listP50Ms"),
)
_ONE_BY_ONE = 200  # the first puts of a load, each awaited before the next: their p50
_WINDOW = 32  # puts in flight on the loading connection


@dataclass(frozen=True)
class ConversationBenchConfig:
    conversations: int = 11
    per_kind: int = 0  # questions of each kind asked per conversation; 0: all
    sidecar_exe: str = ""
    sidecar_args: tuple[str, ...] = ()
    # The default model alone: a sentence encoder embeds ~1000 turns in 15 s or more, too
    # long for a smoke run.
    default_model_only: bool = False

    written: int | None = None  # how many of the written chats; None: all

    @classmethod
    def quick(
        cls, sidecar_exe: str = "", sidecar_args: tuple[str, ...] = ()
    ) -> ConversationBenchConfig:
        return cls(2, 3, sidecar_exe, sidecar_args, default_model_only=True, written=2)


@dataclass
class Scores:
    """What one mode found: per question (by kind), the recall at 5 and at 10."""

    at5: dict[str, list[float]]
    at10: dict[str, list[float]]
    put_cpu_us: float = math.nan
    put_p50_ms: float = math.nan
    p50_ms: float = math.nan

    def row(self, mode: str) -> tuple[str | float, ...]:
        def mean(values: list[float]) -> float:
            return sum(values) / len(values) if values else math.nan

        every5 = [v for vs in self.at5.values() for v in vs]
        every10 = [v for vs in self.at10.values() for v in vs]
        kinds = (mean(self.at10.get(kind, [])) for kind in KINDS)
        return (
            mode,
            mean(every5),
            mean(every10),
            *kinds,
            self.put_cpu_us,
            self.put_p50_ms,
            self.p50_ms,
        )


def questions_of(conv: Conversation, per_kind: int) -> list[Question]:
    """The questions asked of ``conv``: all, or the first ``per_kind`` of each kind."""
    if not per_kind:
        return conv.questions
    return [q for kind in KINDS for q in [q for q in conv.questions if q.kind == kind][:per_kind]]


def _score(scores: Scores, question: Question, found: Sequence[str]) -> None:
    evidence = set(question.evidence)
    for k, into in ((5, scores.at5), (10, scores.at10)):
        share = len(evidence.intersection(found[:k])) / len(evidence)
        into.setdefault(question.kind, []).append(share)


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _cpu(pid: int) -> float:
    return sum(thread.seconds for thread in threads_cpu(pid).values())


async def sidecar_mode(
    config: ConversationBenchConfig,
    data: list[Conversation],
    workdir: Path,
    args: Sequence[str],
    model: str | None,
) -> Scores:
    """Load ``data`` into a fresh sidecar started with ``args`` and ask every question;
    ``model`` is the embedding model it must rank with (None: keywords alone).

    :raises bench.proc.ServerFailed: the sidecar did not start or exited.
    :raises bench.lean_client.RpcError: a put or a list was refused.
    :raises bench.measure.BenchFailure: the sidecar does not rank as the row says.
    """
    sidecar_config = SidecarBenchConfig(
        workdir=_made(workdir),
        sidecar_exe=config.sidecar_exe,
        sidecar_args=(*args, "--log-level", "warning", *config.sidecar_args),
    )
    scores = Scores({}, {})
    async with SidecarUnderTest(sidecar_config) as sidecar:
        pid = sidecar.process.pid
        turn_of: dict[str, str] = {}
        refs: dict[str, str] = {}
        async with await LeanClient.connect(sidecar.socket_path, pipelined=True) as client:
            answer = await client.call("host.capabilities")
            relevance = answer["capabilities"]["memory"]["vendor.openwop-memory.relevance"]
            ranks_with = relevance.get("embeddingModel") if relevance.get("semantic") else None
            if ranks_with != model:
                raise BenchFailure(f"the sidecar ranks with {ranks_with}, not {model}")
            await client.call("run.begin", {"runId": WRITER_RUN, "tenant": TENANT})
            for conv in data:
                issued = {"tenant": TENANT, "agent": "bench", "namespace": conv.id}
                refs[conv.id] = (await client.call("memory.issueRef", issued))["memoryRef"]
            await _warm_up(client)
            # The acknowledgement's latency, one put at a time (indexing runs after it).
            first = data[0]
            acknowledged: list[float] = []
            for turn in first.turns[:_ONE_BY_ONE]:
                begun = time.perf_counter()
                entry = await client.call(
                    "memory.put",
                    {
                        "runId": WRITER_RUN,
                        "memoryRef": refs[first.id],
                        "entry": {"content": turn.content},
                    },
                )
                acknowledged.append(time.perf_counter() - begun)
                turn_of[entry["id"]] = turn.id
            acknowledged.sort()
            scores.put_p50_ms = percentile(acknowledged, 0.5) * 1e3
            started = _cpu(pid)
            puts = 0
            for conv in data:
                turns = conv.turns[_ONE_BY_ONE:] if conv is first else conv.turns
                for start in range(0, len(turns), _WINDOW):
                    window = turns[start : start + _WINDOW]
                    answers = await asyncio.gather(
                        *(
                            client.call(
                                "memory.put",
                                {
                                    "runId": WRITER_RUN,
                                    "memoryRef": refs[conv.id],
                                    "entry": {"content": turn.content},
                                },
                            )
                            for turn in window
                        )
                    )
                    for turn, entry in zip(window, answers, strict=True):
                        turn_of[entry["id"]] = turn.id
                    puts += len(window)
            scores.put_cpu_us = (_cpu(pid) - started) / puts * 1e6
            await client.call("run.end", {"runId": WRITER_RUN})
        sidecar.process.check_alive()
        latencies: list[float] = []
        async with await LeanClient.connect(sidecar.socket_path) as reader:
            # Begun after the last put answered, so its snapshot holds every turn.
            await reader.call("run.begin", {"runId": READER_RUN, "tenant": TENANT})
            for conv in data:
                for question in questions_of(conv, config.per_kind):
                    params = {
                        "runId": READER_RUN,
                        "memoryRef": refs[conv.id],
                        "options": {"rank": "relevance", "query": question.text, "limit": 10},
                    }
                    begun = time.perf_counter()
                    entries = await reader.call("memory.list", params)
                    latencies.append(time.perf_counter() - begun)
                    _score(scores, question, [turn_of[e["id"]] for e in entries])
    latencies.sort()
    scores.p50_ms = percentile(latencies, 0.5) * 1e3
    return scores


async def _warm_up(client: LeanClient) -> None:
    """Puts into a scope of their own until the sidecar has loaded its model (on its first
    embedding: a one-time cost the relevance suite reports) and indexed them, so that the
    puts measured next are the steady state's."""
    issued = {"tenant": TENANT, "agent": "bench", "namespace": "warm-up"}
    ref = (await client.call("memory.issueRef", issued))["memoryRef"]
    for n in range(32):
        entry = {"content": f"warming up the sidecar, note {n}"}
        await client.call("memory.put", {"runId": WRITER_RUN, "memoryRef": ref, "entry": entry})
    for _ in range(600):  # the sidecar's own counter, polled: at most 30 s
        if not (await client.call("sidecar.stats")).get("vectorsPending"):
            return
        await asyncio.sleep(0.05)


def _in_process(
    config: ConversationBenchConfig,
    data: list[Conversation],
    index: Callable[[Conversation], Callable[[str], list[str]]],
) -> Scores:
    """Recall of a ranking built per conversation by ``index`` (which returns a search of a
    question's text giving turn ids, best first), with its query's p50."""
    scores = Scores({}, {})
    latencies: list[float] = []
    for conv in data:
        search = index(conv)
        for question in questions_of(conv, config.per_kind):
            begun = time.perf_counter()
            found = search(question.text)
            latencies.append(time.perf_counter() - begun)
            _score(scores, question, found)
    latencies.sort()
    scores.p50_ms = percentile(latencies, 0.5) * 1e3
    return scores


def fts5_index(conv: Conversation) -> Callable[[str], list[str]]:
    """SQLite FTS5 (Porter) over the turns' contents: the words of the question that are
    not stop words, OR'ed, ranked by bm25()."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE turns USING fts5(content, turn UNINDEXED, tokenize=porter)")
    db.executemany("INSERT INTO turns VALUES (?, ?)", [(t.content, t.id) for t in conv.turns])

    def search(question: str) -> list[str]:
        words = [w for w in query_terms(question) if w not in STOP_WORDS]
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in words)  # quoted: a word, never an operator
        rows = db.execute(
            "SELECT turn FROM turns WHERE turns MATCH ? ORDER BY bm25(turns) LIMIT 10", (match,)
        )
        return [turn for (turn,) in rows]

    return search


def meaning_index(model: str) -> Callable[[Conversation], Callable[[str], list[str]]]:
    """Cosine similarity of the model's vectors of the turns and of the question, top 10."""
    import numpy as np  # the search extra's

    encoder = load_encoder(model)

    def index(conv: Conversation) -> Callable[[str], list[str]]:
        turns = conv.turns
        vectors = encoder.embed([t.content for t in turns]).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1)
        vectors /= np.where(norms == 0, 1.0, norms)[:, None]

        def search(question: str) -> list[str]:
            query = encoder.embed([question]).astype(np.float32)[0]
            similarity = vectors @ (query / (np.linalg.norm(query) or 1.0))
            return [turns[i].id for i in np.argsort(-similarity, kind="stable")[:10]]

        return search

    return index


def installed_models() -> list[str]:
    return [m for m in known_models() if model_installed(m)]


async def run(config: ConversationBenchConfig, workdir: Path) -> SuiteResult:
    """Every mode's row on each set, in the tables :data:`TITLE` (the made-up chats) and
    :data:`WRITTEN_TITLE`, plus a metric per set and mode's recall@10."""
    models = installed_models()
    if config.default_model_only:
        models = [m for m in models if m == DEFAULT_MODEL]
    sets = (
        ("conversations", TITLE, generate(config.conversations)),
        ("conversations (written)", WRITTEN_TITLE, written(conversations=config.written)),
    )
    result = SuiteResult(metrics=[], tables=[])
    for prefix, title, data in sets:
        table, metrics = await _one_set(config, data, workdir / prefix.split()[-1], models, title)
        result.tables.append(table)
        result.metrics.extend(
            Metric(f"{prefix}: {m.name}", m.value, m.unit, m.target) for m in metrics
        )
    if not models:
        result.notes.append("conversations: no embedding model installed, keyword rows only")
    return result


async def _one_set(
    config: ConversationBenchConfig,
    data: list[Conversation],
    workdir: Path,
    models: list[str],
    title: str,
) -> tuple[Table, list[Metric]]:
    """The table ``title`` of every mode on ``data``, and their metrics (names without the
    set's)."""
    asked = sum(len(questions_of(c, config.per_kind)) for c in data)
    table = Table(title, COLUMNS)
    modes: list[tuple[str, tuple[str, ...], str | None]] = [
        ("keyword", ("--semantic-search", "false"), None)
    ]
    for model in models:
        name = "hybrid" if model == DEFAULT_MODEL else f"hybrid-{model}"
        flags: tuple[str, ...] = () if model == DEFAULT_MODEL else ("--embedding-model", model)
        modes.append((name, flags, model))
    rows: list[tuple[str, Scores]] = []
    for name, flags, ranks_with in modes:
        rows.append((name, await sidecar_mode(config, data, workdir / name, flags, ranks_with)))
    rows.append(("fts5-bm25", _in_process(config, data, fts5_index)))
    for model in models:
        name = "meaning-only" if model == DEFAULT_MODEL else f"meaning-only-{model}"
        rows.append((name, _in_process(config, data, meaning_index(model))))
    metrics = [
        Metric("turns loaded", sum(len(c.turns) for c in data), "turns"),
        Metric("questions asked", asked, "questions"),
    ]
    for name, scores in rows:
        row = scores.row(name)
        table.rows.append(row)
        metrics.append(Metric(f"recall@10, {name}", float(row[2]), "ratio"))
    # What the search extra adds to a put's acknowledgement (its indexing runs after it).
    plain = rows[0][1].put_p50_ms
    for name, scores in rows[1 : len(modes)]:
        metrics.append(
            Metric(f"put p50, {name} / keyword", scores.put_p50_ms / plain, "x", Target("<=", 1.2))
        )
    return table, metrics


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2 conversations, 12 questions each")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--sidecar-exe", default="", help="the openwop-memory executable")
    args = parser.parse_args(argv)
    if args.quick:
        config = ConversationBenchConfig.quick(args.sidecar_exe)
    else:
        config = ConversationBenchConfig(sidecar_exe=args.sidecar_exe)
    with tempfile.TemporaryDirectory(prefix="owm-conversations-") as directory:
        result = asyncio.run(run(config, Path(directory)))
    for metric in result.metrics:
        if metric.unit in ("turns", "questions"):
            print(f"{metric.name}: {metric.value:g} {metric.unit}")
    for table in result.tables:
        print(table.format())
    for note in result.notes:
        print(note)
    if args.json:
        out = {
            "metrics": [m.as_json() for m in result.metrics],
            "tables": {t.title: t.as_json() for t in result.tables},
        }
        print(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
