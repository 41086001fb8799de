"""The recall rules a hybrid search adds to fusion (issue 22): which queries ask when and
which entries say when (``retrieval/time_cues.py``), and an entry's score with its
neighbours' (``retrieval/context.py``), checked by calling them."""

from __future__ import annotations

import pytest
from openwop_memory.retrieval.context import with_context
from openwop_memory.retrieval.time_cues import asks_when, says_when

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "query",
    [
        "When did Kwame get back from the research cruise?",
        "  when was the deploy",
        "What year did Priya adopt Biscuit?",
        "How long was Kwame's trip to Ghana?",
        "how many weeks was she in the boot",
    ],
)
def test_questions_about_time_ask_when(query: str) -> None:
    assert asks_when(query)


@pytest.mark.parametrize(
    "query",
    [
        "What was the first meal Felipe cooked in his new kitchen?",
        "What did Sam make at the pottery class?",
        "Which trip came first for Ana: Lisbon or Kyoto?",  # a comparison: see _ASKS
        "Did Ana get Pepper before or after leaving Leeds?",
        "whenever",
        "where does Ana live now",
        "",
    ],
)
def test_other_questions_do_not(query: str) -> None:
    assert not asks_when(query)


@pytest.mark.parametrize(
    "content",
    [
        "I went to a support group yesterday and it was so powerful.",
        "tuesday. still feel the floor moving",
        "We exchanged on Friday. Completion is the 24th.",
        "Moved here three years ago",
        "back in 2019 we had a cat",
        "next week is the exam",
        "the release went out on 2024-03-01",
        "her birthday is 12 March",
        "8 May 2023 Kwame: see you on Sunday",  # the stamp aside, the turn says when
    ],
)
def test_entries_that_date_something_say_when(content: str) -> None:
    assert says_when(content)


@pytest.mark.parametrize(
    "content",
    [
        "Here's a pic of my latest painting",
        "8 May 2023 Kwame: whoa. by who",  # a date stamp opening the text is its label
        "[2023-05-08 14:02] deploy done",
        "Friday, 12 May 2023, 9:30 am Ana: hi",
        "the marketing team is in maybe",
        "",
    ],
)
def test_labels_and_undated_text_do_not(content: str) -> None:
    assert not says_when(content)


def test_an_entry_counts_its_best_neighbour_and_links_go_both_ways() -> None:
    scores = {1: 0.2, 2: 0.8, 3: 0.1, 9: 0.5}
    # 2's neighbours are 1 and 3; nothing is known of 9's.
    scored = with_context(scores, {2: (1, 3)}, weight=0.25)
    assert scored[2] == pytest.approx((0.8 + 0.25 * 0.2) / 1.25)
    assert scored[1] == pytest.approx((0.2 + 0.25 * 0.8) / 1.25)  # linked from 2
    assert scored[3] == pytest.approx((0.1 + 0.25 * 0.8) / 1.25)
    assert scored[9] == pytest.approx(0.5 / 1.25)
    assert all(0 < score <= 1 for score in scored.values())


def test_a_neighbour_without_a_score_of_its_own_is_no_hit() -> None:
    # 5 and 6 are 4's neighbours, 6 scoring nothing and 5 not scored at all.
    scored = with_context({4: 0.9, 6: 0.0}, {4: (5, 6)})
    assert set(scored) == {4}
    assert with_context({}, {4: (5, 6)}) == {}


def test_without_weight_the_scores_are_unchanged() -> None:
    scores = {1: 0.3, 2: 0.123456789}
    assert with_context(scores, {1: (None, 2)}, weight=0.0) == scores


def test_the_order_of_the_mappings_does_not_matter() -> None:
    scores = {n: n / 10 for n in range(1, 10)}
    links = {n: (n - 1, n + 1) for n in range(2, 9, 2)}
    forward = with_context(scores, links)
    backward = with_context(dict(reversed(scores.items())), dict(reversed(links.items())))
    assert forward == backward
