"""``MemoryClient`` (the blocking client over a portal) against a real sidecar, and the
client distribution's independence from the daemon's dependencies."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openwop_memory_client import (
    ConflictError,
    EntryInput,
    ForbiddenError,
    MemoryClient,
    MemoryEntry,
    RequestTimeoutError,
    RunNotFoundError,
    SecretSpec,
    SidecarUnavailableError,
    ValidationError,
)
from support.names import uid
from support.schemas import check_capabilities, check_entry
from support.sidecar import Sidecar

SECRET = "sk-live-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


def test_round_trip_of_every_method(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        check_capabilities({"capabilities": client.capabilities()})
        assert client.health()["status"] == "ok"
        ref = client.issue_ref(tenant, "agent")
        assert client.call("memory.issueRef", tenant=tenant, agent="agent") == {"memoryRef": ref}
        with client.run(uid("w"), tenant, [SecretSpec(id="openai", value=SECRET)]) as writer:
            assert writer.resumed is False and writer.snapshot_at.endswith("Z")
            first = writer.put(ref, EntryInput(content=f"a {SECRET}", tags=["x"]))
            second = writer.put(ref, {"content": "b"})
            assert writer.list(ref) == []
            assert writer.add_secrets({"db": "another-secret-1"}) == 2
            run_id = writer.run_id
        check_entry(first.to_wire())
        assert first.content == "a [REDACTED:openai]" and first.tags == ("x",)
        assert client.call("run.end", runId=run_id) == {"ended": False}  # exit ended it
        with client.run(uid("r"), tenant) as reader:
            assert reader.list(ref) == [second, first]
            assert reader.list(ref, {"tag": "x"}) == [first]
            assert reader.get(ref, second.id) == second
            assert reader.delete(ref, second.id) is True
            assert reader.delete(ref, second.id) is False
        assert client.stats()["requests"]["memory.delete"]["ok"] >= 2
        assert SECRET not in repr(writer) and repr(writer).startswith("MemoryRun(")


def test_threads_share_one_client(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        with client.run(uid("w"), tenant) as writer, ThreadPoolExecutor(8) as pool:
            written = list(pool.map(lambda i: writer.put(ref, {"content": f"n{i}"}), range(120)))
        assert [e.content for e in written] == [f"n{i}" for i in range(120)]
        with client.run(uid("r"), tenant) as reader, ThreadPoolExecutor(8) as pool:
            read = list(pool.map(lambda e: reader.get(ref, e.id), written))
            assert read == written
            assert len(reader.list(ref, {"limit": 1000})) == 120


def test_typed_errors(shared_sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(shared_sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        other_ref = client.issue_ref(uid("other"), "agent")
        with client.run(uid("w"), tenant) as run:
            with pytest.raises(ForbiddenError):
                run.put(other_ref, {"content": "x"})
            with pytest.raises(ValidationError) as bad:
                run.put(ref, {"content": 42})  # type: ignore[arg-type]
            assert bad.value.details["field"] == "entry.content"
            params = {"runId": run.run_id, "memoryRef": ref, "idempotencyKey": "k"}
            client.call("memory.put", entry={"content": "one"}, **params)
            with pytest.raises(ConflictError):
                client.call("memory.put", entry={"content": "two"}, **params)
        with pytest.raises(RunNotFoundError):
            client.call("memory.list", runId=uid("never"), memoryRef=ref)


def test_restart_between_calls(sidecar: Sidecar) -> None:
    tenant = uid("t")
    with MemoryClient(sidecar.socket) as client:
        ref = client.issue_ref(tenant, "agent")
        with client.run(uid("w"), tenant, {"openai": SECRET}) as run:
            snapshot = run.snapshot_at
            with client.run(uid("other"), tenant) as other:
                hidden = other.put(ref, {"content": "after the snapshot"})
            sidecar.stop()
            sidecar.start()
            entry = run.put(ref, {"content": f"k={SECRET}"}, idempotency_key="step-1")
            assert entry.content == "k=[REDACTED:openai]"
            assert run.snapshot_at == snapshot
            assert run.list(ref) == []
            assert run.get(ref, hidden.id) is None
            sidecar.kill()
            sidecar.start()
            assert run.put(ref, {"content": f"k={SECRET}"}, idempotency_key="step-1") == entry
        with client.run(uid("r"), tenant) as reader:
            assert reader.list(ref) == [entry, hidden]


def test_body_error_propagates_and_the_run_is_ended(shared_sidecar: Sidecar) -> None:
    run_id = uid("w")
    with MemoryClient(shared_sidecar.socket) as client:
        with pytest.raises(ZeroDivisionError), client.run(run_id, uid("t")):
            _ = 1 / 0
        assert client.call("run.end", runId=run_id) == {"ended": False}


def test_timeout_when_nobody_answers(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(4)
        with MemoryClient(path, timeout=0.3) as client:
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError):
                client.capabilities()
            assert 0.25 < time.monotonic() - started < 3


def test_unavailable_when_nothing_listens(tmp_path: Path) -> None:
    client = MemoryClient(tmp_path / "absent.sock", reconnect_attempts=2, reconnect_backoff=0.01)
    with pytest.raises(SidecarUnavailableError), client:
        pass
    with pytest.raises(RuntimeError, match="not open"):
        client.health()


def test_the_client_installs_without_the_daemon_dependencies() -> None:
    project = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ ]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    assert names == {"anyio", "pydantic"}

    blocked = ["openwop_memory", "aiosqlite", "jsonrpcserver", "structlog", "orjson"]
    script = f"""
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing it now raises ImportError
import openwop_memory_client as c
c.AsyncMemoryClient("/tmp/x.sock")
c.MemoryClient("/tmp/x.sock", timeout=1)
loaded = sorted(n for n in sys.modules if n.split(".")[0] in {blocked!r} and sys.modules[n])
assert not loaded, loaded
print("ok", sorted(c.__all__))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok") and "'MemoryClient'" in done.stdout


def test_public_names_are_exported() -> None:
    import openwop_memory_client as c

    for name in ("AsyncMemoryClient", "AsyncMemoryRun", "MemoryClient", "MemoryRun"):
        assert name in c.__all__ and getattr(c, name).__module__.startswith(c.__name__)
    assert MemoryEntry.__name__ in c.__all__
