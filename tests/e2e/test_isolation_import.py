"""Issue 20, row 4: ``openwop-memory import`` applies what a put applies.

An export file may be edited or crafted; before, its entries were stored as written: the
host's and a tenant's registered secrets and well-known credentials verbatim (SR-1
bypassed), an entry many times ``max_entry_size_bytes``, empty and repeated tags, and a
``createdAt`` in 9999 that dated every later put of the SQLite database in 9999. Each test
edits a real export (so its scopes and ref key are real), imports it through the real CLI
into a real database, and reads the result through a real sidecar.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from openwop_memory.timefmt import parse_rfc3339
from support.backends import Backend
from support.protocol import begin, issue, list_all, put
from support.sidecar import Sidecar, run_cli

pytestmark = pytest.mark.backend_independent

HOST_SECRET = "host-wide-secret-4f9a2c71"
TENANT_SECRET = "tenant-own-secret-8d3e5b60"
CREDENTIAL = "AKIA" + "Q3ZT7R2LMN4PXV6W"  # the shape of an AWS access key id
CONTENT_MARK = "the-content-of-this-entry"  # what no error may quote


def secrets_dir(workdir: Path) -> Path:
    """A secrets directory: one host-wide secret, and one of tenant ``t-imp``."""
    directory = workdir / "secrets"
    (directory / "tenants" / "t-imp").mkdir(parents=True)
    (directory / "host-key").write_text(HOST_SECRET + "\n")
    (directory / "tenants" / "t-imp" / "tenant-key").write_text(TENANT_SECRET + "\n")
    return directory


def exported(workdir: Path, count: int) -> tuple[Path, str, list[dict[str, Any]]]:
    """An export of ``count`` harmless entries of tenant ``t-imp``: the file, the scope's
    ref and the entry lines, to be edited and written back with :func:`write`."""
    path = workdir / "memory.ndjson"
    source = Sidecar(workdir, socket_path=workdir / "source.sock")
    with source, source.client() as client:
        ref = issue(client, "t-imp", "a")
        begin(client, "w", "t-imp")
        for i in range(count):
            put(client, "w", ref, f"harmless {i}")
        database = f"sqlite:///{source.database}"
        done = run_cli("export", str(path), "--database", database, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = path.read_text().splitlines()
    return path, ref, [json.loads(line) for line in lines[1:-1]]


def write(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write ``entries`` back between the file's header and trailer."""
    lines = path.read_text().splitlines()
    body = [json.dumps(e) for e in entries]
    path.write_text("\n".join([lines[0], *body, lines[-1]]) + "\n")


def import_into(path: Path, url: str, **settings: str) -> tuple[int, str, str]:
    env = {f"OPENWOP_MEMORY_{name.upper()}": value for name, value in settings.items()}
    done = run_cli("import", str(path), "--database", url, env=env, timeout=120)
    return done.returncode, done.stdout, done.stderr


def assert_one_clean_line(err: str, *secrets: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in (CONTENT_MARK, *secrets):
        assert needle not in err, err


@pytest.mark.across_processes
def test_an_import_redacts_host_tenant_and_credential_secrets(
    workdir: Path, backend: Backend
) -> None:
    path, ref, entries = exported(workdir, 3)
    entries[0]["content"] = f"the host's {HOST_SECRET} leaked"
    entries[1]["content"] = f"the tenant's {TENANT_SECRET} leaked"
    entries[2]["content"] = f"a key {CREDENTIAL} pasted"
    entries[2]["tags"] = [f"key:{HOST_SECRET}"]
    write(path, entries)
    moved = workdir / f"moved-{backend.name}.db"
    code, out, err = import_into(
        path, backend.url_for(moved), secrets_dir=str(secrets_dir(workdir))
    )
    assert code == 0, err
    assert "imported 3 entries" in out and "4 secrets redacted" in out, out
    there = Sidecar(workdir, database=moved, backend=backend, socket_path=workdir / "m.sock")
    with there, there.client() as client:
        begin(client, "r", "t-imp")
        stored = {e["id"]: e for e in list_all(client, "r", ref)}
    assert stored[entries[0]["id"]]["content"] == "the host's [REDACTED:host-key] leaked"
    assert stored[entries[1]["id"]]["content"] == "the tenant's [REDACTED:tenant-key] leaked"
    assert "[REDACTED:pattern:" in stored[entries[2]["id"]]["content"]
    assert stored[entries[2]["id"]]["tags"] == ["key:[REDACTED:host-key]"]
    served = json.dumps(stored)
    for secret in (HOST_SECRET, TENANT_SECRET, CREDENTIAL):
        assert secret not in served
    if backend.name == "sqlite":
        for file in moved.parent.glob(moved.name + "*"):
            data = file.read_bytes()
            for secret in (HOST_SECRET, TENANT_SECRET, CREDENTIAL):
                assert secret.encode() not in data, file


def test_under_reject_a_secret_refuses_the_whole_import_naming_its_line(workdir: Path) -> None:
    path, _, entries = exported(workdir, 3)
    entries[1]["content"] = f"{CONTENT_MARK} with {TENANT_SECRET}"
    write(path, entries)
    moved = workdir / "moved.db"
    code, out, err = import_into(
        path, f"sqlite:///{moved}", secrets_dir=str(secrets_dir(workdir)), redaction="reject"
    )
    assert code == 1 and out == "", (out, err)
    assert "line 3: entry.content: the entry contains a registered secret" in err, err
    assert "tenant-key" in err  # the secret's id, never its value
    assert_one_clean_line(err, TENANT_SECRET)
    # Nothing was stored: the same file imports whole once the policy allows rewriting.
    code, out, err = import_into(path, f"sqlite:///{moved}", secrets_dir=str(workdir / "secrets"))
    assert code == 0 and "imported 3 entries" in out and "(0 already there)" in out, err


def test_an_entry_over_max_entry_size_bytes_is_refused_naming_its_line(workdir: Path) -> None:
    path, _, entries = exported(workdir, 2)
    # 1 MiB: 16x the default put limit (64 KiB), refused before any redaction or embedding.
    entries[1]["content"] = CONTENT_MARK + "x" * (1 << 20)
    write(path, entries)
    started = time.monotonic()
    code, _, err = import_into(path, f"sqlite:///{workdir / 'moved.db'}")
    assert time.monotonic() - started < 30
    assert code == 1
    assert "line 3: content plus tags exceed 65536 bytes (max_entry_size_bytes)" in err, err
    assert_one_clean_line(err)
    # The destination's setting is the one applied.
    entries[1]["content"] = CONTENT_MARK + "x" * 2000
    write(path, entries)
    code, _, err = import_into(
        path, f"sqlite:///{workdir / 'moved.db'}", max_entry_size_bytes="1024"
    )
    assert code == 1 and "line 3: content plus tags exceed 1024 bytes" in err, err
    assert_one_clean_line(err)


def test_tags_are_kept_as_a_put_keeps_them(workdir: Path) -> None:
    path, ref, entries = exported(workdir, 1)
    entries[0]["tags"] = ["", "a", "a", "", "b"]
    write(path, entries)
    moved = workdir / "moved.db"
    code, _, err = import_into(path, f"sqlite:///{moved}")
    assert code == 0, err
    there = Sidecar(workdir, database=moved, socket_path=workdir / "m.sock")
    with there, there.client() as client:
        begin(client, "r", "t-imp")
        (entry,) = list_all(client, "r", ref)
    assert entry["tags"] == ["a", "b"]


def test_a_created_at_in_the_future_is_clamped_and_dates_no_later_put(workdir: Path) -> None:
    path, ref, entries = exported(workdir, 2)
    entries[1]["createdAt"] = "9999-01-01T00:00:00Z"
    write(path, entries)
    moved = workdir / "moved.db"
    before = time.time()
    code, out, err = import_into(path, f"sqlite:///{moved}")
    assert code == 0, err
    assert "1 createdAt in the future set to the import's time" in out, out
    there = Sidecar(workdir, database=moved, socket_path=workdir / "m.sock")
    with there, there.client() as client:
        later = begin(client, "r", "t-imp")
        fresh = put(client, "r", ref, "a put after the import")
        stored = {e["id"]: e for e in list_all(client, "r", ref)}
    after = time.time()
    clamped = parse_rfc3339(stored[entries[1]["id"]]["createdAt"]) / 1e6
    assert before - 1 <= clamped <= after + 1
    for wire_time in (fresh["createdAt"], later["snapshotAt"]):
        assert before - 1 <= parse_rfc3339(wire_time) / 1e6 <= after + 1, wire_time
