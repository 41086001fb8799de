"""Fusion: one relevance score in [0, 1] per candidate, from its keyword and meaning scores.

Reciprocal rank fusion with equal weights, what search used before, fell below the keyword
list alone on real multi-session conversations: a weak list by meaning pulls a good keyword
list down, because a rank says nothing of how near the entry is. So each side is weighed by
its own score instead:

    score = (1 - w) * coverage + w * closeness

where ``coverage`` is the share of the query's keyword weight the entry holds (its BM25
term weights over those of an entry holding every query term, :func:`keyword_ceiling`: an
absolute measure, so a list whose best hit holds one minor word of the query does not
count as a good list), and ``closeness`` is how far an entry's cosine rises above the
model's floor (below which cosines are what unrelated texts score), relative to the best
candidate's rise or to the rise of the model's ``near`` cosine, whichever is larger: the
nearest of weakly related entries is not scored as if it were a paraphrase, so a score
says how relevant an entry is, and ``minScore`` can leave such entries out. The floor is
fixed, not taken from the scope's spread of cosines: a spread would count entries outside
the snapshot, and a replay's order would move when a sweep removed them. A keyword hit
outside the nearest candidates is weighed by its own cosine too. An entry no query term
matches takes part only if its cosine reaches the model's ``related`` floor: below it, a
cosine is no evidence of relatedness, and a query with nothing relevant is answered with
nothing.

``w`` and the floors belong to the model (:class:`Weights`), chosen by measuring recall on
conversations (``make bench BENCH_ARGS="--only conversations"``): a light static model
earns a small ``w``, a sentence encoder a larger one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .context import CONTEXT

NEAR = 0.5
"""The cosine of an entry that counts as fully near when no candidate is nearer, for both
models: a paraphrase scores about 0.5 to 0.8 with them. Without it the nearest candidate
always counted as fully near, and the best of a few unrelated entries scored as high as a
paraphrase. Recall on the labelled set and the conversations moved by less than 0.003
(0.4 and 0.5 alike; at 0.6 the labelled set's recall@5 fell with all-MiniLM-L6-v2)."""


@dataclass(frozen=True)
class Weights:
    """How much a model's meaning counts (``meaning``, in [0, 1)); the cosine a candidate
    needs to count at all (``floor``); the cosine an entry no query term matches needs
    to be a hit (``related``); how much the best neighbour's score counts in an entry's
    (``context``, :mod:`~openwop_memory.retrieval.context`; 0: not at all); and the cosine
    that counts as fully near when no candidate is nearer (``near``, above ``floor``)."""

    meaning: float
    floor: float
    related: float
    context: float = CONTEXT
    near: float = NEAR


def fuse(
    keyword: Sequence[tuple[int, float]],
    meaning: Sequence[tuple[int, float]],
    *,
    weights: Weights,
) -> list[tuple[int, float]]:
    """The union of ``keyword`` (``(seq, coverage)``, in (0, 1]) and ``meaning``
    (``(seq, cosine)``), each entry with its fused score, best first, ties by the larger
    ``seq`` (the newer) first; entries scoring 0 are left out.

    Deterministic: the same lists give the same scores and order (sums of two terms, each
    computed the same way every time).
    """
    usual, w, related = weights.floor, weights.meaning, weights.related
    above = {seq: cosine for seq, cosine in meaning if cosine > usual}
    best_rise = max(max(above.values(), default=usual), weights.near) - usual
    scores = {seq: (1 - w) * score for seq, score in keyword if score > 0}
    for seq, cosine in above.items():
        rise = cosine - usual
        own = scores.get(seq)
        if own is None and cosine < related:
            continue
        closeness = rise / best_rise if best_rise > 0 else 0.0
        scores[seq] = (0.0 if own is None else own) + w * closeness
    # Sorted as (score, seq) pairs, largest first: the order the contract states, without
    # a key function (a search fuses twice, a few hundred entries each).
    ranked = sorted([(round(score, 9), seq) for seq, score in scores.items() if score > 0])
    ranked.reverse()
    return [(seq, score) for score, seq in ranked]


def keyword_ceiling(total: int, counts: Sequence[int], terms: int) -> float:
    """The keyword score of an entry holding every one of ``terms`` query terms, where
    ``total`` entries match any and ``counts`` are how many match each term that matches
    at all (in any order): the sum of every term's inverse document frequency, a term no
    entry holds counting as one held by none."""

    def idf(n: int) -> float:
        return math.log(1.0 + (total - n + 0.5) / (n + 0.5))

    held = sorted(counts)  # one order of summation, whatever order the database gave
    return math.fsum([idf(n) for n in held] + [idf(0)] * (terms - len(held)))


def coverage(score: float, ceiling: float) -> float:
    """A keyword score as relevance in [0, 1]: the share of the query's term weight
    (:func:`keyword_ceiling`) the entry holds, rounded as :func:`fuse` rounds."""
    return round(min(score / ceiling, 1.0), 9) if ceiling > 0 else 0.0


LIGHT_WEIGHTS = Weights(meaning=0.4, floor=0.1, related=0.3, context=0.1)
"""WordLlama's (the light default): a static model's cosines are weak evidence. Its
context weight is 0.1: at 0.25 the written chats gained 0.009 of recall@10 but the made-up
ones' open-domain questions fell just below the keyword list's.

Its ``related`` is 0.3: unrelated texts reach 0.2 to 0.3 with it about as often as a
paraphrase does, so at 0.2 a query with nothing relevant was answered with entries all
the same (the labelled set's unrelated queries came back empty 1 time in 20; 3 at 0.25,
11 at 0.3, 12 at 0.35, 19 at 0.4). The cost is the paraphrases it only weakly sees: the
labelled set's recall@10 0.871 -> 0.703, @5 0.703 -> 0.674 (at 0.4: 0.565); the
conversations' recall moved by less than 0.005, every kind still at or above the keyword
list's."""

# all-MiniLM-L6-v2's: 0.5 rather than 0.6, chosen on both of the conversations
# benchmark's sets (recall@10 with context: written chats 0.657 at 0.5 against 0.628 at
# 0.6 and 0.653 at 0.4; the made-up, worded-apart ones 0.470, 0.467 and 0.444). Its
# ``related`` is 0.28: the labelled set's unrelated queries came back empty 12 times in
# 20 at 0.2, 14 at 0.25, 17 at 0.28 and 19 at 0.3, where recall@5 of its paraphrases fell
# from 0.835 to 0.735 (0.845 at 0.2); the conversations' recall@10 moved 0.657 -> 0.660
# (written) and 0.470 -> 0.455 (made up).
_WEIGHTS = {
    "wordllama-l2_supercat-64": LIGHT_WEIGHTS,
    "all-minilm-l6-v2": Weights(meaning=0.5, floor=0.1, related=0.28),
}


def weights_for(model: str) -> Weights:
    """The fusion weights measured for the embedding model called ``model`` (the light
    default's for a model not measured)."""
    return _WEIGHTS.get(model, LIGHT_WEIGHTS)
