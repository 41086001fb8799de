"""The secrets directory (``--secrets-dir``): loading rules, reload triggers, settings, and the
end-to-end redaction of host and tenant secrets by a real sidecar.

Unit tests use real files in tmp directories and ``structlog.testing.capture_logs``. Every
secret value is a string of unusual letters and digits, so that a log dump containing any
five consecutive characters of one is caught (the reader must never log a value or a part
of one).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from openwop_memory.config import ConfigError, Settings, load_settings
from openwop_memory.service import secrets_directory
from openwop_memory.service.secrets_directory import (
    MAX_SECRET_FILE_BYTES,
    MAX_SECRETS_PER_SCOPE,
    SecretsDirectory,
)
from support.polling import eventually, wait_for
from support.protocol import issue, new_run, put, secrets_param
from support.sidecar import RawClient, Sidecar

HOST_VALUE = "Qz7XjVk3Wq9Jx"
ACME_VALUE = "Rb4YmTn8Lp2Gd"
GLOBEX_VALUE = "Hc6FsWd5Nv1Kz"
NEW_HOST_VALUE = "Pj9UeXr2Mb7Ty"
SHORT_VALUE = "Zx9Qw4v"  # 7 characters: ignored

Logs = list[MutableMapping[str, Any]]


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def fragments(value: str, size: int = 5) -> set[str]:
    return {value[i : i + size] for i in range(len(value) - size + 1)} or {value}


def assert_no_value_in(text: str, *values: str) -> None:
    for value in values:
        leaked = sorted(f for f in fragments(value) if f in text)
        assert not leaked, f"a secret value (or part of it) was logged: {leaked}"


def events(logs: Logs, name: str) -> Logs:
    return [e for e in logs if e["event"] == name]


def loaded(directory: Path) -> tuple[SecretsDirectory, Logs]:
    secrets = SecretsDirectory(directory)
    with structlog.testing.capture_logs() as logs:
        secrets.reload()
    return secrets, logs


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    """DIR/openai (host-wide) and one secret each for tenants acme and globex."""
    directory = tmp_path / "secrets"
    write(directory / "openai", HOST_VALUE + "\n")
    write(directory / "tenants" / "acme" / "acme-key", ACME_VALUE)
    write(directory / "tenants" / "globex" / "globex-key", GLOBEX_VALUE + "\r\n")
    return directory


# -- layout ----------------------------------------------------------------------------------


def test_host_wide_and_tenant_secrets(secrets_dir: Path) -> None:
    secrets, logs = loaded(secrets_dir)
    assert secrets.generation == 1
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai", ACME_VALUE: "acme-key"}
    assert dict(secrets.values_for("globex")) == {
        HOST_VALUE: "openai",
        GLOBEX_VALUE: "globex-key",
    }
    assert dict(secrets.values_for("initech")) == {HOST_VALUE: "openai"}
    [line] = events(logs, "host_secrets_loaded")
    assert (line["host_wide"], line["tenants"], line["total"]) == (1, 2, 3)
    assert line["log_level"] == "info"
    assert not events(logs, "host_secret_ignored")
    assert_no_value_in(repr(logs), HOST_VALUE, ACME_VALUE, GLOBEX_VALUE)


def test_mappings_are_cached_and_immutable(secrets_dir: Path) -> None:
    secrets, _ = loaded(secrets_dir)
    acme = secrets.values_for("acme")
    assert secrets.values_for("acme") is acme
    assert secrets.values_for("initech") is secrets.values_for("someone-else")
    with pytest.raises(TypeError):
        acme[NEW_HOST_VALUE] = "x"  # type: ignore[index]
    write(secrets_dir / "openai", NEW_HOST_VALUE)
    assert secrets.reload()
    assert secrets.values_for("acme") is not acme
    assert dict(acme) == {HOST_VALUE: "openai", ACME_VALUE: "acme-key"}  # a snapshot


def test_nothing_is_loaded_before_the_first_load(secrets_dir: Path) -> None:
    secrets = SecretsDirectory(secrets_dir)
    assert secrets.generation == 0
    assert dict(secrets.values_for("acme")) == {}


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b"Qz7XjVk3Wq9Jx\n", "Qz7XjVk3Wq9Jx"),
        (b"Qz7XjVk3Wq9Jx\r\n", "Qz7XjVk3Wq9Jx"),
        (b"Qz7XjVk3Wq9Jx\n\n", "Qz7XjVk3Wq9Jx\n"),
        (b"Qz7XjVk3Wq9Jx\r", "Qz7XjVk3Wq9Jx\r"),
        (b"  Qz7XjVk3Wq9Jx \n", "  Qz7XjVk3Wq9Jx "),
        (b"Qz7X\njVk3Wq9Jx", "Qz7X\njVk3Wq9Jx"),
        ("Qz7XjVk3Wq9J\u00e9\n".encode(), "Qz7XjVk3Wq9J\u00e9"),
    ],
    ids=["lf", "crlf", "two-lf", "cr-kept", "spaces-kept", "inner-lf", "utf8"],
)
def test_one_trailing_newline_is_dropped(tmp_path: Path, data: bytes, value: str) -> None:
    write(tmp_path / "id", data)
    secrets, _ = loaded(tmp_path)
    assert dict(secrets.values_for("t")) == {value: "id"}


def test_the_tenant_id_wins_when_a_value_is_in_both(tmp_path: Path) -> None:
    write(tmp_path / "host-id", HOST_VALUE)
    write(tmp_path / "tenants" / "acme" / "acme-id", HOST_VALUE)
    secrets, _ = loaded(tmp_path)
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "acme-id"}
    assert dict(secrets.values_for("globex")) == {HOST_VALUE: "host-id"}


def test_the_same_value_twice_in_one_directory_keeps_the_first_name(tmp_path: Path) -> None:
    write(tmp_path / "b-second", HOST_VALUE)
    write(tmp_path / "a-first", HOST_VALUE)
    secrets, _ = loaded(tmp_path)
    assert dict(secrets.values_for("t")) == {HOST_VALUE: "a-first"}


def test_names_starting_with_a_dot_are_skipped_silently(tmp_path: Path) -> None:
    write(tmp_path / ".hidden", SHORT_VALUE)
    write(tmp_path / ".also-hidden", HOST_VALUE)
    write(tmp_path / "tenants" / ".acme" / "id", ACME_VALUE)
    write(tmp_path / "tenants" / "acme" / ".id", ACME_VALUE)
    secrets, logs = loaded(tmp_path)
    assert secrets.generation == 0
    assert dict(secrets.values_for("acme")) == {}
    assert not [e for e in logs if e["log_level"] != "info"]


# -- what is ignored, and how it is logged -----------------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()
    write(path / "inside", GLOBEX_VALUE)


def _dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


def _content(data: bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.write_bytes(data)

    return make


IGNORED: list[tuple[str, str | bytes, Callable[[Path], None], str]] = [
    # (case id, file name, how to make the file, a word of the reason)
    ("short", "short-id", _content(SHORT_VALUE.encode() + b"\n"), "shorter than 8"),
    ("short-crlf", "short-id", _content(b"Zx9Qw4v\r\n"), "shorter than 8"),
    ("empty", "empty-id", _content(b""), "shorter than 8"),
    ("blank", "blank-id", _content(b" \t " * 4 + b"\n"), "whitespace"),
    ("not-utf8", "latin1-id", _content("Zx9Qw4v\u00e9Kp".encode("latin-1")), "UTF-8"),
    ("too-large", "large-id", _content(b"Qz7Xj" * (MAX_SECRET_FILE_BYTES // 5 + 1)), "16 KiB"),
    ("fifo", "fifo-id", _fifo, "not a regular file"),
    ("directory", "dir-id", _directory, "not a regular file"),
    ("unreadable", "dangling-id", _dangling_link, "unreadable"),
    ("id-with-bracket", "bad]id", _content(b"Zx9Qw4vKp3"), "invalid secret id"),
    ("id-with-control", "bad\x01id", _content(b"Zx9Qw4vKp3"), "invalid secret id"),
    ("id-with-del", "bad\x7fid", _content(b"Zx9Qw4vKp3"), "invalid secret id"),
    ("id-too-long", "i" * 129, _content(b"Zx9Qw4vKp3"), "invalid secret id"),
    ("id-not-utf8", b"bad\xffid", _content(b"Zx9Qw4vKp3"), "invalid secret id"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [pytest.param(*case[1:], id=case[0]) for case in IGNORED],
)
def test_an_unusable_file_is_ignored_with_a_warning_but_never_its_value(
    tmp_path: Path, name: str | bytes, make: Callable[[Path], None], reason: str
) -> None:
    write(tmp_path / "openai", HOST_VALUE)
    path = Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), os.fsencode(name))))
    make(path)
    secrets, logs = loaded(tmp_path)
    assert dict(secrets.values_for("t")) == {HOST_VALUE: "openai"}
    [warning] = events(logs, "host_secret_ignored")
    assert warning["log_level"] == "warning"
    assert reason in warning["reason"], warning
    shown = os.fsdecode(name)
    if "invalid" in reason:
        assert warning["secret_id"] == ascii(shown)[:200]
    else:
        assert warning["secret_id"] == shown
    assert_no_value_in(repr(logs), SHORT_VALUE, "Zx9Qw4vKp3", HOST_VALUE, GLOBEX_VALUE)
    assert_no_value_in(repr(logs), "Qz7XjQz7Xj", "Zx9Qw4v\u00e9Kp")


def test_a_file_of_exactly_16_kib_is_used(tmp_path: Path) -> None:
    value = ("Qz7Xj" * MAX_SECRET_FILE_BYTES)[:MAX_SECRET_FILE_BYTES]
    write(tmp_path / "big", value)
    write(tmp_path / "big-with-newline", value[:-1] + "\n")
    secrets, logs = loaded(tmp_path)
    assert dict(secrets.values_for("t")) == {value: "big", value[:-1]: "big-with-newline"}
    assert not events(logs, "host_secret_ignored")


@pytest.mark.parametrize(
    ("make", "reason", "tenant"),
    [
        (lambda d: write(d / "tenants", ACME_VALUE), "tenants is not a readable directory", None),
        (lambda d: write(d / "tenants" / "acme", ACME_VALUE), "not a readable tenant", "acme"),
        (
            lambda d: write(d / "tenants" / "bad\x02tenant" / "id", ACME_VALUE),
            "invalid tenant name",
            ascii("bad\x02tenant"),
        ),
        (
            lambda d: write(d / "tenants" / ("t" * 129) / "id", ACME_VALUE),
            "invalid tenant name",
            ascii("t" * 129),
        ),
    ],
    ids=["tenants-is-a-file", "tenant-is-a-file", "tenant-with-control", "tenant-too-long"],
)
def test_an_unusable_tenant_directory_is_ignored_with_a_warning(
    tmp_path: Path, make: Callable[[Path], object], reason: str, tenant: str | None
) -> None:
    write(tmp_path / "openai", HOST_VALUE)
    make(tmp_path)
    secrets, logs = loaded(tmp_path)
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai"}
    [warning] = events(logs, "host_secret_ignored")
    assert reason in warning["reason"], warning
    assert warning.get("tenant") == tenant
    assert_no_value_in(repr(logs), ACME_VALUE, HOST_VALUE)


@pytest.mark.parametrize("tenant", [None, "acme"], ids=["host-wide", "tenant"])
def test_at_most_256_secrets_per_directory_by_name_order(
    tmp_path: Path, tenant: str | None
) -> None:
    directory = tmp_path if tenant is None else tmp_path / "tenants" / tenant
    total = MAX_SECRETS_PER_SCOPE + 9
    for i in reversed(range(total)):  # creation order must not matter
        write(directory / f"s{i:03d}", f"Qz7XjVk{i:03d}Wq9")
    write(directory / "bad]id", "Zx9Qw4vKp3")  # sorts before "s": ignored, not counted
    secrets, logs = loaded(tmp_path)
    ids = set(secrets.values_for("acme").values())
    assert ids == {f"s{i:03d}" for i in range(MAX_SECRETS_PER_SCOPE)}
    over = [e for e in events(logs, "host_secret_ignored") if "more than" in e["reason"]]
    assert [e["secret_id"] for e in over] == [
        f"s{i:03d}" for i in range(MAX_SECRETS_PER_SCOPE, total)
    ]
    assert all(e.get("tenant") == tenant for e in over)
    assert_no_value_in(repr(logs), "Qz7XjVk", "Zx9Qw4vKp3")


def test_host_and_tenant_caps_are_separate(tmp_path: Path) -> None:
    for i in range(MAX_SECRETS_PER_SCOPE):
        write(tmp_path / f"h{i:03d}", f"Qz7XjVk{i:03d}Wq9")
        write(tmp_path / "tenants" / "acme" / f"a{i:03d}", f"Rb4YmTn{i:03d}Lp2")
    secrets, logs = loaded(tmp_path)
    assert len(secrets.values_for("acme")) == 2 * MAX_SECRETS_PER_SCOPE
    assert not events(logs, "host_secret_ignored")


# -- the directory itself ----------------------------------------------------------------------


def test_a_missing_directory_holds_no_secrets_until_it_appears(tmp_path: Path) -> None:
    directory = tmp_path / "not-yet"
    secrets, logs = loaded(directory)
    assert dict(secrets.values_for("acme")) == {}
    [missing] = events(logs, "host_secrets_dir_missing")
    assert missing["log_level"] == "warning"
    assert missing["directory"] == str(directory)
    write(directory / "openai", HOST_VALUE)
    assert secrets.reload()
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai"}


def test_a_directory_that_cannot_be_listed_raises_and_keeps_the_secrets(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    write(directory / "openai", HOST_VALUE)
    secrets, _ = loaded(directory)
    (directory / "openai").unlink()
    directory.rmdir()
    directory.write_text("a file where the directory was\n")
    with pytest.raises(NotADirectoryError):
        secrets.reload()
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai"}
    assert secrets.generation == 1


def test_generation_changes_only_when_the_secrets_change(tmp_path: Path) -> None:
    secrets = SecretsDirectory(tmp_path)
    with structlog.testing.capture_logs() as logs:
        assert not secrets.reload()  # empty, as before the first load
        assert secrets.generation == 0
        write(tmp_path / "openai", HOST_VALUE)
        assert secrets.reload() and secrets.generation == 1
        assert not secrets.reload()
        write(tmp_path / "openai", HOST_VALUE + "\n")  # rewritten, same value
        write(tmp_path / "too-short", SHORT_VALUE)  # ignored: no change
        assert not secrets.reload() and secrets.generation == 1
        write(tmp_path / "openai", NEW_HOST_VALUE)
        assert secrets.reload() and secrets.generation == 2
        (tmp_path / "openai").rename(tmp_path / "renamed")  # same value, new id
        assert secrets.reload() and secrets.generation == 3
        write(tmp_path / "tenants" / "acme" / "renamed", NEW_HOST_VALUE)  # tenant's own now
        assert secrets.reload() and secrets.generation == 4
        (tmp_path / "renamed").unlink()
        (tmp_path / "tenants" / "acme" / "renamed").unlink()
        assert secrets.reload() and secrets.generation == 5
        assert dict(secrets.values_for("acme")) == {}
    # One line for the first load, then one per load that changed something.
    assert [e["generation"] for e in events(logs, "host_secrets_loaded")] == [0, 1, 2, 3, 4, 5]


# -- Kubernetes Secret volumes -----------------------------------------------------------------


def kubernetes_volume(directory: Path, version: str, files: dict[str, str]) -> None:
    """Lay out (or update) ``directory`` as the kubelet does a Secret volume: the files in
    a timestamped directory, ``..data`` pointing at it, top-level names linked through it.
    An update swaps ``..data`` atomically with a rename."""
    target = directory / f"..{version}"
    for rel, value in files.items():
        write(target / rel, value)
    (directory / "..data_tmp").symlink_to(target.name)
    os.replace(directory / "..data_tmp", directory / "..data")
    for top in {rel.split("/")[0] for rel in files}:
        if not (directory / top).is_symlink():
            (directory / top).symlink_to(f"..data/{top}")


def test_a_kubernetes_secret_volume_and_its_atomic_update(tmp_path: Path) -> None:
    kubernetes_volume(
        tmp_path, "2024_01_01_00_00_00.1", {"openai": HOST_VALUE, "tenants/acme/key": ACME_VALUE}
    )
    secrets, logs = loaded(tmp_path)
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai", ACME_VALUE: "key"}
    assert not [e for e in logs if e["log_level"] != "info"]  # ..data and co. are skipped

    kubernetes_volume(
        tmp_path,
        "2024_01_02_00_00_00.2",
        {"openai": NEW_HOST_VALUE, "tenants/acme/key": GLOBEX_VALUE},
    )
    assert secrets._poll() is True  # the followed files changed: the poll notices
    assert dict(secrets.values_for("acme")) == {NEW_HOST_VALUE: "openai", GLOBEX_VALUE: "key"}
    assert secrets._poll() is None  # nothing changed since


# -- the watcher -------------------------------------------------------------------------------


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Return once ``predicate()`` is true; AssertionError naming ``what`` after 10 s."""
    with anyio.move_on_after(10):
        while True:
            if predicate():
                return
            await anyio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.anyio
async def test_watch_reloads_a_changed_file(secrets_dir: Path) -> None:
    secrets = SecretsDirectory(secrets_dir)
    secrets.reload()
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(secrets.watch, 0.02)
            write(secrets_dir / "tenants" / "acme" / "acme-key", NEW_HOST_VALUE + "\n")
            await wait_until(lambda: secrets.generation == 2, "the poll to reload")
            tg.cancel_scope.cancel()
    assert dict(secrets.values_for("acme")) == {HOST_VALUE: "openai", NEW_HOST_VALUE: "acme-key"}
    [reload] = events(logs, "host_secrets_reload")
    assert (reload["trigger"], reload["changed"], reload["generation"]) == ("poll", True, 2)
    assert_no_value_in(repr(logs), HOST_VALUE, NEW_HOST_VALUE, ACME_VALUE, GLOBEX_VALUE)


@pytest.mark.anyio
async def test_watch_does_not_reload_an_unchanged_directory(
    secrets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = SecretsDirectory(secrets_dir)
    secrets.reload()
    polls: list[bool | None] = []
    poll = secrets._poll

    def counted() -> bool | None:
        polls.append(poll())
        return polls[-1]

    monkeypatch.setattr(secrets, "_poll", counted)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(secrets.watch, 0.01)
            await wait_until(lambda: len(polls) >= 5, "five polls")
            tg.cancel_scope.cancel()
    assert set(polls) == {None}
    assert not logs


@pytest.mark.anyio
async def test_watch_outlives_a_failing_poll(
    secrets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = SecretsDirectory(secrets_dir)
    secrets.reload()
    real = secrets_directory._signature
    calls: list[int] = []

    def flaky(directory: Path) -> secrets_directory.Signature:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(HOST_VALUE)  # the message must not be logged either
        return real(directory)

    monkeypatch.setattr(secrets_directory, "_signature", flaky)
    write(secrets_dir / "openai", NEW_HOST_VALUE)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(secrets.watch, 0.01)
            await wait_until(lambda: secrets.generation == 2, "the next poll to reload")
            tg.cancel_scope.cancel()
    [failed] = events(logs, "host_secrets_poll_failed")
    assert failed["error"] == "RuntimeError"
    assert_no_value_in(repr(logs), HOST_VALUE, NEW_HOST_VALUE)


@pytest.mark.anyio
async def test_reload_now_logs_its_trigger_and_survives_an_unlistable_directory(
    tmp_path: Path,
) -> None:
    write(tmp_path / "secrets" / "openai", HOST_VALUE)
    secrets = SecretsDirectory(tmp_path / "secrets")
    with structlog.testing.capture_logs() as logs:
        assert await secrets.reload_now("sighup")
        (tmp_path / "secrets" / "openai").unlink()
        (tmp_path / "secrets").rmdir()
        (tmp_path / "secrets").write_text("not a directory\n")
        assert not await secrets.reload_now("sighup")
    [reload] = events(logs, "host_secrets_reload")
    assert (reload["trigger"], reload["changed"]) == ("sighup", True)
    [failed] = events(logs, "host_secrets_reload_failed")
    assert (failed["trigger"], failed["error"]) == ("sighup", "NotADirectoryError")
    assert dict(secrets.values_for("t")) == {HOST_VALUE: "openai"}


# -- settings --------------------------------------------------------------------------------


NEW_SETTINGS = {
    "secrets_dir": "/run/secrets/openwop-memory",
    "secrets_poll_interval": "500ms",
    "redaction": "reject-disguised",
    "credential_patterns": "off",
}


def check_new_settings(settings: Settings) -> None:
    assert settings.secrets_dir == "/run/secrets/openwop-memory"
    assert settings.secrets_poll_interval == 0.5
    assert settings.redaction == "reject-disguised"
    assert settings.credential_patterns == "off"


def test_new_settings_defaults() -> None:
    settings = load_settings({}, environ={})
    assert settings.secrets_dir is None
    assert settings.secrets_poll_interval == 2.0
    assert settings.redaction == "rewrite"
    assert settings.credential_patterns == "rewrite"


def test_new_settings_from_flags() -> None:
    check_new_settings(load_settings(NEW_SETTINGS, environ={}))


def test_new_settings_from_the_environment() -> None:
    environ = {"OPENWOP_MEMORY_" + k.upper(): v for k, v in NEW_SETTINGS.items()}
    check_new_settings(load_settings({}, environ=environ))


def test_new_settings_from_toml(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("".join(f'{k} = "{v}"\n' for k, v in NEW_SETTINGS.items()))
    check_new_settings(load_settings({}, environ={}, config_file=str(config)))


@pytest.mark.parametrize(
    ("flags", "environ", "toml", "needles"),
    [
        ({}, {"OPENWOP_MEMORY_CREDENTIAL_PATTERNS": "mask"}, None,
         ("credential_patterns", "OPENWOP_MEMORY_CREDENTIAL_PATTERNS", "'off'")),
        ({}, {}, 'redaction = "disguised"\n', ("redaction", "config file", "'reject-disguised'")),
        ({"secrets_poll_interval": "0"}, {}, None,
         ("secrets_poll_interval", "--secrets-poll-interval", "greater than 0")),
        ({}, {"OPENWOP_MEMORY_SECRETS_POLL_INTERVAL": "often"}, None,
         ("secrets_poll_interval", "OPENWOP_MEMORY_SECRETS_POLL_INTERVAL", "duration")),
        ({}, {"OPENWOP_MEMORY_SECRETS_DIR": ""}, None,
         ("secrets_dir", "OPENWOP_MEMORY_SECRETS_DIR", "at least 1 character")),
        ({}, {}, "secrets_dir = 5\n", ("secrets_dir", "config file", "string")),
    ],
    ids=["env-patterns", "toml-redaction", "flag-zero-poll", "env-bad-poll", "env-empty-dir",
         "toml-dir-not-a-string"],
)  # fmt: skip
def test_invalid_new_settings_are_refused_naming_them(
    tmp_path: Path,
    flags: dict[str, str],
    environ: dict[str, str],
    toml: str | None,
    needles: tuple[str, ...],
) -> None:
    config = None
    if toml is not None:
        config = tmp_path / "settings.toml"
        config.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_settings(flags, environ=environ, config_file=str(config) if config else None)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


# -- a real sidecar ----------------------------------------------------------------------------


def start(workdir: Path, directory: Path, *args: str, env: dict[str, str] | None = None) -> Sidecar:
    """A sidecar reading ``directory``; credential patterns off, so that only the keyrings
    decide what is redacted."""
    return Sidecar(
        workdir, "--secrets-dir", str(directory), "--credential-patterns", "off", *args, env=env
    )


def stored(client: RawClient, tenant: str, content: str) -> str:
    """The content a fresh run of ``tenant``, registering no secrets, gets stored."""
    return str(put(client, new_run(client, tenant), issue(client, tenant), content)["content"])


def assert_serving(sidecar: Sidecar) -> None:
    assert sidecar.proc is not None and sidecar.proc.poll() is None, sidecar.log()
    with sidecar.client() as client:
        assert client.call("sidecar.health")["status"] == "ok"


ALL_VALUES = (HOST_VALUE, ACME_VALUE, GLOBEX_VALUE, NEW_HOST_VALUE, SHORT_VALUE)


@pytest.fixture
def sidecar_log_has_no_secret() -> Iterator[list[Sidecar]]:
    """Tests append their sidecars; after the test, no log may hold a secret value."""
    started: list[Sidecar] = []
    yield started
    for sidecar in started:
        assert_no_value_in(sidecar.log(), *ALL_VALUES)


# Depends on MemoryService using host_secrets when it redacts (service/memory.py).
def test_host_and_tenant_secrets_are_redacted_for_a_run_without_secrets(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    content = f"one {HOST_VALUE} two {ACME_VALUE} three {GLOBEX_VALUE} end"
    with start(workdir, secrets_dir) as sidecar, sidecar.client() as client:
        sidecar_log_has_no_secret.append(sidecar)
        assert stored(client, "acme", content) == (
            f"one [REDACTED:openai] two [REDACTED:acme-key] three {GLOBEX_VALUE} end"
        )
        assert stored(client, "globex", content) == (
            f"one [REDACTED:openai] two {ACME_VALUE} three [REDACTED:globex-key] end"
        )
        assert stored(client, "initech", content) == (
            f"one [REDACTED:openai] two {ACME_VALUE} three {GLOBEX_VALUE} end"
        )


# Depends on MemoryService using host_secrets when it redacts (service/memory.py).
def test_after_sighup_the_next_put_redacts_the_new_value(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    # A poll this slow cannot be what picks the change up.
    with start(workdir, secrets_dir, "--secrets-poll-interval", "1h") as sidecar:
        sidecar_log_has_no_secret.append(sidecar)
        with sidecar.client() as client:
            assert stored(client, "acme", f"a {HOST_VALUE} b") == "a [REDACTED:openai] b"
        write(secrets_dir / "openai", NEW_HOST_VALUE + "\n")
        sidecar.signal(signal.SIGHUP)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_reload", trigger="sighup")),
            20,
            "the SIGHUP reload",
        )
        with sidecar.client() as client:
            assert stored(client, "acme", f"a {NEW_HOST_VALUE} b") == "a [REDACTED:openai] b"
            assert stored(client, "acme", f"a {HOST_VALUE} b") == f"a {HOST_VALUE} b"
        assert_serving(sidecar)


# Depends on MemoryService using host_secrets when it redacts (service/memory.py).
# A run's keyring is its own secrets merged over its tenant's host secrets, compiled once;
# a reload must make the next put of a run already open recompile it (service/keyring_cache.py).
def test_a_run_with_its_own_secrets_redacts_host_secrets_added_while_it_is_open(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    with start(workdir, secrets_dir, "--secrets-poll-interval", "1h") as sidecar:
        sidecar_log_has_no_secret.append(sidecar)
        with sidecar.client() as client:
            run = new_run(client, "acme", secrets=secrets_param(own=GLOBEX_VALUE))
            ref = issue(client, "acme")
            before = f"a {GLOBEX_VALUE} b {NEW_HOST_VALUE} c {HOST_VALUE}"
            assert put(client, run, ref, before)["content"] == (
                f"a [REDACTED:own] b {NEW_HOST_VALUE} c [REDACTED:openai]"
            )
            write(secrets_dir / "tenants" / "acme" / "new-key", NEW_HOST_VALUE)
            sidecar.signal(signal.SIGHUP)
            wait_for(
                lambda: bool(sidecar.events("host_secrets_reload", changed=True)),
                20,
                "the SIGHUP reload",
            )
            assert put(client, run, ref, before)["content"] == (
                "a [REDACTED:own] b [REDACTED:new-key] c [REDACTED:openai]"
            )


def test_a_changed_file_is_redacted_after_the_poll_interval(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    with (
        start(workdir, secrets_dir, "--secrets-poll-interval", "0.2") as sidecar,
        sidecar.client() as client,
    ):
        sidecar_log_has_no_secret.append(sidecar)
        write(secrets_dir / "tenants" / "acme" / "new-key", NEW_HOST_VALUE)

        def redacted() -> str | None:
            content = stored(client, "acme", f"x {NEW_HOST_VALUE} y")
            return content if "REDACTED" in content else None

        assert eventually(redacted, timeout=20) == "x [REDACTED:new-key] y"
        assert stored(client, "globex", f"x {NEW_HOST_VALUE} y") == f"x {NEW_HOST_VALUE} y"


def test_sighup_rereads_the_directory_and_the_sidecar_keeps_serving(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    with start(workdir, secrets_dir, "--secrets-poll-interval", "1h") as sidecar:
        sidecar_log_has_no_secret.append(sidecar)
        [first] = sidecar.events("host_secrets_loaded")
        assert (first["host_wide"], first["tenants"], first["total"]) == (1, 2, 3)
        assert first["directory"] == str(secrets_dir)
        write(secrets_dir / "tenants" / "initech" / "initech-key", NEW_HOST_VALUE)
        write(secrets_dir / "too-short", SHORT_VALUE + "\n")
        sidecar.signal(signal.SIGHUP)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_reload", trigger="sighup")),
            20,
            "the SIGHUP reload",
        )
        [reload] = sidecar.events("host_secrets_reload")
        assert (reload["changed"], reload["generation"]) == (True, 2)
        assert sidecar.events("host_secrets_loaded")[-1]["total"] == 4
        [ignored] = sidecar.events("host_secret_ignored")
        assert (ignored["secret_id"], ignored["level"]) == ("too-short", "warning")
        assert_serving(sidecar)
        sidecar.signal(signal.SIGHUP)  # nothing changed this time
        wait_for(lambda: len(sidecar.events("host_secrets_reload")) == 2, 20, "a second reload")
        assert sidecar.events("host_secrets_reload")[-1]["changed"] is False
        assert_serving(sidecar)
        assert sidecar.stop() == 0


def test_sighup_without_a_secrets_dir_does_not_stop_the_sidecar(workdir: Path) -> None:
    with Sidecar(workdir) as sidecar:
        sidecar.signal(signal.SIGHUP)
        wait_for(lambda: bool(sidecar.events("signal_ignored", signal="SIGHUP")), 20, "SIGHUP")
        assert_serving(sidecar)
        assert sidecar.stop() == 0


def test_the_poll_notices_a_change_without_a_signal(
    workdir: Path, secrets_dir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    with start(workdir, secrets_dir, "--secrets-poll-interval", "0.2") as sidecar:
        sidecar_log_has_no_secret.append(sidecar)
        write(secrets_dir / "openai", NEW_HOST_VALUE)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_reload", trigger="poll")),
            20,
            "the poll to reload",
        )
        [reload] = sidecar.events("host_secrets_reload")
        assert (reload["changed"], reload["generation"]) == (True, 2)
        assert_serving(sidecar)


def test_a_missing_secrets_dir_starts_empty_and_is_read_once_created(
    workdir: Path, sidecar_log_has_no_secret: list[Sidecar]
) -> None:
    directory = workdir / "later"
    with start(workdir, directory, "--secrets-poll-interval", "0.2") as sidecar:
        sidecar_log_has_no_secret.append(sidecar)
        [missing] = sidecar.events("host_secrets_dir_missing")
        assert missing["level"] == "warning"
        write(directory / "openai", HOST_VALUE)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_loaded", total=1)),
            20,
            "the poll to read the new directory",
        )
        assert len(sidecar.events("host_secrets_dir_missing")) == 1  # one warning only
        assert_serving(sidecar)


def test_a_secrets_dir_that_is_not_a_directory_fails_start_cleanly(workdir: Path) -> None:
    not_a_dir = workdir / "secrets"
    not_a_dir.write_text(HOST_VALUE)
    sidecar = start(workdir, not_a_dir)
    with pytest.raises(RuntimeError, match="exited with 1") as err:
        sidecar.start()
    text = str(err.value)
    assert "secrets_dir" in text and str(not_a_dir) in text and "Traceback" not in text
    assert_no_value_in(text, HOST_VALUE)
    assert not sidecar.socket.exists()


@pytest.mark.parametrize("source", ["env", "toml"])
def test_secrets_dir_from_the_environment_or_toml(
    workdir: Path, secrets_dir: Path, source: str
) -> None:
    env: dict[str, str] = {}
    args: list[str] = []
    if source == "env":
        env["OPENWOP_MEMORY_SECRETS_DIR"] = str(secrets_dir)
        env["OPENWOP_MEMORY_SECRETS_POLL_INTERVAL"] = "200ms"
    else:
        config = workdir / "settings.toml"
        config.write_text(f'secrets_dir = "{secrets_dir}"\nsecrets_poll_interval = "200ms"\n')
        args += ["--config", str(config)]
    with Sidecar(workdir, *args, env=env) as sidecar:
        [first] = sidecar.events("host_secrets_loaded")
        assert (first["directory"], first["total"]) == (str(secrets_dir), 3)
        write(secrets_dir / "openai", NEW_HOST_VALUE)  # picked up at the 200 ms poll
        wait_for(
            lambda: bool(sidecar.events("host_secrets_reload", trigger="poll")),
            20,
            "the poll to reload",
        )
