"""PostgreSQL at start-up, from the real CLI against a real server.

Errors: exit 1 with one line holding the server's own message (never the URL or the
password), for the three mistakes a new operator makes: a wrong password, a mistyped database
name, a user without the right to create the tables. A server that is not up yet is waited
for (``database_wait``), telling systemd so, and a server that never comes fails the start
after the bound with one line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.backends import Backend
from support.postgres import PostgresServer
from support.sidecar import EXE, Sidecar, run_cli

pytestmark = pytest.mark.backend_independent

PASSWORD = "right-Horse-7battery"
WRONG = "wrong-Zq9-secret"


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        server.add_password_role("owm_pw", PASSWORD)
        server.psql('CREATE ROLE "owm_nocreate" LOGIN')
        server.create_database("owm_start")
        yield server


def refused(workdir: Path, url: str) -> str:
    """The one line ``serve`` wrote before exiting 1 with the database ``url``."""
    started = time.monotonic()
    # The default database_wait (30 s): a mistake no wait repairs is not waited for.
    done = run_cli("serve", "--socket", str(workdir / "s.sock"), "--database", url)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 15
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("openwop-memory: cannot start: "), line
    assert "postgresql://" not in line
    return line


def test_a_wrong_password_says_so_without_either_password(
    workdir: Path, server: PostgresServer
) -> None:
    line = refused(workdir, server.url_as("owm_start", "owm_pw", WRONG))
    assert 'password authentication failed for user "owm_pw"' in line
    assert "(28P01)" in line
    assert WRONG not in line and PASSWORD not in line


def test_a_mistyped_database_is_named(workdir: Path, server: PostgresServer) -> None:
    line = refused(workdir, server.url_as("owm_strat", "owm_pw", PASSWORD))
    assert 'database "owm_strat" does not exist' in line
    assert "(3D000)" in line
    assert PASSWORD not in line


def test_a_user_without_create_rights_is_told_what_to_grant(
    workdir: Path, server: PostgresServer
) -> None:
    line = refused(workdir, server.url_as("owm_start", "owm_nocreate"))
    assert "permission denied for schema public" in line
    assert "(42501)" in line
    assert "GRANT CREATE ON SCHEMA" in line
    assert "group openwop-memory" not in line  # the socket's hint is for the OS's EACCES


def test_the_right_password_opens_it(workdir: Path, server: PostgresServer) -> None:
    """The role is usable: the refusals above are the mistakes, not the set-up."""
    server.psql('GRANT CREATE ON SCHEMA public TO "owm_pw"', "owm_start")
    url = server.url_as("owm_start", "owm_pw", PASSWORD)
    with Sidecar(workdir, backend=Backend("pw", lambda _path: url)) as sidecar:
        (opened,) = sidecar.events("database_opened")
    assert opened["database"] == "owm_start"
    assert PASSWORD not in sidecar.log()


def _stopped_server_url(server: PostgresServer, name: str) -> str:
    url = server.create_database(name)
    server.stop()
    return url


def test_a_sidecar_waits_for_a_server_that_starts_late(
    workdir: Path, server: PostgresServer
) -> None:
    url = _stopped_server_url(server, "owm_late")
    notify_path = workdir / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        late = threading.Timer(2.0, server.start)
        late.start()
        try:
            sidecar = Sidecar(
                workdir,
                "--database-wait",
                "20s",
                backend=Backend("late", lambda _path: url),
                env={"NOTIFY_SOCKET": str(notify_path)},
            )
            with sidecar:  # ready (health ok) within Sidecar's 20 s
                pass
        finally:
            late.join()
        notify.settimeout(0)
        messages = []
        while True:
            try:
                messages.extend(notify.recv(4096).decode().split("\n"))
            except BlockingIOError:
                break
    waiting = sidecar.events("database_waiting")
    assert waiting, sidecar.log()
    assert all(0 < w["retry_in_seconds"] <= 4 for w in waiting)
    assert [w["attempt"] for w in waiting] == list(range(1, len(waiting) + 1))
    assert "cannot reach the PostgreSQL server" in waiting[0]["reason"]
    statuses = [m for m in messages if m.startswith("STATUS=waiting for the database")]
    assert len(statuses) == len(waiting)
    assert messages.index("READY=1") > messages.index(statuses[-1])
    assert messages[messages.index("READY=1") + 1] == "STATUS=serving"
    assert sidecar.events("database_opened")


def test_a_server_that_never_comes_fails_the_start_after_the_bound(
    workdir: Path, server: PostgresServer
) -> None:
    url = _stopped_server_url(server, "owm_never")
    try:
        started = time.monotonic()
        done = run_cli(
            "serve", "--socket", str(workdir / "s.sock"), "--database", url,
            "--database-wait", "2s", "--postgresql-connect-timeout", "1s",
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        server.start()
    assert done.returncode == 1, done.stderr
    assert 2 <= took < 15, took
    lines = done.stderr.splitlines()
    (last,) = [line for line in lines if not line.startswith("{")]
    assert last == lines[-1]
    assert last.startswith("openwop-memory: cannot start: cannot reach the PostgreSQL server")
    assert "database_wait" in last and "waited" in last
    attempts = [json.loads(line) for line in lines[:-1]]
    assert len(attempts) >= 2
    assert {a["event"] for a in attempts} == {"database_waiting"}


def test_a_sidecar_without_network_points_at_the_drop_in(workdir: Path) -> None:
    """As under the shipped unit (PrivateNetwork=yes: a network namespace with no route):
    the line names what refused the connection, and the page with the drop-in."""
    if os.geteuid() != 0:
        pytest.fail("a network namespace of its own needs root, as CI has")
    done = subprocess.run(
        ["unshare", "--net", EXE, "serve", "--socket", str(workdir / "s.sock"),
         "--database", f"postgresql://memory:{PASSWORD}@192.0.2.10/memory",
         "--database-wait", "0s"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot reach the PostgreSQL server (OSError: Network is unreachable)" in line
    assert "this host refused the connection itself" in line
    assert "PostgreSQL drop-in (see systemd/README.md)" in line
    assert PASSWORD not in line and "192.0.2.10" not in line
