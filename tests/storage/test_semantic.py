"""Relevance by meaning (the ``search`` extra): the model loads from its package with no
network, its vectors are WordLlama's, scores are exact; through the storage API on both
backends (vectors fused with keywords, entries without one, the snapshot and filters); and
on a real sidecar: a match by meaning alone ranks first, replays rank the same, later
entries stay out, no registered secret reaches the index or the vectors, and capabilities
say semantic exactly when the model is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openwop_memory.app import open_app
from openwop_memory.config import Settings
from openwop_memory.domain import SweepHorizons
from openwop_memory.retrieval import nearest
from openwop_memory.retrieval.encoders import wordllama as semantic
from openwop_memory.retrieval.fusion import LIGHT_WEIGHTS, Weights
from openwop_memory.retrieval.search import Search
from openwop_memory.retrieval.text import query_terms
from openwop_memory.storage.base import (
    PENDING_VECTOR,
    EntryRow,
    ListFilter,
    PutRequest,
    Scope,
    Snapshot,
    Storage,
    StoredEntry,
)
from openwop_memory.timefmt import now_us
from openwop_memory.wire.dispatch import Dispatcher
from openwop_memory_client import UpstreamUnavailableError
from support.backends import POSTGRES, selected
from support.names import uid
from support.on_disk import files_of, query
from support.polling import wait_for
from support.protocol import begin, listing, new_run, put
from support.schemas import check_capabilities
from support.sidecar import RawClient, Sidecar, sidecars_sharing_a_database
from support.store import SECOND, fresh_snapshot, stored

ROOT = Path(__file__).resolve().parents[2]
LABELLED = ROOT / "bench" / "data" / "relevance_set.json"
A = Scope("tenant-a", "notes")


@cache
def model() -> semantic.Embedder:
    return semantic.load()


def labelled() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(LABELLED.read_text())
    return data


# -- the model ------------------------------------------------------------------------------


def _python(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with an empty home and cache, hub downloads off, and
    every socket connection refused."""
    guard = (
        "import socket\n"
        "def _refused(*a, **k):\n"
        "    raise OSError('no network in this test')\n"
        "socket.socket.connect = _refused\n"
        "socket.create_connection = _refused\n"
    )
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "HF_HOME": str(home / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", guard + code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.backend_independent
def test_the_model_loads_from_its_package_with_no_network(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = _python(
        "import sys\n"
        "from openwop_memory.retrieval.encoders import wordllama as semantic\n"
        "assert semantic.model_installed()\n"
        "vector = semantic.load().vector('the staging deploy failed')\n"
        "assert vector is not None and len(vector) == semantic.VECTOR_BYTES\n"
        # wordllama's own modules (which would configure logging) were never imported
        "assert not [m for m in sys.modules if m.startswith('wordllama')]\n"
        "print('loaded')\n",
        home,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded"
    assert list(home.rglob("*")) == []  # nothing downloaded or cached


@pytest.mark.backend_independent
def test_the_vectors_are_wordllamas_embedding(tmp_path: Path) -> None:
    """Against WordLlama's own inference over the same files, in a fresh interpreter (its
    import configures the root logger)."""
    texts = [e["content"] for e in labelled()["entries"][:20]] + ["one", "a b c d"]
    home = tmp_path / "home"
    home.mkdir()
    proc = _python(
        "import json, sys\n"
        "import numpy as np\n"
        "from safetensors.numpy import load_file\n"
        "from tokenizers import Tokenizer\n"
        "from wordllama.inference import WordLlamaInference\n"
        "from openwop_memory.retrieval.encoders import wordllama as semantic\n"
        "weights, tokenizer = semantic._package_files()\n"
        "table = load_file(str(weights))['embedding.weight'][:, :semantic.DIMENSIONS]\n"
        "theirs = WordLlamaInference(table, Tokenizer.from_file(str(tokenizer)))\n"
        "ours = semantic.load()\n"
        "texts = json.loads(sys.argv[1])\n"
        "want = theirs.embed(texts, norm=True)\n"
        "got = np.stack([ours.unit(t) for t in texts])\n"
        "print(float(np.abs(want - got).max()))\n"
        "\n".replace("sys.argv[1]", repr(json.dumps(texts))),
        home,
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.split()[-1]) < 1e-5


@pytest.mark.backend_independent
def test_scores_are_exact_in_any_row_order() -> None:
    rng = np.random.default_rng(5)
    rows = rng.integers(-127, 128, size=(500, semantic.RANK_DIMENSIONS)).astype(np.float32)
    query = rng.integers(-127, 128, size=semantic.RANK_DIMENSIONS).astype(np.float32)
    scores = semantic.similarities(rows, semantic.norms_of(rows), query)
    order = rng.permutation(len(rows))
    shuffled = semantic.similarities(rows[order], semantic.norms_of(rows[order]), query)
    assert np.array_equal(shuffled, scores[order])
    # The same value Python's integers give.
    ints = rows.astype(np.int64)
    dot = int(ints[7] @ query.astype(np.int64))
    assert scores[7] == dot / float(np.sqrt(float(int(ints[7] @ ints[7]))))


@pytest.mark.backend_independent
def test_text_without_words_has_no_vector() -> None:
    assert model().vector(" \n\t ") is None
    assert model().vector("") is None


# -- through the storage API, both backends -------------------------------------------------


def request(scope: Scope, content: str, *, vector: bool = True, **kw: Any) -> PutRequest:
    digest = hashlib.sha256(content.encode()).digest()
    embedded = model().vector(content) if vector else None
    return PutRequest(
        scope, content, kw.get("tags", ()), kw.get("expires_us"), None, digest, embedded
    )


async def searched(
    store: Storage,
    snap: Snapshot,
    text: str,
    *,
    keywords: bool = True,
    meaning: bool = True,
    limit: int = 10,
    **kw: Any,
) -> list[str]:
    rows = await Search(store).search(
        scope=kw.pop("scope", A),
        snapshot=snap,
        now_us=now_us(),
        terms=query_terms(text) if keywords else [],
        limit=limit,
        tag=kw.pop("tag", None),
        vector=model().vector(text) if meaning else None,
        **kw,
    )
    return [r.content for r in rows]


PEANUTS = "The user is allergic to peanuts."
CELLO = "The user plays the cello in an amateur orchestra on Thursday evenings."
DEPLOY = "The staging deploy failed because the database volume ran out of disk space."


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_meaning_finds_what_keywords_cannot(store: Storage) -> None:
    contents = [PEANUTS, CELLO, DEPLOY]
    for content in contents:
        await stored(store, request(A, content))
    snap = await fresh_snapshot(store, "tenant-a")
    question = "musical instrument hobby"
    assert await searched(store, snap, question, meaning=False) == []
    assert (await searched(store, snap, question))[0] == CELLO
    assert (await searched(store, snap, question, keywords=False))[0] == CELLO
    # By meaning, exactly the entries at least `related` similar, most similar first.
    for text in ("giraffe", "quantum chromodynamics", "peanut butter"):
        query = semantic.query_vector(model().vector(text) or b"")
        rows = np.stack([semantic.query_vector(model().vector(c) or b"") for c in contents])
        cosines = semantic.similarities(rows, semantic.norms_of(rows), query)
        cosines /= np.sqrt(float(query @ query))
        ranked = sorted(zip(cosines, contents, strict=True), reverse=True)
        near = [c for cos, c in ranked if cos >= LIGHT_WEIGHTS.related]
        assert await searched(store, snap, text, keywords=False) == near


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_a_question_about_nothing_stored_finds_nothing(store: Storage) -> None:
    # The light model puts each of these questions between 0.2 and 0.3 of one of the
    # entries (none shares a word with them): unrelated, though above the 0.2 that used to
    # be enough for an entry matching no word.
    contents = [
        PEANUTS,
        CELLO,
        DEPLOY,
        "The user's dog is a golden retriever named Biscuit.",
        "The user's laptop budget is 1500 dollars.",
    ]
    for content in contents:
        await stored(store, request(A, content))
    snap = await fresh_snapshot(store, "tenant-a")
    unrelated = [
        "how tall is mount everest",
        "what colour is a flamingo",
        "explain quantum entanglement",
        "the rules of ice hockey",
        "the weather tomorrow",
        "how many moons does jupiter have",
    ]
    for question in unrelated:
        assert await searched(store, snap, question) == [], question
    # What is stored is still found by meaning alone.
    assert await searched(store, snap, "which pet do they have") == [contents[3]]
    assert (await searched(store, snap, "musical instrument hobby"))[0] == CELLO


@pytest.mark.anyio
async def test_the_labelled_sets_unrelated_questions_share_no_word_with_it(
    store: Storage,
) -> None:
    # What the bench's "unrelated queries answered empty" rows rest on: a keyword index
    # finds nothing for them, so an entry they bring back came by meaning alone.
    data = labelled()
    for entry in data["entries"]:
        await stored(store, request(A, entry["content"], vector=False))
    snap = await fresh_snapshot(store, "tenant-a")
    for question in data["unrelated"]:
        assert await searched(store, snap, question, meaning=False) == [], question
    page = (ROOT / "docs" / "search.md").read_text()
    assert f"of its {len(data['unrelated'])} unrelated questions" in page


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_an_entry_without_a_vector_still_ranks_by_keywords(store: Storage) -> None:
    old = "orchestra rehearsal moved to the big hall"
    await stored(store, request(A, old, vector=False))
    await stored(store, request(A, CELLO))
    snap = await fresh_snapshot(store, "tenant-a")
    assert set(await searched(store, snap, "orchestra")) == {old, CELLO}
    assert await searched(store, snap, "orchestra", keywords=False) == [CELLO]


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_meaning_sees_only_the_snapshot_and_the_conditions(store: Storage) -> None:
    cello = await stored(store, request(A, CELLO, tags=("music",)))
    await stored(store, request(A, PEANUTS, tags=("health",)))
    before = await fresh_snapshot(store, "tenant-a")
    await stored(store, request(A, "Plays the violin in a string quartet."))
    other_scope = Scope("tenant-a", "elsewhere")
    await stored(store, request(other_scope, "Plays the double bass in a jazz band."))
    assert await store.delete(scope=A, entry_id=cello.id, now_us=now_us())
    after = await fresh_snapshot(store, "tenant-a")
    question = "which musical instrument"
    violin, bass = "Plays the violin in a string quartet.", "Plays the double bass in a jazz band."
    seen = await searched(store, before, question, keywords=False)
    assert seen[0] == CELLO and violin not in seen and bass not in seen
    seen_after = await searched(store, after, question, keywords=False)
    assert seen_after[0] == violin and CELLO not in seen_after and bass not in seen_after
    assert CELLO not in await searched(store, before, question, keywords=False, tag="health")
    none_after = ListFilter(created_after_us=now_us())
    assert await searched(store, before, question, keywords=False, where=none_after) == []
    assert await searched(store, before, question, keywords=False, max_tokens=3) == []
    # The same snapshot again, from a warm cache: the same answer.
    assert await searched(store, before, question, keywords=False) == seen


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_many_candidates_rejected_by_a_filter_are_passed_over(store: Storage) -> None:
    """The nearest entries are checked a chunk at a time: a tag held by few of them still
    finds them, in the same order as without the tag."""
    contents = [f"Plays the cello, lesson number {n}" for n in range(40)]
    for n, content in enumerate(contents):
        await stored(store, request(A, content, tags=("kept",) if n % 10 == 0 else ()))
    snap = await fresh_snapshot(store, "tenant-a")
    everything = await searched(store, snap, "cello music", keywords=False, limit=40)
    assert sorted(everything) == sorted(contents)
    kept = await searched(store, snap, "cello music", keywords=False, limit=2, tag="kept")
    assert kept == [c for c in everything if contents.index(c) % 10 == 0][:2]


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_a_purged_entry_leaves_the_cache_and_the_ranking(store: Storage) -> None:
    """An entry swept away after the cache loaded it is found gone by the check, and the
    ranking is that of the entries still there."""
    cello = await stored(store, request(A, CELLO))
    await stored(store, request(A, "Plays the violin in a string quartet."))
    question = "which musical instrument"
    assert (await searched(store, await fresh_snapshot(store, "tenant-a"), question))[0] == CELLO
    assert await store.delete(scope=A, entry_id=cello.id, now_us=now_us())
    # Every snapshot released, so the tombstone goes.
    later = now_us() + 10 * SECOND
    counts = await store.sweep(horizons=SweepHorizons(later, later, 0, 0), batch_size=10)
    assert counts.purged_tombstones == 1
    snap = await fresh_snapshot(store, "tenant-a")
    assert await searched(store, snap, question, keywords=False) == [
        "Plays the violin in a string quartet."
    ]
    assert CELLO not in await searched(store, snap, question)


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_a_failing_database_is_upstream_unavailable_not_a_group(store: Storage) -> None:
    """The two sides of a hybrid search run side by side; a failure of either is raised as
    the backend's own error."""
    await stored(store, request(A, CELLO))
    snap = await fresh_snapshot(store, "tenant-a")
    await store.close()
    with pytest.raises(UpstreamUnavailableError):
        await searched(store, snap, "musical instrument hobby")


@pytest.mark.backend_independent
@pytest.mark.anyio
@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("distinct", [9000, 40])
async def test_a_big_scope_ranks_exactly_as_brute_force(
    store: Storage, parts: int, distinct: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope past the size scored on the event loop (loaded and scored on worker
    threads, in one part or three): the nearest entries are those numpy's brute force
    finds, in its order; also when only 40 vectors recur, so that equal scores straddle
    the parts and the answer's end (each part picks its own best first)."""
    monkeypatch.setattr(nearest, "_CPUS", parts)
    monkeypatch.setattr(nearest, "_PART_BYTES", 2500 * semantic.VECTOR_BYTES)
    monkeypatch.setattr(nearest, "_INLINE_BYTES", 8192 * semantic.VECTOR_BYTES)
    assert len(nearest._parts(9000, semantic.VECTOR_BYTES)) == parts
    rng = np.random.default_rng(9)
    vectors = rng.integers(-127, 128, size=(9000, semantic.VECTOR_BYTES), dtype=np.int8)
    vectors = vectors[rng.integers(0, distinct, size=9000)] if distinct < 9000 else vectors
    rows = [f"entry {i}" for i in range(len(vectors))]
    start = now_us() - 10_000_000
    # Imported in bulk (the vectors stored as a put stores them): 9,000 puts would take
    # most of the time, and the test is of the search.
    assert await store.import_entries(
        entries=[
            StoredEntry(A, EntryRow(f"e-{i}", rows[i], (), start + i, None, 2), v.tobytes())
            for i, v in enumerate(vectors)
        ]
    ) == len(vectors)
    snap = await fresh_snapshot(store, "tenant-a")
    query = vectors[4321]
    matrix = vectors.astype(np.float32)
    scores = semantic.similarities(matrix, semantic.norms_of(matrix), query.astype(np.float32))
    cosines = scores / np.sqrt(float(query.astype(np.float32) @ query.astype(np.float32)))
    # Floors low enough that about a fifth of the random vectors are candidates.
    weights = Weights(meaning=0.5, floor=0.1, related=0.1, context=0.0)
    keep = cosines > weights.floor
    order = sorted(np.flatnonzero(keep), key=lambda i: (-scores[i], -i))[:50]
    found = await Search(store).search(
        scope=A,
        snapshot=snap,
        now_us=now_us(),
        terms=[],
        limit=50,
        tag=None,
        vector=query.tobytes(),
        weights=weights,
    )
    assert [r.content for r in found] == [rows[i] for i in order]
    if distinct == 9000:
        assert found[0].content == "entry 4321"
    else:  # 4321's copies tie with it, the newest first
        assert len({scores[i] for i in order}) < len(order)


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_the_model_failing_to_load_leaves_keywords_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Files present but unreadable (the weights replaced by the tokenizer's JSON): the
    model is then not installed, and puts get no vector."""
    from openwop_memory.service.embedding import EmbeddingModel

    monkeypatch.setattr(semantic, "_WEIGHTS", semantic._TOKENIZER)
    with pytest.raises(semantic.ModelUnavailableError, match="cannot read the model"):
        semantic.load()
    assert semantic.model_installed()  # the files are there...
    embedding = EmbeddingModel()
    assert await embedding.vector("the staging deploy failed") is None  # ...but unreadable
    assert not embedding.installed
    assert await embedding.vector("again") is None


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_forget_removes_the_vectors_and_older_snapshots_stop_finding_them(
    store: Storage,
) -> None:
    """RFC 0080's forget purges the rows, vectors included: a snapshot taken before, whose
    cache already holds the vector, no longer finds the entry by meaning."""
    await stored(store, request(A, CELLO, tags=("subject:s1",)))
    violin = "Plays the violin in a string quartet."
    await stored(store, request(A, violin))
    old = await fresh_snapshot(store, "tenant-a")
    question = "which musical instrument"
    assert (await searched(store, old, question, keywords=False))[0] == CELLO
    assert await store.forget(tenant="tenant-a", tag="subject:s1", batch_size=10) == 1
    assert CELLO not in await searched(store, old, question, keywords=False)
    assert (await searched(store, old, question))[0] == violin


# -- on a real sidecar ----------------------------------------------------------------------


def relevance(client: RawClient, run: str, ref: str, text: str, **options: Any) -> list[str]:
    found = listing(client, run, ref, rank="relevance", query=text, **options)
    return [e["content"] for e in found]


def filled(client: RawClient, tenant: str) -> str:
    ref = uid("ref")
    writer = new_run(client, tenant)
    for entry in labelled()["entries"]:
        put(client, writer, ref, entry["content"])
    return ref


def test_a_match_by_meaning_alone_ranks_first_and_replays_the_same(client: RawClient) -> None:
    tenant = uid("t")
    ref = filled(client, tenant)
    run = new_run(client, tenant)
    question = "musical instrument hobby"
    assert not set(query_terms(question)) & set(query_terms(CELLO))
    first = relevance(client, run, ref, question)
    assert first[0] == CELLO
    # Written after the run began: never seen by it, however near.
    writer = new_run(client, tenant)
    put(client, writer, ref, "Anna's hobby: a musical instrument, the viola.")
    assert relevance(client, run, ref, question) == first
    # A replay of the run, after it ended here, ranks exactly as before.
    assert client.call("run.end", runId=run)["ended"] is True
    assert begin(client, run, tenant, replay=True)["resumed"] is True
    assert relevance(client, run, ref, question) == first
    # A run begun now does see the new entry.
    assert relevance(client, new_run(client, tenant), ref, question)[0].startswith("Anna's")


def test_a_query_of_stop_words_alone_finds_nothing_even_by_meaning(client: RawClient) -> None:
    """Issue 22: a query with nothing content-bearing is nothing relevant, although its
    words have vectors near some entries."""
    tenant = uid("t")
    ref = filled(client, tenant)
    run = new_run(client, tenant)
    assert query_terms("what were they doing there") == []
    assert relevance(client, run, ref, "what were they doing there") == []
    assert relevance(client, run, ref, "what were they playing there")  # one real word


def test_capabilities_say_semantic_with_the_model(client: RawClient) -> None:
    result = client.call("host.capabilities")
    check_capabilities(result)
    memory = result["capabilities"]["memory"]
    assert memory["search"] == {"supported": True, "modes": ["semantic", "filter"]}
    assert memory["vendor.openwop-memory.relevance"] == {
        "keyword": True,
        "semantic": True,
        "embeddingModel": semantic.MODEL,
        "fusion": "weighted-scores",
    }


SECRET = "quokkaplum93sekret"


def stored_vector(sidecar: Sidecar) -> bytes:
    """The one entry's stored vector, once the background indexer has written it."""

    def vector() -> bytes:
        if sidecar.backend.name == "sqlite":
            [(stored,)] = query(sidecar.database, "SELECT embedding FROM entries")
            return bytes(stored)
        sql = "SELECT encode(embedding, 'hex') FROM entries"
        [hexed] = POSTGRES.psql(sidecar.database, sql).split()
        return bytes.fromhex(hexed)

    wait_for(lambda: vector() != PENDING_VECTOR, 10, "the vector stored")
    return vector()


def test_no_registered_secret_reaches_the_index_or_the_vectors(sidecar: Sidecar) -> None:
    tenant = uid("t")
    ref = uid("ref")
    raw = f"the vault token is {SECRET} and rotates monthly"
    with sidecar.client() as client:
        writer = uid("run")
        client.call(
            "run.begin", runId=writer, tenant=tenant, secrets=[{"id": "v", "value": SECRET}]
        )
        entry = put(client, writer, ref, raw)
        assert SECRET not in entry["content"]
        found = relevance(client, new_run(client, tenant), ref, "vault token rotation")
        assert found == [entry["content"]]
        # The search ranked by a vector computed in memory; the stored one is the indexer's,
        # written off the put's path, so the files are read once it is there.
        vector = stored_vector(sidecar)
        if sidecar.backend.name == "sqlite":
            stored_files = files_of(sidecar.database.parent)
            assert any(name.endswith("-wal") for name in stored_files)
            for name, data in stored_files.items():  # the database, its WAL, the log
                assert SECRET.encode() not in data, name
                assert SECRET[:10].encode() not in data, name
            terms = query(sidecar.database, "SELECT block FROM entries_fts_data")
            assert all(SECRET[:10].encode() not in bytes(block) for (block,) in terms)
        else:
            rows = POSTGRES.psql(
                sidecar.database,
                "SELECT convert_from(content, 'UTF8'), search::text, encode(embedding, 'hex')"
                " FROM entries",
            )
            assert "vault" in rows and SECRET not in rows and SECRET[:10] not in rows
            server = POSTGRES.server
            assert server is not None
            for segment in sorted((server.data / "pg_wal").glob("0*")):
                assert SECRET.encode() not in segment.read_bytes(), segment.name
        # The vector is the redacted content's, not the one the worker sent.
        assert vector == model().vector(entry["content"])
        assert vector != model().vector(raw)


# -- without the model (in process: the loader finds no package) ---------------------------


@pytest.fixture
async def without_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Dispatcher]:
    monkeypatch.setattr(semantic, "_PACKAGE", "openwop_no_such_package")
    assert not semantic.model_installed()
    settings = Settings.model_validate({"database": selected().url_for(tmp_path / "plain.db")})
    async with await open_app(settings) as app:
        yield app.dispatcher


async def _call(dispatcher: Dispatcher, method: str, **params: Any) -> Any:
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    answer = await dispatcher.handle_line(line.encode())
    assert answer is not None
    response = json.loads(answer)
    assert "result" in response, response
    return response["result"]


@pytest.mark.anyio
async def test_without_the_model_relevance_is_keywords_only(without_model: Dispatcher) -> None:
    result = await _call(without_model, "host.capabilities")
    check_capabilities(result)
    memory = result["capabilities"]["memory"]
    assert memory["search"] == {"supported": True, "modes": ["filter"]}
    assert memory["vendor.openwop-memory.relevance"] == {"keyword": True, "semantic": False}
    await _call(without_model, "run.begin", runId="w", tenant="t")
    for content in (CELLO, PEANUTS):
        entry = {"content": content, "tags": []}
        await _call(without_model, "memory.put", runId="w", memoryRef="r", entry=entry)
    await _call(without_model, "run.begin", runId="reader", tenant="t")

    async def ranked(text: str) -> list[str]:
        options = {"rank": "relevance", "query": text}
        found = await _call(
            without_model, "memory.list", runId="reader", memoryRef="r", options=options
        )
        return [e["content"] for e in found]

    assert await ranked("musical instrument hobby") == []
    assert await ranked("cello") == [CELLO]


def test_entries_put_without_the_model_rank_by_keywords(workdir: Path) -> None:
    """Entries written while semantic search was off (or before the extra was installed)
    have no vector: a sidecar with the model finds them by their words, not by meaning."""
    tenant, ref = uid("t"), uid("ref")
    old = "The orchestra rehearses the cello part on Thursdays."
    with Sidecar(workdir, "--semantic-search=false") as before, before.client() as client:
        put(client, new_run(client, tenant), ref, old)
    with Sidecar(workdir) as after, after.client() as client:
        long_entry = "My hobby is the viola, a musical instrument. " + "More notes. " * 100
        assert len(long_entry) > 1024  # embedded on a worker thread
        put(client, new_run(client, tenant), ref, long_entry)
        run = new_run(client, tenant)
        assert relevance(client, run, ref, "orchestra") == [old]
        assert relevance(client, run, ref, "musical instrument hobby") == [long_entry]
        assert relevance(client, run, ref, "string instruments", limit=5) == [long_entry]
        if after.backend.name == "sqlite":
            sql = "SELECT length(embedding) FROM entries ORDER BY seq"
            # The indexer stores the second vector after the put's commit.
            wait_for(lambda: query(after.database, sql)[1] != (1,), 10, "the vector stored")
            assert query(after.database, sql) == [(None,), (semantic.VECTOR_BYTES,)]


def test_another_sidecar_replays_the_same_ranking(workdir: Path) -> None:
    """Scores are exact, so a sidecar with a cache of its own (built after later writes and
    a delete) ranks a run's relevance lists exactly as the first one did."""
    tenant = uid("t")
    questions = ["musical instrument hobby", "travel plans for Japan", "money and taxes"]
    with sidecars_sharing_a_database(workdir) as (_, _, a, b):
        ref = filled(a, tenant)
        run = new_run(a, tenant)
        first = {q: listing(a, run, ref, rank="relevance", query=q, limit=20) for q in questions}
        writer = new_run(b, tenant)
        put(b, writer, ref, "Practises the piano every evening, a musical hobby.")
        gone = first[questions[0]][0]["id"]
        assert b.call("memory.delete", runId=writer, memoryRef=ref, id=gone) is True
        assert begin(b, run, tenant)["resumed"] is True
        for q in questions:
            again = listing(b, run, ref, rank="relevance", query=q, limit=20)
            assert again == first[q]
            assert listing(a, run, ref, rank="relevance", query=q, limit=20) == first[q]


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_a_prefetched_scope_is_searched_from_memory_as_it_would_be_otherwise(
    store: Storage,
) -> None:
    """``Search.prefetch`` (run beside a first query's embedding) loads the scope's vectors,
    pending ones computed; the search after it reads only what came since, and ranks as a
    search that loaded them itself."""
    for content in (PEANUTS, CELLO, DEPLOY):
        await stored(store, request(A, content))
    snap = await fresh_snapshot(store, "tenant-a")
    question = "musical instrument hobby"
    searcher = Search(store)
    await searcher.prefetch(scope=A, dimensions=semantic.DIMENSIONS, embed=None)
    cache = searcher._vector_cache()
    assert cache._scopes[A].size == 3
    loads: list[int] = []
    vectors_after = store.vectors_after

    async def counted(*, scope: Scope, after: int) -> Any:
        loads.append(after)
        return await vectors_after(scope=scope, after=after)

    store.vectors_after = counted  # type: ignore[method-assign]
    rows = await searcher.search(
        scope=A,
        snapshot=snap,
        now_us=now_us(),
        terms=query_terms(question),
        limit=10,
        tag=None,
        vector=model().vector(question),
    )
    assert loads and min(loads) > 0  # only what came after the prefetched rows
    assert [r.content for r in rows] == await searched(store, snap, question)
