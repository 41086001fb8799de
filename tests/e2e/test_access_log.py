"""Which requests get a log line, and what it holds: :class:`AccessLog` against an in-memory
stream and a hand-moved clock, then a real sidecar with its default settings."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from openwop_memory.logs import JsonSink
from openwop_memory.wire.access_log import (
    CLIENT_ERROR_LINES_PER_SECOND,
    MAX_LOGGED_ID_CHARS,
    AccessLog,
)
from support.sidecar import Sidecar


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    *, every: bool = False, slow_after: float = 0.5, level: int = logging.INFO
) -> tuple[AccessLog, io.BytesIO, Clock]:
    stream, clock = io.BytesIO(), Clock()
    log = AccessLog(
        every_request=every, slow_after=slow_after, sink=JsonSink(stream, level), clock=clock
    )
    return log, stream, clock


def lines(stream: io.BytesIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def record(log: AccessLog, method: str, outcome: str, seconds: float, rpc_id: object = 1) -> None:
    """What the dispatcher does at the end of a request."""
    if log.wants(outcome, seconds):
        log.write(method, outcome, seconds, rpc_id)


@pytest.mark.backend_independent
def test_a_quick_success_gets_no_line_unless_the_access_log_is_on() -> None:
    quiet, quiet_out, _ = make()
    record(quiet, "memory.get", "ok", 0.0001)
    record(quiet, "memory.get", "cancelled", 0.0001)
    assert quiet_out.getvalue() == b""
    loud, loud_out, _ = make(every=True)
    record(loud, "memory.get", "ok", 0.0001, rpc_id="abc")
    record(loud, "memory.get", "cancelled", 0.0001, rpc_id=None)
    first, second = lines(loud_out)
    assert first["event"] == "request" and first["level"] == "info"
    assert (first["method"], first["outcome"], first["id"]) == ("memory.get", "ok", "abc")
    assert first["duration_ms"] == 0.1
    assert first["timestamp"].endswith("Z")
    assert "slow" not in first and "suppressed" not in first
    assert second["outcome"] == "cancelled" and "id" not in second


@pytest.mark.backend_independent
def test_a_slow_request_is_a_warning_whatever_the_access_log_says() -> None:
    log, out, _ = make(slow_after=0.25)
    record(log, "memory.list", "ok", 0.2499)
    record(log, "memory.list", "ok", 0.25, rpc_id=7)
    [line] = lines(out)
    assert (line["level"], line["slow"], line["id"], line["duration_ms"]) == (
        "warning",
        True,
        7,
        250.0,
    )
    off, off_out, _ = make(slow_after=0)  # 0: nothing is slow
    record(off, "memory.list", "ok", 3600.0)
    assert off_out.getvalue() == b""


@pytest.mark.backend_independent
def test_server_errors_are_warnings_and_never_rate_limited() -> None:
    log, out, _ = make()
    for _ in range(3 * CLIENT_ERROR_LINES_PER_SECOND):
        record(log, "memory.put", "upstream_unavailable", 0.001)
        record(log, "memory.get", "internal_error", 0.001)
    written = lines(out)
    assert len(written) == 6 * CLIENT_ERROR_LINES_PER_SECOND
    assert {line["level"] for line in written} == {"warning"}


@pytest.mark.backend_independent
def test_client_errors_are_capped_per_second_and_the_gap_is_counted() -> None:
    log, out, clock = make()
    for _ in range(CLIENT_ERROR_LINES_PER_SECOND + 25):
        log.write("-", "validation_error", 0.00001, None, -32700)
    written = lines(out)
    assert len(written) == CLIENT_ERROR_LINES_PER_SECOND
    assert all(line["rpc_code"] == -32700 and line["level"] == "info" for line in written)
    assert "suppressed" not in written[-1]
    clock.now += 0.5  # the same second: still capped
    record(log, "memory.get", "not_found", 0.001)
    assert len(lines(out)) == CLIENT_ERROR_LINES_PER_SECOND
    clock.now += 0.5  # the next second: lines again, the first one counting the gap
    record(log, "memory.get", "forbidden", 0.001)
    record(log, "memory.get", "forbidden", 0.001)
    *_, gap, after = lines(out)
    assert gap["outcome"] == "forbidden" and gap["suppressed"] == 26
    assert "suppressed" not in after


@pytest.mark.backend_independent
def test_a_server_error_line_reports_client_lines_left_out() -> None:
    log, out, _ = make()
    for _ in range(CLIENT_ERROR_LINES_PER_SECOND + 3):
        record(log, "memory.put", "validation_error", 0.001)
    record(log, "memory.put", "internal_error", 0.001)
    assert lines(out)[-1]["suppressed"] == 3


@pytest.mark.backend_independent
def test_a_long_string_id_is_cut_and_other_ids_are_left_out() -> None:
    log, out, _ = make(every=True)
    record(log, "m", "ok", 0.0, rpc_id="x" * 10_000)
    record(log, "m", "ok", 0.0, rpc_id=["not", "an", "id"])
    record(log, "m", "ok", 0.0, rpc_id=None)
    first, *rest = lines(out)
    assert first["id"] == "x" * MAX_LOGGED_ID_CHARS
    assert all("id" not in line for line in rest)


@pytest.mark.backend_independent
def test_lines_below_the_log_level_are_dropped() -> None:
    log, out, _ = make(every=True, slow_after=0.1, level=logging.WARNING)
    record(log, "memory.get", "ok", 0.01)
    record(log, "memory.get", "validation_error", 0.01)
    record(log, "memory.get", "ok", 0.2)
    [line] = lines(out)
    assert line["slow"] is True


# -- a real sidecar ----------------------------------------------------------------------------


def test_by_default_only_failed_requests_are_logged_but_all_are_counted(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar, sidecar.client() as client:
        for _ in range(5):
            assert client.call("sidecar.health")["status"] == "ok"
        client.error("memory.get", runId="never-begun", memoryRef="ref", id="e")
        garbage = client.raw(b"{not json")
        assert garbage["error"]["data"]["error"] == "validation_error"
        stats = client.call("sidecar.stats")["requests"]
        assert sidecar.stop() == 0
    assert stats["sidecar.health"]["ok"] >= 5
    assert stats["memory.get"] == {"not_found": 1}
    assert stats["-"] == {"validation_error": 1}
    logged = [(line["method"], line["outcome"]) for line in sidecar.events("request")]
    assert logged == [("memory.get", "not_found"), ("-", "validation_error")]
    assert sidecar.events("request")[0]["id"] == client.next_id - 1  # before sidecar.stats


def test_a_slow_request_threshold_logs_every_slower_request(workdir: Path) -> None:
    # One microsecond: every request takes longer.
    with Sidecar(workdir, "--slow-request-threshold", "0.000001") as sidecar:
        with sidecar.client() as client:
            client.call("host.capabilities")
            client.call("sidecar.health")
        assert sidecar.stop() == 0
    # The readiness probe's health calls are slower than that too: every line is logged.
    lines = sidecar.events("request")
    methods = [line["method"] for line in lines]
    assert methods.count("host.capabilities") == 1
    assert methods[-1] == "sidecar.health" and methods.count("sidecar.health") >= 2
    assert all(line["slow"] is True and line["level"] == "warning" for line in lines)


def test_a_storm_of_malformed_lines_gets_few_log_lines(workdir: Path) -> None:
    storm = 300
    with Sidecar(workdir) as sidecar, sidecar.client(timeout=30) as client:
        client.sock.sendall(b"{garbage\n" * storm)
        for _ in range(storm):
            assert client.read()["error"]["data"]["error"] == "validation_error"
        stats = client.call("sidecar.stats")["requests"]
        assert sidecar.stop() == 0
    assert stats["-"]["validation_error"] == storm
    # Ten a second: the storm is answered within a second or two.
    assert len(sidecar.events("request")) <= 3 * CLIENT_ERROR_LINES_PER_SECOND


@pytest.mark.backend_independent
def test_the_settings_read_from_every_source() -> None:
    from openwop_memory.config import ConfigError, load_settings

    default = load_settings({}, environ={})
    assert (default.access_log, default.slow_request_threshold) == (False, 0.5)
    env = {"OPENWOP_MEMORY_ACCESS_LOG": "true", "OPENWOP_MEMORY_SLOW_REQUEST_THRESHOLD": "2s"}
    from_env = load_settings({}, environ=env)
    assert (from_env.access_log, from_env.slow_request_threshold) == (True, 2.0)
    flags = load_settings({"access_log": "false", "slow_request_threshold": "0"}, environ=env)
    assert (flags.access_log, flags.slow_request_threshold) == (False, 0.0)
    with pytest.raises(ConfigError, match="slow_request_threshold"):
        load_settings({"slow_request_threshold": "-1"}, environ={})


@pytest.mark.backend_independent
def test_without_a_json_sink_the_line_goes_through_structlog() -> None:
    """Console logs (or none configured): the same fields, through structlog's chain."""
    from openwop_memory.logs import json_sink
    from structlog.testing import capture_logs

    assert json_sink() is None  # this process never configured JSON logs
    log = AccessLog(every_request=True, slow_after=1.0)
    with capture_logs() as captured:
        record(log, "memory.get", "ok", 0.002, rpc_id=3)
        record(log, "memory.put", "internal_error", 0.001, rpc_id=None)
    assert [(c["event"], c["log_level"], c["method"], c["outcome"]) for c in captured] == [
        ("request", "info", "memory.get", "ok"),
        ("request", "warning", "memory.put", "internal_error"),
    ]
    assert captured[0]["id"] == 3 and captured[0]["duration_ms"] == 2.0


def test_a_refused_leak_names_its_tenant_run_and_secret_ids_never_the_value(
    workdir: Path,
) -> None:
    value = "sk-live-9f8e7d6c5b4a39281706"
    with Sidecar(workdir, "--redaction", "reject") as sidecar, sidecar.client() as client:
        ref = client.call("memory.issueRef", tenant="t-corr", agent="a")["memoryRef"]
        client.call("run.begin", runId="r-corr", tenant="t-corr", secrets=[
            {"id": "stripe-key", "value": value}
        ])  # fmt: skip
        error = client.error(
            "memory.put", runId="r-corr", memoryRef=ref, entry={"content": f"key {value}"}
        )
        assert error.code == "secret_leakage"
        client.error("memory.get", runId="r-unknown", memoryRef=ref, id="mem_x")
        assert sidecar.stop() == 0
    leak, unknown = sidecar.events("request")
    assert (leak["method"], leak["outcome"]) == ("memory.put", "secret_leakage")
    assert (leak["run_id"], leak["tenant"]) == ("r-corr", "t-corr")
    assert leak["secret_ids"] == ["stripe-key"]
    # A run that is not open here: its id is known, its tenant is not.
    assert unknown["run_id"] == "r-unknown" and "tenant" not in unknown
    assert value not in sidecar.log()
