"""Settings sources and the command line, observed through the real executable.

Effective values are read back through behaviour: ``host.capabilities`` shows
``max_entry_size_bytes``, a request line of exactly the cap (and one byte more) shows
``max_request_bytes``, and a put carrying a secret shows the redaction policy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openwop_memory import __version__
from openwop_memory.config import (
    DEPRECATED,
    GROUPS,
    ConfigError,
    host_and_port,
    load_settings,
    setting_fields,
)
from openwop_memory.storage.sqlite.settings import SqliteSettings
from support.sidecar import EXE, RawClient, Sidecar, run_cli

# What this module tests sits above storage (connections, listeners, settings, keyrings,
# redaction): the PostgreSQL pass of `make test` would run it again for nothing.
pytestmark = pytest.mark.backend_independent

TENANT = "tenant-config"
SECRET = "config-test-secret-value"


def health_line(rid: str, size: int) -> bytes:
    """A valid ``sidecar.health`` request exactly ``size`` bytes long (without its newline)."""
    line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "sidecar.health", "params": {}})
    assert len(line) <= size
    return line.encode().ljust(size)  # JSON allows trailing whitespace


def effective_request_cap_is(client: RawClient, cap: int) -> None:
    at_cap = client.raw(health_line("at-cap", cap))
    assert at_cap.get("id") == "at-cap" and at_cap["result"]["status"] == "ok", at_cap
    over = client.raw(health_line("over-cap", cap + 1))
    assert over["id"] is None
    assert over["error"]["code"] == -32600
    assert over["error"]["data"]["error"] == "validation_error"
    assert client.call("sidecar.health")["status"] == "ok"  # the connection stays usable


def effective_entry_size_is(client: RawClient, size: int) -> None:
    caps = client.call("host.capabilities")["capabilities"]
    assert caps["memory"]["maxEntrySizeBytes"] == size
    ref = client.call("memory.issueRef", tenant=TENANT, agent="agent")["memoryRef"]
    client.call("run.begin", runId="sizes", tenant=TENANT)
    fits = client.call("memory.put", runId="sizes", memoryRef=ref, entry={"content": "s" * size})
    assert len(fits["content"]) == size
    err = client.error(
        "memory.put", runId="sizes", memoryRef=ref, entry={"content": "s" * (size + 1)}
    )
    assert err.code == "validation_error"


def effective_redaction_is(client: RawClient, policy: str) -> None:
    ref = client.call("memory.issueRef", tenant=TENANT, agent="agent")["memoryRef"]
    secrets = [{"id": "k", "value": SECRET}]
    client.call("run.begin", runId="redaction", tenant=TENANT, secrets=secrets)
    response = client.request(
        "memory.put", {"runId": "redaction", "memoryRef": ref, "entry": {"content": SECRET}}
    )
    if policy == "reject":
        assert response["error"]["data"]["error"] == "secret_leakage"
    else:
        assert response["result"]["content"] == "[REDACTED:k]"


TOML_LAYER = """
max_entry_size_bytes = 1000
max_request_bytes = 2048
redaction = "reject"
socket = "{toml_socket}"
"""
ENV_LAYER = {
    "OPENWOP_MEMORY_MAX_ENTRY_SIZE_BYTES": "2000",
    "OPENWOP_MEMORY_MAX_REQUEST_BYTES": "4096",
    "OPENWOP_MEMORY_REDACTION": "rewrite",
}
FLAG_LAYER = (
    *("--max-entry-size-bytes", "3000"),
    *("--max-request-bytes", "8192"),
    *("--redaction", "reject"),
)


@pytest.mark.parametrize(
    ("layers", "entry_size", "request_cap", "redaction"),
    [
        ("toml", 1000, 2048, "reject"),
        ("toml+env", 2000, 4096, "rewrite"),
        ("toml+env+flags", 3000, 8192, "reject"),
        ("env+flags", 3000, 8192, "reject"),
    ],
)
def test_flags_beat_env_beat_toml(
    workdir: Path, layers: str, entry_size: int, request_cap: int, redaction: str
) -> None:
    toml_socket = workdir / "from-toml.sock"
    env_socket = workdir / "from-env.sock"
    config = workdir / "settings.toml"
    config.write_text(TOML_LAYER.format(toml_socket=toml_socket))
    env: dict[str, str] = {}
    args: list[str] = []
    if "toml" in layers:
        if "env" in layers:
            env["OPENWOP_MEMORY_CONFIG"] = str(config)  # the file named by the environment
        else:
            args += ["--config", str(config)]
    if "env" in layers:
        env.update(ENV_LAYER, OPENWOP_MEMORY_SOCKET=str(env_socket))
    if "flags" in layers:
        args += FLAG_LAYER
    # Sidecar always passes --socket, which must win over the TOML and env sockets.
    with Sidecar(workdir, *args, env=env) as sidecar, sidecar.client() as client:
        effective_request_cap_is(client, request_cap)
        effective_entry_size_is(client, entry_size)
        effective_redaction_is(client, redaction)
        assert not toml_socket.exists() and not env_socket.exists()


def test_a_flag_overrides_an_invalid_env_value(workdir: Path) -> None:
    env = {"OPENWOP_MEMORY_REDACTION": "maybe", "OPENWOP_MEMORY_DRAIN_TIMEOUT": "soon"}
    args = ("--redaction", "reject", "--drain-timeout", "5s")
    with Sidecar(workdir, *args, env=env) as sidecar, sidecar.client() as client:
        effective_redaction_is(client, "reject")


BAD_SETTINGS: list[tuple[str, tuple[str, ...], dict[str, str], str | None, tuple[str, ...]]] = [
    # (id, flags, env, TOML text, what the message must name); "{config}" is the TOML path
    ("env-bad-int", (), {"OPENWOP_MEMORY_MAX_REQUEST_BYTES": "lots"}, None,
     ("max_request_bytes", "OPENWOP_MEMORY_MAX_REQUEST_BYTES")),
    ("toml-unknown-key", (), {}, "max_requests_bytes = 4096\n",
     ("max_requests_bytes", "{config}")),
    ("toml-wrong-type", (), {}, 'max_entry_size_bytes = "big"\n',
     ("max_entry_size_bytes", "{config}")),
    ("flag-bad-duration", ("--drain-timeout", "10 minutes"), {}, None,
     ("drain_timeout", "--drain-timeout")),
    ("toml-bad-duration", (), {}, 'sweep_interval = "5 fortnights"\n',
     ("sweep_interval", "{config}")),
    ("env-bad-duration", (), {"OPENWOP_MEMORY_BUSY_TIMEOUT": "-5s"}, None,
     ("busy_timeout", "OPENWOP_MEMORY_BUSY_TIMEOUT")),
    ("flag-zero-duration", ("--drain-timeout", "0"), {}, None,
     ("drain_timeout", "--drain-timeout")),
    ("flag-bad-socket-mode", ("--socket-mode", "0999"), {}, None,
     ("socket_mode", "--socket-mode")),
    ("env-bad-socket-mode", (), {"OPENWOP_MEMORY_SOCKET_MODE": "rw-rw----"}, None,
     ("socket_mode", "OPENWOP_MEMORY_SOCKET_MODE")),
    ("env-bad-redaction", (), {"OPENWOP_MEMORY_REDACTION": "mask"}, None,
     ("redaction", "OPENWOP_MEMORY_REDACTION")),
    ("toml-bad-redaction", (), {}, 'redaction = "off"\n',
     ("redaction", "{config}")),
    ("env-bad-credential-patterns", (), {"OPENWOP_MEMORY_CREDENTIAL_PATTERNS": "mask"}, None,
     ("credential_patterns", "OPENWOP_MEMORY_CREDENTIAL_PATTERNS")),
    ("flag-zero-secrets-poll-interval", ("--secrets-poll-interval", "0"), {}, None,
     ("secrets_poll_interval", "--secrets-poll-interval")),
    ("flag-bad-database-scheme", ("--database", "mysql://memory@localhost/memory"), {}, None,
     ("database", "--database")),
    ("flag-retention-not-twice-sweep", ("--replay-retention", "100s", "--sweep-interval", "60s"),
     {}, None, ("replay_retention", "--replay-retention")),
    ("env-retention-not-twice-sweep", (), {"OPENWOP_MEMORY_REPLAY_RETENTION": "2m"}, None,
     ("replay_retention", "OPENWOP_MEMORY_REPLAY_RETENTION")),
    ("toml-syntax-error", (), {}, "max_request_bytes = \n", ("{config}",)),
    ("toml-bad-sqlite-value", (), {}, '[sqlite]\nbusy_timeout = "soon"\n',
     ("sqlite.busy_timeout", "{config}")),
    ("toml-unknown-sqlite-key", (), {}, '[sqlite]\nsynchronus = "FULL"\n',
     ("sqlite.synchronus", "{config}")),
    ("toml-sqlite-not-a-table", (), {}, 'sqlite = "fast"\n', ("sqlite", "{config}")),
    ("flag-bad-sqlite-read-connections", ("--sqlite-read-connections", "0"), {}, None,
     ("sqlite.read_connections", "--sqlite-read-connections")),
    ("env-bad-sqlite-synchronous", (), {"OPENWOP_MEMORY_SQLITE_SYNCHRONOUS": "OFF"}, None,
     ("sqlite.synchronous", "OPENWOP_MEMORY_SQLITE_SYNCHRONOUS")),
    ("old-and-new-spelling", ("--synchronous", "FULL"),
     {"OPENWOP_MEMORY_SQLITE_SYNCHRONOUS": "FULL"}, None,
     ("sqlite.synchronous", "--synchronous", "OPENWOP_MEMORY_SQLITE_SYNCHRONOUS")),
    ("old-and-new-spelling-in-toml", (), {},
     'busy_timeout = "1s"\n[sqlite]\nbusy_timeout = "2s"\n',
     ("sqlite.busy_timeout", "busy_timeout (from config file {config})")),
    ("postgresql-unreachable",
     ("--database", "postgresql://memory@/memory?host=/nonexistent",
      "--postgresql-connect-timeout", "1s", "--database-wait", "0s"),
     {}, None, ("cannot reach the PostgreSQL server", "check that the server is up")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "env", "toml", "needles"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_SETTINGS],
)
def test_bad_setting_fails_start_naming_it_and_its_source(
    workdir: Path,
    flags: tuple[str, ...],
    env: dict[str, str],
    toml: str | None,
    needles: tuple[str, ...],
) -> None:
    socket_path = workdir / "memory.sock"
    database = workdir / "memory.db"
    config = workdir / "settings.toml"
    args = ["serve", "--socket", str(socket_path), "--database", f"sqlite:///{database}"]
    if toml is not None:
        config.write_text(toml)
        args += ["--config", str(config)]
    result = run_cli(*args, *flags, env=env)
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle.format(config=config) in result.stderr, (needle, result.stderr)
    assert not socket_path.exists() and not database.exists()


def serve_args(workdir: Path) -> tuple[str, ...]:
    """Socket and database inside ``workdir``, so a wrongly started sidecar pollutes nothing."""
    database = f"sqlite:///{workdir}/memory.db"
    return ("serve", "--socket", str(workdir / "memory.sock"), "--database", database)


def test_missing_config_file_fails_start(workdir: Path) -> None:
    missing = workdir / "nowhere.toml"
    result = run_cli(*serve_args(workdir), "--config", str(missing))
    assert result.returncode == 1
    assert str(missing) in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("sweep_interval", "replay_retention", "starts"),
    [
        ("500ms", "1001ms", True),
        ("500ms", "1s", False),
        ("2h", "241m", True),
        ("2h", "4h", False),
        ("1h", "7d", True),
        ("12h", "1d", False),
    ],
)
def test_duration_units(
    workdir: Path, sweep_interval: str, replay_retention: str, starts: bool
) -> None:
    """Units are read as such: retention must be more than twice the sweep interval."""
    args = ("--sweep-interval", sweep_interval, "--replay-retention", replay_retention)
    if not starts:
        result = run_cli(*serve_args(workdir), *args)
        assert result.returncode == 1
        assert "replay_retention" in result.stderr
        return
    env = {"OPENWOP_MEMORY_BUSY_TIMEOUT": "1500ms", "OPENWOP_MEMORY_DRAIN_TIMEOUT": "2.5"}
    with Sidecar(workdir, *args, env=env) as sidecar, sidecar.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"


@contextlib.contextmanager
def bare_serve(
    workdir: Path, args: list[str], env: dict[str, str], socket_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """``openwop-memory serve`` with exactly ``args`` (cwd ``workdir``), once it answers."""
    log = workdir / "bare-serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [EXE, "serve", *args], stdout=out, stderr=out, cwd=workdir, env={**os.environ, **env}
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError, EOFError, ValueError), RawClient(socket_path) as c:
                if c.call("sidecar.health")["status"] == "ok":
                    break
            assert time.monotonic() < deadline, f"not ready:\n{log.read_text()}"
            time.sleep(0.02)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_defaults_put_socket_and_database_under_var(workdir: Path) -> None:
    socket_path = workdir / "var" / "openwop-memory.sock"
    with bare_serve(workdir, [], {}, socket_path) as proc:
        assert (workdir / "var" / "openwop-memory.db").is_file()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert not socket_path.exists()


def test_every_flag_reads_its_env_variable(workdir: Path) -> None:
    socket_path = workdir / "env-only" / "memory.sock"
    database = workdir / "env-db" / "memory.db"
    env = {
        "OPENWOP_MEMORY_SOCKET": str(socket_path),
        "OPENWOP_MEMORY_DATABASE": f"sqlite:///{database}",
        "OPENWOP_MEMORY_SOCKET_MODE": "0600",
        "OPENWOP_MEMORY_MAX_ENTRY_SIZE_BYTES": "4321",
    }
    with bare_serve(workdir, [], env, socket_path), RawClient(socket_path) as client:
        assert database.is_file()
        assert oct(os.stat(socket_path).st_mode & 0o777) == oct(0o600)
        caps = client.call("host.capabilities")["capabilities"]
        assert caps["memory"]["maxEntrySizeBytes"] == 4321
        # `health` finds the socket through the same variable.
        result = run_cli("health", env={"OPENWOP_MEMORY_SOCKET": str(socket_path)})
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["status"] == "ok"


# -- health, version, help -----------------------------------------------------------------


def test_health_exits_0_with_json_when_healthy(workdir: Path, sidecar: Sidecar) -> None:
    result = run_cli("health", "--socket", str(sidecar.socket))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "ok"
    assert report["version"] == __version__
    assert isinstance(report["uptimeSeconds"], int | float)
    # The socket can also come from the settings file, named by flag or environment.
    config = workdir / "settings.toml"
    config.write_text(f'socket = "{sidecar.socket}"\n')
    for args, env in (
        (("--config", str(config)), {}),
        ((), {"OPENWOP_MEMORY_CONFIG": str(config)}),
    ):
        result = run_cli("health", *args, env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["status"] == "ok"


def test_health_exits_2_when_nothing_answers(workdir: Path) -> None:
    missing = workdir / "nothing-here.sock"
    stale = workdir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(stale))
    for path in (missing, stale):
        # Far below the 30 s it would wait for an answer: a refused connect fails at once.
        result = run_cli("health", "--socket", str(path), "--timeout", "30", timeout=15)
        assert result.returncode == 2, result
        assert result.stdout == ""
        assert str(path) in result.stderr and "Traceback" not in result.stderr


def test_health_exits_2_when_a_listener_never_answers(workdir: Path) -> None:
    path = workdir / "silent.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(path))
        silent.listen()  # accepts into the backlog, never reads or writes
        result = run_cli("health", "--socket", str(path), "--timeout", "1", timeout=20)
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr


@contextlib.contextmanager
def one_answer_server(path: Path, answer: bytes) -> Iterator[None]:
    """A stand-in peer that answers one request line with ``answer``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(20)
    requests: list[dict[str, Any]] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(20)
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            requests.append(json.loads(data))
            conn.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield
    finally:
        thread.join(30)
        server.close()
    assert [r["method"] for r in requests] == ["sidecar.health"]


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        ({"status": "degraded", "version": "x", "uptimeSeconds": 1, "storage": {}}, 1),
        ({"status": "ok", "version": "x", "uptimeSeconds": 1, "storage": {}}, 0),
        (None, 2),
    ],
    ids=["degraded", "ok", "garbage"],
)
def test_health_exit_code_follows_the_answer(
    workdir: Path, answer: dict[str, Any] | None, code: int
) -> None:
    path = workdir / "peer.sock"
    line = (
        b"this is not json\n"
        if answer is None
        else json.dumps({"jsonrpc": "2.0", "id": 1, "result": answer}).encode() + b"\n"
    )
    with one_answer_server(path, line):
        result = run_cli("health", "--socket", str(path), "--timeout", "10")
    assert result.returncode == code, result
    if answer is not None:
        assert json.loads(result.stdout)["status"] == answer["status"]


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", __version__)


def test_python_dash_m_help() -> None:
    top = subprocess.run(
        [sys.executable, "-m", "openwop_memory", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout and "health" in top.stdout
    serve = subprocess.run(
        [sys.executable, "-m", "openwop_memory", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert serve.returncode == 0, serve.stderr
    for flag in (
        "--config",
        "--socket",
        "--database",
        "--redaction",
        "--socket-mode",
        "--drain-timeout",
        "--max-request-bytes",
        "--max-entry-size-bytes",
        "--replay-retention",
        "--sweep-interval",
        "--credential-patterns",
        "--secrets-dir",
        "--secrets-poll-interval",
        "--sqlite-synchronous",
        "--sqlite-busy-timeout",
        "--sqlite-read-connections",
        "--sqlite-inline-point-reads",
    ):
        assert flag in serve.stdout, flag


def test_the_shipped_example_config_is_valid_and_names_every_setting() -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "openwop-memory.toml"
    settings = load_settings({}, environ={}, config_file=str(example))
    assert settings.socket == "/run/openwop-memory/memory.sock"
    with example.open("rb") as f:
        data = tomllib.load(f)
    # A group's table names its settings; another table (tenant_binding) is one setting.
    names = {
        f"{key}.{sub}" if key in GROUPS else key
        for key, value in data.items()
        for sub in (value if key in GROUPS else [key])
    }
    assert names == set(setting_fields())
    assert {"sqlite.synchronous", "sqlite.busy_timeout"} <= names
    assert not names & set(DEPRECATED), "the example uses only current spellings"


# -- backend setting groups ------------------------------------------------------------------


def test_sqlite_group_is_read_from_every_source(workdir: Path) -> None:
    config = workdir / "settings.toml"
    config.write_text('[sqlite]\nbusy_timeout = "2s"\nread_connections = 3\nsynchronous = "FULL"\n')
    env = {
        "OPENWOP_MEMORY_SQLITE_READ_CONNECTIONS": "4",
        "OPENWOP_MEMORY_SQLITE_SYNCHRONOUS": "EXTRA",
    }
    flags = {"sqlite.synchronous": "NORMAL", "sqlite.inline_point_reads": "false"}
    settings = load_settings(flags, environ=env, config_file=str(config))
    assert settings.sqlite.busy_timeout == 2.0  # the file
    assert settings.sqlite.read_connections == 4  # the environment beats the file
    assert settings.sqlite.synchronous == "NORMAL"  # the flag beats both
    assert settings.sqlite.inline_point_reads is False
    assert load_settings({}, environ={}).sqlite == SqliteSettings()


@pytest.mark.sqlite_only
@pytest.mark.parametrize("source", ["flag", "env", "toml"])
def test_an_old_flat_spelling_still_works_and_warns(workdir: Path, source: str) -> None:
    """``synchronous`` (now ``sqlite.synchronous``) given the old way takes effect, and the
    sidecar logs a warning that names the new spelling."""
    args: list[str] = []
    env: dict[str, str] = {}
    if source == "flag":
        args = ["--synchronous", "FULL"]
    elif source == "env":
        env = {"OPENWOP_MEMORY_SYNCHRONOUS": "FULL"}
    else:
        config = workdir / "settings.toml"
        config.write_text('synchronous = "FULL"\n')
        args = ["--config", str(config)]
    with Sidecar(workdir, *args, env=env) as sidecar, sidecar.client() as client:
        assert client.call("sidecar.health")["storage"]["synchronous"] == "FULL"
        warnings = sidecar.events("deprecated_setting")
    assert len(warnings) == 1, sidecar.log()
    assert warnings[0]["level"] == "warning"
    assert warnings[0]["setting"] == "synchronous"
    assert warnings[0]["use"] == "sqlite.synchronous"
    assert "--sqlite-synchronous" in warnings[0]["message"]
    assert "OPENWOP_MEMORY_SQLITE_SYNCHRONOUS" in warnings[0]["message"]


@pytest.mark.sqlite_only
def test_the_new_spelling_takes_effect_without_a_warning(workdir: Path) -> None:
    with (
        Sidecar(workdir, "--sqlite-synchronous", "EXTRA") as sidecar,
        sidecar.client() as client,
    ):
        assert client.call("sidecar.health")["storage"]["synchronous"] == "EXTRA"
    assert not sidecar.events("deprecated_setting")


@pytest.mark.parametrize(
    ("toml", "setting", "value"),
    [
        pytest.param("sweep_interval = 90\nreplay_retention = 1.5e3\n", "sweep_interval", 90.0),
        pytest.param("sweep_interval = 90\nreplay_retention = 1.5e3\n", "replay_retention", 1500.0),
        pytest.param('metrics_address = "[::1]:9464"\n', "metrics_address", "[::1]:9464"),
        pytest.param("socket_mode = 0o600\n", "socket_mode", 0o600),
        pytest.param(
            'socket_mode = 0o666\n[tenant_binding]\n"uid:1001" = ["acme"]\n', "socket_mode", 0o666
        ),
    ],
    ids=["number-seconds", "float-seconds", "ipv6-address", "mode-0o600", "mode-0o666"],
)
def test_toml_typed_values_are_accepted(
    workdir: Path, toml: str, setting: str, value: object
) -> None:
    """TOML numbers are seconds, a bracketed IPv6 host is an address, an integer is a mode."""
    config = workdir / "typed.toml"
    config.write_text(toml)
    settings = load_settings({}, environ={}, config_file=str(config))
    assert getattr(settings, setting) == value


def test_a_bracketed_ipv6_address_splits_into_host_and_port() -> None:
    assert host_and_port("[::1]:9464") == ("::1", 9464)
    assert host_and_port("127.0.0.1:0") == ("127.0.0.1", 0)


MODE_SYNTAX = 'expected an octal file mode such as "0660" or 0o660'
OWNER_RW = "the owner needs read and write permission on the socket"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "metrics_address = 9464\n",
            "metrics_address (from {source}): Input should be a valid string",
        ),
        ("socket_mode = 660\n", f"socket_mode (from {{source}}): {MODE_SYNTAX}"),
        ("socket_mode = 0o1777\n", f"socket_mode (from {{source}}): {MODE_SYNTAX}"),
        ("socket_mode = -1\n", f"socket_mode (from {{source}}): {MODE_SYNTAX}"),
        ("socket_mode = 0o440\n", f"socket_mode (from {{source}}): {OWNER_RW}"),
        ('socket_mode = "0060"\n', f"socket_mode (from {{source}}): {OWNER_RW}"),
    ],
    ids=[
        "address-integer",
        "mode-decimal-660",
        "mode-sticky",
        "mode-negative",
        "mode-0o440",
        "mode-string-0060",
    ],
)
def test_toml_typed_values_are_refused_with_one_line(
    workdir: Path, toml: str, message: str
) -> None:
    config = workdir / "typed.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_settings({}, environ={}, config_file=str(config))
    source = f"config file {config}"
    assert str(caught.value) == "invalid setting " + message.format(source=source)


def test_a_table_setting_from_the_environment_must_be_json() -> None:
    var = "OPENWOP_MEMORY_TENANT_BINDING"
    good = load_settings({}, environ={var: '{"uid:1001": ["acme"]}'})
    assert good.tenant_binding == {"uid:1001": ["acme"]}
    with pytest.raises(ConfigError) as caught:
        load_settings({}, environ={var: '{"uid:1001": ["acme"'})
    assert str(caught.value) == (
        f"invalid setting tenant_binding (from environment {var}): "
        'expected a table such as {"uid:1001": ["acme"]}'
    )


def test_a_bad_table_in_the_environment_fails_start_with_its_message(workdir: Path) -> None:
    var = "OPENWOP_MEMORY_TENANT_BINDING"
    result = run_cli(*serve_args(workdir), env={var: "uid:1001=acme"})
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert (
        f"invalid setting tenant_binding (from environment {var}): "
        'expected a table such as {"uid:1001": ["acme"]}'
    ) in result.stderr
    assert not (workdir / "memory.db").exists()


@pytest.mark.parametrize("mode", ["777", "0666", "0o602"])
def test_a_world_writable_socket_is_refused_without_tenant_binding(
    workdir: Path, mode: str
) -> None:
    """Connecting takes write permission, so such a mode lets every local user use every
    tenant: the start is refused in one line, and nothing is created. With tenant_binding
    (each connection's user checked) it is allowed."""
    result = run_cli(*serve_args(workdir), "--socket-mode", mode)
    assert result.returncode == 1, result
    value = f"{int(mode.replace('o', ''), 8):04o}"
    assert result.stderr.splitlines()[-1] == (
        f"openwop-memory: invalid setting socket_mode (from flag --socket-mode): {value} lets "
        "every local user connect and use any tenant; give the socket a group (0660) and put "
        "the workers' users in it, or set tenant_binding"
    )
    assert sorted(p.name for p in workdir.iterdir()) == []
    bound = load_settings(
        {"socket_mode": mode}, environ={"OPENWOP_MEMORY_TENANT_BINDING": '{"uid:1": ["a"]}'}
    )
    assert bound.socket_mode == int(value, 8)
