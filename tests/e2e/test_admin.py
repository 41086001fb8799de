"""The admin socket: only the operator reaches it, the workers' socket knows none of its
methods, ``inspect run`` shows exactly what the run's own list returns, and ``backup``
copies a database under write load into a file that passes ``integrity_check``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from openwop_memory.wire.admin import ADMIN_METHODS
from support.on_disk import query
from support.protocol import issue, listing, put
from support.schemas import check_capabilities
from support.sidecar import RawClient, RpcError, Sidecar, run_cli

TENANT = "t-admin"


def admin_sidecar(workdir: Path, *args: str) -> Sidecar:
    return Sidecar(workdir, "--admin-socket", str(workdir / "admin.sock"), *args)


def cli(sidecar: Sidecar, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, "--admin-socket", str(sidecar.workdir / "admin.sock"), timeout=60)


@pytest.mark.backend_independent
def test_the_workers_socket_knows_no_admin_method(workdir: Path) -> None:
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        for method in ADMIN_METHODS:
            with pytest.raises(RpcError) as refused:
                client.call(method)
            assert refused.value.rpc_code == -32601, method
            assert refused.value.details == {"resource": "method"}


@pytest.mark.backend_independent
def test_the_admin_socket_is_the_service_users_alone_and_goes_with_the_sidecar(
    workdir: Path,
) -> None:
    with admin_sidecar(workdir) as sidecar:
        st = os.stat(workdir / "admin.sock")
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.getuid()
        with RawClient(workdir / "admin.sock") as admin:
            assert admin.call("admin.runs") == []
            # The admin socket serves no worker method: it is not a way around binding.
            with pytest.raises(RpcError):
                admin.call("memory.issueRef", tenant=TENANT, agent="a")
        assert sidecar.stop() == 0
    assert not (workdir / "admin.sock").exists()


def test_inspect_run_shows_exactly_what_the_runs_list_returns(workdir: Path) -> None:
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        refs = [issue(client, TENANT, "a"), issue(client, TENANT, "b"), "plain-ref"]
        client.call("run.begin", runId="w", tenant=TENANT)
        written = [
            put(client, "w", ref, f"{ref[-4:]} {i}", ["k"]) for ref in refs for i in range(3)
        ]
        client.call("run.begin", runId="seen", tenant=TENANT)
        put(client, "w", refs[0], "after the snapshot", ["k"])  # the run must not see this
        client.call("memory.delete", runId="w", memoryRef=refs[1], id=written[3]["id"])
        lists = [
            client.call("memory.list", runId="seen", memoryRef=ref, options={"limit": 1000})
            for ref in refs
        ]
        with RawClient(workdir / "admin.sock") as admin:
            view = admin.call("admin.run", runId="seen")
            runs = admin.call("admin.runs")
        out = cli(sidecar, "inspect", "run", "seen", "--json")
        table = cli(sidecar, "inspect", "run", "seen")
    assert view["runId"] == "seen" and view["tenant"] == TENANT
    assert sorted((s["entries"] for s in view["scopes"]), key=json.dumps) == sorted(
        lists, key=json.dumps
    )
    assert written[3]["id"] in json.dumps(view), "deleted after the snapshot: still seen"
    assert "after the snapshot" not in json.dumps(view)
    assert {r["runId"] for r in runs} == {"w", "seen"}
    assert all(r["tenant"] == TENANT and r["openHere"] and r["retained"] for r in runs)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == view
    assert table.returncode == 0 and "run seen" in table.stdout
    assert all(e["id"] in table.stdout for s in lists for e in s)


def test_inspect_scopes_and_entry(workdir: Path) -> None:
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        ref = issue(client, TENANT, "a")
        client.call("run.begin", runId="w", tenant=TENANT)
        kept = put(client, "w", ref, "kept", ["k"])
        gone = put(client, "w", ref, "gone", ["k"])
        client.call("memory.delete", runId="w", memoryRef=ref, id=gone["id"])
        scopes = cli(sidecar, "inspect", "scopes", TENANT, "--json")
        entry = cli(sidecar, "inspect", "entry", kept["id"], "--json")
        deleted = cli(sidecar, "inspect", "entry", gone["id"], "--json")
        missing = cli(sidecar, "inspect", "entry", "mem_nothing")
    (scope,) = json.loads(scopes.stdout)
    assert scope["liveEntries"] == 1 and scope["scope"].startswith("issued:")
    found = json.loads(entry.stdout)
    assert found == {"tenant": TENANT, "scope": scope["scope"], "deleted": False, "entry": kept}
    assert json.loads(deleted.stdout)["deleted"] is True
    assert missing.returncode == 1
    assert missing.stderr.strip() == "openwop-memory: not_found: no entry has this id"


@pytest.mark.backend_independent
def test_the_cli_says_when_no_admin_socket_is_known(workdir: Path) -> None:
    out = run_cli("inspect", "runs", timeout=60)  # no OPENWOP_MEMORY_ADMIN_SOCKET: see conftest
    assert out.returncode == 2
    assert out.stderr.startswith("openwop-memory: no admin socket: pass --admin-socket PATH")


@pytest.mark.sqlite_only
def test_backup_under_write_load_holds_every_earlier_write_and_passes_its_check(
    workdir: Path,
) -> None:
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        ref = issue(client, TENANT, "a")
        client.call("run.begin", runId="w", tenant=TENANT)
        before = [put(client, "w", ref, f"before {i}", ["k"])["id"] for i in range(200)]
        stop = threading.Event()
        during: list[str] = []

        def write() -> None:
            with sidecar.client() as writer:
                writer.call("run.begin", runId="w2", tenant=TENANT)
                while not stop.is_set():
                    during.append(put(writer, "w2", ref, "during", ["k"])["id"])

        thread = threading.Thread(target=write)
        thread.start()
        try:
            out = cli(sidecar, "backup", str(workdir / "copy.db"))
            again = cli(sidecar, "backup", str(workdir / "copy.db"))
        finally:
            stop.set()
            thread.join(30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("backed up ") and str(workdir / "copy.db") in out.stdout
    assert again.returncode == 1 and "the backup path exists" in again.stderr
    assert during, "writes went on during the backup"
    copy = workdir / "copy.db"
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert query(copy, "PRAGMA integrity_check") == [("ok",)]
    stored = {row[0] for row in query(copy, "SELECT id FROM entries")}
    assert set(before) <= stored


def test_backup_on_postgresql_says_what_to_use_instead(workdir: Path) -> None:
    with admin_sidecar(workdir) as sidecar:
        if sidecar.backend.name != "postgresql":
            pytest.skip("the PostgreSQL backend's answer (SQLite's is tested above)")
        out = cli(sidecar, "backup", str(workdir / "copy.db"))
    assert out.returncode == 1
    assert "pg_dump" in out.stderr
    assert not (workdir / "copy.db").exists()


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "runs"],
        ["inspect", "run"],
        ["inspect", "diff"],
        ["inspect", "scopes"],
        ["backup"],
        ["forget"],
    ],
)
def test_every_admin_command_says_where_it_looks_and_how_it_exits(command: list[str]) -> None:
    out = run_cli(*command, "--help")
    assert out.returncode == 0
    for needle in ("OPENWOP_MEMORY_ADMIN_SOCKET", "[default: 60s]", "exit codes:", "2  nothing"):
        assert needle in out.stdout, (needle, out.stdout)


def test_forget_removes_a_subject_from_every_scope_of_the_tenant_for_every_run(
    workdir: Path,
) -> None:
    # Every request logged: not one line may name the subject.
    with admin_sidecar(workdir, "--access-log") as sidecar, sidecar.client() as client:
        caps = client.call("host.capabilities")
        refs = [issue(client, TENANT, "a"), issue(client, TENANT, "b")]
        other_ref = issue(client, "t-other", "a")
        client.call("run.begin", runId="w", tenant=TENANT)
        client.call("run.begin", runId="w-other", tenant="t-other")
        doomed = [put(client, "w", ref, "alice likes tea", ["subject:alice"]) for ref in refs]
        kept = put(client, "w", refs[0], "bob likes coffee", ["subject:bob"])
        elsewhere = put(client, "w-other", other_ref, "alice elsewhere", ["subject:alice"])
        client.call("run.begin", runId="saw-her", tenant=TENANT)
        assert len(listing(client, "saw-her", refs[1])) == 1
        # Not on the workers' socket, whatever the params: no worker can forget.
        with pytest.raises(RpcError) as refused:
            client.call("admin.forget", tenant=TENANT, subject="bob")
        assert refused.value.rpc_code == -32601
        out = cli(sidecar, "forget", TENANT, "alice")
        again = cli(sidecar, "forget", TENANT, "alice", "--json")
        bad = cli(sidecar, "forget", TENANT, "x" * 129)
        seen = [listing(client, "saw-her", ref) for ref in refs]
        client.call("run.begin", runId="after", tenant=TENANT)
        client.call("run.begin", runId="after-other", tenant="t-other")
        now = [listing(client, "after", ref) for ref in refs]
        other = listing(client, "after-other", other_ref)
        events = sidecar.events("subject_forgotten")
        page = client.call("sidecar.metrics")["text"]
        log = sidecar.log()
    check_capabilities(caps)
    assert caps["capabilities"]["memory"]["retention"] == {"ttl": True, "forget": True}
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"forgot 2 entries of subject alice in tenant {TENANT} in ")
    assert again.returncode == 0 and json.loads(again.stdout)["forgotten"] == 0
    assert bad.returncode == 1 and "validation_error" in bad.stderr
    assert seen == [[kept], []], "a run that saw them before stops seeing them"
    assert now == [[kept], []]
    assert other == [elsewhere], "another tenant's entries about the same subject stay"
    assert {e["id"] for e in doomed}.isdisjoint(e["id"] for e in seen[0] + now[0])
    assert [(e["tenant"], e["forgotten"]) for e in events] == [(TENANT, 2), (TENANT, 0)]
    assert "alice" not in log, "the subject's id is not logged"
    assert any(line.get("method") == "admin.forget" for line in sidecar.log_lines())
    assert "\nopenwop_memory_forgotten_entries_total 2.0\n" in page


def words(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_inspect_prints_plain_tables_and_a_run_that_sees_nothing(workdir: Path) -> None:
    """Without ``--json``: one header and one row per item, and a run begun before any
    write says it sees no entries although its tenant has a live scope."""
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        ref = issue(client, TENANT, "a")
        client.call("run.begin", runId="early", tenant=TENANT)  # snapshot before any write
        client.call("run.begin", runId="w", tenant=TENANT)
        kept = put(client, "w", ref, "kept\nacross lines", ["k", "j"])
        gone = put(client, "w", ref, "gone", ["k"])
        client.call("memory.delete", runId="w", memoryRef=ref, id=gone["id"])
        with RawClient(workdir / "admin.sock") as admin:
            runs_json = admin.call("admin.runs")
            (scope,) = admin.call("admin.scopes", tenant=TENANT)
        runs = cli(sidecar, "inspect", "runs")
        scopes = cli(sidecar, "inspect", "scopes", TENANT)
        entry = cli(sidecar, "inspect", "entry", kept["id"])
        deleted = cli(sidecar, "inspect", "entry", gone["id"])
        early = cli(sidecar, "inspect", "run", "early")
    for out in (runs, scopes, entry, deleted, early):
        assert out.returncode == 0 and out.stderr == "", out
    header = ["runId", "tenant", "snapshotAt", "touchedAt", "retained", "openHere"]
    assert words(runs.stdout)[0] == header
    assert sorted(words(runs.stdout)[1:]) == sorted(
        [r["runId"], TENANT, r["snapshotAt"], r["touchedAt"], "True", "True"] for r in runs_json
    )
    assert words(scopes.stdout) == [["scope", "liveEntries"], [scope["scope"], "1"]]
    assert entry.stdout.splitlines()[0] == f"tenant {TENANT}  scope {scope['scope']}"
    assert words(entry.stdout)[1] == ["id", "createdAt", "expiresAt", "tags", "content"]
    assert words(entry.stdout)[2:] == [
        [kept["id"], kept["createdAt"], "k,j", "kept\\nacross", "lines"]
    ]
    assert deleted.stdout.splitlines()[0] == f"tenant {TENANT}  scope {scope['scope']}  (deleted)"
    assert words(deleted.stdout)[2] == [gone["id"], gone["createdAt"], "k", "gone"]
    (snapshot,) = (r["snapshotAt"] for r in runs_json if r["runId"] == "early")
    assert early.stdout.splitlines() == [
        f"run early  tenant {TENANT}  snapshot {snapshot}",
        "(sees no entries)",
    ]


def test_inspect_diff_shows_what_was_added_superseded_and_deleted(workdir: Path) -> None:
    with admin_sidecar(workdir) as sidecar, sidecar.client() as client:
        ref = issue(client, TENANT, "a")
        client.call("run.begin", runId="w", tenant=TENANT)
        kept = put(client, "w", ref, "kept")
        doomed = put(client, "w", ref, "deleted later")
        key = {"vendor.openwop-memory.key": {"key": "colour"}}
        red = client.call("memory.put", runId="w", memoryRef=ref, entry={"content": "red"}, **key)[
            "entry"
        ]
        client.call("run.begin", runId="before", tenant=TENANT)
        blue = client.call(
            "memory.put", runId="w", memoryRef=ref, entry={"content": "blue"}, **key
        )["entry"]
        added = put(client, "w", ref, "added later")
        assert client.call("memory.delete", runId="w", memoryRef=ref, id=doomed["id"])
        client.call("run.begin", runId="after", tenant=TENANT)
        client.call("run.begin", runId="other", tenant="t-other")
        with RawClient(workdir / "admin.sock") as admin:
            diff = admin.call("admin.diff", **{"from": "after", "to": "before"})  # swapped
            same = admin.call("admin.diff", **{"from": "before", "to": "before"})
            with pytest.raises(RpcError) as tenants:
                admin.call("admin.diff", **{"from": "before", "to": "other"})
        table = cli(sidecar, "inspect", "diff", "before", "after")
    assert diff["from"]["runId"] == "before" and diff["to"]["runId"] == "after"
    [scope] = diff["scopes"]
    assert [e["id"] for e in scope["added"]] == [added["id"], blue["id"]]
    assert scope["superseded"] == [{"entry": red, "by": blue["id"]}]
    assert [e["id"] for e in scope["deleted"]] == [doomed["id"]]
    assert scope["truncated"] is False
    assert kept["id"] not in json.dumps(scope)
    assert same["scopes"] == []
    assert tenants.value.code == "validation_error" and tenants.value.details == {"field": "to"}
    assert table.returncode == 0, table.stderr
    assert "1 superseded" in table.stdout and f"superseded by {blue['id']}" in table.stdout
    assert "added later" in table.stdout and "deleted later" in table.stdout
