"""Prometheus metrics: the page a real sidecar serves over HTTP and over its socket, parsed
with ``prometheus_client``'s own parser; counters that move as requests are sent."""

from __future__ import annotations

import http.client
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from openwop_memory.service.stats import LATENCY_BUCKETS, Stats
from prometheus_client.parser import text_string_to_metric_families
from support.disguises import fullwidth
from support.polling import eventually, wait_for
from support.protocol import begin, issue, put
from support.sidecar import RawClient, Sidecar, run_cli

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# A listener whose every scrape makes the page: these tests read counters right after
# moving them (the default serves the page made up to a second before).
FRESH_PAGES = ("--metrics-address", "127.0.0.1:0", "--metrics-render-interval", "0")


def samples(text: str) -> Samples:
    """Every sample of a metrics page by (name, sorted labels); the parser rejects a page
    that is not valid exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        conn.close()


def metrics_port(sidecar: Sidecar) -> int:
    (line,) = sidecar.events("metrics_listening")
    return int(str(line["address"]).rpartition(":")[2])


def begin_and_put(client: RawClient, n: int) -> None:
    ref = issue(client, "t-metrics", "a")
    begin(client, "r-metrics", "t-metrics")
    for i in range(n):
        put(client, "r-metrics", ref, f"n{i}")


def test_the_size_gauges_and_the_start_up_line_count_exactly(workdir: Path) -> None:
    """Seven entries in three scopes, two deleted: five live entries and three scopes, on
    the page and in ``database_opened`` after a restart (SQLite counts; PostgreSQL's
    figures are its planner's, named as estimates, and the line says whether it holds any
    entry at all)."""
    args = ("--metrics-address", "127.0.0.1:0")
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as client:
        begin(client, "r-sizes", "t-sizes")
        refs = [issue(client, "t-sizes", agent) for agent in ("a", "b", "c")]
        written = [put(client, "r-sizes", refs[i % 3], f"entry {i}") for i in range(7)]
        for entry, ref in ((written[0], refs[0]), (written[4], refs[1])):
            assert client.call("memory.delete", runId="r-sizes", memoryRef=ref, id=entry["id"])
        page = samples(scrape(metrics_port(sidecar))[2])
    with Sidecar(workdir, *args, database=sidecar.database) as again:
        (opened,) = again.events("database_opened")
        reopened = samples(scrape(metrics_port(again))[2])
    if sidecar.backend.name == "sqlite":
        for figures in (page, reopened):
            assert figures[("openwop_memory_entries", ())] == 5
            assert figures[("openwop_memory_scopes", ())] == 3
            assert ("openwop_memory_scopes_estimate", ()) not in figures
        assert (opened["entries"], opened["scopes"]) == (5, 3)
    else:
        assert ("openwop_memory_entries", ()) not in page
        assert opened["holds_entries"] is True and "entries" not in opened


def test_the_http_page_counts_requests_and_serves_nothing_else(workdir: Path) -> None:
    with Sidecar(workdir, *FRESH_PAGES) as sidecar:
        port = metrics_port(sidecar)
        status, content_type, text = scrape(port)
        assert status == 200
        assert content_type.startswith("text/plain; version=0.0.4")
        before = samples(text)
        assert before[("openwop_memory_storage_up", ())] == 1
        assert ("process_resident_memory_bytes", ()) in before
        with sidecar.client() as client:
            begin_and_put(client, 5)
            client.call("memory.get", runId="r-metrics", memoryRef="nowhere", id="mem_x")
            assert client.error("memory.get", runId="r-metrics").code == "validation_error"
        after = samples(scrape(port)[2])
        put_ok = ("openwop_memory_requests_total", (("method", "memory.put"), ("outcome", "ok")))
        assert after[put_ok] - before.get(put_ok, 0) == 5
        invalid = (
            "openwop_memory_requests_total",
            (("method", "memory.get"), ("outcome", "validation_error")),
        )
        assert after[invalid] == 1
        count = ("openwop_memory_request_duration_seconds_count", (("method", "memory.put"),))
        inf = (
            "openwop_memory_request_duration_seconds_bucket",
            (("le", "+Inf"), ("method", "memory.put")),
        )
        assert after[count] == after[inf] == 5
        assert after[("openwop_memory_database_bytes", ())] > 0
        if sidecar.backend.name == "sqlite":
            assert after[("openwop_memory_committed_writes_total", ())] >= 5
            assert after[("openwop_memory_commits_total", ())] >= 1
            assert after[("openwop_memory_entries", ())] == 5
            assert after[("openwop_memory_scopes", ())] == 1
            assert ("openwop_memory_entries_estimate", ()) not in after
        assert after[("openwop_memory_open_runs", ())] == 1
        # Nothing but /metrics, and only to read it.
        assert scrape(port, "/")[0] == 404
        assert scrape(port, "/metrics/../admin")[0] == 404
        assert scrape(port, method="POST")[0] == 405
        status, _, head_body = scrape(port, method="HEAD")
        assert (status, head_body) == (200, "")


def raw_exchange(port: int, data: bytes, half_close: bool = False) -> bytes:
    """Send ``data`` as it is to the metrics listener; everything it answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(data)
        if half_close:
            conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


BAD_REQUEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 12\r\nConnection: close\r\n\r\nbad request\n"
)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "head",
    [
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        b"GET /metrics FTP/1.0\r\n\r\n",
        b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"x" * 9000,  # over the head cap, unended
    ],
    ids=["two-parts", "four-parts", "not-http", "empty-line", "head-over-cap"],
)
def test_a_malformed_request_head_gets_400_and_the_listener_keeps_serving(
    workdir: Path, head: bytes
) -> None:
    with Sidecar(workdir, *FRESH_PAGES) as sidecar:
        port = metrics_port(sidecar)
        assert raw_exchange(port, head) == BAD_REQUEST
        # A scraper that leaves before ending its head gets nothing, and harms nothing.
        assert raw_exchange(port, b"GET /metrics HTTP/1.1\r\n", half_close=True) == b""
        status, _, text = scrape(port)
        assert status == 200 and ("openwop_memory_storage_up", ()) in samples(text)


def test_no_label_carries_a_tenant_a_run_or_content(workdir: Path) -> None:
    with Sidecar(workdir, *FRESH_PAGES) as sidecar:
        with sidecar.client() as client:
            begin_and_put(client, 2)
        text = scrape(metrics_port(sidecar))[2]
    assert "t-metrics" not in text and "r-metrics" not in text and "n1" not in text
    labels = {name for (_, pairs) in samples(text) for name, _ in pairs}
    assert labels <= {"method", "outcome", "le", "version", "kind"}


@pytest.mark.backend_independent
def test_the_cli_prints_the_page_over_the_socket(sidecar: Sidecar) -> None:
    with sidecar.client() as client:
        begin_and_put(client, 3)
    out = run_cli("metrics", "--socket", str(sidecar.socket))
    assert out.returncode == 0, out.stderr
    parsed = samples(out.stdout)
    assert (
        parsed[("openwop_memory_requests_total", (("method", "memory.put"), ("outcome", "ok")))]
        == 3
    )
    with sidecar.client() as client:
        answer: Any = client.call("sidecar.metrics")
    assert answer["contentType"].startswith("text/plain; version=0.0.4")
    assert samples(answer["text"])


@pytest.mark.backend_independent
def test_the_cli_says_when_nothing_answers(workdir: Path) -> None:
    out = run_cli("metrics", "--socket", str(workdir / "none.sock"), "--timeout", "1")
    assert out.returncode == 2
    assert out.stderr.startswith("openwop-memory: no metrics from ")


@pytest.mark.backend_independent
def test_a_taken_metrics_address_stops_the_start_and_leaves_no_socket(workdir: Path) -> None:
    with Sidecar(workdir, "--metrics-address", "127.0.0.1:0") as first:
        taken = f"127.0.0.1:{metrics_port(first)}"
        second = Sidecar(workdir, "--metrics-address", taken, socket_path=workdir / "second.sock")
        with pytest.raises(RuntimeError, match=r"cannot listen for metrics on 127\.0\.0\.1:"):
            second.start()
        assert not (workdir / "second.sock").exists()


@pytest.mark.backend_independent
@pytest.mark.parametrize("address", ["9464", "localhost", ":9464", "127.0.0.1:99999"])
def test_a_malformed_metrics_address_is_refused(workdir: Path, address: str) -> None:
    out = run_cli("serve", "--socket", str(workdir / "s.sock"), "--metrics-address", address)
    assert out.returncode == 1
    assert "metrics_address" in out.stderr and "host:port" in out.stderr


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, 0), (0.0001, 0), (0.00010001, 1), (1.0, 12), (10.0, 15), (11.0, 16)],
)
def test_a_duration_lands_in_the_first_bucket_that_holds_it(seconds: float, bucket: int) -> None:
    stats = Stats()
    stats.observe("memory.get", "ok", seconds)
    counts = stats.latency["memory.get"].buckets
    assert len(counts) == len(LATENCY_BUCKETS) + 1
    assert counts[bucket] == 1 and sum(counts) == 1
    assert stats.requests["memory.get"]["ok"] == 1


@pytest.mark.backend_independent
def test_an_empty_metrics_address_is_no_listener() -> None:
    from openwop_memory.config import load_settings

    assert load_settings({"metrics_address": ""}, environ={}).metrics_address is None
    address = load_settings({}, environ={"OPENWOP_MEMORY_METRICS_ADDRESS": "127.0.0.1:9"})
    assert address.metrics_address == "127.0.0.1:9"


def kinds(page: Samples, name: str, label: str = "kind") -> dict[str, float]:
    """The samples of one labelled counter by its label's value."""
    return {dict(labels)[label]: v for (n, labels), v in page.items() if n == name}


def test_redactions_refusals_and_commit_batches_are_counted_by_kind(workdir: Path) -> None:
    secret = "hunter2-open-sesame"
    token = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"  # a GitHub token's format, no run's secret
    sidecar = Sidecar(workdir, "--redaction", "reject-disguised")
    with sidecar, sidecar.client() as client:
        ref = issue(client, "t-kinds", "a")
        begin(client, "r-kinds", "t-kinds", secrets=[{"id": "pw", "value": secret}])
        put(client, "r-kinds", ref, f"plain {secret} and again {secret}")
        put(client, "r-kinds", ref, f"a token {token}")
        refused = client.error(
            "memory.put",
            runId="r-kinds",
            memoryRef=ref,
            entry={"content": "disguised " + fullwidth(secret)},
        )
        assert refused.code == "secret_leakage"
        page = samples(client.call("sidecar.metrics")["text"])
    # Once per secret and field, however often the field holds it.
    assert kinds(page, "openwop_memory_redactions_total") == {"secret": 1, "pattern": 1}
    assert kinds(page, "openwop_memory_refusals_total") == {"disguised": 1}
    assert "openwop_memory_host_secrets_reloads_total" not in {n for n, _ in page}, "no dir"
    if sidecar.backend.name == "sqlite":
        count = page[("openwop_memory_commit_batch_size_count", ())]
        assert count == page[("openwop_memory_commits_total", ())] >= 1
        total = page[("openwop_memory_commit_batch_size_sum", ())]
        assert total == page[("openwop_memory_committed_writes_total", ())] >= 3
        assert page[("openwop_memory_commit_batch_size_bucket", (("le", "+Inf"),))] == count


def test_host_secret_reloads_and_sweeps_are_counted(workdir: Path) -> None:
    secrets = workdir / "secrets"
    secrets.mkdir()
    args = ["--secrets-dir", str(secrets), "--secrets-poll-interval", "1h"]
    args += ["--sweep-interval", "0.2", "--replay-retention", "0.5"]
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as client:
        sidecar.signal(signal.SIGHUP)
        wait_for(lambda: bool(sidecar.events("host_secrets_reload")), 10, "the first reload")
        (secrets / "api").write_text("a-host-secret-value\n")
        sidecar.signal(signal.SIGHUP)
        wait_for(lambda: len(sidecar.events("host_secrets_reload")) == 2, 10, "the second")
        ref = issue(client, "t-sweep", "a")
        begin(client, "r-sweep", "t-sweep")
        put(client, "r-sweep", ref, "kept", idempotencyKey="once")
        client.call("run.end", runId="r-sweep")

        def swept() -> Samples | None:
            page = samples(client.call("sidecar.metrics")["text"])
            done = page[("openwop_memory_expired_snapshots_total", ())] >= 1
            return (
                page
                if done and page[("openwop_memory_purged_idempotency_keys_total", ())]
                else None
            )

        page = eventually(swept, timeout=20)
    reloads = kinds(page, "openwop_memory_host_secrets_reloads_total", "outcome")
    assert reloads == {"unchanged": 1, "changed": 1}
    assert ("openwop_memory_purged_run_markers_total", ()) in page
