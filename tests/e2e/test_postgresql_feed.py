"""The change feed across a PostgreSQL fleet with a sidecar killed mid-run (its own module,
so that pytest-xdist can run it beside the rest of the fleet tests)."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.fleet import fleet
from support.sidecar import RpcError, Sidecar

pytestmark = pytest.mark.backend_independent


# -- the change feed across the fleet ---------------------------------------------------------


def _feed_writer(sidecar: Sidecar, worker: int, until: float, acked: list[tuple[str, str]]) -> None:
    """Puts and deletes of one tenant, one at a time, until ``until`` or the sidecar dies;
    what the sidecar acknowledged, in order, goes to ``acked`` as (entry id, operation)."""
    rng = random.Random(worker)
    mine: list[str] = []
    try:
        with sidecar.client() as c:
            c.call("run.begin", runId=f"feed-w{worker}", tenant="feed")
            while time.monotonic() < until:
                if mine and rng.random() < 0.25:
                    victim = mine.pop(rng.randrange(len(mine)))
                    params = {"runId": f"feed-w{worker}", "memoryRef": "scope", "id": victim}
                    if c.call("memory.delete", **params):
                        acked.append((victim, "delete"))
                else:
                    entry = c.call(
                        "memory.put",
                        runId=f"feed-w{worker}",
                        memoryRef="scope",
                        entry={"content": f"w{worker}"},
                    )
                    acked.append((entry["id"], "put"))
                    mine.append(entry["id"])
    except (OSError, EOFError, RpcError):
        pass  # the sidecar was killed under this worker


def test_the_change_feed_over_three_sidecars_with_one_killed(workdir: Path) -> None:
    """Two writers on each of three sidecars; one sidecar is killed (-9) mid-run. Read from
    a survivor, the feed holds every acknowledged put and delete exactly once, each
    writer's in the order it made them, positions increasing, and nothing that was not
    committed: every record names an entry the database holds."""
    with fleet(workdir, 3) as sidecars:
        acked: list[list[tuple[str, str]]] = [[] for _ in range(6)]
        until = time.monotonic() + 2.5
        with ThreadPoolExecutor(6) as pool:
            futures = [
                pool.submit(_feed_writer, sidecars[n % 3], n, until, acked[n]) for n in range(6)
            ]
            time.sleep(1.0)
            sidecars[2].kill()
            for future in futures:
                future.result()
        with sidecars[0].client() as c:
            records: list[Any] = []
            cursor: str | None = None
            while True:
                params: dict[str, Any] = {"tenant": "feed", "limit": 1000}
                if cursor is not None:
                    params["cursor"] = cursor
                answer = c.call("memory.changes", **params)
                records += answer["changes"]
                if not answer["changes"]:
                    break
                cursor = answer["nextCursor"]
            c.call("run.begin", runId="feed-reader", tenant="feed")
            held: set[str] = set()
            page: dict[str, Any] = {"runId": "feed-reader", "memoryRef": "scope", "limit": 1000}
            while True:
                answer = c.call("memory.page", **page)
                held |= {e["id"] for e in answer["entries"]}
                if answer.get("nextCursor") is None:
                    break
                page["cursor"] = answer["nextCursor"]
    changes = [(r["id"], r["operation"]) for r in records]
    assert len(changes) == len(set(changes)), "a change appears twice"
    assert [r["at"] for r in records] == sorted(r["at"] for r in records)
    where = {change: n for n, change in enumerate(changes)}
    killed = sum(len(acked[n]) for n in (2, 5))
    assert killed > 0 and sum(map(len, acked)) > killed, "the load did not run on every sidecar"
    for mine in acked:
        assert all(change in where for change in mine), "an acknowledged change is missing"
        positions = [where[change] for change in mine]
        assert positions == sorted(positions), "a writer's changes are out of order"
    deleted = {i for i, op in changes if op == "delete"}
    for entry_id, op in changes:
        assert op in ("put", "delete"), op
        if op == "put":
            # Committed: live now, or deleted by a change the feed also holds.
            assert entry_id in held or entry_id in deleted, entry_id
