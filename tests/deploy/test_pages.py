"""Pages and counts *(extension)*: ``memory.page`` with a cursor exact within a run's
snapshot, and ``memory.count`` (docs/PROTOCOL.md), on a real sidecar."""

from __future__ import annotations

from typing import Any

from support.protocol import begin, delete, issue, listing, put
from support.schemas import check_entry, check_envelope
from support.shared import SharedClient


def pages(c: SharedClient, run: str, ref: str, limit: int, between: Any = None) -> list[str]:
    """Every page's entry ids in order, calling ``between()`` after each page."""
    ids: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"runId": run, "memoryRef": ref, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        answer = c.call("memory.page", **params)
        for entry in answer["entries"]:
            check_entry(entry)
        ids += [e["id"] for e in answer["entries"]]
        cursor = answer.get("nextCursor")
        if cursor is None:
            return ids
        if between is not None:
            between()


def test_pages_hold_the_snapshot_once_whatever_is_written(shared_client: SharedClient) -> None:
    c = shared_client
    ref = issue(c)
    begin(c, "w")
    written = [put(c, "w", ref, f"note {n}", ["odd"] if n % 2 else [])["id"] for n in range(23)]
    begin(c, "reader")
    snapshot = [e["id"] for e in listing(c, "reader", ref, limit=1000)]
    assert sorted(snapshot) == sorted(written)
    assert c.call("memory.count", runId="reader", memoryRef=ref) == {"count": 23}
    assert c.call("memory.count", runId="reader", memoryRef=ref, tag="odd") == {"count": 11}
    victims = iter(written)
    late: list[str] = []

    def meanwhile() -> None:  # new entries and deletes land between the pages
        late.append(put(c, "w", ref, "late")["id"])
        assert delete(c, "w", ref, next(victims))

    assert pages(c, "reader", ref, 5, meanwhile) == snapshot
    assert len(late) == 4  # 23 entries in pages of 5: four gaps between them
    assert c.call("memory.count", runId="reader", memoryRef=ref) == {"count": 23}
    begin(c, "later")  # a new snapshot sees the writes, paged the same way
    later = pages(c, "later", ref, 3)
    assert later == [e["id"] for e in listing(c, "later", ref, limit=1000)]
    assert set(later) == (set(written) - set(written[:4])) | set(late)
    assert c.call("memory.count", runId="later", memoryRef=ref) == {"count": len(later)}


def test_a_cursor_is_bound_to_its_scope_and_snapshot(shared_client: SharedClient) -> None:
    c = shared_client
    ref, other = issue(c), issue(c, agent="other")
    begin(c, "w")
    for n in range(3):
        put(c, "w", ref, f"n{n}")
    begin(c, "r1")
    cursor = c.call("memory.page", runId="r1", memoryRef=ref, limit=1)["nextCursor"]
    assert c.call("memory.page", runId="r1", memoryRef=ref, limit=1, cursor=cursor)["entries"]
    put(c, "w", ref, "moves the snapshot")
    begin(c, "r2")
    tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
    for run, scope, bad in (("r1", other, cursor), ("r2", ref, cursor), ("r1", ref, tampered)):
        err = c.error("memory.page", runId=run, memoryRef=scope, cursor=bad)
        check_envelope(err.error)
        assert (err.code, err.details) == ("validation_error", {"field": "cursor"}), err.error
