"""Concurrency against one real sidecar: many connections, racing runs, pipelining.

Writers are threads, each with its own connection (``RawClient``); a barrier releases them
together. Nothing here measures speed: each test checks what the store holds afterwards.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.polling import wait_for
from support.protocol import TENANT, begin, issue_refs, list_all, notification, req
from support.sidecar import RawClient, RpcError, Sidecar

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_dozens_of_concurrent_writers_lose_nothing(sidecar: Sidecar, rpc: RawClient) -> None:
    writers, puts, scopes = 48, 50, 6
    refs = issue_refs(rpc, scopes)
    begin(rpc, "writers")
    start = threading.Barrier(writers)

    def writer(n: int) -> list[dict[str, Any]]:
        written: list[dict[str, Any]] = []
        with RawClient(sidecar.socket, timeout=60) as client:
            start.wait(timeout=30)
            for i in range(puts):
                entry = client.call(
                    "memory.put",
                    runId="writers",
                    memoryRef=refs[n % scopes],
                    entry={"content": f"writer {n} put {i}", "tags": [f"writer:{n}"]},
                )
                assert entry["content"] == f"writer {n} put {i}"
                written.append(entry)
        return written

    with ThreadPoolExecutor(writers) as pool:
        results = list(pool.map(writer, range(writers)))

    every = [entry for written in results for entry in written]
    assert len(every) == writers * puts
    assert len({e["id"] for e in every}) == len(every), "two puts were given the same id"
    for written in results:
        stamps = [e["createdAt"] for e in written]
        assert all(TIME.match(s) for s in stamps), stamps
        # One connection waits for each answer, so its puts commit in the order sent.
        assert stamps == sorted(stamps), "createdAt went backwards between sequential puts"

    reader = begin(rpc, "reader")
    assert max(e["createdAt"] for e in every) <= reader["snapshotAt"]
    for s, ref in enumerate(refs):
        listed = list_all(rpc, "reader", ref)
        expected = [e for n, written in enumerate(results) if n % scopes == s for e in written]
        assert sorted(e["id"] for e in listed) == sorted(e["id"] for e in expected)
        assert {e["id"]: e for e in listed} == {e["id"]: e for e in expected}
        # Newest first: createdAt never increases along the listing...
        stamps = [e["createdAt"] for e in listed]
        assert stamps == sorted(stamps, reverse=True)
        # ...and each writer's puts appear in reverse commit (= send) order.
        position = {e["id"]: i for i, e in enumerate(listed)}
        for n in range(s, writers, scopes):
            places = [position[e["id"]] for e in results[n]]
            assert places == sorted(places, reverse=True)

    def get_all(chunk: list[tuple[str, dict[str, Any]]]) -> None:
        with RawClient(sidecar.socket, timeout=60) as client:
            for ref, entry in chunk:
                got = client.call("memory.get", runId="reader", memoryRef=ref, id=entry["id"])
                assert got == entry

    keyed = [(refs[n % scopes], e) for n, written in enumerate(results) for e in written]
    with ThreadPoolExecutor(8) as pool:
        for done in pool.map(get_all, [keyed[i::8] for i in range(8)]):
            assert done is None


@dataclass
class WriteLog:
    """Writers that record, on one shared tick counter, when each put started and was acked."""

    socket: Path
    run_id: str
    refs: list[str]
    quota: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    ticks: itertools.count[int] = field(default_factory=itertools.count)
    acked: list[str] = field(default_factory=list)
    started: dict[str, int] = field(default_factory=dict)  # id -> tick before it was sent
    order: dict[int, list[str]] = field(default_factory=dict)  # writer -> ids in send order

    def acked_at_least(self, count: int) -> Callable[[], bool]:
        return lambda: len(self.acked) >= count

    def tick(self) -> int:
        with self.lock:
            return next(self.ticks)

    def writer(self, n: int) -> None:
        self.order[n] = []
        with RawClient(self.socket, timeout=60) as client:
            for i in range(self.quota):
                sent = self.tick()
                entry = client.call(
                    "memory.put",
                    runId=self.run_id,
                    memoryRef=self.refs[n],
                    entry={"content": f"writer {n} put {i}"},
                )
                with self.lock:
                    self.started[entry["id"]] = sent
                    self.acked.append(entry["id"])
                self.order[n].append(entry["id"])


def test_snapshot_is_a_consistent_cut_of_concurrent_writes(
    sidecar: Sidecar, rpc: RawClient
) -> None:
    refs = issue_refs(rpc, 8)
    begin(rpc, "writers")
    log = WriteLog(sidecar.socket, "writers", refs, quota=120)
    cuts: list[tuple[str, set[str], int]] = []  # (run, acked before begin was sent, tick after)
    with ThreadPoolExecutor(len(refs)) as pool:
        futures = [pool.submit(log.writer, n) for n in range(len(refs))]
        for k in range(10):
            wait_for(log.acked_at_least(60 * (k + 1)), 60, "more acknowledged puts")
            with log.lock:
                before = set(log.acked)
            begun = begin(rpc, f"cut-{k}")
            assert begun["resumed"] is False
            cuts.append((f"cut-{k}", before, log.tick()))
        for future in futures:
            future.result(timeout=60)

    assert len(log.acked) == len(refs) * log.quota
    for run_id, acked_before, answered in cuts:
        visible = {e["id"] for ref in refs for e in list_all(rpc, run_id, ref)}
        missing = acked_before - visible
        assert not missing, f"{run_id}: {len(missing)} puts acknowledged before it are missing"
        late = {i for i in visible if log.started[i] > answered}
        assert not late, f"{run_id}: {len(late)} puts sent after it answered are visible"
        for n, ids in log.order.items():
            # Sequential puts of one writer: what a snapshot holds is a prefix of them.
            shown = [i in visible for i in ids]
            assert shown == sorted(shown, reverse=True), f"{run_id}: writer {n} not a prefix"


def test_concurrent_begin_of_one_new_run_agrees_on_the_snapshot(
    sidecar: Sidecar, rpc: RawClient
) -> None:
    beginners = 32
    refs = issue_refs(rpc, 4)
    begin(rpc, "writers")
    stop = threading.Event()
    progress = [0] * len(refs)

    def background_writer(n: int) -> None:
        with RawClient(sidecar.socket, timeout=60) as client:
            while not stop.is_set():
                content = f"background {n} put {progress[n]}"
                client.call(
                    "memory.put", runId="writers", memoryRef=refs[n], entry={"content": content}
                )
                progress[n] += 1

    start = threading.Barrier(beginners)

    def beginner(_: int) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
        with RawClient(sidecar.socket, timeout=60) as client:
            start.wait(timeout=30)
            begun: dict[str, Any] = begin(client, "shared")
            seen = [list_all(client, "shared", ref) for ref in refs]
        return begun, seen

    with ThreadPoolExecutor(len(refs)) as writers:
        background = [writers.submit(background_writer, n) for n in range(len(refs))]
        try:
            # The writers are going, so the commit point moves while the begins race.
            wait_for(lambda: min(progress) >= 5, 30, "the background writers to get going")
            with ThreadPoolExecutor(beginners) as pool:
                answers = list(pool.map(beginner, range(beginners)))
        finally:
            stop.set()
        for future in background:
            future.result(timeout=60)

    snapshots = {begun["snapshotAt"] for begun, _ in answers}
    assert len(snapshots) == 1, f"one new run got {len(snapshots)} different snapshots"
    assert sorted(begun["resumed"] for begun, _ in answers) == [False] + [True] * (beginners - 1)
    assert all(begun["runId"] == "shared" and begun["tenant"] == TENANT for begun, _ in answers)
    first_view = answers[0][1]
    assert all(view == first_view for _, view in answers), "one run, different contents"
    (snapshot_at,) = snapshots
    assert all(e["createdAt"] <= snapshot_at for scope in first_view for e in scope)


def test_pipelined_requests_are_matched_by_id(sidecar: Sidecar, rpc: RawClient) -> None:
    (ref,) = issue_refs(rpc, 1)
    begin(rpc, "writer")
    seeded = [
        rpc.call("memory.put", runId="writer", memoryRef=ref, entry={"content": f"seed {i}"})
        for i in range(20)
    ]
    begin(rpc, "reader")

    # (id, line, check of the response) for requests that are answered; ids mix ints and
    # strings that spell the same number, which must not be confused.
    expected: dict[tuple[type, Any], Callable[[dict[str, Any]], None]] = {}
    lines: list[bytes] = []

    def expect(rid: Any, line: bytes, check: Callable[[dict[str, Any]], None]) -> None:
        expected[(type(rid), rid)] = check
        lines.append(line)

    def put_check(content: str) -> Callable[[dict[str, Any]], None]:
        def check(r: dict[str, Any]) -> None:
            assert r["result"]["content"] == content

        return check

    def get_check(entry: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        def check(r: dict[str, Any]) -> None:
            assert r["result"] == entry

        return check

    def list_check(r: dict[str, Any]) -> None:
        assert [e["id"] for e in r["result"]] == [e["id"] for e in reversed(seeded[-5:])]

    def caps_check(r: dict[str, Any]) -> None:
        assert r["result"]["capabilities"]["memory"]["supported"] is True

    def unknown_check(r: dict[str, Any]) -> None:
        assert r["error"]["data"]["error"] == "not_found"

    notified = "sent as a notification"
    for i in range(60):
        content = f"pipelined put {i}"
        entry_in = {"content": content}
        put = req("memory.put", {"runId": "writer", "memoryRef": ref, "entry": entry_in}, i)
        expect(i, put, put_check(content))
        entry = seeded[i % len(seeded)]
        get = req("memory.get", {"runId": "reader", "memoryRef": ref, "id": entry["id"]}, str(i))
        expect(str(i), get, get_check(entry))
        if i % 10 == 0:
            options = {"limit": 5}
            params = {"runId": "reader", "memoryRef": ref, "options": options}
            listing = req("memory.list", params, f"list-{i}")
            expect(f"list-{i}", listing, list_check)
            expect(f"caps-{i}", req("host.capabilities", {}, f"caps-{i}"), caps_check)
            expect(-i - 1, req("no.such.method", {}, -i - 1), unknown_check)
            unanswered = {"content": f"{notified} {i}"}
            params = {"runId": "writer", "memoryRef": ref, "entry": unanswered}
            lines.append(notification("memory.put", params))
    rpc.sock.sendall(b"".join(line + b"\n" for line in lines))

    answered: dict[tuple[type, Any], dict[str, Any]] = {}
    while len(answered) < len(expected):
        response = rpc.read()
        key = (type(response["id"]), response["id"])
        assert key in expected, f"an answer with an id never sent: {response['id']!r}"
        assert key not in answered, f"two answers for id {response['id']!r}"
        assert response["jsonrpc"] == "2.0"
        answered[key] = response
    for key, check in expected.items():
        check(answered[key])

    # Notifications are not answered: the next line is the answer to a fresh request.
    assert rpc.call("sidecar.health")["status"] == "ok"
    # Every answered put is inside a run begun after its answer; a notification's put is
    # never acknowledged, so it is only known to commit eventually (the last one may still
    # be in progress on PostgreSQL when the answers above are all in).
    runs = (f"after-{n}" for n in itertools.count())

    def notified_puts_committed() -> bool:
        run = next(runs)
        begin(rpc, run)
        contents = {e["content"] for e in list_all(rpc, run, ref)}
        assert {f"pipelined put {i}" for i in range(60)} <= contents
        return {f"{notified} {i}" for i in range(0, 60, 10)} <= contents

    wait_for(notified_puts_committed, 10, "the notifications' puts to commit")


def test_racing_idempotent_puts_and_deletes(sidecar: Sidecar, rpc: RawClient) -> None:
    racers = 24
    (ref,) = issue_refs(rpc, 1)
    begin(rpc, "writer")

    def race(call: Callable[[RawClient, int], Any]) -> list[Any]:
        start = threading.Barrier(racers)

        def one(n: int) -> Any:
            with RawClient(sidecar.socket, timeout=60) as client:
                start.wait(timeout=30)
                try:
                    return call(client, n)
                except RpcError as err:
                    return err

        with ThreadPoolExecutor(racers) as pool:
            return list(pool.map(one, range(racers)))

    def same_entry(client: RawClient, n: int) -> Any:
        entry = {"content": "one entry, many senders", "tags": ["same"]}
        return client.call(
            "memory.put", runId="writer", memoryRef=ref, entry=entry, idempotencyKey="same-key"
        )

    same = race(same_entry)
    assert all(isinstance(r, dict) for r in same), same
    assert len({json.dumps(r, sort_keys=True) for r in same}) == 1

    def different_entries(client: RawClient, n: int) -> Any:
        entry = {"content": f"sender {n}"}
        return client.call(
            "memory.put", runId="writer", memoryRef=ref, entry=entry, idempotencyKey="contested"
        )

    contested = race(different_entries)
    winners = [r for r in contested if isinstance(r, dict)]
    losers = [r for r in contested if isinstance(r, RpcError)]
    assert len(winners) == 1, f"{len(winners)} different entries won one idempotency key"
    assert len(losers) == racers - 1
    assert {err.code for err in losers} == {"conflict"}

    begin(rpc, "reader")
    listed = list_all(rpc, "reader", ref)
    assert sorted(e["id"] for e in listed) == sorted([same[0]["id"], winners[0]["id"]])

    def delete(client: RawClient, n: int) -> Any:
        return client.call("memory.delete", runId="writer", memoryRef=ref, id=winners[0]["id"])

    deleted = race(delete)
    assert sorted(deleted, key=str) == [False] * (racers - 1) + [True]
    begin(rpc, "after-delete")
    assert [e["id"] for e in list_all(rpc, "after-delete", ref)] == [same[0]["id"]]
