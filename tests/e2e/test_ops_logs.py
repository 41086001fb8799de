"""The log during a PostgreSQL outage: one line per event in the configured format, the
driver's own (standard library) logging included, no traceback, and the outage itself named
at ``error`` so that ``--log-level error`` still shows it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.backends import Backend
from support.polling import wait_for
from support.postgres import PostgresServer
from support.sidecar import Sidecar

pytestmark = pytest.mark.backend_independent

# What a Python traceback's lines start with (a raw one, or one a renderer pretty-printed).
TRACEBACK_MARKS = ("Traceback (most recent call last)", '  File "', "    raise ", "During handling")


def _outage_log(workdir: Path, *args: str) -> list[str]:
    """The lines a sidecar wrote (stderr and stdout) while its server was down ~2.5 s."""
    with PostgresServer() as server:
        url = server.create_database("outage")
        backend = Backend("outage", lambda _path: url)
        timeouts = ("--postgresql-command-timeout", "1s", "--postgresql-connect-timeout", "1s")
        with Sidecar(workdir, *timeouts, *args, backend=backend) as sidecar:
            with sidecar.client() as c:
                c.call("run.begin", runId="r", tenant="t")
                c.call("memory.put", runId="r", memoryRef="scope", entry={"content": "x"})
                server.stop("immediate")
                codes = []
                deadline = time.monotonic() + 2.5
                while time.monotonic() < deadline:
                    codes.append(c.error("memory.list", runId="r", memoryRef="scope").code)
                    time.sleep(0.2)
                assert len(codes) >= 3 and set(codes) == {"upstream_unavailable"}
                server.start()
                wait_for(sidecar.ready, 20, "the sidecar serving again")
            assert sidecar.stop() == 0
            return sidecar.log().splitlines()


@pytest.mark.parametrize("level", ["info", "error"])
def test_an_outage_logs_json_lines_only(workdir: Path, level: str) -> None:
    lines = _outage_log(workdir, "--log-level", level)
    assert lines
    parsed = []
    for line in lines:
        assert not line.startswith(TRACEBACK_MARKS), line
        parsed.append(json.loads(line))  # every line is one JSON object
    assert all(isinstance(p, dict) for p in parsed)
    (outage,) = [p for p in parsed if p["event"] == "database_unreachable"]
    assert outage["level"] == "error"
    assert outage["error"].split(":")[0].split()[0] in {
        "ConnectionRefusedError",
        "ConnectionDoesNotExistError",
        "ConnectionResetError",
        "FileNotFoundError",
        "TimeoutError",
    }, outage
    if level == "info":
        # asyncpg's pool, through the standard library: its line, with the exception
        # summed up in one field.
        driver = [p for p in parsed if p.get("logger", "").startswith("asyncpg")]
        assert driver, parsed
        assert all("\n" not in p.get("error", "") for p in driver)
        assert any(p.get("error") for p in driver), driver
        assert [p for p in parsed if p["event"] == "database_reachable"]
    else:
        assert {p["level"] for p in parsed} == {"error"}


def test_an_outage_logs_console_lines_without_tracebacks(workdir: Path) -> None:
    lines = _outage_log(workdir, "--log-format", "console", "--log-level", "info")
    assert any("database_unreachable" in line for line in lines)
    assert any("asyncpg" in line for line in lines), lines
    for line in lines:
        assert not line.startswith(TRACEBACK_MARKS), line
        assert not line.startswith("{"), line


# A dependency's record with content in its message's later lines and in its exception,
# logged through the standard library by a process set up as `serve` sets itself up.
_FOREIGN_RECORD = """
import asyncpg, logging
from openwop_memory.logs import configure_logging
configure_logging("json", "info")
try:
    raise ValueError("the entry said SECRET-1")
except ValueError:
    logging.getLogger("asyncio").error(
        "Task exception was never retrieved\\nfuture: <Task exception=ValueError('SECRET-2')>",
        exc_info=True,
    )
exc = asyncpg.exceptions.UniqueViolationError("Key (k)=(SECRET-3) already exists")
logging.getLogger("asyncpg.pool").warning("a failure", exc_info=exc)
refused = ConnectionRefusedError(111, "Connection refused")
logging.getLogger("asyncpg.pool").warning("refused", exc_info=refused)
"""


def test_a_dependency_s_exception_is_one_field_without_its_content() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _FOREIGN_RECORD], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 3, lines
    assert "SECRET" not in done.stderr
    first, second, third = map(json.loads, lines)
    assert (first["event"], first["logger"], first["level"]) == (
        "Task exception was never retrieved", "asyncio", "error",
    )  # fmt: skip
    assert first["error"] == "ValueError"
    assert second["error"] == "UniqueViolationError (23505)"
    assert third["error"] == "ConnectionRefusedError: Connection refused"
