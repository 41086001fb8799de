"""Process lifecycle of the real sidecar: signals and draining, start-up checks, logging.

Start-up failures run ``openwop-memory serve`` to completion with ``subprocess.run``; the
rest use :class:`Sidecar`. Waits poll with deadlines; no test asserts a speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from support.protocol import TENANT, begin, issue, list_all, req
from support.sidecar import RawClient, Sidecar, run_cli


def assert_clean_failure(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 1 with a one-line reason on stderr that mentions each needle; no traceback."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert re.search(needle, result.stderr, re.IGNORECASE), (needle, result.stderr)


def connection_refused(path: Path) -> bool:
    try:
        client = RawClient(path, timeout=2)
    except OSError:
        return True
    client.close()
    return False


def begin_writer(sidecar: Sidecar) -> str:
    with sidecar.client() as client:
        ref = issue(client)
        begin(client, "writer")
    return ref


def put_line(rid: int, ref: str, content: str) -> bytes:
    return req(
        "memory.put", {"runId": "writer", "memoryRef": ref, "entry": {"content": content}}, rid
    )


def listed(sidecar: Sidecar, ref: str, run_id: str) -> list[dict[str, Any]]:
    with sidecar.client() as client:
        assert begin(client, run_id, TENANT)["resumed"] is False
        return list_all(client, run_id, ref)


# -- graceful stop -------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_answers_requests_already_read_then_exits_0(
    workdir: Path, signum: signal.Signals
) -> None:
    """A signal lands while a connection streams pipelined puts at the sidecar."""
    total = 600
    padding = "p" * 1500
    with Sidecar(workdir, "--drain-timeout", "30s", "--access-log") as sidecar:
        ref = begin_writer(sidecar)
        payload = b"".join(put_line(i, ref, f"drain {i} {padding}") + b"\n" for i in range(total))
        answers: dict[int, dict[str, Any]] = {}
        with sidecar.client(timeout=60) as client:

            def send() -> None:
                # Once the sidecar stops reading it closes the connection under this send.
                with contextlib.suppress(OSError):
                    client.sock.sendall(payload)

            sender = threading.Thread(target=send)
            sender.start()
            try:
                first = client.read()
                answers[first["id"]] = first
                sidecar.signal(signum)
                while True:
                    try:
                        answer = client.read()
                    except (EOFError, ConnectionResetError):
                        break
                    assert answer["id"] not in answers, "two answers for one request"
                    answers[answer["id"]] = answer
            finally:
                sender.join(60)
        assert sidecar.proc is not None
        assert sidecar.proc.wait(45) == 0, sidecar.log()
        assert not sidecar.socket.exists(), "the socket file was left behind"

    assert answers, "no request was answered before the signal"
    failed = [a for a in answers.values() if "result" not in a]
    assert not failed, f"requests failed during the drain: {failed[:3]}"
    puts_handled = [r for r in sidecar.events("request") if r.get("method") == "memory.put"]
    # Every request the sidecar took in was answered: as many answers as handled puts.
    assert len(puts_handled) == len(answers)
    assert not sidecar.events("drain_timeout")

    with Sidecar(workdir) as restarted:
        present = {e["id"]: e["content"] for e in listed(restarted, ref, "after-restart")}
    for answer in answers.values():
        entry = answer["result"]
        assert present.get(entry["id"]) == entry["content"], "an acknowledged put was lost"
    assert len(present) <= total


@contextlib.contextmanager
def held_drain(sidecar: Sidecar) -> Iterator[RawClient]:
    """A connection with an answer in flight that cannot finish: its reader never reads.

    Its ``memory.list`` answers are megabytes, far beyond the socket buffer, so the sidecar
    blocks sending them and the drain cannot complete until the client goes away.
    """
    ref = begin_writer(sidecar)
    with sidecar.client() as client:
        for i in range(24):
            content = f"{i:04d}" + "b" * 60000
            client.call("memory.put", runId="writer", memoryRef=ref, entry={"content": content})
        client.call("run.begin", runId="reader", tenant=TENANT)
    with sidecar.client() as stuck:
        for i in range(6):
            params = {"runId": "reader", "memoryRef": ref, "options": {"limit": 1000}}
            request = {"jsonrpc": "2.0", "id": i, "method": "memory.list", "params": params}
            stuck.send_line(json.dumps(request).encode())
        wait_for(
            lambda: any(r.get("method") == "memory.list" for r in sidecar.events("request")),
            30,
            "the sidecar to handle a list",
        )
        yield stuck


@pytest.mark.parametrize(
    "second", [signal.SIGTERM, signal.SIGINT], ids=["then-SIGTERM-143", "then-SIGINT-130"]
)
def test_second_signal_during_drain_exits_at_once(workdir: Path, second: signal.Signals) -> None:
    with (
        Sidecar(workdir, "--drain-timeout", "120s", "--access-log") as sidecar,
        held_drain(sidecar),
    ):
        assert sidecar.proc is not None
        sidecar.signal(signal.SIGTERM)
        wait_for(lambda: bool(sidecar.events("stopping")), 30, "the drain to start")
        wait_for(lambda: connection_refused(sidecar.socket), 30, "the listener to close")
        assert sidecar.proc.poll() is None, "the drain should still be held by the stuck answer"
        sidecar.signal(second)
        # Far sooner than the 120 s drain timeout.
        assert sidecar.proc.wait(30) == 128 + second


def test_drain_timeout_abandons_a_stuck_connection_and_exits_0(workdir: Path) -> None:
    with (
        Sidecar(workdir, "--drain-timeout", "500ms", "--access-log") as sidecar,
        held_drain(sidecar),
    ):
        assert sidecar.proc is not None
        sidecar.signal(signal.SIGTERM)
        # The stuck client never reads, so only the drain timeout can end the drain.
        assert sidecar.proc.wait(20) == 0, sidecar.log()
        assert not sidecar.socket.exists()
        assert sidecar.events("drain_timeout")
    with Sidecar(workdir) as restarted, restarted.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_idle_sidecar_exits_0_on_one_signal(workdir: Path, signum: signal.Signals) -> None:
    with Sidecar(workdir) as sidecar, sidecar.client() as idle:
        assert idle.call("sidecar.health")["status"] == "ok"
        assert sidecar.proc is not None
        sidecar.signal(signum)
        # The idle connection is closed by the sidecar, not left hanging.
        with pytest.raises(EOFError):
            idle.read()
        assert sidecar.proc.wait(30) == 0
        assert not sidecar.socket.exists()
        assert sidecar.events("stopped")


def test_sd_notify_ready_then_stopping(workdir: Path) -> None:
    notify_path = workdir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.settimeout(20)
        with Sidecar(workdir, env={"NOTIFY_SOCKET": str(notify_path)}) as sidecar:
            assert notify.recv(4096).split(b"\n")[0] == b"READY=1"
            assert sidecar.stop() == 0
        assert b"STOPPING=1" in notify.recv(4096)


# -- start-up ------------------------------------------------------------------------------


def test_refuses_to_start_where_a_live_sidecar_answers(workdir: Path, sidecar: Sidecar) -> None:
    before = os.stat(sidecar.socket)
    other_database = workdir / "other" / "memory.db"
    result = run_cli(
        "serve", "--socket", str(sidecar.socket), "--database", f"sqlite:///{other_database}"
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert str(sidecar.socket) in result.stderr
    assert re.search(r"already|in use|listening", result.stderr, re.IGNORECASE), result.stderr
    after = os.stat(sidecar.socket)
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (
        before.st_ino,
        before.st_mode,
        before.st_mtime_ns,
    )
    assert not other_database.exists(), "the refused sidecar created its database"
    with sidecar.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"
        assert client.call("run.begin", runId="still-serving", tenant=TENANT)["resumed"] is False
    assert sidecar.proc is not None and sidecar.proc.poll() is None


def test_stale_socket_file_is_replaced(workdir: Path) -> None:
    path = workdir / "memory.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening, then closed: a stale socket file
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    with Sidecar(workdir, socket_path=path) as sidecar, sidecar.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


def test_regular_file_at_the_socket_path_is_refused(workdir: Path) -> None:
    path = workdir / "memory.sock"
    path.write_text("not a socket\n")
    database = workdir / "memory.db"
    result = run_cli("serve", "--socket", str(path), "--database", f"sqlite:///{database}")
    assert_clean_failure(result, re.escape(str(path)))
    assert path.read_text() == "not a socket\n"
    assert not database.exists()


@pytest.mark.parametrize(
    ("args", "env", "mode"),
    [
        ((), {}, 0o660),
        (("--socket-mode", "0600"), {}, 0o600),
        ((), {"OPENWOP_MEMORY_SOCKET_MODE": "0640"}, 0o640),
    ],
    ids=["default", "flag", "env"],
)
def test_socket_file_mode(
    workdir: Path, args: tuple[str, ...], env: dict[str, str], mode: int
) -> None:
    with Sidecar(workdir, *args, env=env) as sidecar:
        st = os.stat(sidecar.socket)
        assert stat.S_ISSOCK(st.st_mode)
        assert oct(stat.S_IMODE(st.st_mode)) == oct(mode)


def test_socket_directory_is_created(workdir: Path) -> None:
    path = workdir / "run" / "nested" / "memory.sock"
    with Sidecar(workdir, socket_path=path) as sidecar, sidecar.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"
        assert path.parent.is_dir()


@pytest.mark.sqlite_only
def test_newer_schema_refuses_to_start(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar:
        ref = begin_writer(sidecar)
        with sidecar.client() as client:
            client.call("memory.put", runId="writer", memoryRef=ref, entry={"content": "kept"})
        assert sidecar.stop() == 0
    with contextlib.closing(sqlite3.connect(sidecar.database)) as db, db:
        db.execute("INSERT INTO schema_migrations (version, applied_us) VALUES (999, 0)")

    result = run_cli(
        "serve", "--socket", str(sidecar.socket), "--database", f"sqlite:///{sidecar.database}"
    )
    assert_clean_failure(result, "schema")
    assert not sidecar.socket.exists()
    with contextlib.closing(sqlite3.connect(sidecar.database)) as db:
        versions = [v for (v,) in db.execute("SELECT version FROM schema_migrations")]
    assert max(versions) == 999, "the refused start rewrote the schema record"


def test_database_directory_that_cannot_be_created_fails_cleanly(workdir: Path) -> None:
    blocker = workdir / "blocker"
    blocker.write_text("a regular file where a directory should go\n")
    socket_path = workdir / "memory.sock"
    result = run_cli(
        "serve", "--socket", str(socket_path), "--database", f"sqlite:///{blocker}/sub/memory.db"
    )
    assert_clean_failure(result, "database|director")
    assert not socket_path.exists()


def test_an_in_memory_sqlite_url_is_refused_creating_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workdir)  # a relative ":memory:" file would land here
    socket_path = workdir / "memory.sock"
    result = run_cli("serve", "--socket", str(socket_path), "--database", "sqlite:///:memory:")
    assert_clean_failure(result)
    assert result.stderr.splitlines()[-1] == (
        "openwop-memory: cannot start: an in-memory SQLite database cannot be shared or use WAL"
    )
    assert sorted(p.name for p in workdir.iterdir()) == []


def test_a_file_that_is_not_an_sqlite_database_is_refused_untouched(workdir: Path) -> None:
    database = workdir / "notes.db"
    body = b"not a database, just someone's notes\n" * 200
    database.write_bytes(body)
    before = database.stat()
    socket_path = workdir / "memory.sock"
    result = run_cli("serve", "--socket", str(socket_path), "--database", f"sqlite:///{database}")
    assert_clean_failure(result)
    assert result.stderr.splitlines()[-1] == (
        f"openwop-memory: cannot start: cannot open SQLite database {database}: "
        "file is not a database"
    )
    assert database.read_bytes() == body
    assert database.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in workdir.iterdir()) == ["notes.db"]  # no -wal, -shm, socket


def test_postgresql_url_fails_cleanly(workdir: Path) -> None:
    socket_path = workdir / "memory.sock"
    result = run_cli(
        "serve",
        "--socket",
        str(socket_path),
        "--database",
        "postgresql://memory@localhost:5432/memory",
        "--database-wait",
        "1s",  # nothing listens there: waited for that long, then refused
    )
    assert_clean_failure(result, "sqlite|postgres", "database_wait")
    assert not socket_path.exists()


# -- logging -------------------------------------------------------------------------------


def test_ready_line_at_start(sidecar: Sidecar) -> None:
    lines = sidecar.log_lines()
    ready = [line for line in lines if line.get("event") == "ready"]
    assert len(ready) == 1
    assert ready[0]["socket"] == str(sidecar.socket)
    assert ready[0]["level"] == "info"
    assert lines.index(ready[0]) < min(
        [i for i, line in enumerate(lines) if line.get("event") == "request"] or [len(lines)]
    )


SECRET = "hunter2-hunter2-very-secret"
CONTENT = "private note about the quarterly numbers"
TAG = "private-tag-value"


def logged_session(sidecar: Sidecar) -> list[tuple[str, str]]:
    """Make requests on several connections; return the (method, outcome) of each."""
    sent: list[tuple[str, str]] = []
    with sidecar.client() as client:
        ref = str(client.call("memory.issueRef", tenant=TENANT, agent="agent")["memoryRef"])
        sent.append(("memory.issueRef", "ok"))
        secrets = [{"id": "k", "value": SECRET}]
        client.call("run.begin", runId="writer", tenant=TENANT, secrets=secrets)
        sent.append(("run.begin", "ok"))
        entry = {"content": f"{CONTENT} {SECRET}", "tags": [TAG]}
        put = client.call("memory.put", runId="writer", memoryRef=ref, entry=entry)
        sent.append(("memory.put", "ok"))
    with sidecar.client() as client:
        client.call("run.begin", runId="reader", tenant=TENANT)
        sent.append(("run.begin", "ok"))
        client.call("memory.list", runId="reader", memoryRef=ref)
        sent.append(("memory.list", "ok"))
        client.call("memory.get", runId="reader", memoryRef=ref, id=put["id"])
        sent.append(("memory.get", "ok"))
        client.error("memory.get", runId="never-begun", memoryRef=ref, id=put["id"])
        sent.append(("memory.get", "not_found"))
        client.error("memory.put", runId="writer", memoryRef=ref, entry={"content": 5})
        sent.append(("memory.put", "validation_error"))
    with sidecar.client() as client:
        client.call("host.capabilities")
        sent.append(("host.capabilities", "ok"))
    return sent


def test_request_logs_carry_no_content_secrets_or_params(workdir: Path) -> None:
    with Sidecar(workdir, "--access-log") as sidecar:
        sent = logged_session(sidecar)
        assert sidecar.stop() == 0
    text = sidecar.log()
    for private in (SECRET, CONTENT, TAG, "quarterly"):
        assert private not in text
    lines = sidecar.log_lines()
    assert len(lines) == len([t for t in text.splitlines() if t.strip()]), "non-JSON log lines"
    assert all("params" not in line for line in lines)
    requests = sidecar.events("request")
    assert len(requests) >= len(sent), "the session's requests were not logged"
    for line in requests:
        assert isinstance(line["method"], str)
        assert isinstance(line["outcome"], str)


def logged(sidecar: Sidecar, count: int) -> int:
    """``count``, once the access log holds that many lines: a line is written after its
    answer (and flushed on the loop's next turn), so the answer can come first."""
    wait_for(lambda: len(sidecar.events("request")) >= count, 10, f"{count} request lines")
    assert len(sidecar.events("request")) == count, sidecar.events("request")
    return count


def test_one_log_line_per_request_with_method_outcome_and_duration(workdir: Path) -> None:
    with Sidecar(workdir, "--access-log") as sidecar:
        before = logged(sidecar, 1)  # the start-up readiness probe's
        sent = logged_session(sidecar)
        assert sidecar.stop() == 0
    lines = sidecar.events("request")[before:]
    assert [(line.get("method"), line.get("outcome")) for line in lines] == sent
    for line in lines:
        assert isinstance(line.get("duration_ms"), int | float), line
        assert line["duration_ms"] >= 0


def test_rejected_requests_are_logged_once_each(workdir: Path) -> None:
    with Sidecar(workdir, "--max-request-bytes", "2048", "--access-log") as sidecar:
        with sidecar.client() as client:
            assert client.call("sidecar.health")["status"] == "ok"
            before = logged(sidecar, 2)  # the readiness probe's and that one
            oversized = b'{"jsonrpc": "2.0", "id": 2, "method": "x", "params": {}}'.ljust(3000)
            answers = [
                client.raw(b"{not json"),
                client.raw(b'{"jsonrpc": "2.0", "id": 1, "method": "no.such.method"}'),
                client.raw(oversized),
            ]
            assert [a["error"]["data"]["error"] for a in answers] == [
                "validation_error",
                "not_found",
                "validation_error",
            ]
            assert client.call("sidecar.health")["status"] == "ok"
        assert sidecar.stop() == 0
    lines = sidecar.events("request")[before:]
    outcomes = [line.get("outcome") for line in lines]
    assert outcomes == ["validation_error", "not_found", "validation_error", "ok"], lines
    for line in lines:
        assert "method" in line and "duration_ms" in line, line
