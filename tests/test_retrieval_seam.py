"""The retrieval layer's seam (issue 22): the names and contracts the service's search and
the recall work meet at, checked in-process."""

from __future__ import annotations

import numpy as np
import pytest
from openwop_memory.retrieval.encoders import (
    DEFAULT_MODEL,
    EncoderUnavailableError,
    load_encoder,
)
from openwop_memory.retrieval.fusion import fuse
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


def test_fusion_scores_are_in_0_1_and_zero_for_hidden_or_unmatched_rows() -> None:
    keyword = np.array([0.0, 2.5, 1.0, 4.0], np.float32)
    meaning = np.array([0.05, 0.9, -0.3, 0.2], np.float32)
    visible = np.array([True, True, True, False])
    created = np.arange(4, dtype=np.int64)
    for side in (meaning, None):
        scores = fuse(keyword=keyword, meaning=side, created_us=created, visible=visible, query="q")
        assert scores.dtype == np.float32 and scores.shape == (4,)
        assert bool(((scores >= 0) & (scores <= 1)).all())
        assert scores[3] == 0  # not visible, although its keyword score is the best
        assert scores[0] == 0  # no term matches, cosine below the floor
        assert scores[1] == max(scores)


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
