"""Keyed entries *(extension)*: ``memory.put`` with ``vendor.openwop-memory.key``,
``memory.getKey`` and ``memory.history`` (docs/PROTOCOL.md), on a real sidecar.

A revision is an entry: a supersede ends the old one at the new one's commit position, so
older snapshots keep the old revision and later ones see only the new, in list, get,
search and getKey alike.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from openwop_memory_client.wire import VENDOR_KEY
from support.protocol import begin, delete, issue, listing
from support.schemas import check_entry, check_envelope
from support.shared import SharedClient
from support.sidecar import RpcError


def keyed_put(
    c: SharedClient, run: str, ref: str, content: str, key: str, **options: Any
) -> dict[str, Any]:
    """A keyed put's answer, checked: ``{entry, key, revision, superseded?}``."""
    params: dict[str, Any] = {"runId": run, "memoryRef": ref, "entry": {"content": content}}
    params[VENDOR_KEY] = {"key": key, **options}
    answer = c.call("memory.put", **params)
    assert set(answer) <= {"entry", "key", "revision", "superseded"}, answer
    assert answer["key"] == key and isinstance(answer["revision"], int), answer
    check_entry(answer["entry"])
    return dict(answer)


def get_key(c: SharedClient, run: str, ref: str, key: str) -> dict[str, Any] | None:
    answer = c.call("memory.getKey", runId=run, memoryRef=ref, key=key)
    if answer is not None:
        check_entry(answer["entry"])
    return None if answer is None else dict(answer)


def history(c: SharedClient, run: str, ref: str, key: str, **params: Any) -> list[Any]:
    answer = c.call("memory.history", runId=run, memoryRef=ref, key=key, **params)
    assert answer["key"] == key
    for revision in answer["revisions"]:
        check_entry(revision["entry"])
    return list(answer["revisions"])


def test_a_supersede_is_seen_by_later_snapshots_only(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c)
    begin(c, "writer")
    first = keyed_put(c, "writer", ref, "the colour is red", "colour")
    assert first["revision"] == 1 and "superseded" not in first
    begin(c, "before")
    second = keyed_put(c, "writer", ref, "the colour is blue", "colour")
    assert second["revision"] == 2 and second["superseded"] == first["entry"]["id"]
    begin(c, "after")

    old = get_key(c, "before", ref, "colour")
    assert old is not None and (old["revision"], old["entry"]) == (1, first["entry"])
    new = get_key(c, "after", ref, "colour")
    assert new is not None and (new["revision"], new["entry"]) == (2, second["entry"])
    assert [e["id"] for e in listing(c, "before", ref)] == [first["entry"]["id"]]
    assert [e["id"] for e in listing(c, "after", ref)] == [second["entry"]["id"]]
    found = listing(c, "after", ref, rank="relevance", query="colour")
    assert [e["id"] for e in found] == [second["entry"]["id"]]
    assert c.call("memory.get", runId="after", memoryRef=ref, id=first["entry"]["id"]) is None

    states = [(r["revision"], r["state"]) for r in history(c, "after", ref, "colour")]
    assert states == [(2, "current"), (1, "superseded")]
    assert [r["revision"] for r in history(c, "after", ref, "colour", before=2)] == [1]
    assert get_key(c, "after", ref, "other") is None


def test_expected_revision_refuses_a_stale_write(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c)
    begin(c, "r")
    assert keyed_put(c, "r", ref, "one", "k", expectedRevision=0)["revision"] == 1
    err = c.error(
        "memory.put",
        runId="r",
        memoryRef=ref,
        entry={"content": "x"},
        **{VENDOR_KEY: {"key": "k", "expectedRevision": 0}},
    )
    check_envelope(err.error)
    assert (err.code, err.rpc_code) == ("conflict", -32009)
    assert err.details == {"field": f"{VENDOR_KEY}.expectedRevision", "revision": 1}
    assert keyed_put(c, "r", ref, "two", "k", expectedRevision=1)["revision"] == 2
    assert len(history(c, "r", ref, "k")) == 2  # the refused put wrote nothing

    # A deleted key has no current revision; its numbers go on.
    current = get_key(c, "r", ref, "k")
    assert current is None  # the run's own writes are after its snapshot
    begin(c, "r2")
    current = get_key(c, "r2", ref, "k")
    assert current is not None
    assert delete(c, "r2", ref, current["entry"]["id"])
    assert keyed_put(c, "r2", ref, "three", "k", expectedRevision=0)["revision"] == 3
    states = [(r["revision"], r["state"]) for r in history(c, "r2", ref, "k")]
    assert states == [(3, "current"), (2, "deleted"), (1, "superseded")]


def test_an_idempotent_retry_adds_no_revision(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c)
    begin(c, "r")
    first = keyed_put(c, "r", ref, "v", "k", expectedRevision=0)
    params = {"runId": "r", "memoryRef": ref, "entry": {"content": "v2"}, "idempotencyKey": "i1"}
    a = c.call("memory.put", **params, **{VENDOR_KEY: {"key": "k", "expectedRevision": 1}})
    b = c.call("memory.put", **params, **{VENDOR_KEY: {"key": "k", "expectedRevision": 1}})
    assert a["revision"] == 2 and a["superseded"] == first["entry"]["id"]
    # The retry answers the same entry and revision (not what it superseded: documented).
    assert b == {k: v for k, v in a.items() if k != "superseded"}
    assert [r["revision"] for r in history(c, "r", ref, "k")] == [2, 1]
    # The same idempotency key for another entry key is another request: conflict.
    err = c.error("memory.put", **params, **{VENDOR_KEY: {"key": "other"}})
    assert err.code == "conflict" and err.details == {"field": "idempotencyKey"}


def test_keys_are_checked(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c)
    begin(c, "r")
    for bad in ({"key": ""}, {"key": "a\nb"}, {"key": "k", "expectedRevision": -1}, {"k": 1}):
        err = c.error(
            "memory.put", runId="r", memoryRef=ref, entry={"content": "x"}, **{VENDOR_KEY: bad}
        )
        assert err.code == "validation_error", (bad, err.error)
    assert history(c, "r", ref, "k") == []


WRITERS = 32
SECONDS = 1.5


def race(c: SharedClient, ref: str, key: str, seconds: float) -> tuple[int, int]:
    """``WRITERS`` writers, each on its own connection and run, racing to put revisions of
    ``key`` by compare-and-set for ``seconds``; checks that no acknowledged revision is
    lost and every refusal was a conflict. Returns (acknowledged, refused)."""
    acknowledged: list[tuple[int, str]] = []
    refused: list[int] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def writer(n: int) -> None:
        try:
            with SharedClient(c.path, c.prefix) as w:
                begin(w, f"w{n}")
                expected, count = 0, 0
                while time.monotonic() < deadline:
                    params = {
                        "runId": f"w{n}",
                        "memoryRef": ref,
                        "entry": {"content": f"{n}:{count}"},
                    }
                    try:
                        answer = w.call(
                            "memory.put",
                            **params,
                            **{VENDOR_KEY: {"key": key, "expectedRevision": expected}},
                        )
                    except RpcError as err:
                        if err.code != "conflict":
                            raise AssertionError(err.error) from None
                        expected = err.details["revision"]
                        with lock:
                            refused.append(expected)
                        continue
                    expected, count = answer["revision"], count + 1
                    with lock:
                        acknowledged.append((answer["revision"], answer["entry"]["id"]))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    begin(c, "reader")
    stored: list[tuple[int, str]] = []
    before = None
    while True:
        page = history(
            c, "reader", ref, key, limit=1000, **({} if before is None else {"before": before})
        )
        if not page:
            break
        stored += [(r["revision"], r["entry"]["id"]) for r in page]
        before = page[-1]["revision"]
    # Every acknowledged revision is in the history, with the id its writer was told, and
    # nothing else is: revisions 1..N, one each.
    assert sorted(stored) == sorted(acknowledged)
    assert [r for r, _ in sorted(stored)] == list(range(1, len(acknowledged) + 1))
    return len(acknowledged), len(refused)


def test_racing_writers_lose_no_update(shared_client: SharedClient) -> None:
    ref = issue(shared_client)
    acknowledged, refused = race(shared_client, ref, "counter", SECONDS)
    assert acknowledged > 1 and refused > 0  # the writers did race
