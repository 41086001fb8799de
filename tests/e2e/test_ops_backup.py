"""``openwop-memory backup`` checks, from its own side, the file the sidecar reports.

The sidecar runs in a mount namespace of its own (``unshare``), where a directory of the
test is a private tmpfs (what systemd's ``PrivateTmp=`` does to ``/tmp``) and another is
read-only (what ``ProtectSystem=strict`` does to everything but the service's directories).
A backup the sidecar writes into the private directory exists only in its view: the CLI
says so and exits 1. A read-only destination is refused with the way out. A directory both
see works as before.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
from pathlib import Path

import pytest
from support.backends import BACKENDS
from support.protocol import begin, issue, put
from support.sidecar import Sidecar, run_cli

pytestmark = pytest.mark.backend_independent


class SandboxedSidecar(Sidecar):
    """A sidecar in a mount namespace where ``private`` is a tmpfs of its own and
    ``read_only`` is mounted read-only; the rest of the file system is the test's."""

    def __init__(self, workdir: Path, private: Path, read_only: Path) -> None:
        super().__init__(
            workdir, "--admin-socket", str(workdir / "admin.sock"), backend=BACKENDS["sqlite"]
        )
        self.private, self.read_only = private, read_only

    @property
    def argv(self) -> list[str]:
        setup = (
            f"mount -t tmpfs private {shlex.quote(str(self.private))} && "
            f"mount --bind {shlex.quote(str(self.read_only))} {shlex.quote(str(self.read_only))}"
            f" && mount -o remount,bind,ro {shlex.quote(str(self.read_only))} && "
            'exec "$@"'
        )
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "sh",
                *super().argv]  # fmt: skip


@pytest.fixture
def sandboxed(workdir: Path) -> SandboxedSidecar:
    if os.geteuid() != 0:
        pytest.fail("a sidecar in a mount namespace of its own needs root, as CI has")
    for name in ("private", "read-only", "shared"):
        (workdir / name).mkdir()
    return SandboxedSidecar(workdir, workdir / "private", workdir / "read-only")


def backup(sidecar: Sidecar, dest: Path) -> tuple[int, list[str], str]:
    done = run_cli("backup", str(dest), "--admin-socket", str(sidecar.workdir / "admin.sock"))
    return done.returncode, done.stderr.splitlines(), done.stdout


def test_a_backup_only_the_sidecar_sees_is_reported_as_such(sandboxed: SandboxedSidecar) -> None:
    with sandboxed as sidecar, sidecar.client() as c:
        ref = issue(c, "t", "a")
        begin(c, "r", "t")
        put(c, "r", ref, "kept")
        dest = sidecar.workdir / "private" / "memory-backup.db"
        code, err, out = backup(sidecar, dest)
        assert code == 1, (err, out)
        (line,) = err
        assert line.startswith("openwop-memory: the sidecar reports a backup of ")
        assert f"bytes at {dest}, but it does not exist here" in line
        assert "another mount namespace" in line
        assert "/var/lib/openwop-memory/backups" in line
        assert not dest.exists()
        # A directory both see: the same command succeeds, and the file is a database.
        shared = sidecar.workdir / "shared" / "memory-backup.db"
        code, err, out = backup(sidecar, shared)
        assert code == 0, err
        assert out.startswith(f"backed up {shared.stat().st_size} bytes to {shared}")
        with sqlite3.connect(shared) as db:
            assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 1


def test_a_read_only_destination_is_refused_naming_one_that_works(
    sandboxed: SandboxedSidecar,
) -> None:
    with sandboxed as sidecar:
        dest = sidecar.workdir / "read-only" / "memory-backup.db"
        code, err, _ = backup(sidecar, dest)
        assert code == 1
        (line,) = err
        assert "validation_error" in line and "read-only for the sidecar" in line
        assert "/var/lib/openwop-memory/backups" in line
        assert not dest.exists()
