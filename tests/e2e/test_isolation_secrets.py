"""Issue 20, "also seen": the secrets directory and its files are checked as the database
file is. Writable by the group: a warning naming the path. Writable by every user: refused,
since any local user could plant a "secret" (a symlink to a file only the service reads
would make redaction an oracle on that file). Before, a 0777 directory or a 0666 file loaded
without a word. A sidecar refuses to start on one; a reload keeps the secrets it had and
logs an error naming the path (never a value)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import structlog
from openwop_memory.service.secrets_directory import SecretsDirectory, UnsafeSecretsError
from support.polling import wait_for
from support.protocol import issue, new_run, put
from support.sidecar import RawClient, Sidecar

pytestmark = pytest.mark.backend_independent

VALUE = "Wm3KqZ8rTx5Hv"
PLANTED = "Jd7NpYc2Fs9Lb"


def secrets(tmp_path: Path) -> Path:
    directory = tmp_path / "secrets"
    (directory / "tenants" / "acme").mkdir(parents=True)
    (directory / "openai").write_text(VALUE + "\n")
    (directory / "tenants" / "acme" / "acme-key").write_text("Tq4GhVb6Rn1Xe\n")
    for path in (directory, directory / "tenants", directory / "tenants" / "acme"):
        path.chmod(0o755)
    for path in (directory / "openai", directory / "tenants" / "acme" / "acme-key"):
        path.chmod(0o644)
    return directory


@pytest.mark.parametrize(
    "relative", [".", "tenants", "tenants/acme", "openai", "tenants/acme/acme-key"]
)
def test_a_world_writable_directory_or_file_refuses_the_load(tmp_path: Path, relative: str) -> None:
    directory = secrets(tmp_path)
    loaded = SecretsDirectory(directory)
    loaded.reload()
    target = directory / relative
    target.chmod(0o777 if target.is_dir() else 0o666)
    (directory / "openai").write_text(PLANTED + "\n")  # what a local user could have done
    with pytest.raises(UnsafeSecretsError) as refused:
        loaded.reload()
    assert str(target) in str(refused.value) and "writable by every user" in str(refused.value)
    assert VALUE not in str(refused.value) and PLANTED not in str(refused.value)
    # The secrets loaded before stay in force; the planted value is not one.
    assert dict(loaded.values_for("globex")) == {VALUE: "openai"}


def test_a_symlink_to_a_world_writable_file_is_refused(tmp_path: Path) -> None:
    directory = secrets(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(PLANTED + "\n")
    elsewhere.chmod(0o666)
    (directory / "planted").symlink_to(elsewhere)
    with pytest.raises(UnsafeSecretsError, match="writable by every user"):
        SecretsDirectory(directory).reload()


def test_group_writable_is_a_warning_naming_the_path_and_loads(tmp_path: Path) -> None:
    directory = secrets(tmp_path)
    (directory / "openai").chmod(0o664)
    (directory / "tenants").chmod(0o775)
    loaded = SecretsDirectory(directory)
    with structlog.testing.capture_logs() as logs:
        loaded.reload()
    warned = [e for e in logs if e["event"] == "host_secrets_writable_by_group"]
    assert sorted((e["path"], e["mode"]) for e in warned) == [
        (str(directory / "openai"), "0664"),
        (str(directory / "tenants"), "0775"),
    ]
    assert all(e["log_level"] == "warning" for e in warned)
    assert dict(loaded.values_for("globex")) == {VALUE: "openai"}
    assert VALUE not in repr(logs)


def test_a_sidecar_does_not_start_on_a_world_writable_directory(workdir: Path) -> None:
    directory = secrets(workdir)
    directory.chmod(0o777)
    sidecar = Sidecar(workdir, "--secrets-dir", str(directory))
    with pytest.raises(RuntimeError, match="exited with 1") as failed:
        sidecar.start()
    text = str(failed.value)
    assert f"cannot read secrets_dir {directory}: {directory} is writable by every user" in text
    assert "Traceback" not in text and VALUE not in text
    assert not sidecar.socket.exists()


def stored(client: RawClient, content: str) -> str:
    return str(put(client, new_run(client, "acme"), issue(client, "acme"), content)["content"])


def test_a_reload_refuses_a_world_writable_file_and_keeps_serving_the_old_secrets(
    workdir: Path,
) -> None:
    directory = secrets(workdir)
    args = ("--secrets-dir", str(directory), "--credential-patterns", "off")
    with Sidecar(workdir, *args, "--secrets-poll-interval", "100ms") as sidecar:
        # A local user overwrites the world-writable file with a value of their choosing.
        os.chmod(directory / "openai", 0o666)  # noqa: S103 - the attack itself
        (directory / "openai").write_text(PLANTED + "\n")
        sidecar.signal(signal.SIGHUP)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_refused", path=str(directory / "openai"))),
            20,
            "the refusal",
        )
        [refused, *_] = sidecar.events("host_secrets_refused")
        assert refused["level"] == "error" and refused["mode"] == "0666"
        with sidecar.client() as client:
            assert stored(client, f"a {VALUE} b") == "a [REDACTED:openai] b"
            assert stored(client, f"a {PLANTED} b") == f"a {PLANTED} b"
        # The operator's chmod is a change the poll notices: the file is read again.
        os.chmod(directory / "openai", 0o600)
        wait_for(
            lambda: bool(sidecar.events("host_secrets_reload", trigger="poll", changed=True)),
            20,
            "the reload after chmod",
        )
        with sidecar.client() as client:
            assert stored(client, f"a {PLANTED} b") == "a [REDACTED:openai] b"
        assert VALUE not in sidecar.log() and PLANTED not in sidecar.log()
