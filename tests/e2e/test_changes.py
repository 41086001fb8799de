"""The change feed *(extension)*: ``memory.changes`` (docs/PROTOCOL.md) records every
committed put, supersede, delete, expiry and forget, content-free, in commit order, per
tenant, with a cursor to resume from; on a real sidecar."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from openwop_memory_client.wire import VENDOR_KEY
from support.protocol import begin, delete, issue, put
from support.schemas import check_envelope
from support.sidecar import RawClient, Sidecar, run_cli

TENANT = "feed-tenant"


@pytest.fixture(scope="module")
def feed_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    from support.sidecar import socket_workdir

    with socket_workdir(tmp_path_factory.mktemp("changes")) as workdir:
        args = ("--admin-socket", str(workdir / "admin.sock"), "--sweep-interval", "0.2")
        with Sidecar(workdir, *args) as sidecar:
            yield sidecar


def read_feed(c: RawClient, tenant: str, cursor: str | None = None) -> tuple[list[Any], str]:
    params: dict[str, Any] = {"tenant": tenant}
    if cursor is not None:
        params["cursor"] = cursor
    answer = c.call("memory.changes", **params)
    for record in answer["changes"]:
        assert set(record) <= {"id", "operation", "at", "memoryRef", "scope"}, record
    return list(answer["changes"]), str(answer["nextCursor"])


def test_every_change_once_in_commit_order(feed_sidecar: Sidecar) -> None:
    with feed_sidecar.client() as c:
        ref = issue(c, TENANT)
        begin(c, "w", TENANT)
        _, start = read_feed(c, TENANT)
        a = put(c, "w", ref, "alice likes tea", ["subject:alice"])
        keyed = {"runId": "w", "memoryRef": ref, "entry": {"content": "v1"}}
        k1 = c.call("memory.put", **keyed, **{VENDOR_KEY: {"key": "k"}})
        k2 = c.call(
            "memory.put", **{**keyed, "entry": {"content": "v2"}}, **{VENDOR_KEY: {"key": "k"}}
        )
        assert delete(c, "w", ref, k2["entry"]["id"])
        soon = (datetime.now(UTC) + timedelta(seconds=0.5)).isoformat()
        short = put(c, "w", ref, "brief", expires_at=soon)
        first, cursor = read_feed(c, TENANT, start)
        expected = [
            (a["id"], "put"),
            (k1["entry"]["id"], "put"),
            (k1["entry"]["id"], "supersede"),
            (k2["entry"]["id"], "put"),
            (k2["entry"]["id"], "delete"),
            (short["id"], "put"),
        ]
        assert [(r["id"], r["operation"]) for r in first] == expected
        assert all(r["memoryRef"] == ref for r in first)
        assert "likes" not in str(first)  # content-free
        # Resuming gives only what came after, once.
        assert read_feed(c, TENANT, cursor)[0] == []
        deadline = time.monotonic() + 10
        later: list[Any] = []
        while time.monotonic() < deadline and not later:
            time.sleep(0.2)
            later, cursor = read_feed(c, TENANT, cursor)
        assert [(r["id"], r["operation"]) for r in later] == [(short["id"], "expire")]
        run_cli(
            "forget", TENANT, "alice", "--admin-socket", str(feed_sidecar.workdir / "admin.sock")
        )
        forgot, cursor = read_feed(c, TENANT, cursor)
        assert [(r["id"], r["operation"]) for r in forgot] == [(a["id"], "forget")]


def test_the_feed_is_the_tenants_own(feed_sidecar: Sidecar) -> None:
    with feed_sidecar.client() as c:
        ref = issue(c, "feed-other")
        begin(c, "o", "feed-other")
        put(c, "o", ref, "elsewhere")
        _, cursor = read_feed(c, "feed-other")
        mine, _ = read_feed(c, "feed-lonely")
        assert mine == []
        err = c.error("memory.changes", tenant="feed-lonely", cursor=cursor)
        check_envelope(err.error)
        assert (err.code, err.details) == ("validation_error", {"field": "cursor"})
        plain = "plain-scope"
        put(c, "o", plain, "x")
        records, _ = read_feed(c, "feed-other")
        assert records[-1]["scope"].startswith("plain:") and "memoryRef" not in records[-1]


def test_capabilities_advertise_the_feed(feed_sidecar: Sidecar, tmp_path: Path) -> None:
    with feed_sidecar.client() as c:
        caps = c.call("host.capabilities")["capabilities"]["memory"]
        assert caps["vendor.openwop-memory.changes"] == {"supported": True}
