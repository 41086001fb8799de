"""Conversational context: an entry's relevance also counts its neighbours'.

A turn often means little without the one before it: "tuesday. still feel the floor
moving" answers "when did you get back from the cruise?", and only the question names the
cruise. So in a hybrid search each of the best candidates is linked to its neighbours, the
entries of the scope just before and after it as the snapshot shows them
(:meth:`~openwop_memory.retrieval.nearest.VectorCache.adjacent`), and an entry's score
becomes its own plus a weight ``c`` times the best score among those linked to it:

    score = (own + c * best linked) / (1 + c)

``c`` is the model's (:class:`~openwop_memory.retrieval.fusion.Weights`): :data:`CONTEXT`
for a sentence encoder, less for the light model.

Only entries with a relevance of their own take part (an entry scoring 0 stays out, so a
note written next to a relevant one is not found for that alone), and the neighbours are
read from the snapshot, never from what was stored beside an entry at its put: an entry
deleted, erased or written since never counts, and a replay ranks as the first execution
did. Measured on the conversations benchmark (``bench/conversations.py``): recall@10 of the
written chats +0.02 to +0.03 with either model, the made-up ones' unchanged or better;
embedding each turn together with the one before it found a little more (+0.01), but would
keep a trace of a deleted or expired neighbour in the entry's vector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

CONTEXT = 0.25
"""How much the best linked neighbour's score counts (0.2 to 0.35 measured alike; 0.6
pulled the made-up conversations' single facts down)."""

Links = Mapping[int, tuple[int | None, int | None]]
"""For an entry's ``seq``: the ``seq`` of the entry before it and of the one after it (None
where there is none)."""


def with_context(
    scores: Mapping[int, float], links: Links, *, weight: float = CONTEXT
) -> dict[int, float]:
    """Each entry of ``scores`` (``seq`` to a score in [0, 1]) scored with its context: its
    own score plus ``weight`` times the best score of an entry linked to it (either way:
    an entry linked from another is linked to it too; an entry not in ``scores`` counts 0),
    over ``1 + weight``, rounded to 9 decimals. Entries scoring 0 are left out.

    Deterministic: the result depends on the mappings' contents, not their order.
    """
    linked: dict[int, set[int]] = {}

    def link(a: int, b: int | None) -> None:
        if b is not None:
            linked.setdefault(a, set()).add(b)
            linked.setdefault(b, set()).add(a)

    for seq, (before, after) in links.items():
        link(seq, before)
        link(seq, after)
    result: dict[int, float] = {}
    scale = 1 + weight
    for seq, own in scores.items():
        if own <= 0:
            continue
        around = linked.get(seq)
        best = max(_known(scores, around), default=0.0) if around else 0.0
        result[seq] = round((own + weight * best) / scale, 9)
    return result


def _known(scores: Mapping[int, float], seqs: Iterable[int]) -> Iterable[float]:
    return (scores[seq] for seq in seqs if seq in scores)
