"""``memory.search`` *(extension)*: the relevance list with each hit's score, a threshold,
and "nothing relevant" answered with nothing, through a real sidecar."""

from __future__ import annotations

from typing import Any

from support.names import uid
from support.protocol import assert_run_not_found, invalid, listing, new_run, put
from support.schemas import check_entry
from support.sidecar import RawClient

NOTES = [
    "Our beagle puppy Biscuit chewed the sofa again.",
    "The laptop budget for next quarter is 1200 euros.",
    "Sam is allergic to peanuts and carries an epipen.",
    "Biscuit the beagle goes to the vet on Friday.",
]


def filled(client: RawClient) -> tuple[str, str]:
    """A scope holding NOTES, and a run begun after they were written (which sees them)."""
    tenant, ref = uid("t"), uid("ref")
    writer = new_run(client, tenant)
    for note in NOTES:
        put(client, writer, ref, note)
    return new_run(client, tenant), ref


def search(client: RawClient, run: str, ref: str, query: str, **params: Any) -> list[Any]:
    result = client.call("memory.search", runId=run, memoryRef=ref, query=query, **params)
    assert set(result) == {"hits"}, result
    for hit in result["hits"]:
        assert set(hit) == {"entry", "score"}, hit
        check_entry(hit["entry"])
        assert 0 < hit["score"] <= 1
    scores = [hit["score"] for hit in result["hits"]]
    assert scores == sorted(scores, reverse=True)
    hits: list[Any] = result["hits"]
    return hits


def test_hits_are_the_relevance_list_with_its_scores(client: RawClient) -> None:
    run, ref = filled(client)
    hits = search(client, run, ref, "when is the beagle seeing the vet")
    listed = listing(client, run, ref, rank="relevance", query="when is the beagle seeing the vet")
    assert [h["entry"] for h in hits] == listed
    assert hits[0]["entry"]["content"] == NOTES[3]
    assert hits[0]["score"] > hits[-1]["score"]


def test_min_score_leaves_out_the_weaker_hits(client: RawClient) -> None:
    run, ref = filled(client)
    every = search(client, run, ref, "beagle vet")
    assert len(every) >= 2
    cut = (every[0]["score"] + every[-1]["score"]) / 2
    kept = search(client, run, ref, "beagle vet", minScore=cut)
    assert kept == [h for h in every if h["score"] >= cut]
    assert 0 < len(kept) < len(every)
    assert search(client, run, ref, "beagle vet", minScore=1.0) == [
        h for h in every if h["score"] >= 1.0
    ]


def test_a_query_of_stop_words_finds_nothing(client: RawClient) -> None:
    run, ref = filled(client)
    assert search(client, run, ref, "what is it that they were") == []


def test_limit_and_tag_apply(client: RawClient) -> None:
    run, ref = filled(client)
    assert len(search(client, run, ref, "beagle", limit=1)) == 1
    assert search(client, run, ref, "beagle", tag="no-such-tag") == []


def test_bad_params_are_refused_with_the_field(client: RawClient) -> None:
    run, ref = filled(client)
    for bad in ({"minScore": 1.5}, {"minScore": -0.1}, {"limit": -1}, {"query": ""}):
        params = {"runId": run, "memoryRef": ref, "query": "beagle"} | bad
        err = invalid(client, "memory.search", **params)
        assert "beagle" not in str(err.error) or "query" in bad


def test_an_unknown_run_is_not_found(client: RawClient) -> None:
    err = client.error("memory.search", runId=uid("nope"), memoryRef=uid("ref"), query="beagle")
    assert_run_not_found(err)
