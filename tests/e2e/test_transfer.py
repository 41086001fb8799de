"""``openwop-memory export`` and ``import``: a memory moved from one database to another
(SQLite and PostgreSQL, either way) through the NDJSON file, with real sidecars on both
ends: the refs workers hold reach the same entries afterwards, and a file that is cut off,
or a database that already holds memory, imports nothing."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openwop_memory.service.transfer import TransferError, entries_of, read_key
from support.backends import BACKENDS, Backend
from support.protocol import begin, delete, issue, list_all, put, secrets_param
from support.sidecar import EXE, RawClient, Sidecar, run_cli, unmeasured

# Each test chooses the backends it moves memory between.
pytestmark = pytest.mark.backend_independent

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
SECRET = "sk-transfer-0123456789"  # a run's secret: redacted before it is stored


def fill(client: RawClient) -> list[str]:
    """Entries in two tenants and three scopes (one deleted, one redacted); the refs."""
    refs = [issue(client, "t-move", "a"), issue(client, "t-move", "b"), issue(client, "t-2", "a")]
    begin(client, "w", "t-move", secrets=secrets_param(key=SECRET))
    begin(client, "w2", "t-2")
    put(client, "w", refs[0], "first", ["subject:x", "k"])
    put(client, "w", refs[0], f"the key is {SECRET}")
    put(client, "w", refs[1], "second", expires_at="2999-01-01T00:00:00Z")
    gone = put(client, "w", refs[1], "deleted before the export")
    assert delete(client, "w", refs[1], gone["id"])
    put(client, "w2", refs[2], "another tenant")
    return refs


def seen(client: RawClient, refs: list[str], run: str) -> list[list[dict[str, Any]]]:
    """What new runs of each ref's tenant see in it."""
    begin(client, run + "-m", "t-move")
    begin(client, run + "-2", "t-2")
    runs = [run + "-m", run + "-m", run + "-2"]
    return [list_all(client, r, ref) for r, ref in zip(runs, refs, strict=True)]


def cli(*args: str) -> tuple[int, str, str]:
    done = run_cli(*args, timeout=120)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.across_processes
def test_a_memory_moves_to_a_fresh_database_of_either_backend(
    workdir: Path, backend: Backend
) -> None:
    export = workdir / "memory.ndjson"
    with Sidecar(workdir, backend=backend) as source, source.client() as client:
        refs = fill(client)
        before = seen(client, refs, "before")
        # Beside the running sidecar, which goes on serving.
        code, out, err = cli("export", str(export), "--database", backend.url_for(source.database))
        assert client.call("sidecar.health")["status"] == "ok"
    assert code == 0, err
    assert out.startswith(f"exported 4 entries of 2 tenants to {export} in ")
    assert stat.S_IMODE(os.stat(export).st_mode) == 0o600
    text = export.read_text()
    assert SECRET not in text and "[REDACTED:key]" in text, "redacted as stored"
    assert "deleted before the export" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["format"] == "openwop-memory-export" and lines[-1] == {
        "end": True,
        "entries": 4,
    }
    for target in (b for b in BACKENDS.values() if b.shared):  # the CLI is another process
        moved = workdir / f"moved-{target.name}.db"
        url = target.url_for(moved)
        code, out, err = cli("import", str(export), "--database", url)
        assert code == 0, err
        assert out.startswith(f"imported 4 entries from {export} (0 already there) in ")
        code, out, err = cli("import", str(export), "--database", url)
        assert code == 0 and "imported 0 entries" in out and "(4 already there)" in out, err
        sock = workdir / f"{target.name}.sock"
        there = Sidecar(workdir, database=moved, backend=target, socket_path=sock)
        with there, there.client() as client:
            assert [issue(client, "t-move", "a"), issue(client, "t-move", "b")] == refs[:2]
            assert seen(client, refs, "after") == before, (backend.name, target.name)


def test_an_imported_entry_is_found_by_meaning_as_a_put_one_is(workdir: Path) -> None:
    """The file carries no vectors; the import computes them as a put does, so relevance by
    meaning works in the new database (a query sharing no word with the entry finds it)."""
    export = workdir / "memory.ndjson"
    cello = "The user plays the cello in an amateur orchestra on Thursday evenings."
    with Sidecar(workdir) as source, source.client() as client:
        capabilities = client.call("host.capabilities")["capabilities"]
        assert "semantic" in capabilities["memory"]["search"]["modes"]
        ref = issue(client, "t-meaning", "a")
        begin(client, "w", "t-meaning")
        put(client, "w", ref, cello)
        put(client, "w", ref, "The staging deploy failed: the volume ran out of disk space.")
        code, _, err = cli("export", str(export), "--database", f"sqlite:///{source.database}")
    assert code == 0, err
    assert "embedding" not in export.read_text()
    moved = workdir / "moved.db"
    code, _, err = cli("import", str(export), "--database", f"sqlite:///{moved}")
    assert code == 0, err
    there = Sidecar(workdir, database=moved, socket_path=workdir / "moved.sock")
    with there, there.client() as client:
        begin(client, "r", "t-meaning")
        options = {"rank": "relevance", "query": "musical instrument hobby", "limit": 1}
        found = client.call("memory.list", runId="r", memoryRef=ref, options=options)
        assert [e["content"] for e in found] == [cello]


def test_an_import_refuses_a_cut_file_and_a_database_with_memory_of_its_own(
    workdir: Path,
) -> None:
    sqlite = BACKENDS["sqlite"]
    export = workdir / "memory.ndjson"
    with Sidecar(workdir, backend=sqlite) as source, source.client() as client:
        fill(client)
        url = sqlite.url_for(source.database)
        assert cli("export", str(export), "--database", url)[0] == 0
        code, _, err = cli("export", str(export), "--database", url)
    assert code == 1 and f"cannot create {export}" in err, "never over an existing file"
    cut = workdir / "cut.ndjson"
    cut.write_text("".join(export.read_text().splitlines(keepends=True)[:-1]))
    fresh = workdir / "fresh.db"
    code, _, err = cli("import", str(cut), "--database", sqlite.url_for(fresh))
    assert code == 1 and "ends without its trailer" in err, err
    bad = workdir / "bad.ndjson"
    lines = export.read_text().splitlines(keepends=True)
    bad.write_text(lines[0] + '{"tenant": "t", "scope": "nope"}\n' + "".join(lines[1:]))
    code, _, err = cli("import", str(bad), "--database", sqlite.url_for(fresh))
    assert code == 1 and err.startswith("openwop-memory: import failed: line 2: "), err
    assert not list(workdir.glob("fresh.db*")), "nothing was imported, nor a database left"
    own = Sidecar(workdir, database=workdir / "own.db", backend=sqlite)
    with own, own.client() as client:
        fill(client)
    # Stopped (an import is refused while it serves: test_import_lock.py).
    code, _, err = cli("import", str(export), "--database", sqlite.url_for(own.database))
    assert code == 1 and "already holds memory under another ref key" in err
    code, _, err = cli("import", str(workdir / "nothing.ndjson"), "--database", url)
    assert code == 1 and f"cannot read {workdir / 'nothing.ndjson'}" in err
    code, _, err = cli("export", str(workdir / "x.ndjson"), "--config", str(workdir / "no.toml"))
    assert code == 1 and "no.toml" in err
    missing = workdir / "missing.db"
    code, _, err = cli(
        "export", str(workdir / "none.ndjson"), "--database", sqlite.url_for(missing)
    )
    assert code == 1 and "does not exist" in err and not missing.exists()
    assert not (workdir / "none.ndjson").exists()


def test_the_readmes_move_to_postgresql_runs_as_written(workdir: Path) -> None:
    section = OPERATIONS.read_text().partition("## Moving memory between databases")[2]
    block = section.partition("```\n")[2].partition("```")[0]
    commands = [line.split() for line in block.splitlines() if line.startswith("openwop-memory ")]
    assert [c[1] for c in commands] == ["export", "import"]
    source, target = BACKENDS["sqlite"], BACKENDS["postgresql"]
    swap = {
        "sqlite:////var/lib/openwop-memory/memory.db": source.url_for(workdir / "memory.db"),
        "postgresql://openwop@db.internal/memory": target.url_for(workdir / "moved.db"),
        "memory.ndjson": str(workdir / "memory.ndjson"),
    }
    with Sidecar(workdir, backend=source) as sidecar, sidecar.client() as client:
        refs = fill(client)
        before = seen(client, refs, "before")
    for command in commands:
        code, _, err = cli(*(swap.get(word, word) for word in command[1:]))
        assert code == 0, err
    moved = Sidecar(workdir, database=workdir / "moved.db", backend=target)
    with moved, moved.client() as client:
        assert seen(client, refs, "after") == before


@pytest.mark.parametrize("command", ["export", "import"])
def test_each_says_where_it_finds_the_database_and_how_it_exits(command: str) -> None:
    code, out, _ = cli(command, "--help")
    assert code == 0
    for needle in ("--database URL", "OPENWOP_MEMORY_DATABASE", "OPENWOP_MEMORY_CONFIG", "0600"):
        assert needle in out, (needle, out)
    assert "exit codes:\n  0  done\n  1  it could not be done" in out


GOOD_HEADER = (
    '{"format": "openwop-memory-export", "version": 1, "exportedAt": "2026-01-01T00:00:00Z",'
    f' "refKey": "{"A" * 43}="}}\n'
)
GOOD_ENTRY = (
    '{"tenant": "t", "scope": "plain:00ff", "id": "mem_1", "content": "c", "tags": ["a"],'
    ' "createdAt": "2026-01-01T00:00:00Z"}\n'
)
TRAILER_1 = '{"end": true, "entries": 1}\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", "line 1: not JSON"),
        (
            GOOD_HEADER.replace("memory-export", "memory-dump"),
            "line 1: not an openwop-memory-export file",
        ),
        (GOOD_HEADER.replace("A" * 43 + "=", "QUJD"), "line 1: refKey is not 32 bytes"),
        (GOOD_HEADER.replace("A" * 43 + "=", "A" * 42 + "!="), "line 1: refKey is not 32 bytes"),
        (GOOD_HEADER.replace("A" * 43 + "=", "A" * 43), "line 1: refKey is not 32 bytes"),
        (
            GOOD_HEADER + GOOD_ENTRY + '{"end": true, "entries": 2}\n',
            "line 3: the trailer counts 2",
        ),
        (GOOD_HEADER + GOOD_ENTRY + TRAILER_1 + GOOD_ENTRY, "line 4: a line after the trailer"),
        (GOOD_HEADER + GOOD_ENTRY.replace("2026-01-01T00:00:00Z", "yesterday"), "not RFC 3339"),
        (GOOD_HEADER + GOOD_ENTRY.replace('"c"', "1"), "line 2: content: "),
        (GOOD_HEADER + GOOD_ENTRY, "line 3: the file ends without its trailer"),
    ],
)
def test_a_bad_file_is_refused_naming_its_line_and_no_content(text: str, message: str) -> None:
    with pytest.raises(TransferError) as refused:
        read_key(io.BytesIO(text.encode()))
    assert message in str(refused.value)
    assert '"c"' not in str(refused.value)


def test_a_good_file_gives_its_key_count_and_entries_in_order() -> None:
    source = io.BytesIO((GOOD_HEADER + GOOD_ENTRY + TRAILER_1).encode())
    key, count = read_key(source)
    assert (len(key), count) == (32, 1)
    (entry,) = entries_of(source)
    assert (entry.scope.tenant, entry.scope.key, entry.entry.id, entry.entry.tags) == (
        "t",
        "plain:00ff",
        "mem_1",
        ("a",),
    )


MANY = 2 * 500 + 37  # three import batches of transfer.BATCH, the last one partial


def entry_lines(path: Path) -> list[str]:
    """The entry lines of an export file (without its header and trailer)."""
    return path.read_text().splitlines()[1:-1]


def test_an_import_of_several_batches_round_trips(workdir: Path) -> None:
    export = workdir / "many.ndjson"
    with Sidecar(workdir) as source, source.client() as client:
        ref = issue(client, "t-many", "a")
        begin(client, "w", "t-many")
        for i in range(MANY):
            put(client, "w", ref, f"entry {i:04d} " + "x" * 200, [f"n:{i % 7}"])
        code, out, err = cli("export", str(export), "--database", f"sqlite:///{source.database}")
    assert code == 0 and out.startswith(f"exported {MANY} entries of 1 tenants to "), err
    moved = workdir / "moved.db"
    code, out, err = cli("import", str(export), "--database", f"sqlite:///{moved}")
    assert code == 0, err
    assert out.startswith(f"imported {MANY} entries from {export} (0 already there) in "), out
    again = workdir / "again.ndjson"
    code, _, err = cli("export", str(again), "--database", f"sqlite:///{moved}")
    assert code == 0, err
    assert sorted(entry_lines(again)) == sorted(entry_lines(export))
    assert len(set(entry_lines(again))) == MANY
    there = Sidecar(workdir, database=moved, socket_path=workdir / "moved.sock")
    with there, there.client() as client:
        assert issue(client, "t-many", "a") == ref
        begin(client, "r", "t-many")
        for line in (entry_lines(export)[0], entry_lines(export)[-1]):
            wanted = json.loads(line)
            got = client.call("memory.get", runId="r", memoryRef=ref, id=wanted["id"])
            assert got is not None and got["content"] == wanted["content"]


def test_an_export_that_cannot_write_says_so_and_leaves_no_partial_file(workdir: Path) -> None:
    """A file size limit (RLIMIT_FSIZE, as a full disk would) makes the export's writes fail
    midway: one line naming the file, exit 1, no partial file, the database untouched."""
    export = workdir / "cut-short.ndjson"
    with Sidecar(workdir) as source, source.client() as client:
        ref = issue(client, "t-full", "a")
        begin(client, "w", "t-full")
        for i in range(600):  # about 150 KB of export, over the 64 KiB limit
            put(client, "w", ref, f"entry {i} " + "x" * 200)
        assert source.stop() == 0
    database = source.database.read_bytes()
    # Ignoring SIGXFSZ makes an over-limit write fail with EFBIG instead of killing.
    limited = 'trap \'\' XFSZ; ulimit -f 128; exec "$0" "$@"'
    done = subprocess.run(
        [
            "sh",
            "-c",
            limited,
            EXE,
            "export",
            str(export),
            "--database",
            f"sqlite:///{source.database}",
        ],
        # Unmeasured: under the same limit coverage could not write its data file either.
        env=unmeasured(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done
    assert done.stderr.splitlines() == [
        f"openwop-memory: export failed: cannot write {export}: File too large"
    ]
    assert not export.exists()
    assert source.database.read_bytes() == database
