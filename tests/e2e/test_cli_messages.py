"""The command line's words: help text, and each error as one exact line with its hint.

Errors found before start-up are checked in this process (``cli.main``, which returns
before logging is configured); those that need a start that fails run the real command.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from openwop_memory.cli import main as cli
from openwop_memory.cli import rpc as cli_rpc
from openwop_memory.cli.rpc import INSTALLED_CONFIG as SHIPPED_CONFIG  # before any test patches it
from openwop_memory.config import choices_of, flag_of, setting_fields
from openwop_memory.errors import StartupError
from support.sidecar import EXE, Sidecar

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "OPENWOP_MEMORY_SOCKET",
        "OPENWOP_MEMORY_ADMIN_SOCKET",
        "OPENWOP_MEMORY_CONFIG",
        "OPENWOP_MEMORY_DATABASE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli_rpc, "INSTALLED_CONFIG", str(tmp_path / "not-installed.toml"))
    monkeypatch.setattr(cli, "INSTALLED_CONFIG", str(tmp_path / "not-installed.toml"))


def stderr_of(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 1) -> str:
    assert cli.main(list(argv)) == code
    out = capsys.readouterr()
    assert out.err.count("\n") == 1, out.err
    return out.err.rstrip("\n")


def serve(tmp_path: Path, *argv: str) -> list[str]:
    return [
        "serve",
        "--socket",
        str(tmp_path / "m.sock"),
        "--database",
        f"sqlite:///{tmp_path}/m.db",
        *argv,
    ]


@pytest.mark.parametrize(
    ("database", "suggestion"),
    [
        ("/var/lib/app/x.db", "sqlite:////var/lib/app/x.db"),
        ("var/x.db", "sqlite:///var/x.db"),
    ],
)
def test_a_bare_database_path_suggests_its_url(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, database: str, suggestion: str
) -> None:
    err = stderr_of(capsys, *serve(tmp_path), "--database", database)
    assert err == (
        "openwop-memory: invalid setting database (from flag --database): expected "
        "sqlite:///relative/path, sqlite:////absolute/path or postgresql://user@host/db; "
        f"for a SQLite file write {suggestion}"
    )


def test_a_socket_path_over_the_limit_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = "/tmp/" + "s" * 103  # 108 bytes
    err = stderr_of(capsys, *serve(tmp_path), "--socket", path)
    assert err == (
        f"openwop-memory: cannot start: the socket path {path} is 108 bytes; a Unix socket "
        "path is limited to 107 bytes: choose a shorter --socket (a relative path counts from "
        "the working directory)"
    )
    assert not (tmp_path / "m.db").exists()


def test_a_misspelled_toml_key_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "c.toml"
    config.write_text('max_requests_bytes = 4096\n[sqlite]\nsynchronus = "FULL"\n')
    err = stderr_of(capsys, *serve(tmp_path), "--config", str(config))
    assert err == (
        f"openwop-memory: unknown setting 'max_requests_bytes' in config file {config}; "
        "did you mean max_request_bytes?"
    )
    config.write_text('[sqlite]\nsynchronus = "FULL"\n')
    err = stderr_of(capsys, *serve(tmp_path), "--config", str(config))
    assert err == (
        f"openwop-memory: unknown setting 'sqlite.synchronus' in config file {config}; "
        "did you mean sqlite.synchronous?"
    )


def test_a_misspelled_variable_gets_a_suggestion(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENWOP_MEMORY_REDACTON", "reject")
    err = stderr_of(capsys, *serve(tmp_path))
    assert err == (
        "openwop-memory: unknown environment variable OPENWOP_MEMORY_REDACTON; "
        "did you mean OPENWOP_MEMORY_REDACTION?"
    )


def test_a_variable_like_no_setting_is_left_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers share the prefix for their own settings; only near misses are refused.
    monkeypatch.setenv("OPENWOP_MEMORY_WORKER_POOL", "4")
    err = stderr_of(capsys, *serve(tmp_path), "--drain-timeout", "0")
    assert err.startswith("openwop-memory: invalid setting drain_timeout")


def test_pydantics_value_error_prefix_is_not_shown(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    err = stderr_of(capsys, *serve(tmp_path), "--socket-mode", "0999")
    assert err == (
        "openwop-memory: invalid setting socket_mode (from flag --socket-mode): expected an "
        'octal file mode such as "0660" or 0o660'
    )
    err = stderr_of(capsys, *serve(tmp_path), "--replay-retention", "a week")
    assert err == (
        "openwop-memory: invalid setting replay_retention (from flag --replay-retention): "
        "expected seconds or a duration such as 500ms, 60s, 5m, 2h, 7d"
    )


def test_health_with_a_missing_config_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "missing.toml"
    err = stderr_of(capsys, "health", "--config", str(missing), code=2)
    assert err == f"openwop-memory: cannot read config file {missing}: No such file or directory"


def test_health_reads_the_installed_config_by_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = tmp_path / "openwop-memory.toml"
    installed.write_text(f'socket = "{tmp_path}/installed.sock"\n')
    monkeypatch.setattr(cli_rpc, "INSTALLED_CONFIG", str(installed))
    monkeypatch.setattr(cli, "INSTALLED_CONFIG", str(installed))
    err = stderr_of(capsys, "health", "--timeout", "1", code=2)
    assert err == (
        f"openwop-memory: no healthy answer on {tmp_path}/installed.sock: No such file or directory"
    )
    # The environment still comes first, as it does for serve.
    monkeypatch.setenv("OPENWOP_MEMORY_SOCKET", str(tmp_path / "env.sock"))
    err = stderr_of(capsys, "health", "--timeout", "1", code=2)
    assert err.startswith(f"openwop-memory: no healthy answer on {tmp_path}/env.sock: ")


@pytest.mark.parametrize(
    "command", [["inspect", "runs"], ["backup", "/tmp/b.db"], ["forget", "t", "s"]]
)
def test_an_admin_command_with_a_missing_config_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "missing.toml"
    err = stderr_of(capsys, *command, "--config", str(missing), code=2)
    assert err == f"openwop-memory: cannot read config file {missing}: No such file or directory"


def test_an_admin_command_reads_the_installed_config_by_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no config anywhere there is no admin socket to ask.
    err = stderr_of(capsys, "inspect", "runs", code=2)
    assert err.startswith("openwop-memory: no admin socket: ")
    installed = tmp_path / "openwop-memory.toml"
    installed.write_text(f'admin_socket = "{tmp_path}/admin.sock"\n')
    monkeypatch.setattr(cli_rpc, "INSTALLED_CONFIG", str(installed))
    monkeypatch.setattr(cli, "INSTALLED_CONFIG", str(installed))
    err = stderr_of(capsys, "inspect", "runs", "--timeout", "1", code=2)
    assert err == (
        f"openwop-memory: no answer on the admin socket {tmp_path}/admin.sock: "
        "No such file or directory"
    )
    # The environment still comes first.
    monkeypatch.setenv("OPENWOP_MEMORY_ADMIN_SOCKET", str(tmp_path / "env.sock"))
    err = stderr_of(capsys, "inspect", "runs", "--timeout", "1", code=2)
    assert err.startswith(f"openwop-memory: no answer on the admin socket {tmp_path}/env.sock: ")


@pytest.mark.parametrize(
    ("command", "words"), [("health", "no healthy answer on"), ("metrics", "no metrics from")]
)
def test_a_probe_socket_path_over_the_limit_says_so(
    capsys: pytest.CaptureFixture[str], command: str, words: str
) -> None:
    path = "/tmp/" + "s" * 103  # 108 bytes
    err = stderr_of(capsys, command, "--socket", path, code=2)
    assert err == (
        f"openwop-memory: {words} {path}: the path is 108 bytes; a Unix socket path is "
        "limited to 107 bytes"
    )


def test_the_installed_config_is_the_one_the_unit_serves_and_its_group_the_hints() -> None:
    unit = (ROOT / "systemd" / "openwop-memory.service").read_text()
    assert f" serve --config {SHIPPED_CONFIG}\n" in unit
    assert "\nGroup=openwop-memory\n" in unit
    assert "group openwop-memory " in cli_rpc.PERMISSION_HINT


def test_health_permission_error_hints_at_the_group(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(self: socket.socket, address: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    err = stderr_of(capsys, "health", "--socket", str(tmp_path / "m.sock"), code=2)
    assert err == (
        f"openwop-memory: no healthy answer on {tmp_path}/m.sock: Permission denied "
        "(is this user in the group openwop-memory (or the socket's group)?)"
    )


def test_a_start_refused_for_permission_hints_at_the_group() -> None:
    exc = StartupError("cannot listen on /run/openwop-memory/memory.sock: Permission denied")
    assert cli.startup_message(exc) == (
        "cannot listen on /run/openwop-memory/memory.sock: Permission denied "
        "(is this user in the group openwop-memory (or the socket's group)?)"
    )
    assert cli.startup_message(StartupError("x: File exists")) == "x: File exists"


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *argv], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def test_a_failed_start_removes_the_database_it_created(tmp_path: Path) -> None:
    # A dangling symlink where the socket goes: the path checks pass, the listen fails,
    # after the database was opened.
    (tmp_path / "m.sock").symlink_to(tmp_path / "nowhere" / "x")
    result = run(*serve(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"openwop-memory: cannot start: cannot listen on {tmp_path}/m.sock: Address already in use"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.sock"]
    # A database that was there before is kept.
    (tmp_path / "m.db").write_bytes(b"")
    result = run(*serve(tmp_path), cwd=tmp_path)
    assert result.returncode == 1 and (tmp_path / "m.db").exists()


def test_a_socket_path_through_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = run(*serve(tmp_path), "--socket", str(tmp_path / "afile" / "m.sock"), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == (
        f"openwop-memory: cannot start: cannot use the socket path {tmp_path}/afile/m.sock: "
        "Not a directory\n"
    )


def test_top_level_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out
    assert "serve" in out and "health" in out and "OPENWOP_MEMORY_" in out


def test_every_serve_flag_has_help_env_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for name in setting_fields():
        env = "OPENWOP_MEMORY_" + name.replace(".", "_").upper()
        assert f"[env: {env}; default: " in out, name
    assert "[env: OPENWOP_MEMORY_REPLAY_RETENTION; default: 7d]" in out
    assert "[env: OPENWOP_MEMORY_SECRETS_POLL_INTERVAL; default: 2s]" in out
    assert "[env: OPENWOP_MEMORY_SLOW_REQUEST_THRESHOLD; default: 500ms]" in out
    assert "[env: OPENWOP_MEMORY_SOCKET_MODE; default: 0660]" in out
    assert "--redaction {rewrite,reject,reject-disguised}" in out
    assert "604800" not in out
    for name, field in setting_fields().items():
        # Each its own words, not the name repeated; choices listed in the metavar.
        assert field.description and field.description != name, name
        choices = choices_of(field)
        if choices:
            assert f"{flag_of(name)} {{{','.join(choices)}}}" in out, name
    assert "--admin-socket PATH" in out


def test_health_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["health", "--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for line in ("  0  the sidecar answered ok", "  1  the sidecar answered degraded", "  2  no"):
        assert line in out


@pytest.mark.parametrize("argv", [["help"], ["help", "health"], ["help", "serve"]])
def test_help_is_a_command(tmp_path: Path, argv: list[str]) -> None:
    """``openwop-memory help [COMMAND]`` prints the help ``--help`` prints, exit 0."""
    shown = run(*argv, cwd=tmp_path)
    asked = run(*argv[1:], "--help", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stderr == "", shown
    assert shown.stdout == asked.stdout and shown.stdout.startswith("usage: openwop-memory")


@pytest.mark.parametrize(("command", "method"), [("health", "health"), ("metrics", "metrics")])
def test_health_and_metrics_on_the_admin_socket_say_so_in_one_line(
    workdir: Path, command: str, method: str
) -> None:
    """Pointed at the admin socket (which serves the operator's methods only), the probes
    say which socket they need, in one line, exit 2; not a bare ``KeyError``."""
    admin = workdir / "admin.sock"
    with Sidecar(workdir, "--admin-socket", str(admin)):
        result = run(command, "--socket", str(admin), cwd=workdir)
    assert result.returncode == 2, result
    assert result.stdout == ""
    verb = "no healthy answer on" if command == "health" else "no metrics from"
    assert result.stderr == (
        f"openwop-memory: {verb} {admin}: it does not serve sidecar.{method} "
        "(method_not_found): is it the admin socket? health and metrics ask the workers' "
        "socket (--socket)\n"
    )
