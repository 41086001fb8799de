"""Issue 20, "also seen": a malformed database URL is refused in one line that never echoes
a password, by the real ``openwop-memory serve``; before, a bad port or an unclosed IPv6
bracket gave a 56-line traceback from the driver, and a URL written without its scheme was
echoed, password included, in the hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sidecar import run_cli

pytestmark = pytest.mark.backend_independent

PASSWORD = "pw-s3cr3t-9931"


@pytest.mark.parametrize(
    ("database", "said"),
    [
        (
            f"postgresql://u:{PASSWORD}@h:notaport/db",
            "the database URL is malformed: a host's port",
        ),
        (f"postgresql://u:{PASSWORD}@[::1/db", "the database URL is malformed"),
        (f"postgresql://u:{PASSWORD}@h1:5432,[::1/db", "the database URL is malformed"),
        (
            f"u:{PASSWORD}@db.internal/memory",
            "a PostgreSQL database is written postgresql://user:password@host/db",
        ),
    ],
)
def test_a_malformed_database_url_is_one_line_without_its_password(
    tmp_path: Path, database: str, said: str
) -> None:
    done = run_cli(
        "serve", "--socket", str(tmp_path / "m.sock"), "--database", database, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert said in done.stderr, done.stderr
    assert PASSWORD not in done.stderr + done.stdout


def test_the_import_and_export_commands_say_the_same(tmp_path: Path) -> None:
    database = f"postgresql://u:{PASSWORD}@h:notaport/db"
    for command in ("export", "import"):
        done = run_cli(command, str(tmp_path / "x.ndjson"), "--database", database, timeout=60)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1, done.stderr
        assert "the database URL is malformed" in done.stderr and PASSWORD not in done.stderr
