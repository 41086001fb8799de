"""``AsyncMemoryClient`` against a real sidecar: every method, multiplexing, typed errors,
reconnects after a restart, transparent re-begin on the same snapshot, retries without
duplicates, timeouts and an absent sidecar."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from openwop_memory_client import (
    AsyncMemoryClient,
    ConflictError,
    EntryInput,
    ForbiddenError,
    MemoryEntry,
    MemoryListOptions,
    MemoryServiceError,
    MethodNotFoundError,
    NotFoundError,
    ReplaySnapshotUnavailableError,
    RequestTimeoutError,
    RunNotFoundError,
    RunNotOpenError,
    SecretLeakageError,
    SecretSpec,
    SidecarUnavailableError,
    ValidationError,
)
from support.names import uid
from support.schemas import check_capabilities, check_entry
from support.sidecar import Sidecar

pytestmark = pytest.mark.anyio

SECRET = "sk-live-0123456789abcdef"
OTHER_SECRET = "pw-another-secret-value"


def in_an_hour() -> str:
    return (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@contextlib.contextmanager
def silent_listener(path: Path) -> Iterator[None]:
    """A socket that accepts connections (in the kernel backlog) and never answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(16)
        yield
    finally:
        sock.close()


# -- a line proxy between the client and the sidecar ---------------------------------------


@dataclass
class ProxyState:
    accepted: int = 0
    # Answers to this many upcoming memory.put requests are swallowed, and the client's
    # connection cut instead: the put is committed, its answer lost.
    cut_put_answers: int = 0
    cut: list[Any] = field(default_factory=list)


async def _relay(client: anyio.abc.SocketStream, upstream_path: Path, state: ProxyState) -> None:
    lost = (
        anyio.EndOfStream,
        anyio.IncompleteRead,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
    )
    async with client, await anyio.connect_unix(upstream_path) as upstream:
        cut_ids: set[Any] = set()
        async with anyio.create_task_group() as tg:

            async def to_sidecar() -> None:
                reader = BufferedByteReceiveStream(client)
                with contextlib.suppress(*lost):
                    while True:
                        line = await reader.receive_until(b"\n", 1 << 24)
                        request = json.loads(line)
                        if request.get("method") == "memory.put" and state.cut_put_answers:
                            state.cut_put_answers -= 1
                            cut_ids.add(request["id"])
                        await upstream.send(line + b"\n")
                tg.cancel_scope.cancel()

            async def to_client() -> None:
                reader = BufferedByteReceiveStream(upstream)
                with contextlib.suppress(*lost):
                    while True:
                        line = await reader.receive_until(b"\n", 1 << 24)
                        answer = json.loads(line)
                        if answer.get("id") in cut_ids:
                            state.cut.append(answer["id"])
                            break
                        await client.send(line + b"\n")
                tg.cancel_scope.cancel()

            tg.start_soon(to_sidecar)
            tg.start_soon(to_client)


@contextlib.asynccontextmanager
async def line_proxy(path: Path, upstream: Path) -> AsyncIterator[ProxyState]:
    """A Unix-socket proxy at ``path`` relaying whole lines to the sidecar at ``upstream``."""
    state = ProxyState()
    async with await anyio.create_unix_listener(path) as listener, anyio.create_task_group() as tg:

        async def accept() -> None:
            with contextlib.suppress(anyio.ClosedResourceError):
                while True:
                    stream = await listener.accept()
                    state.accepted += 1
                    tg.start_soon(_relay, stream, upstream, state)

        tg.start_soon(accept)
        yield state
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def proxied_client(
    upstream: Sidecar, tmp_path: Path
) -> AsyncIterator[tuple[ProxyState, AsyncMemoryClient]]:
    """An open ``AsyncMemoryClient`` whose connections to ``upstream`` run through a
    :func:`line_proxy` at ``tmp_path / "p.sock"``; yields the proxy's state and the client."""
    async with (
        line_proxy(tmp_path / "p.sock", upstream.socket) as proxy,
        AsyncMemoryClient(tmp_path / "p.sock") as client,
    ):
        yield proxy, client


# -- round trips ---------------------------------------------------------------------------


async def test_host_methods_round_trip(shared_sidecar: Sidecar) -> None:
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        capabilities = await client.capabilities()
        check_capabilities({"capabilities": capabilities})
        assert capabilities["agents"]["memoryBackends"] == ["long-term"]
        tenant = uid("t")
        ref = await client.issue_ref(tenant, "agent")
        assert ref == await client.issue_ref(tenant, "agent", "default")
        assert ref != await client.issue_ref(tenant, "agent", "other")
        health = await client.health()
        assert health["status"] == "ok" and isinstance(health["uptimeSeconds"], float)
        stats = await client.stats()
        assert stats["requests"]["memory.issueRef"]["ok"] >= 3
        raw_health = await client.call("sidecar.health")
        assert raw_health["status"] == "ok" and raw_health.keys() == health.keys()
        raw = await client.call("memory.issueRef", tenant=tenant, agent="agent")
        assert raw == {"memoryRef": ref}


async def test_run_round_trip_of_every_memory_method(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        expires = in_an_hour()
        async with client.run(uid("w"), tenant, secrets={"openai": SECRET}) as writer:
            assert writer.resumed is False
            first = await writer.put(
                ref, EntryInput(content=f"key {SECRET} used", tags=["kind:a"], expiresAt=expires)
            )
            second = await writer.put(ref, {"content": "plain", "tags": ["kind:b", "kind:b", ""]})
            assert await writer.list(ref) == []  # a run never sees its own writes
            assert await writer.get(ref, first.id) is None
            assert await writer.add_secrets({"db": OTHER_SECRET}) == 2
            third = await writer.put(ref, {"content": f"pw {OTHER_SECRET}"})
        for entry in (first, second, third):
            check_entry(entry.to_wire())
        assert first.content == "key [REDACTED:openai] used"
        assert first.tags == ("kind:a",) and first.to_wire()["expiresAt"] == expires
        assert second.tags == ("kind:b",) and second.expires_at is None
        assert third.content == "pw [REDACTED:db]"

        async with client.run(uid("r"), tenant) as reader:
            assert await reader.list(ref) == [third, second, first]
            assert await reader.list(ref, MemoryListOptions(tag="kind:b")) == [second]
            assert await reader.list(ref, {"limit": 1}) == [third]
            assert await reader.get(ref, first.id) == first
            assert await reader.get(ref, "mem_does_not_exist") is None
            assert await reader.delete(ref, second.id) is True
            assert await reader.delete(ref, second.id) is False
            # The delete is in the live store; this run's snapshot still holds the entry.
            assert await reader.get(ref, second.id) == second
        async with client.run(uid("r"), tenant) as later:
            assert await later.list(ref) == [third, first]


async def test_run_begin_end_and_resume(shared_sidecar: Sidecar) -> None:
    tenant, run_id = uid("t"), uid("w")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        specs = [SecretSpec(id="openai", value=SECRET)]
        run = client.run(run_id, tenant, secrets=specs)
        with pytest.raises(RuntimeError):
            _ = run.snapshot_at
        async with run as opened:
            assert opened is run
            snapshot = run.snapshot_at
            assert snapshot.endswith("Z") and len(snapshot) == len("2026-01-01T00:00:00.000000Z")
            active = (await client.stats())["activeRuns"]
        # Exiting sent run.end: ending it again reports False, and it is no longer active.
        assert await client.call("run.end", runId=run_id) == {"ended": False}
        assert (await client.stats())["activeRuns"] == active - 1
        async with client.run(run_id, tenant) as again:
            assert again.resumed is True and again.snapshot_at == snapshot
        assert SECRET not in repr(run) and "secrets=1" in repr(run)


async def test_run_end_is_sent_when_the_body_raises(shared_sidecar: Sidecar) -> None:
    tenant, run_id = uid("t"), uid("w")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        with pytest.raises(KeyError):
            async with client.run(run_id, tenant):
                raise KeyError("boom")
        assert await client.call("run.end", runId=run_id) == {"ended": False}


async def test_many_concurrent_calls_share_one_connection(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    tenant = uid("t")
    async with line_proxy(tmp_path / "p.sock", shared_sidecar.socket) as proxy:
        async with AsyncMemoryClient(tmp_path / "p.sock") as client:
            ref = await client.issue_ref(tenant, "agent")
            written: dict[int, MemoryEntry] = {}
            async with client.run(uid("w"), tenant) as writer:

                async def put(i: int) -> None:
                    written[i] = await writer.put(
                        ref, {"content": f"entry {i}", "tags": [f"n:{i}"]}
                    )

                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(put, i)
            assert all(written[i].content == f"entry {i}" for i in range(200))
            assert len({e.id for e in written.values()}) == 200

            read: dict[int, MemoryEntry | None] = {}
            async with client.run(uid("r"), tenant) as reader:

                async def get(i: int) -> None:
                    read[i] = await reader.get(ref, written[i].id)

                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(get, i)
                assert len(await reader.list(ref, {"limit": 1000})) == 200
            assert read == written
        assert proxy.accepted == 1


# -- typed errors --------------------------------------------------------------------------


async def test_validation_errors_are_typed(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            with pytest.raises(ValidationError) as past:
                await run.put(ref, {"content": "x", "expiresAt": "2000-01-01T00:00:00Z"})
            assert past.value.details["field"] == "entry.expiresAt"
            assert past.value.code == "validation_error" and past.value.wire_rpc_code == -32602
            with pytest.raises(ValidationError) as unknown:
                await run.put(ref, {"content": "x", "id": "mine"})  # type: ignore[arg-type]
            assert unknown.value.details["field"].startswith("entry")
            with pytest.raises(ValidationError):
                await client.call("memory.list", runId=run.run_id, memoryRef=ref, bogus=1)
            # Not encodable as UTF-8: refused before sending, quoting nothing of it.
            with pytest.raises(ValidationError) as surrogate:
                await run.put(ref, {"content": "zq\ud800xy"})
            assert "\ud800" not in str(surrogate.value) and "zq" not in str(surrogate.value)


async def test_short_secret_is_refused_without_echoing_it(shared_sidecar: Sidecar) -> None:
    short = "Xq7#zp1"  # 7 characters: below the 8-character minimum
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        with pytest.raises(ValidationError) as err:
            async with client.run(uid("w"), uid("t"), secrets={"k": short}):
                pass
        assert "secrets" in err.value.details["field"]
        assert short not in str(err.value) + repr(err.value) + json.dumps(err.value.details)


async def test_not_found_errors_are_typed(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        with pytest.raises(RunNotFoundError) as run_err:
            await client.call("memory.get", runId=uid("never"), memoryRef=ref, id="x")
        assert isinstance(run_err.value, NotFoundError) and run_err.value.code == "not_found"
        assert run_err.value.details["resource"] == "run"
        with pytest.raises(MethodNotFoundError) as method_err:
            await client.call("memory.frobnicate")
        assert method_err.value.details["resource"] == "method"
        # A run that was never entered is not begun behind the caller's back.
        with pytest.raises(RunNotOpenError):
            await client.run(uid("ghost"), tenant).put(ref, {"content": "x"})


async def test_forbidden_cross_tenant(shared_sidecar: Sidecar) -> None:
    tenant_a, tenant_b, run_id = uid("a"), uid("b"), uid("w")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref_b = await client.issue_ref(tenant_b, "agent")
        async with client.run(run_id, tenant_a) as run:
            with pytest.raises(ForbiddenError) as put_err:
                await run.put(ref_b, {"content": "x"})
            assert put_err.value.code == "forbidden" and put_err.value.wire_rpc_code == -32003
            with pytest.raises(ForbiddenError):
                await run.list(ref_b)
        # The same run id under tenant B is B's own run, not A's.
        async with client.run(run_id, tenant_b) as theirs:
            assert theirs.resumed is False


async def test_conflict_and_idempotent_resend_via_generic_call(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            params: dict[str, Any] = {"runId": run.run_id, "memoryRef": ref, "idempotencyKey": "k"}
            first = await client.call("memory.put", entry={"content": "one"}, **params)
            assert await client.call("memory.put", entry={"content": "one"}, **params) == first
            with pytest.raises(ConflictError) as err:
                await client.call("memory.put", entry={"content": "two"}, **params)
            assert err.value.code == "conflict" and err.value.wire_rpc_code == -32009
            same = await run.put(ref, {"content": "one"}, idempotency_key="k")
            assert same.to_wire() == first
        async with client.run(uid("r"), tenant) as reader:
            assert [e.to_wire() for e in await reader.list(ref)] == [first]


async def test_replay_of_unknown_run_is_typed(shared_sidecar: Sidecar) -> None:
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        with pytest.raises(ReplaySnapshotUnavailableError) as err:
            async with client.run(uid("never"), uid("t"), replay=True):
                pass
        assert err.value.details["reason"] == "unknown_run"


async def test_secret_leakage_under_reject_policy(tmp_path: Path) -> None:
    tenant = uid("t")
    with Sidecar(tmp_path, "--redaction", "reject") as sidecar:
        async with AsyncMemoryClient(sidecar.socket) as client:
            ref = await client.issue_ref(tenant, "agent")
            async with client.run(uid("w"), tenant, secrets={"openai": SECRET}) as run:
                with pytest.raises(SecretLeakageError) as err:
                    await run.put(ref, {"content": f"the key is {SECRET}", "tags": ["t"]})
                clean = await run.put(ref, {"content": "nothing secret"})
            assert err.value.details["secretIds"] == ["openai"]
            assert err.value.code == "secret_leakage" and err.value.wire_rpc_code == -32010
            assert SECRET not in str(err.value) + repr(err.value) + json.dumps(err.value.details)
            async with client.run(uid("r"), tenant) as reader:
                assert await reader.list(ref) == [clean]


async def test_oversized_request_gets_its_error_not_a_timeout(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(shared_sidecar.socket, timeout=5) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            started = time.monotonic()
            with pytest.raises(ValidationError) as err:
                await run.put(ref, {"content": "x" * (2 << 20)})
            assert time.monotonic() - started < 4
            assert err.value.wire_rpc_code == -32600 and "maxRequestBytes" in err.value.details
            # The connection stays usable.
            assert (await run.put(ref, {"content": "small"})).content == "small"


# -- restarts, reconnects and retries ------------------------------------------------------


async def test_restart_between_calls_rebegins_the_run_on_its_snapshot(sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("early"), tenant) as early:
            before = await early.put(ref, {"content": "before the run"})
        async with client.run(uid("w"), tenant, secrets={"openai": SECRET}) as run:
            snapshot = run.snapshot_at
            async with client.run(uid("other"), tenant) as other:
                after = await other.put(ref, {"content": "written after the run began"})
            await anyio.to_thread.run_sync(sidecar.stop)
            await anyio.to_thread.run_sync(sidecar.start)

            mine = await run.put(ref, {"content": f"uses {SECRET}"})
            # Re-begun with its secrets (redaction still applies) on its snapshot.
            assert mine.content == "uses [REDACTED:openai]"
            assert run.snapshot_at == snapshot
            assert await run.list(ref) == [before]
            assert await run.get(ref, after.id) is None
            counts = (await client.stats())["requests"]
            assert counts["run.begin"] == {"ok": 1}
            assert counts["memory.put"] == {"not_found": 1, "ok": 1}
        async with client.run(uid("r"), tenant) as reader:
            assert await reader.list(ref) == [mine, after, before]


async def test_restart_and_resent_put_hold_exactly_one_entry(sidecar: Sidecar) -> None:
    tenant = uid("t")
    async with AsyncMemoryClient(sidecar.socket) as client:
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            first = await run.put(ref, {"content": "once"}, idempotency_key="step-7")
            await anyio.to_thread.run_sync(sidecar.kill)
            await anyio.to_thread.run_sync(sidecar.start)
            again = await run.put(ref, {"content": "once"}, idempotency_key="step-7")
        assert again == first
        async with client.run(uid("r"), tenant) as reader:
            assert await reader.list(ref) == [first]


async def test_call_waits_for_a_sidecar_coming_back(sidecar: Sidecar) -> None:
    async with AsyncMemoryClient(
        sidecar.socket, reconnect_attempts=40, reconnect_backoff_max=0.1
    ) as client:
        await anyio.to_thread.run_sync(sidecar.stop)

        async def restart_soon() -> None:
            await anyio.sleep(0.3)
            await anyio.to_thread.run_sync(sidecar.start)

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_soon)
            health = await client.health()
        assert health["status"] == "ok" and health["uptimeSeconds"] < 5


async def test_lost_answer_to_a_put_is_resent_without_a_duplicate(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    tenant = uid("t")
    async with proxied_client(shared_sidecar, tmp_path) as (proxy, client):
        ref = await client.issue_ref(tenant, "agent")
        puts_before = (await client.stats())["requests"].get("memory.put", {}).get("ok", 0)
        async with client.run(uid("w"), tenant) as run:
            proxy.cut_put_answers = 1
            entry = await run.put(ref, {"content": "exactly once"})
        assert len(proxy.cut) == 1 and proxy.accepted == 2
        # The sidecar took the put twice and answered the second from its key.
        assert (await client.stats())["requests"]["memory.put"]["ok"] == puts_before + 2
        async with client.run(uid("r"), tenant) as reader:
            assert await reader.list(ref) == [entry]


async def test_put_without_key_is_not_resent_when_its_fate_is_unknown(
    shared_sidecar: Sidecar, tmp_path: Path
) -> None:
    tenant = uid("t")
    async with proxied_client(shared_sidecar, tmp_path) as (proxy, client):
        ref = await client.issue_ref(tenant, "agent")
        async with client.run(uid("w"), tenant) as run:
            proxy.cut_put_answers = 1
            with pytest.raises(SidecarUnavailableError):
                await client.call(
                    "memory.put", runId=run.run_id, memoryRef=ref, entry={"content": "x"}
                )
        async with client.run(uid("r"), tenant) as reader:
            assert [e.content for e in await reader.list(ref)] == ["x"]


async def test_timeout_when_nobody_answers(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    with silent_listener(path):
        async with AsyncMemoryClient(path, timeout=0.3) as client:
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError) as err:
                await client.health()
            assert 0.25 < time.monotonic() - started < 3
            assert "sidecar.health" in str(err.value)


async def test_unavailable_when_nothing_listens(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SidecarUnavailableError) as err:
        async with AsyncMemoryClient(
            tmp_path / "absent.sock", reconnect_attempts=3, reconnect_backoff=0.01
        ):
            pass
    assert time.monotonic() - started < 3
    assert "3 attempts" in str(err.value)


async def test_unavailable_after_the_sidecar_stops_for_good(sidecar: Sidecar) -> None:
    # One round of attempts takes 0.1 + 0.2 s; twenty rounds would take 6 s.
    async with AsyncMemoryClient(
        sidecar.socket, reconnect_attempts=3, reconnect_backoff=0.1
    ) as client:
        assert (await client.health())["status"] == "ok"
        await anyio.to_thread.run_sync(sidecar.stop)
        results: list[BaseException] = []

        async def health() -> None:
            try:
                await client.health()
            except SidecarUnavailableError as exc:
                results.append(exc)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(health)
        # Twenty callers share one round of attempts instead of queueing twenty rounds.
        assert len(results) == 20 and time.monotonic() - started < 2


async def test_client_must_be_open() -> None:
    client = AsyncMemoryClient("/nonexistent/openwop.sock")
    assert "openwop.sock" in repr(client)
    with pytest.raises(RuntimeError):
        await client.health()
    with pytest.raises(ValueError, match="timeout"):
        AsyncMemoryClient("/x", timeout=0)


async def test_errors_in_the_body_propagate_unwrapped(shared_sidecar: Sidecar) -> None:
    with pytest.raises(KeyError):
        async with AsyncMemoryClient(shared_sidecar.socket):
            raise KeyError("mine")
    with pytest.raises(KeyError):
        async with (
            AsyncMemoryClient(shared_sidecar.socket) as client,
            client.run(uid("w"), uid("t")),
        ):
            raise KeyError("mine")


async def test_every_error_is_a_memory_service_error(shared_sidecar: Sidecar) -> None:
    async with AsyncMemoryClient(shared_sidecar.socket) as client:
        with pytest.raises(MemoryServiceError) as err:
            await client.call("run.end")  # runId missing
        assert type(err.value) is ValidationError and err.value.details["field"] == "runId"
