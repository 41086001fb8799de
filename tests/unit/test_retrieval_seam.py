"""The retrieval layer's seam (issue 22): the names and contracts the service's search and
the recall work meet at, checked in-process."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import pytest
from openwop_memory.retrieval.encoders import (
    DEFAULT_MODEL,
    EncoderUnavailableError,
    load_encoder,
)
from openwop_memory.retrieval.fusion import Weights, coverage, fuse, keyword_ceiling
from openwop_memory.retrieval.text import index_terms, query_terms

pytestmark = pytest.mark.backend_independent


def test_terms_of_an_entry_keep_repeats_and_a_query_drops_stop_words() -> None:
    assert index_terms("The dog, the DOG and a cat") == [
        "the",
        "dog",
        "the",
        "dog",
        "and",
        "a",
        "cat",
    ]
    assert query_terms("what is the dog's name?") == ["dog", "name"]
    assert query_terms("what is it that they were") == []


WEIGHTS = Weights(meaning=0.3, floor=0.2, related=0.5)


def test_fusion_scores_are_in_0_1_best_first_and_leave_out_the_unrelated() -> None:
    keyword = [(4, 1.0), (2, 0.5), (3, 0.25)]  # coverages
    meaning = [(7, 0.9), (2, 0.8), (5, 0.45), (6, 0.21)]
    fused = fuse(keyword, meaning, weights=WEIGHTS)
    scores = dict(fused)
    assert all(0 < score <= 1 for score in scores.values())
    assert [seq for seq, _ in fused] == sorted(scores, key=lambda s: (-scores[s], -s))
    # 5 and 6 match no term and are less similar than ``related``: not hits.
    assert set(scores) == {2, 3, 4, 7}
    # The best keyword hit keeps its keyword share; 2 gains meaning on top of its keywords.
    assert scores[4] == pytest.approx(0.7) and scores[2] > 0.7 * 0.5
    assert scores[7] == pytest.approx(0.3)  # meaning alone, the best rise above the floor


def test_fusion_of_keywords_alone_keeps_the_keyword_order() -> None:
    keyword = [(1, 0.9), (9, 0.6), (5, 0.6), (2, 0.1)]
    assert [seq for seq, _ in fuse(keyword, [], weights=WEIGHTS)] == [1, 9, 5, 2]


def test_coverage_is_the_share_of_the_query_terms_weight() -> None:
    # 10 entries match: "rare" 1 of them, "common" 9; a third term no entry holds.
    ceiling = keyword_ceiling(10, [9, 1], 3)
    assert ceiling == keyword_ceiling(10, [1, 9], 3)  # the database's order does not matter
    rare = math.log(1 + 9.5 / 1.5)
    assert coverage(rare, ceiling) == round(rare / ceiling, 9)
    assert 0 < coverage(rare, ceiling) < coverage(rare, keyword_ceiling(10, [9, 1], 2)) < 1
    assert coverage(ceiling, ceiling) == 1.0 and coverage(1.0, 0.0) == 0.0


def test_fusion_scores_weak_meaning_against_the_near_cosine() -> None:
    weights = Weights(meaning=0.3, floor=0.2, related=0.5, near=0.8)
    # The nearest of weakly related entries is not fully near: 0.6 rises 0.4 of 0.6.
    weak = dict(fuse([], [(1, 0.5), (2, 0.6)], weights=weights))
    assert weak == {2: pytest.approx(0.3 * 0.4 / 0.6), 1: pytest.approx(0.3 * 0.3 / 0.6)}
    # Beside a nearer entry, the best rise is that entry's.
    near = dict(fuse([], [(2, 0.6), (3, 0.9)], weights=weights))
    assert near == {3: pytest.approx(0.3), 2: pytest.approx(0.3 * 0.4 / 0.7)}


def test_fusion_with_nothing_relevant_finds_nothing() -> None:
    assert fuse([], [(1, 0.45), (2, 0.3)], weights=WEIGHTS) == []


def test_fusion_is_deterministic_and_ties_go_to_the_newer() -> None:
    keyword = [(3, 1.0), (8, 1.0)]
    meaning = [(3, 0.6), (8, 0.6)]
    first = fuse(keyword, meaning, weights=WEIGHTS)
    assert first == fuse(keyword, meaning, weights=WEIGHTS)
    assert [seq for seq, _ in first] == [8, 3]


def test_an_unknown_model_is_a_clear_error() -> None:
    with pytest.raises(EncoderUnavailableError, match="unknown embedding model 'nope'"):
        load_encoder("nope")


def test_the_default_encoder_gives_deterministic_int8_unit_rows() -> None:
    encoder = load_encoder(DEFAULT_MODEL)
    texts = ["the staging deploy failed", "a b c", ""]
    first, again = encoder.embed(texts), encoder.embed(list(reversed(texts)))[::-1]
    assert first.dtype == np.int8 and first.shape == (3, encoder.dimensions)
    assert np.array_equal(first, again)
    assert int(np.abs(first[0]).max()) == 127  # scaled so its largest component is 127
    assert not first[2].any()  # no word: a row of zeros


def test_the_embedding_model_setting_defaults_to_the_light_model_and_refuses_others() -> None:
    from openwop_memory.config import ConfigError, load_settings

    assert load_settings({}, environ={}).embedding_model == DEFAULT_MODEL
    env = {"OPENWOP_MEMORY_EMBEDDING_MODEL": "no-such-model"}
    with pytest.raises(ConfigError, match="embedding_model"):
        load_settings({}, environ=env)


def test_similarities_of_int8_rows_are_those_of_their_float32_copy() -> None:
    """The vector cache keeps the stored int8 rows and multiplies them as they are: the
    same cosines to the bit as one float32 product, any length (SIMD tails included),
    at int8's extremes, and on every kernel SimSIMD has for this CPU (the plain C one
    included), so a replay on another machine ranks alike."""
    import simsimd
    from openwop_memory.retrieval.encoders.wordllama import norms_of, similarities

    rng = np.random.default_rng(7)
    cases = [(5000, 384), (3, 64), (0, 64), (257, 383), (9, 1), (40, 17)]
    matrices = [rng.integers(-127, 128, size=shape, dtype=np.int8) for shape in cases]
    matrices.append(np.full((4, 384), 127, dtype=np.int8))  # the largest dot products
    matrices.append(np.full((4, 384), -127, dtype=np.int8))
    matrices.append(rng.integers(-127, 128, size=(100, 64), dtype=np.int8)[::3])  # strided
    kernels = [k for k, on in simsimd.get_capabilities().items() if on and k != "serial"]
    try:
        for kernel in [None, *kernels]:  # None: every kernel off, the plain C one
            if kernel is None:
                for k in kernels:
                    simsimd.disable_capability(k)
            else:
                simsimd.enable_capability(kernel)
            for stored in matrices:
                dimensions = stored.shape[1]
                extreme = len(stored) > 0 and stored[0, 0] == 127
                drawn = np.full(dimensions, 127) if extreme else rng.integers(-127, 128, dimensions)
                query = np.asarray(drawn, dtype=np.float32)
                wide = stored.astype(np.float32)
                exact = np.sqrt((stored.astype(np.int64) ** 2).sum(axis=1).astype(np.float64))
                assert np.array_equal(norms_of(stored), np.where(exact == 0, 1.0, exact))
                assert np.array_equal(norms_of(stored), norms_of(wide))
                found = similarities(stored, norms_of(stored), query)
                assert np.array_equal(found, similarities(wide, norms_of(wide), query)), kernel
    finally:
        for k in kernels:
            simsimd.enable_capability(k)


@pytest.mark.anyio
async def test_a_query_asked_again_reuses_its_vector() -> None:
    """The service keeps recent queries' vectors: the same bytes, without embedding again."""
    from openwop_memory.service.embedding import EmbeddingModel

    model = EmbeddingModel(model=DEFAULT_MODEL)
    first = await model.query_vector("where does the user live")
    assert first is not None and first == await model.vector("where does the user live")
    encoder = await model._loaded()
    assert encoder is not None
    calls: list[int] = []
    embed = encoder.embed

    def counted(texts: Any) -> Any:
        calls.append(len(texts))
        return embed(texts)

    encoder.embed = counted  # type: ignore[method-assign]
    assert await model.query_vector("where does the user live") == first
    assert await model.query_vector("   ") is None  # no word: no vector, also kept
    assert await model.query_vector("   ") is None
    assert calls == [1]
    assert await model.query_vector("x" * 5000) is not None  # too long to keep
    assert await model.query_vector("x" * 5000) is not None
    assert calls == [1, 1, 1]


def test_the_vector_cache_row_sizes_docs_search_states() -> None:
    from pathlib import Path

    from openwop_memory.retrieval.nearest import row_bytes

    page = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    for dimensions, kind in ((384, "all-MiniLM-L6-v2"), (64, "the light model")):
        size = row_bytes(dimensions)
        mib = size * 100_000 / 2**20
        assert f"of {kind}: {mib:.2g} MiB, {size} bytes" in page.replace("\n", " ")


def test_each_models_vector_length_is_known_before_it_loads() -> None:
    from openwop_memory.retrieval.encoders import STRONG_MODEL, dimensions_of, minilm, wordllama

    assert dimensions_of(DEFAULT_MODEL) == wordllama.VECTOR_BYTES
    assert dimensions_of(STRONG_MODEL) == minilm.DIMENSIONS
    assert dimensions_of("nope") is None


def test_protocol_doc_states_the_rankings_numbers() -> None:
    """docs/PROTOCOL.md's relevance section gives the numbers the code ranks with."""
    from pathlib import Path

    from openwop_memory.retrieval.encoders import STRONG_MODEL
    from openwop_memory.retrieval.fusion import weights_for
    from openwop_memory.retrieval.search import CONTEXT_LINKED, candidate_pool, context_linked
    from openwop_memory.retrieval.time_cues import SAYS_WHEN

    page = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    page = " ".join(page.split())
    light, strong = weights_for(DEFAULT_MODEL), weights_for(STRONG_MODEL)
    assert candidate_pool(1) == 40 and candidate_pool(100) == 150 and candidate_pool(41) == 61
    assert "`max(limit + \u230alimit / 2\u230b, 40)`" in page  # floor brackets
    assert [context_linked(n) for n in (1, 30, 100)] == [20, 30, CONTEXT_LINKED]
    assert f"`min(max(limit, 20), {CONTEXT_LINKED})`" in page
    assert f"{light.meaning}, {light.floor} and {light.related} for the default WordLlama" in page
    assert f"{strong.meaning}, {strong.floor} and {strong.related} for `all-minilm-l6-v2`" in page
    assert light.near == strong.near and f"`near` is {light.near} for both" in page
    assert f"{1 + SAYS_WHEN} times as much, every score then divided by {1 + SAYS_WHEN}" in page
    assert f"({light.context} for WordLlama, {strong.context} for `all-minilm-l6-v2`)" in page


@pytest.mark.parametrize("spread", ["random", "ties", "ascending", "descending"])
def test_the_best_scores_of_a_part_are_those_a_full_sort_gives(spread: str) -> None:
    """``_top`` and ``_kth_largest`` look for the best among scores above a bound read off
    a sample first: the same values as a sort of all of them, with ties, sorted input
    (where a sample's bound is furthest off) and sizes on both sides of the sampling."""
    from openwop_memory.retrieval import nearest

    rng = np.random.default_rng(11)
    for n in (1, 50, nearest._SAMPLE_FROM - 1, nearest._SAMPLE_FROM, 40_000, 100_000):
        drawn = rng.random(n)
        scores = {
            "random": drawn,
            "ties": rng.integers(0, 4, n).astype(np.float64),
            "ascending": np.sort(drawn),
            "descending": np.sort(drawn)[::-1].copy(),
        }[spread]
        best_first = np.sort(scores)[::-1]
        for k in (1, 7, 187, 1000, n, n + 5):
            wanted = best_first[: min(k, n)]
            assert nearest._kth_largest(scores, k) == wanted[-1]
            assert np.array_equal(np.sort(nearest._top(scores, k))[::-1], wanted)


@pytest.mark.parametrize("dimensions", [64, 384])
@pytest.mark.parametrize("rows", [0, 1, 32767, 131071, 262144, 262145, 10**6, 4 * 10**6])
def test_a_scope_is_scored_in_parts_that_cover_its_rows_once(rows: int, dimensions: int) -> None:
    from openwop_memory.retrieval import nearest

    parts = nearest._parts(rows, dimensions)
    assert [i for part in parts for i in part] == list(range(rows))
    assert 1 <= len(parts) <= max(1, min(nearest._CPUS, 4))
    smallest = min(len(p) for p in parts)
    assert len(parts) == 1 or smallest * dimensions >= nearest._PART_BYTES


def test_docs_search_states_when_a_scope_is_scored_in_parts() -> None:
    from pathlib import Path

    from openwop_memory.retrieval import nearest

    page = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    page = " ".join(page.split())
    both = 2 * nearest._PART_BYTES
    assert nearest._parts(both // 384 - 1, 384) == [range(both // 384 - 1)]
    assert len(nearest._parts(both // 384, 384)) == min(nearest._CPUS, 2)
    assert f"A scope whose vectors take {both >> 20} MiB or more ({both // 384:,} entries" in page
    inline = nearest._INLINE_BYTES
    assert f"A scope of up to {inline >> 20} MiB of vectors ({inline // 384:,} entries" in page


def test_the_vector_cache_keeps_blas_to_one_thread() -> None:
    """In a fresh process: BLAS has the threads the environment gives it until the
    vector cache is made, and one after (retrieval/blas.py says why)."""
    import subprocess
    import sys

    code = (
        "import numpy, threadpoolctl\n"
        "def blas(): return {i['num_threads'] for i in threadpoolctl.threadpool_info()"
        " if i['user_api'] == 'blas'}\n"
        "print(sorted(blas()))\n"
        "from openwop_memory.retrieval.nearest import VectorCache\n"
        "VectorCache()\n"
        "print(sorted(blas()))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    before, after = done.stdout.split("\n")[:2]
    assert before != "[]"  # numpy's BLAS was found (2 threads, or fewer on a 1-CPU host)
    assert after == "[1]"


def test_search_doc_states_when_a_keyword_is_looked_up_alone() -> None:
    """docs/search.md gives the bound the SQLite keyword lookup uses."""
    from pathlib import Path

    from openwop_memory.storage.sqlite.backend import _BIG_SCOPE, _RARE_TERM

    page = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    page = " ".join(page.split())
    assert f"in a scope of more than {_BIG_SCOPE:,} entries" in page
    assert f"held by at most {_RARE_TERM} entries of the whole database" in page


def test_search_doc_states_which_entries_are_counted_after_their_put() -> None:
    """docs/search.md gives the length up to which SQLite counts tokens after the put."""
    from pathlib import Path

    from openwop_memory.storage.sqlite.keywords import COUNT_LATER_MAX_CHARS

    page = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    page = " ".join(page.split())
    assert f"the token count of an entry of up to {COUNT_LATER_MAX_CHARS:,} characters" in page


def test_search_doc_states_how_many_rows_each_backend_indexes_a_transaction() -> None:
    """docs/search.md gives the keyword indexers' transaction sizes."""
    from pathlib import Path

    from openwop_memory.storage.postgresql.keywords import BATCH as POSTGRESQL_BATCH
    from openwop_memory.storage.sqlite.keywords import BATCH as SQLITE_BATCH

    page = (Path(__file__).resolve().parents[2] / "docs" / "search.md").read_text()
    page = " ".join(page.split())
    assert f"indexes committed rows after it, {SQLITE_BATCH} a transaction," in page
    assert f"fills it in after the commit, {POSTGRESQL_BATCH} rows a transaction," in page


@pytest.mark.parametrize(
    ("cpus", "rows", "fills"), [(2, 9000, True), (4, 9000, False), (2, 100, False)]
)
@pytest.mark.anyio
async def test_the_keyword_statement_waits_only_for_a_product_that_fills_every_cpu(
    cpus: int, rows: int, fills: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fills_every_cpu`` says whether a scope's product takes a thread on every CPU (the
    search then runs its keyword statement after it); ``nearest`` sets its event once the
    entries are scored, and on the way out when it finds nothing or fails."""
    import anyio
    from openwop_memory.retrieval import nearest
    from openwop_memory.storage.base import Scope

    monkeypatch.setattr(nearest, "_CPUS", cpus)
    monkeypatch.setattr(nearest, "_PART_BYTES", 2500 * 8)
    monkeypatch.setattr(nearest, "_INLINE_BYTES", 1000 * 8)
    scope = Scope("t", "s")
    rng = np.random.default_rng(3)
    vectors = rng.integers(-127, 128, size=(rows, 8), dtype=np.int8)
    loaded = [(i + 1, None, v.tobytes()) for i, v in enumerate(vectors)]

    async def load_after(after: int) -> list[tuple[int, None, bytes]]:
        return [r for r in loaded if r[0] > after]

    async def keep_all(seqs: list[int]) -> tuple[set[int], set[int]]:
        assert done.is_set()  # the candidates are checked once every entry is scored
        return set(seqs), set(seqs)

    cache = nearest.VectorCache()
    assert not cache.fills_every_cpu(scope, 8)  # nothing cached yet
    await cache.refresh(scope, 8, load_after=load_after)
    assert cache.fills_every_cpu(scope, 8) is fills
    assert not cache.fills_every_cpu(scope, 16)  # another model's length
    done = anyio.Event()
    found = await cache.nearest(
        scope,
        snapshot_seq=rows,
        now_us=0,
        vector=vectors[7].tobytes(),
        floor=-1.0,
        count=5,
        load_after=load_after,
        check=keep_all,
        scored=done,
    )
    assert done.is_set() and found[0][0] == 8

    async def failing(seqs: list[int]) -> tuple[set[int], set[int]]:
        raise RuntimeError("the check failed")

    for count, check in ((0, keep_all), (5, failing)):
        event = anyio.Event()
        with pytest.raises(RuntimeError) if check is failing else contextlib.nullcontext():
            await cache.nearest(
                scope,
                snapshot_seq=rows,
                now_us=0,
                vector=vectors[7].tobytes(),
                floor=-1.0,
                count=count,
                load_after=load_after,
                check=check,
                scored=event,
            )
        assert event.is_set()
